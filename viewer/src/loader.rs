//! Background loading: each file is read, decoded and prepared in its own [`Job`], with
//! progress the UI can show and a flag that cancels it. The UI thread never blocks on a file.
//!
//! Which reader a file needs is not decided here: every file is opened by
//! `memsnap_converters::OpenOptions`, as the `memsnap` commands open it. This module keeps
//! the UI's side only: the thread, the stage and fraction shown, the preview drawn while a
//! pickle loads, and the kinds of failure (`LoadError`). The thread, cancelling, panics and
//! handing the result to the app are the [`crate::job`] every background task uses.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egui::DroppedFileHandle;
use memsnap_converters::{ConvertError, Failure, OpenOptions};
use memsnap_format::io::Detected;
use memsnap_format::{Action, Snapshot, TraceEntry};

use crate::job::{Job, JobError, Progress};

/// Where a snapshot comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A path from the command line, File > Open or the recent list.
    Path(PathBuf),
    /// A file dropped on the window (a path on native platforms, bytes otherwise).
    Dropped(DroppedFileHandle),
    /// Bytes already in memory (tests, generated snapshots).
    Bytes { name: String, bytes: Arc<[u8]> },
    /// The simulated training run of `memsnap demo` (`--demo`): six steps with a small leak.
    Demo,
}

impl Source {
    /// A short name to show: the file name, or the given name.
    pub fn display_name(&self) -> String {
        match self {
            Source::Path(p) => file_name(p),
            Source::Dropped(f) => file_name(f.path()),
            Source::Bytes { name, .. } => name.clone(),
            Source::Demo => "demo training run".to_owned(),
        }
    }

    /// The path on disk, when there is one.
    pub fn path(&self) -> Option<PathBuf> {
        match self {
            Source::Path(p) => Some(p.clone()),
            Source::Dropped(f) if f.path().is_file() => Some(f.path().to_owned()),
            _ => None,
        }
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// A decoded snapshot and where it came from.
#[derive(Debug)]
pub struct LoadedSnapshot {
    pub name: String,
    pub path: Option<PathBuf>,
    pub snapshot: Snapshot,
    pub detected: Detected,
    /// Size of the file as stored (before decompression).
    pub file_bytes: u64,
    /// Time spent reading and decoding.
    pub decode_time: Duration,
}

/// Why a file did not open. Every variant names the file; decode errors also say where in it.
/// (A panic or a cancel is the job's to report: [`crate::job::JobError`].)
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error("cannot read {name}: {what}")]
    Read { name: String, what: String },
    #[error("{name}: {source}")]
    Decode {
        name: String,
        #[source]
        source: ConvertError,
    },
    /// Another tool's format (a torch.profiler trace, ...) that cannot be imported; `what`
    /// says what is missing.
    #[error("{name}: {what}")]
    Import { name: String, what: String },
    /// The decoded snapshot could not be prepared for showing (no device to analyse, ...).
    #[error("{name}: {source}")]
    Prepare {
        name: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("loading {name} was cancelled")]
    Cancelled { name: String },
}

impl LoadError {
    /// How the viewer tells of a file that did not open: the converters decide which kind of
    /// failure it is ([`ConvertError::failure`]), this only words it.
    fn opening(name: String, error: ConvertError) -> Self {
        match error.failure() {
            Failure::Cancelled => LoadError::Cancelled { name },
            Failure::Read { path, source } => LoadError::Read {
                what: format!("{}: {source}", path.display()),
                name,
            },
            Failure::Import => LoadError::Import {
                what: error.reason(),
                name,
            },
            _ => LoadError::Decode {
                name,
                source: error,
            },
        }
    }
}

/// The stages a load goes through, as [`Progress::stage`] names them.
pub const READING: &str = "reading";
pub const DECODING: &str = "decoding";
pub const ANALYSING: &str = "analysing";

/// The picture of what has been read so far (pickles only), replaced at each progress tick
/// (about every MiB); the loading screen draws it.
#[derive(Debug, Default)]
pub struct PreviewSlot(Mutex<Option<LoadPreview>>);

impl PreviewSlot {
    /// The picture of what has been read so far, while a pickle is being read.
    pub fn get(&self) -> Option<LoadPreview> {
        self.0.lock().ok().and_then(|p| p.clone())
    }

    fn set(&self, preview: &LoadPreview) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(preview.clone());
        }
    }
}

/// What a pickle being read shows before it is done: the bytes in use (allocations minus
/// completed frees, every device together) over the entries read so far, as the min and
/// max of each bucket of entries. At most [`PREVIEW_BUCKETS`] buckets: when full, pairs
/// merge and a bucket holds twice the entries.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadPreview {
    /// (min, max) bytes in use per bucket, in entry order; the last bucket may be partial.
    pub buckets: Vec<(i64, i64)>,
    /// Entries per bucket.
    pub bucket_entries: u64,
    /// Entries read.
    pub entries: u64,
}

/// Most buckets a [`LoadPreview`] keeps (about the width of a window in pixels).
pub const PREVIEW_BUCKETS: usize = 2048;

impl Default for LoadPreview {
    fn default() -> Self {
        LoadPreview {
            buckets: Vec::new(),
            bucket_entries: 1,
            entries: 0,
        }
    }
}

impl LoadPreview {
    /// Adds entries in read order, given the bytes in use before them; returns the bytes in
    /// use after them.
    pub fn extend(&mut self, entries: &[TraceEntry], mut in_use: i64) -> i64 {
        for entry in entries {
            let size = i64::try_from(entry.size).unwrap_or(i64::MAX);
            match entry.action {
                Action::Alloc => in_use = in_use.saturating_add(size),
                Action::FreeCompleted => in_use = in_use.saturating_sub(size),
                _ => {}
            }
            let bucket = (self.entries / self.bucket_entries) as usize;
            if bucket == self.buckets.len() {
                self.buckets.push((in_use, in_use));
            } else {
                let b = &mut self.buckets[bucket];
                *b = (b.0.min(in_use), b.1.max(in_use));
            }
            self.entries += 1;
            if self.buckets.len() == PREVIEW_BUCKETS
                && self
                    .entries
                    .is_multiple_of(self.bucket_entries * PREVIEW_BUCKETS as u64)
            {
                self.buckets = self
                    .buckets
                    .chunks(2)
                    .map(|p| {
                        p.iter().fold((i64::MAX, i64::MIN), |(lo, hi), b| {
                            (lo.min(b.0), hi.max(b.1))
                        })
                    })
                    .collect();
                self.bucket_entries *= 2;
            }
        }
        in_use
    }
}

/// One file being loaded in the background: a [`Job`] that reads, decodes and prepares it,
/// and the preview it draws meanwhile.
pub struct LoadJob<T> {
    pub id: u64,
    pub name: String,
    job: Job<T, LoadError>,
    preview: Arc<PreviewSlot>,
}

impl<T: Send + 'static> LoadJob<T> {
    /// Starts reading `source` in the background. `prepare` runs on the job's thread after
    /// decoding (building the analysis); `repaint` is asked to redraw when the result is
    /// ready.
    pub fn spawn<E>(
        id: u64,
        source: Source,
        repaint: Option<egui::Context>,
        prepare: impl FnOnce(LoadedSnapshot) -> Result<T, E> + Send + 'static,
    ) -> Self
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let name = source.display_name();
        let preview = Arc::new(PreviewSlot::default());
        let slot = preview.clone();
        let job = Job::spawn(format!("loading {name}"), repaint, move |progress| {
            let loaded = load(&source, progress, &slot)?;
            progress.set(ANALYSING, 0, 0);
            let name = loaded.name.clone();
            prepare(loaded).map_err(|e| LoadError::Prepare {
                name,
                source: e.into(),
            })
        });
        LoadJob {
            id,
            name,
            job,
            preview,
        }
    }

    /// Asks the job to stop; it reports [`JobError::Cancelled`] soon after.
    pub fn cancel(&self) {
        self.job.cancel();
    }

    pub fn is_cancelled(&self) -> bool {
        self.job.is_cancelled()
    }

    pub fn progress(&self) -> &Progress {
        self.job.progress()
    }

    /// The picture of what has been read so far, while a pickle is being read.
    pub fn preview(&self) -> Option<LoadPreview> {
        self.preview.get()
    }

    /// The result, once the job is done.
    pub fn poll(&self) -> Option<Result<T, JobError<LoadError>>> {
        self.job.poll()
    }

    /// Blocks until the job is done (tests and headless runs).
    pub fn wait(self) -> Result<T, JobError<LoadError>> {
        self.job.wait()
    }
}

/// Reads and decodes one source, reporting progress and honouring `cancel`. Files and bytes
/// are opened by [`OpenOptions`], the one way in that the command line uses too; this adds
/// only what the UI shows: the stage, the fraction done and the preview.
pub fn load(
    source: &Source,
    progress: &Progress,
    preview_slot: &PreviewSlot,
) -> Result<LoadedSnapshot, LoadError> {
    let name = source.display_name();
    let started = Instant::now();
    progress.set(READING, 0, 0);
    /// Where the bytes come from: a file is opened by its path (a pickle is streamed, never
    /// held whole, so a 1 GB file needs no extra GB), other sources are already in memory.
    enum Input {
        File(PathBuf),
        Memory(Arc<[u8]>),
    }
    let input = match source {
        Source::Demo => return Ok(demo_snapshot(name, started)),
        Source::Path(path) => Input::File(path.clone()),
        Source::Dropped(file) if file.path().is_file() => Input::File(file.path().to_owned()),
        Source::Dropped(file) => Input::Memory(
            file.bytes()
                .map_err(|what| LoadError::Read {
                    name: name.clone(),
                    what,
                })?
                .into(),
        ),
        Source::Bytes { bytes, .. } => Input::Memory(bytes.clone()),
    };
    if progress.is_cancelled() {
        return Err(LoadError::Cancelled { name });
    }
    // The entries read so far, drawn by the UI while the rest loads.
    let mut preview = LoadPreview::default();
    let mut in_use = 0i64;
    let options = OpenOptions::new()
        .progress(|done, total| {
            progress.set(DECODING, done, total);
            !progress.is_cancelled()
        })
        .preview(move |entries| {
            in_use = preview.extend(entries, in_use);
            preview_slot.set(&preview);
        });
    let (opened, file_bytes) = match &input {
        Input::File(path) => {
            let file_bytes = std::fs::metadata(path).map_or(0, |m| m.len());
            progress.set(DECODING, 0, file_bytes);
            (options.open(path), file_bytes)
        }
        Input::Memory(bytes) => {
            let file_bytes = bytes.len() as u64;
            progress.set(DECODING, 0, file_bytes);
            (options.open_bytes(bytes, Path::new(&name)), file_bytes)
        }
    };
    let import = opened.map_err(|error| LoadError::opening(name.clone(), error))?;
    if progress.is_cancelled() {
        return Err(LoadError::Cancelled { name });
    }
    Ok(LoadedSnapshot {
        name,
        path: source.path(),
        snapshot: import.snapshot,
        detected: detected_of(import.source),
        file_bytes,
        decode_time: started.elapsed(),
    })
}

/// The encoding to show for an opened input: an imported one shows as JSON (what it was
/// read from), with its compression.
fn detected_of(source: memsnap_converters::Source) -> Detected {
    use memsnap_converters::Source as S;
    match source {
        S::Snapshot(d) => d,
        S::MemsnapChrome(compression)
        | S::TorchProfiler(compression)
        | S::MemoryTimelineRaw(compression)
        | S::MemoryTimelinePlot(compression) => Detected {
            format: memsnap_format::Format::Json,
            compression,
        },
        _ => Detected {
            format: memsnap_format::Format::Json,
            compression: memsnap_format::Compression::None,
        },
    }
}

/// The demo run: `memsnap demo`'s transformer (memsnap-workload: 6 layers, hidden 1024, batch
/// 8 x 1024 tokens), six steps, 16 MiB leaked per step so the drift shows.
fn demo_snapshot(name: String, started: Instant) -> LoadedSnapshot {
    let run = memsnap_workload::TrainingRun {
        steps: 6,
        leak_bytes_per_step: 16 << 20,
        ..memsnap_workload::TrainingRun::transformer(6, 8, 1024, 1024)
    };
    let (snapshot, _) = memsnap_workload::generate(&run);
    LoadedSnapshot {
        name,
        path: None,
        snapshot,
        detected: Detected {
            format: memsnap_format::Format::Pickle,
            compression: memsnap_format::Compression::None,
        },
        file_bytes: 0,
        decode_time: started.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_source(name: &str, bytes: &[u8]) -> Source {
        Source::Bytes {
            name: name.into(),
            bytes: bytes.into(),
        }
    }

    /// A torch.profiler trace with one `[memory]` event.
    const PROFILER_TRACE: &[u8] = br#"{"traceEvents": [
            {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1700000000000100,
             "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": 1024,
                      "Total Allocated": 1024, "Total Reserved": 2097152}}]}"#;

    #[test]
    fn a_dropped_torch_profiler_trace_opens_through_the_converters() {
        let job = LoadJob::spawn(
            1,
            bytes_source("prof.json", PROFILER_TRACE),
            None,
            Ok::<_, LoadError>,
        );
        let loaded = job.wait().expect("a torch.profiler trace opens");
        let entries = &loaded.snapshot.traces()[0];
        assert_eq!(entries.len(), 1);
        assert_eq!((entries[0].action, entries[0].size), (Action::Alloc, 1024));
        assert_eq!(entries[0].time_us(), Some(1_700_000_000_000_100));
    }

    /// Regression: the loader used to redo the converters' dispatch (regular file, own
    /// binary, detection, fallback) and could drift from the command line. A file only the
    /// converters tell apart (a gzipped torch.profiler trace) opens from disk through the one
    /// open path: the snapshot `memsnap` commands get, with its progress shown to the end.
    #[test]
    fn a_gzipped_profiler_trace_on_disk_opens_as_on_the_command_line_with_progress() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, loaded, progress, _) =
            load_gzipped(dir.path(), "prof.pt.trace.json.gz", PROFILER_TRACE.to_vec());
        let (on_the_command_line, source) =
            memsnap_converters::open_path(&path).expect("memsnap opens it");
        assert!(matches!(
            source,
            memsnap_converters::Source::TorchProfiler(_)
        ));
        assert_eq!(loaded.snapshot.traces(), on_the_command_line.traces());
        assert_eq!(
            loaded.detected.compression,
            memsnap_format::Compression::Gzip
        );
        assert_eq!(progress.fraction(), Some(1.0), "progress reaches the end");
    }

    /// A gzipped pickle on disk is streamed through the one open path with its preview.
    #[test]
    fn a_gzipped_pickle_on_disk_shows_what_has_been_read_while_it_loads() {
        let (snapshot, bytes) = big_pickle();
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, loaded, _, preview) = load_gzipped(dir.path(), "big.pickle.gz", bytes);
        assert_eq!(loaded.snapshot.entry_count(), snapshot.entry_count());
        assert!(preview.get().is_some(), "a preview was shown");
    }

    #[test]
    fn a_trace_without_memory_events_names_what_is_missing() {
        let trace = br#"{"traceEvents": [{"ph": "X", "name": "gemm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}"#;
        let job = LoadJob::spawn(
            1,
            bytes_source("kernels.json", trace),
            None,
            Ok::<_, LoadError>,
        );
        let err = job.wait().expect_err("nothing to show");
        let text = err.to_string();
        assert!(text.starts_with("kernels.json: "), "{text}");
        assert!(text.contains("no [memory] events"), "{text}");
        assert!(matches!(err, JobError::Failed(LoadError::Import { .. })));
    }

    #[test]
    fn garbage_reports_a_decode_error_naming_the_file() {
        let job = LoadJob::spawn(
            1,
            bytes_source("junk.bin", b"hello"),
            None,
            Ok::<_, LoadError>,
        );
        let err = job.wait().expect_err("garbage must not decode");
        let text = err.to_string();
        assert!(text.starts_with("junk.bin: "), "{text}");
        assert!(matches!(err, JobError::Failed(LoadError::Decode { .. })));
    }

    #[test]
    fn a_missing_file_reports_a_read_error_with_its_path() {
        let source = Source::Path("/nonexistent/dir/snap.pickle".into());
        let job = LoadJob::spawn(2, source, None, Ok::<_, LoadError>);
        let text = job.wait().expect_err("no such file").to_string();
        assert!(text.contains("/nonexistent/dir/snap.pickle"), "{text}");
    }

    #[test]
    fn a_panicking_prepare_step_is_reported_not_propagated() {
        let json = br#"{"segments": [], "device_traces": [[]]}"#;
        let job: LoadJob<()> = LoadJob::spawn(
            3,
            bytes_source("ok.json", json),
            None,
            |_| -> Result<(), LoadError> { panic!("boom") },
        );
        let err = job.wait().expect_err("prepare panicked");
        assert!(
            matches!(&err, JobError::Panicked { what, message } if what == "loading ok.json" && message == "boom"),
            "{err}"
        );
        assert_eq!(err.to_string(), "loading ok.json failed unexpectedly: boom");
    }

    #[test]
    fn cancelling_before_reading_reports_cancelled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.json");
        std::fs::write(&path, vec![b' '; 1 << 20]).expect("write");
        let progress = Progress::default();
        progress.cancel();
        let err =
            load(&Source::Path(path), &progress, &PreviewSlot::default()).expect_err("cancelled");
        assert!(matches!(err, LoadError::Cancelled { .. }), "{err}");
    }

    /// Writes `bytes` gzipped as `name` in `dir` and loads that file as the viewer does:
    /// its path, what loaded, and the progress shown.
    fn load_gzipped(
        dir: &Path,
        name: &str,
        bytes: Vec<u8>,
    ) -> (PathBuf, LoadedSnapshot, Progress, PreviewSlot) {
        let path = dir.join(name);
        let gzipped =
            memsnap_format::io::compress(bytes, memsnap_format::Compression::Gzip).expect("gzip");
        std::fs::write(&path, gzipped).expect("write");
        let progress = Progress::default();
        let preview = PreviewSlot::default();
        let loaded = load(&Source::Path(path.clone()), &progress, &preview)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        (path, loaded, progress, preview)
    }

    /// A generated run big enough for several progress ticks, and its pickle.
    fn big_pickle() -> (Snapshot, Vec<u8>) {
        let run = memsnap_workload::TrainingRun {
            target_entries: Some(60_000),
            ..Default::default()
        };
        let (snapshot, _) = memsnap_workload::generate(&run);
        let bytes =
            memsnap_format::io::encode(&snapshot, memsnap_format::Format::Pickle).expect("encode");
        (snapshot, bytes)
    }

    #[test]
    fn a_pickle_shows_what_has_been_read_while_it_loads() {
        let (_, bytes) = big_pickle();
        assert!(
            bytes.len() > 3 << 20,
            "several progress ticks: {} bytes",
            bytes.len()
        );
        let slot = PreviewSlot::default();
        let loaded = load(
            &bytes_source("big.pickle", &bytes),
            &Progress::default(),
            &slot,
        )
        .expect("loads");
        // The last picture shown before the end: part of the entries, in order.
        let preview = slot.get().expect("a preview was shown");
        let total = loaded.snapshot.entry_count() as u64;
        assert!(
            preview.entries > 0 && preview.entries <= total,
            "{preview:?}"
        );
        let mut exact = LoadPreview::default();
        exact.extend(&loaded.snapshot.traces()[0][..preview.entries as usize], 0);
        assert_eq!(preview, exact);
    }

    #[test]
    fn a_preview_keeps_the_exact_min_and_max_in_at_most_its_bucket_count() {
        use memsnap_format::TraceEntry;
        // A saw-tooth of allocations and frees, fed in uneven batches.
        let entries: Vec<TraceEntry> = (0..20_000u64)
            .map(|i| {
                let action = if i % 7 < 4 {
                    Action::Alloc
                } else {
                    Action::FreeCompleted
                };
                TraceEntry::new(action, 0x1000, (i * 37) % 5000, 0)
            })
            .collect();
        let mut preview = LoadPreview::default();
        let mut in_use = 0;
        for batch in entries.chunks(999) {
            in_use = preview.extend(batch, in_use);
            assert!(preview.buckets.len() <= PREVIEW_BUCKETS);
        }
        assert_eq!(preview.entries, entries.len() as u64);
        // Each bucket is the min and max of the running total over its entries.
        let mut running = 0i64;
        let totals: Vec<i64> = entries
            .iter()
            .map(|e| {
                match e.action {
                    Action::Alloc => running += e.size as i64,
                    _ => running -= e.size as i64,
                }
                running
            })
            .collect();
        assert_eq!(in_use, running);
        for (i, &(lo, hi)) in preview.buckets.iter().enumerate() {
            let from = i * preview.bucket_entries as usize;
            let to = (from + preview.bucket_entries as usize).min(totals.len());
            let slice = &totals[from..to];
            assert_eq!(
                (lo, hi),
                (*slice.iter().min().unwrap(), *slice.iter().max().unwrap()),
                "bucket {i}"
            );
        }
    }

    #[test]
    fn a_repaint_is_asked_when_a_load_is_done() {
        let ctx = egui::Context::default();
        let (tx, rx) = std::sync::mpsc::channel();
        ctx.set_request_repaint_callback(move |_| {
            let _ = tx.send(());
        });
        let job = LoadJob::spawn(4, bytes_source("x", b""), Some(ctx), Ok::<_, LoadError>);
        assert!(job.wait().is_err());
        rx.recv_timeout(Duration::from_secs(10))
            .expect("repaint asked");
    }
}

//! Background loading: each file is read, decoded and prepared on its own thread, with
//! progress the UI can show and a flag that cancels it. The UI thread never blocks on a file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use egui::DroppedFileHandle;
use memsnap_format::io::{read_bytes_with, read_path_with, Detected};
use memsnap_format::{FormatError, Snapshot};

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
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {name}: {what}")]
    Read { name: String, what: String },
    #[error("{name}: {source}")]
    Decode {
        name: String,
        #[source]
        source: FormatError,
    },
    #[error("{name}: {what}")]
    Prepare { name: String, what: String },
    #[error("loading {name} was cancelled")]
    Cancelled { name: String },
    #[error("loading {name} failed unexpectedly: {what}")]
    Crashed { name: String, what: String },
}

/// The stage a load is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Reading,
    Decoding,
    Analysing,
}

impl Stage {
    pub fn label(self) -> &'static str {
        match self {
            Stage::Reading => "reading",
            Stage::Decoding => "decoding",
            Stage::Analysing => "analysing",
        }
    }
}

/// Progress shared between a worker and the UI.
#[derive(Debug, Default)]
pub struct LoadProgress {
    done: AtomicU64,
    total: AtomicU64,
    stage: AtomicU8,
}

impl LoadProgress {
    fn set(&self, stage: Stage, done: u64, total: u64) {
        self.stage.store(stage as u8, Ordering::Relaxed);
        self.done.store(done, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
    }

    pub fn stage(&self) -> Stage {
        match self.stage.load(Ordering::Relaxed) {
            0 => Stage::Reading,
            1 => Stage::Decoding,
            _ => Stage::Analysing,
        }
    }

    /// Fraction done in the current stage, or `None` when unknown.
    pub fn fraction(&self) -> Option<f32> {
        let total = self.total.load(Ordering::Relaxed);
        let done = self.done.load(Ordering::Relaxed);
        (total > 0).then(|| (done as f64 / total as f64).clamp(0.0, 1.0) as f32)
    }
}

/// One file being loaded in the background.
pub struct LoadJob<T> {
    pub id: u64,
    pub name: String,
    pub started: Instant,
    progress: Arc<LoadProgress>,
    cancel: Arc<AtomicBool>,
    receiver: mpsc::Receiver<Result<T, LoadError>>,
}

impl<T: Send + 'static> LoadJob<T> {
    /// Starts reading `source` on a new thread. `prepare` runs on that thread after decoding
    /// (building the analysis), and `wake` is called when the result is ready so the UI can
    /// repaint.
    pub fn spawn(
        id: u64,
        source: Source,
        wake: impl Fn() + Send + 'static,
        prepare: impl FnOnce(LoadedSnapshot, &LoadProgress) -> Result<T, String> + Send + 'static,
    ) -> Self {
        let name = source.display_name();
        let progress = Arc::new(LoadProgress::default());
        let cancel = Arc::new(AtomicBool::new(false));
        let (sender, receiver) = mpsc::channel();
        let job = LoadJob {
            id,
            name: name.clone(),
            started: Instant::now(),
            progress: progress.clone(),
            cancel: cancel.clone(),
            receiver,
        };
        let spawned = std::thread::Builder::new()
            .name(format!("load {name}"))
            .spawn(move || {
                // A panic in a decoder must cost one file, not the app.
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let loaded = load(&source, &progress, &cancel)?;
                    progress.set(Stage::Analysing, 0, 0);
                    let name = loaded.name.clone();
                    prepare(loaded, &progress).map_err(|what| LoadError::Prepare { name, what })
                }))
                .unwrap_or_else(|panic| {
                    Err(LoadError::Crashed {
                        name: source.display_name(),
                        what: panic_message(&*panic),
                    })
                });
                let _ = sender.send(result);
                wake();
            });
        if let Err(e) = spawned {
            // No thread: report it through the channel the UI polls anyway.
            let (sender, receiver) = mpsc::channel();
            let _ = sender.send(Err(LoadError::Crashed {
                name: job.name.clone(),
                what: format!("cannot start a loader thread: {e}"),
            }));
            return LoadJob { receiver, ..job };
        }
        job
    }

    /// Asks the worker to stop; it reports [`LoadError::Cancelled`] soon after.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    pub fn progress(&self) -> &LoadProgress {
        &self.progress
    }

    /// The result, once the worker is done.
    pub fn poll(&self) -> Option<Result<T, LoadError>> {
        match self.receiver.try_recv() {
            Ok(result) => Some(result),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(LoadError::Crashed {
                name: self.name.clone(),
                what: "the loader thread ended without a result".into(),
            })),
        }
    }

    /// Blocks until the worker is done (tests and headless runs).
    pub fn wait(&self) -> Result<T, LoadError> {
        self.receiver.recv().unwrap_or_else(|_| {
            Err(LoadError::Crashed {
                name: self.name.clone(),
                what: "the loader thread ended without a result".into(),
            })
        })
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_owned()
    }
}

/// Reads and decodes one source, reporting progress and honouring `cancel`.
pub fn load(
    source: &Source,
    progress: &LoadProgress,
    cancel: &AtomicBool,
) -> Result<LoadedSnapshot, LoadError> {
    let name = source.display_name();
    let started = Instant::now();
    /// Where the bytes come from: a file is streamed (a pickle never held whole, so a 1 GB
    /// file needs no extra GB), other sources are already in memory.
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
    if cancel.load(Ordering::Relaxed) {
        return Err(LoadError::Cancelled { name });
    }
    let mut on_progress = |done: u64, total: u64| {
        progress.set(Stage::Decoding, done, total);
        !cancel.load(Ordering::Relaxed)
    };
    let (decoded, file_bytes) = match input {
        Input::File(path) => {
            let file_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            progress.set(Stage::Decoding, 0, file_bytes);
            (read_path_with(&path, &mut on_progress), file_bytes)
        }
        Input::Memory(bytes) => {
            let file_bytes = bytes.len() as u64;
            progress.set(Stage::Decoding, 0, file_bytes);
            (read_bytes_with(&bytes, &mut on_progress), file_bytes)
        }
    };
    let (snapshot, detected) = match decoded {
        Ok(ok) => ok,
        Err(FormatError::Cancelled) => return Err(LoadError::Cancelled { name }),
        Err(FormatError::Io { path, source }) => {
            return Err(LoadError::Read {
                name,
                what: format!("{}: {source}", path.display()),
            })
        }
        Err(source) => return Err(LoadError::Decode { name, source }),
    };
    if cancel.load(Ordering::Relaxed) {
        return Err(LoadError::Cancelled { name });
    }
    Ok(LoadedSnapshot {
        name,
        path: source.path(),
        snapshot,
        detected,
        file_bytes,
        decode_time: started.elapsed(),
    })
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

    #[test]
    fn garbage_reports_a_decode_error_naming_the_file() {
        let job = LoadJob::spawn(1, bytes_source("junk.bin", b"hello"), || {}, |l, _| Ok(l));
        let err = job.wait().expect_err("garbage must not decode");
        let text = err.to_string();
        assert!(text.starts_with("junk.bin: "), "{text}");
        assert!(matches!(err, LoadError::Decode { .. }));
    }

    #[test]
    fn a_missing_file_reports_a_read_error_with_its_path() {
        let source = Source::Path("/nonexistent/dir/snap.pickle".into());
        let job = LoadJob::spawn(2, source, || {}, |l, _| Ok(l));
        let text = job.wait().expect_err("no such file").to_string();
        assert!(text.contains("/nonexistent/dir/snap.pickle"), "{text}");
    }

    #[test]
    fn a_panicking_prepare_step_is_reported_not_propagated() {
        let json = br#"{"segments": [], "device_traces": [[]]}"#;
        let job: LoadJob<()> = LoadJob::spawn(
            3,
            bytes_source("ok.json", json),
            || {},
            |_, _| panic!("boom"),
        );
        let err = job.wait().expect_err("prepare panicked");
        assert!(err.to_string().contains("boom"), "{err}");
    }

    #[test]
    fn cancelling_before_reading_reports_cancelled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.json");
        std::fs::write(&path, vec![b' '; 1 << 20]).expect("write");
        let progress = LoadProgress::default();
        let cancel = AtomicBool::new(true);
        let err = load(&Source::Path(path), &progress, &cancel).expect_err("cancelled");
        assert!(matches!(err, LoadError::Cancelled { .. }), "{err}");
    }

    #[test]
    fn wake_is_called_when_done() {
        let (tx, rx) = mpsc::channel();
        let job = LoadJob::spawn(
            4,
            bytes_source("x", b""),
            move || {
                let _ = tx.send(());
            },
            |l, _| Ok(l),
        );
        assert!(job.wait().is_err());
        rx.recv_timeout(Duration::from_secs(10)).expect("woken");
    }
}

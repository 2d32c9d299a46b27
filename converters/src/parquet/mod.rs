//! Parquet tables with Arrow types, for querying many ranks' snapshots with DuckDB, Spark,
//! Trino or Polars.
//!
//! An export is a folder with one sub-folder per table and, in each, one Parquet file per
//! input snapshot (`allocations/rank-00003.parquet`), plus `memsnap_export.json` (what was
//! exported, rows per table). Every engine reads a folder of Parquet files as one table:
//! `read_parquet('out/allocations/*.parquet')` in DuckDB, `spark.read.parquet("out/allocations")`,
//! `pl.scan_parquet("out/allocations/*.parquet")`. Every input writes a file to every table
//! (possibly without rows), so each glob always matches.
//!
//! | table | one row per | columns |
//! |---|---|---|
//! | `snapshots` | input file | `rank, file, encoding, devices (list), entries, segments, frames, stacks` |
//! | `devices` | device of a file | `rank, device, entries, allocations, peak_bytes, peak_event, peak_time, peak_reserved_bytes, before_window_bytes, truncated, ooms, step_method, steps` |
//! | `allocations` | allocation | `rank, device, addr, size, block_size, stream, origin, alloc_event, alloc_time, free_requested_event, free_requested_time, free_completed_event, free_completed_time, alive_at_end, stack_id, site_frame_id, site, phase, step, category` |
//! | `steps` | training step | `rank, device, step, partial, warmup, start/end/peak event and time, peak/start/end/min bytes, forward/backward/optimizer start event and time, outliving_bytes, optimizer_state_bytes` |
//! | `segments` | segment of the final state | `rank, device, address, total_size, allocated_size, stream, segment_type, is_expandable, blocks` |
//! | `frames` | distinct frame | `frame_id, filename, line, name` |
//! | `stacks` | frame of a distinct stack | `stack_id, depth (0 = innermost), frame_id` |
//!
//! **Allocations** are memsnap-analysis's replay of each device ([`memsnap_analysis::Replay`]):
//! every `alloc` of the trace, plus memory from before the recorded window (`origin`
//! `freed_before_alloc`, or `live_in_segments` for blocks only the final segments show; their
//! `alloc_event` is null). `size` is the requested size (the trace's `size`, the sizes
//! memsnap's curves add up); `block_size` the allocator's rounded block, known where the final
//! segments hold the block. Events are trace entry indices per device; an allocation is live
//! after event `e` when `coalesce(alloc_event, 0) <= e < coalesce(free_completed_event, ∞)`
//! (the active lifetime peaks use: `devices.peak_event` is such an `e`). `devices.peak_bytes`,
//! `peak_event` and `peak_time` are null for an import whose source does not know allocated
//! bytes (rocprofv3: driver allocations only), `peak_reserved_bytes` for one that records no
//! reserved memory (`export_memory_timeline`). Times are the
//! entries' own `time_us` (null when the file has none). `alive_at_end`: no
//! `free_completed` in the window. `site` is the innermost user frame
//! ([`memsnap_analysis::sites::top_frame`]) as `file:line:function`; `phase`
//! (`setup`, `forward`, `backward`, `optimizer`), `step` and `category` (`parameter`,
//! `optimizer_state`, `gradient`, `activation`, `temporary`, `unknown`) come from
//! [`memsnap_analysis::phases`] and [`memsnap_analysis::categories`].
//!
//! **Ids.** `frame_id` and `stack_id` are content hashes (see `ids.rs`): the same stack has
//! the same id at every rank and in every export, so frames and stacks are written once per
//! export, whichever rank met them first, and tables of separate exports can be unioned.
//!
//! **Ranks** come from the file names when every name holds a distinct `rank<N>`
//! (`rank3.pickle`, `snapshot_rank_12.pickle`, `rank-7/...`), else from the order of the inputs
//! ([`ranks_from_names`]).
//!
//! **Streaming and atomicity.** Inputs are read one at a time per worker, and each table's
//! rows go to its file in batches of 64Ki rows (row groups of up to 1Mi rows, zstd): memory is
//! one snapshot and its analysis per worker. Everything is written into a hidden folder beside
//! the destination, which is renamed into place when every input succeeded; on failure
//! nothing is left behind.
//!
//! ```no_run
//! use memsnap_converters::parquet::{export_files, ExportOptions};
//! use std::path::PathBuf;
//!
//! let files = vec![PathBuf::from("rank0.pickle"), PathBuf::from("rank1.pickle")];
//! let summary = export_files(&files, "tables".as_ref(), &ExportOptions::default())?;
//! println!("{} allocations", summary.rows("allocations"));
//! # Ok::<(), memsnap_converters::ConvertError>(())
//! ```

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use ::parquet::arrow::ArrowWriter;
use ::parquet::basic::{Compression, ZstdLevel};
use ::parquet::file::properties::WriterProperties;
use arrow_schema::SchemaRef;
use memsnap_analysis::phases::PhaseKind;
use memsnap_analysis::replay::Origin;
use memsnap_analysis::sites::{SiteKey, SiteKeyer};
use memsnap_analysis::{CurveKind, DeviceTimeline, GroupBy, StepOptions};
use memsnap_format::{BlockState, Snapshot, StackId};
use serde::Serialize;

mod ids;
mod tables;

pub use tables::{schema, TABLES};

use ids::{Hashed, SnapshotIds};
use tables::{
    batch, AllocationRows, DeviceRows, FrameRows, Rows, SegmentRows, SnapshotRows, StackRows,
    StepRows, BATCH_ROWS,
};

/// The file at the top of every export: what it holds, and the mark that lets `force`
/// replace it.
pub const MANIFEST: &str = "memsnap_export.json";

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParquetError {
    /// The destination exists and holds something.
    #[error("{}: exists and is not an empty folder; choose another destination, or replace it with --force", path.display())]
    OutputExists { path: PathBuf },
    /// `force` never deletes a folder that an export did not write.
    #[error("{}: is a folder that is not a memsnap export (no {MANIFEST}); not replacing it, even with --force", path.display())]
    NotAnExport { path: PathBuf },
    /// A value that does not fit the table's `Int64` column.
    #[error("{file}: device {device}: {what} is {value}, beyond what an Int64 column holds")]
    OutOfRange {
        file: String,
        device: i64,
        what: String,
        value: u64,
    },
    /// Two different frames (or stacks) with the same 64-bit content id.
    #[error(
        "{file}: two different {kind}s have the same id {id}; this export cannot tell them apart"
    )]
    IdCollision {
        file: String,
        kind: &'static str,
        id: i64,
    },
    /// Two inputs were given the same rank.
    #[error("rank {rank} is given to both {first} and {second}")]
    DuplicateRank {
        rank: i64,
        first: String,
        second: String,
    },
    /// An input could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: Box<crate::ConvertError>,
    },
    /// The analysis of a device failed.
    #[error("{file}: {source}")]
    Analysis {
        file: String,
        #[source]
        source: memsnap_analysis::AnalysisError,
    },
    /// The Parquet writer failed.
    #[error("{}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: ::parquet::errors::ParquetError,
    },
    /// Rows that do not match their table's schema (a bug, reported rather than panicking).
    #[error("table {table}: {source}")]
    Arrow {
        table: &'static str,
        #[source]
        source: arrow_schema::ArrowError,
    },
}

type Result<T, E = crate::ConvertError> = std::result::Result<T, E>;

/// How to export.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ExportOptions {
    /// Replace an existing destination: a file, an empty folder or an earlier export.
    pub force: bool,
    /// Files read and written at once (each holds one snapshot in memory); 0 = the cores.
    pub jobs: usize,
    /// zstd level of the Parquet pages (1 fast .. 22 small).
    pub zstd_level: i32,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            force: false,
            jobs: 0,
            zstd_level: 3,
        }
    }
}

impl ExportOptions {
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    pub fn jobs(mut self, jobs: usize) -> Self {
        self.jobs = jobs;
        self
    }

    /// Out-of-range levels fall back to zstd's default.
    pub fn zstd_level(mut self, level: i32) -> Self {
        self.zstd_level = level;
        self
    }
}

/// One input of an export.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Input {
    pub rank: i64,
    /// The file as the user named it.
    pub file: String,
    /// How it was encoded (`pickle`, `msgpack, zstd`, ...).
    pub encoding: String,
}

/// What an export wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExportSummary {
    pub path: PathBuf,
    pub inputs: Vec<Input>,
    /// Rows per table, in [`TABLES`] order.
    pub tables: Vec<(String, u64)>,
    /// Bytes of all files written.
    pub bytes: u64,
}

impl ExportSummary {
    /// Rows written to a table (0 for an unknown name).
    pub fn rows(&self, table: &str) -> u64 {
        self.tables
            .iter()
            .find(|(t, _)| t == table)
            .map_or(0, |(_, n)| *n)
    }
}

/// The rank of each file: the `N` of `rank<N>` in its name (`rank3`, `rank_3`, `rank-3`,
/// `RANK=3`; the last such in the path) when every file has one and no two agree; else its
/// position among the inputs.
pub fn ranks_from_names(files: &[PathBuf]) -> Vec<i64> {
    let named: Vec<Option<i64>> = files.iter().map(|f| rank_in_name(f)).collect();
    let mut seen = std::collections::HashSet::new();
    if named.iter().all(|r| r.is_some_and(|r| seen.insert(r))) {
        named.into_iter().flatten().collect()
    } else {
        (0..files.len() as i64).collect()
    }
}

fn rank_in_name(path: &Path) -> Option<i64> {
    let text = path.to_string_lossy().to_ascii_lowercase();
    let mut found = None;
    for (i, _) in text.match_indices("rank") {
        let rest = text[i + 4..].trim_start_matches(['_', '-', '=', '.']);
        let digits: &str = &rest[..rest.bytes().take_while(u8::is_ascii_digit).count()];
        if let Ok(n) = digits.parse::<i64>() {
            found = Some(n);
        }
    }
    found
}

/// Opens and exports `files` (ranks from [`ranks_from_names`]) into the folder `out`.
pub fn export_files(
    files: &[PathBuf],
    out: &Path,
    options: &ExportOptions,
) -> Result<ExportSummary> {
    let ranks = ranks_from_names(files);
    let export = Export::create(out, options)?;
    let jobs = match options.jobs {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .clamp(1, files.len().max(1));
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let errors: Mutex<Vec<(usize, crate::ConvertError)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                while !failed.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(path) = files.get(i) else { break };
                    let opened = crate::open_path(path).map_err(|source| ParquetError::Read {
                        path: path.clone(),
                        source: Box::new(source),
                    });
                    let result = opened.map_err(Into::into).and_then(|(snapshot, source)| {
                        let input = Input {
                            rank: ranks[i],
                            file: path.display().to_string(),
                            encoding: source.describe(),
                        };
                        export.add(&input, &snapshot)
                    });
                    if let Err(e) = result {
                        failed.store(true, Ordering::Relaxed);
                        if let Ok(mut errors) = errors.lock() {
                            errors.push((i, e));
                        }
                    }
                }
            });
        }
    });
    let mut errors = errors.into_inner().unwrap_or_else(|e| e.into_inner());
    errors.sort_by_key(|(i, _)| *i);
    if let Some((_, e)) = errors.into_iter().next() {
        return Err(e);
    }
    export.finish()
}

/// An export in progress: [`Export::add`] snapshots (from several threads if you like), then
/// [`Export::finish`] to move the folder into place. Dropped unfinished, it leaves nothing.
pub struct Export {
    out: PathBuf,
    staging: PathBuf,
    props: WriterProperties,
    shared: Mutex<Shared>,
    finished: bool,
}

#[derive(Default)]
struct Shared {
    /// Content id -> check hash of every frame and stack written so far.
    frames: HashMap<i64, u64>,
    stacks: HashMap<i64, u64>,
    inputs: Vec<Input>,
    rows: [u64; TABLES.len()],
}

impl Export {
    /// Checks the destination and creates the staging folder beside it.
    pub fn create(out: &Path, options: &ExportOptions) -> Result<Export> {
        check_destination(out, options.force)?;
        let name = out
            .file_name()
            .map_or_else(|| "export".into(), |n| n.to_string_lossy().into_owned());
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(|source| io(&parent, source))?;
        let staging = parent.join(format!(".{name}.memsnap-staging-{}", std::process::id()));
        if staging.exists() {
            // Left by a killed run of this same process id: ours to clear.
            std::fs::remove_dir_all(&staging).map_err(|source| io(&staging, source))?;
        }
        for table in TABLES {
            let dir = staging.join(table);
            std::fs::create_dir_all(&dir).map_err(|source| io(&dir, source))?;
        }
        let level = ZstdLevel::try_new(options.zstd_level).unwrap_or_default();
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(level))
            .set_created_by(format!("memsnap {}", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Export {
            out: out.to_path_buf(),
            staging,
            props,
            shared: Mutex::new(Shared::default()),
            finished: false,
        })
    }

    /// Writes one snapshot's rows to every table, as `rank-<rank>.parquet`.
    pub fn add(&self, input: &Input, snapshot: &Snapshot) -> Result<()> {
        {
            let mut shared = self.lock();
            if let Some(other) = shared.inputs.iter().find(|i| i.rank == input.rank) {
                return Err(ParquetError::DuplicateRank {
                    rank: input.rank,
                    first: other.file.clone(),
                    second: input.file.clone(),
                }
                .into());
            }
            shared.inputs.push(input.clone());
        }
        let part = format!("rank-{:05}.parquet", input.rank);
        let mut parts = Parts::create(&self.staging, &part, &self.props)?;
        let ids = SnapshotIds::of(snapshot);
        self.write_frames_and_stacks(input, snapshot, &ids, &mut parts)?;
        let devices = DeviceTimeline::devices(snapshot);
        for &device in &devices {
            write_device(input, snapshot, &ids, device, &mut parts)?;
        }
        write_segments(input, snapshot, &mut parts)?;
        let rows = &mut parts.snapshots.rows;
        rows.rank.append_value(input.rank);
        rows.file.append_value(&input.file);
        rows.encoding.append_value(&input.encoding);
        rows.devices
            .append_value(snapshot.devices().into_iter().map(Some));
        rows.entries.append_value(count(snapshot.entry_count()));
        rows.segments.append_value(count(snapshot.segments.len()));
        rows.frames.append_value(count(snapshot.frames.len()));
        rows.stacks.append_value(count(snapshot.stacks.len()));
        let written = parts.close()?;
        let mut shared = self.lock();
        for (total, n) in shared.rows.iter_mut().zip(written) {
            *total += n;
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        // A worker that panicked cannot leave the tables half-updated: they are plain counters.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Frames and stacks this export has not written yet.
    fn write_frames_and_stacks(
        &self,
        input: &Input,
        snapshot: &Snapshot,
        ids: &SnapshotIds,
        parts: &mut Parts,
    ) -> Result<()> {
        let collision = |kind, id| ParquetError::IdCollision {
            file: input.file.clone(),
            kind,
            id,
        };
        let mut new_frames = Vec::new();
        let mut new_stacks = Vec::new();
        {
            let mut shared = self.lock();
            for (i, h) in ids.frames.iter().enumerate() {
                if claim(&mut shared.frames, *h).map_err(|id| collision("frame", id))? {
                    new_frames.push(i);
                }
            }
            for (i, h) in ids.stacks.iter().enumerate() {
                if claim(&mut shared.stacks, *h).map_err(|id| collision("stack", id))? {
                    new_stacks.push(i);
                }
            }
        }
        let frames: Vec<_> = snapshot.frames.iter().collect();
        for i in new_frames {
            let (f, h) = (frames[i], ids.frames[i]);
            let rows = &mut parts.frames.rows;
            rows.frame_id.append_value(h.id);
            rows.filename.append_value(&f.filename);
            // Lines beyond Int64 (`torch.compile` writes 2^64 - 1 for "no line") are null.
            rows.line.append_option(f.line.as_i64());
            rows.name.append_value(&f.name);
            parts.frames.flush_if_full()?;
        }
        for i in new_stacks {
            let stack = snapshot.stacks.get(StackId::from_index(i));
            for (depth, f) in stack.iter().enumerate() {
                let Some(frame) = ids.frames.get(f.index()) else {
                    continue;
                };
                let rows = &mut parts.stacks.rows;
                rows.stack_id.append_value(ids.stacks[i].id);
                rows.depth.append_value(count(depth));
                rows.frame_id.append_value(frame.id);
                parts.stacks.flush_if_full()?;
            }
        }
        Ok(())
    }

    /// Moves the finished export into place (replacing what `force` allows) and writes its
    /// manifest.
    pub fn finish(mut self) -> Result<ExportSummary> {
        let shared = std::mem::take(&mut *self.lock());
        let mut inputs = shared.inputs;
        inputs.sort_by_key(|i| i.rank);
        let summary = ExportSummary {
            path: self.out.clone(),
            inputs,
            tables: TABLES
                .iter()
                .zip(shared.rows)
                .map(|(t, n)| (t.to_string(), n))
                .collect(),
            bytes: 0,
        };
        let manifest = serde_json::json!({
            "memsnap_export": 1,
            "producer": format!("memsnap {}", env!("CARGO_PKG_VERSION")),
            "layout": "<table>/rank-<rank>.parquet",
            "tables": summary.tables.iter().map(|(t, n)| (t.clone(), serde_json::Value::from(*n))).collect::<serde_json::Map<_, _>>(),
            "inputs": summary.inputs,
        });
        let path = self.staging.join(MANIFEST);
        let text = serde_json::to_string_pretty(&manifest).unwrap_or_default();
        std::fs::write(&path, text).map_err(|source| io(&path, source))?;
        let bytes = dir_bytes(&self.staging);
        replace_with(&self.staging, &self.out)?;
        self.finished = true;
        Ok(ExportSummary { bytes, ..summary })
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        if !self.finished {
            // Best effort: the staging folder is ours alone.
            let _ = std::fs::remove_dir_all(&self.staging);
        }
    }
}

/// Records a content id: `Ok(true)` when new, `Ok(false)` when written before, `Err(id)` when
/// another frame or stack already has it.
fn claim(seen: &mut HashMap<i64, u64>, h: Hashed) -> std::result::Result<bool, i64> {
    match seen.entry(h.id) {
        std::collections::hash_map::Entry::Occupied(e) if *e.get() == h.check => Ok(false),
        std::collections::hash_map::Entry::Occupied(_) => Err(h.id),
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(h.check);
            Ok(true)
        }
    }
}

fn io(path: &Path, source: std::io::Error) -> crate::ConvertError {
    crate::ConvertError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Whether `out` may be written: absent, an empty folder, or (with `force`) a file or an
/// earlier export.
fn check_destination(out: &Path, force: bool) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(out) else {
        return Ok(());
    };
    if meta.is_dir() {
        let mut entries = std::fs::read_dir(out).map_err(|source| io(out, source))?;
        if entries.next().is_none() {
            return Ok(());
        }
        if !force {
            return Err(ParquetError::OutputExists {
                path: out.to_path_buf(),
            }
            .into());
        }
        if !out.join(MANIFEST).is_file() {
            return Err(ParquetError::NotAnExport {
                path: out.to_path_buf(),
            }
            .into());
        }
        return Ok(());
    }
    if force {
        Ok(())
    } else {
        Err(ParquetError::OutputExists {
            path: out.to_path_buf(),
        }
        .into())
    }
}

/// Renames `staging` to `out`, first moving aside (then deleting) what `out` holds, which
/// [`check_destination`] allowed.
fn replace_with(staging: &Path, out: &Path) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(out) else {
        return std::fs::rename(staging, out).map_err(|source| io(out, source));
    };
    // Beside the staging folder, named like it: nobody else's.
    let mut aside = staging.as_os_str().to_owned();
    aside.push("-replaced");
    let aside = PathBuf::from(aside);
    std::fs::rename(out, &aside).map_err(|source| io(out, source))?;
    if let Err(source) = std::fs::rename(staging, out) {
        let _ = std::fs::rename(&aside, out);
        return Err(io(out, source));
    }
    let removed = if meta.is_dir() {
        std::fs::remove_dir_all(&aside)
    } else {
        std::fs::remove_file(&aside)
    };
    removed.map_err(|source| io(&aside, source))
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// One table's file for one input, and its pending rows.
struct Part<R: Rows> {
    table: &'static str,
    path: PathBuf,
    schema: SchemaRef,
    writer: ArrowWriter<File>,
    rows: R,
    written: u64,
}

impl<R: Rows> Part<R> {
    fn create(
        dir: &Path,
        table: &'static str,
        part: &str,
        props: &WriterProperties,
        rows: R,
    ) -> Result<Self> {
        let path = dir.join(table).join(part);
        let schema = schema(table).ok_or_else(|| ParquetError::Arrow {
            table,
            source: arrow_schema::ArrowError::SchemaError("no such table".into()),
        })?;
        let file = File::create(&path).map_err(|source| io(&path, source))?;
        let writer =
            ArrowWriter::try_new(file, schema.clone(), Some(props.clone())).map_err(|source| {
                ParquetError::Write {
                    path: path.clone(),
                    source,
                }
            })?;
        Ok(Part {
            table,
            path,
            schema,
            writer,
            rows,
            written: 0,
        })
    }

    fn flush_if_full(&mut self) -> Result<()> {
        if self.rows.len() >= BATCH_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let n = self.rows.len();
        if n == 0 {
            return Ok(());
        }
        let batch = batch(&self.schema, &mut self.rows).map_err(|source| ParquetError::Arrow {
            table: self.table,
            source,
        })?;
        self.writer
            .write(&batch)
            .map_err(|source| ParquetError::Write {
                path: self.path.clone(),
                source,
            })?;
        self.written += n as u64;
        Ok(())
    }

    fn close(mut self) -> Result<u64> {
        self.flush()?;
        self.writer.close().map_err(|source| ParquetError::Write {
            path: self.path.clone(),
            source,
        })?;
        Ok(self.written)
    }
}

/// The files of one input, one per table.
struct Parts {
    snapshots: Part<SnapshotRows>,
    devices: Part<DeviceRows>,
    allocations: Part<AllocationRows>,
    steps: Part<StepRows>,
    segments: Part<SegmentRows>,
    frames: Part<FrameRows>,
    stacks: Part<StackRows>,
}

impl Parts {
    fn create(dir: &Path, part: &str, props: &WriterProperties) -> Result<Parts> {
        Ok(Parts {
            snapshots: Part::create(dir, "snapshots", part, props, SnapshotRows::new())?,
            devices: Part::create(dir, "devices", part, props, DeviceRows::new())?,
            allocations: Part::create(dir, "allocations", part, props, AllocationRows::new())?,
            steps: Part::create(dir, "steps", part, props, StepRows::new())?,
            segments: Part::create(dir, "segments", part, props, SegmentRows::new())?,
            frames: Part::create(dir, "frames", part, props, FrameRows::new())?,
            stacks: Part::create(dir, "stacks", part, props, StackRows::new())?,
        })
    }

    /// Closes every file; rows written per table, in [`TABLES`] order.
    fn close(self) -> Result<[u64; TABLES.len()]> {
        Ok([
            self.snapshots.close()?,
            self.devices.close()?,
            self.allocations.close()?,
            self.steps.close()?,
            self.segments.close()?,
            self.frames.close()?,
            self.stacks.close()?,
        ])
    }
}

fn origin_name(origin: Origin) -> &'static str {
    match origin {
        Origin::Traced => "traced",
        Origin::FreedBeforeAlloc => "freed_before_alloc",
        Origin::LiveInSegments => "live_in_segments",
        Origin::Unattributed => "unattributed",
    }
}

/// The allocations, the steps and the device row of one device.
fn write_device(
    input: &Input,
    snapshot: &Snapshot,
    ids: &SnapshotIds,
    device: i64,
    parts: &mut Parts,
) -> Result<()> {
    let timeline =
        DeviceTimeline::build(snapshot, device).map_err(|source| ParquetError::Analysis {
            file: input.file.clone(),
            source,
        })?;
    let analysis = timeline.steps(&StepOptions::default());
    let replay = timeline.replay();
    let trace: &[memsnap_format::TraceEntry] = usize::try_from(device)
        .ok()
        .and_then(|d| snapshot.traces().get(d))
        .map_or(&[], |t| t.as_slice());
    let time_of = |event: Option<u32>| {
        event
            .and_then(|e| trace.get(e as usize))
            .and_then(|t| t.time_us())
    };
    let int = |value: u64, what: &dyn Fn() -> String| {
        i64::try_from(value).map_err(|_| ParquetError::OutOfRange {
            file: input.file.clone(),
            device,
            what: what(),
            value,
        })
    };
    // Blocks the final segments hold, by address: the rounded size of what is live at the end.
    let blocks: HashMap<u64, u64> = snapshot
        .segments
        .iter()
        .filter(|s| s.device == device)
        .flat_map(|s| s.block_addresses())
        .filter(|(_, b)| b.state.is_active())
        .map(|(addr, b)| (addr, b.size))
        .collect();
    let mut keyer = SiteKeyer::new(snapshot, GroupBy::Frame);
    let mut sites: HashMap<SiteKey, (Option<i64>, String)> = HashMap::new();
    for (i, a) in replay.allocations.iter().enumerate() {
        let what = || match a.alloc_event() {
            Some(e) => format!("the allocation at event {e}"),
            None => format!("the allocation at {:#x} from before the window", a.addr),
        };
        let key = keyer.key_of(a);
        let (site_frame, site) = sites.entry(key).or_insert_with_key(|key| {
            let frame = match key {
                SiteKey::Frame(f) => ids.frames.get(f.index()).map(|h| h.id),
                _ => None,
            };
            (frame, key.label(snapshot))
        });
        let phase = a.alloc_event().and_then(|e| analysis.phase_at(e));
        let rows = &mut parts.allocations.rows;
        rows.rank.append_value(input.rank);
        rows.device.append_value(device);
        rows.addr
            .append_value(int(a.addr, &|| format!("the address of {}", what()))?);
        rows.size
            .append_value(int(a.size, &|| format!("the size of {}", what()))?);
        let alive = a.free_completed().is_none();
        let block = if alive { blocks.get(&a.addr) } else { None };
        rows.block_size
            .append_option(block.and_then(|&b| i64::try_from(b).ok()));
        rows.stream.append_value(a.stream);
        rows.origin.append_value(origin_name(a.origin));
        rows.alloc_event
            .append_option(a.alloc_event().map(i64::from));
        rows.alloc_time.append_option(time_of(a.alloc_event()));
        rows.free_requested_event
            .append_option(a.free_requested().map(i64::from));
        rows.free_requested_time
            .append_option(time_of(a.free_requested()));
        rows.free_completed_event
            .append_option(a.free_completed().map(i64::from));
        rows.free_completed_time
            .append_option(time_of(a.free_completed()));
        rows.alive_at_end.append_value(alive);
        rows.stack_id.append_option(
            a.stack
                .and_then(|s| ids.stacks.get(s.index()))
                .map(|h| h.id),
        );
        rows.site_frame_id.append_option(*site_frame);
        rows.site.append_value(site.as_str());
        rows.phase.append_option(phase.map(|(_, p)| p.kind.name()));
        rows.step.append_option(
            phase
                .and_then(|(s, _)| s)
                .and_then(|s| analysis.steps.get(s))
                .map(|s| count(s.index)),
        );
        rows.category
            .append_value(analysis.categories.get(i).map_or("unknown", |c| c.name()));
        parts.allocations.flush_if_full()?;
    }

    let big = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    for s in &analysis.steps {
        let phase = |kind: PhaseKind| s.phases.iter().find(|p| p.kind == kind);
        let rows = &mut parts.steps.rows;
        rows.rank.append_value(input.rank);
        rows.device.append_value(device);
        rows.step.append_value(count(s.index));
        rows.partial.append_value(s.partial);
        rows.warmup.append_value(s.warmup);
        rows.start_event.append_value(i64::from(s.start_event));
        rows.end_event.append_value(i64::from(s.end_event));
        rows.start_time.append_option(s.start_time_us);
        rows.end_time.append_option(s.end_time_us);
        rows.peak_event.append_value(i64::from(s.peak_event));
        rows.peak_time.append_option(s.peak_time_us);
        rows.peak_bytes.append_value(big(s.peak_bytes));
        rows.start_bytes.append_value(big(s.start_bytes));
        rows.end_bytes.append_value(big(s.end_bytes));
        rows.min_bytes.append_value(big(s.min_bytes));
        for (kind, event, time) in [
            (
                PhaseKind::Forward,
                &mut rows.forward_start_event,
                &mut rows.forward_start_time,
            ),
            (
                PhaseKind::Backward,
                &mut rows.backward_start_event,
                &mut rows.backward_start_time,
            ),
            (
                PhaseKind::Optimizer,
                &mut rows.optimizer_start_event,
                &mut rows.optimizer_start_time,
            ),
        ] {
            let p = phase(kind);
            event.append_option(p.map(|p| i64::from(p.start_event)));
            time.append_option(p.and_then(|p| p.start_time_us));
        }
        rows.outliving_bytes.append_value(big(s.outliving_bytes));
        rows.optimizer_state_bytes
            .append_value(big(s.optimizer_state_bytes));
        parts.steps.flush_if_full()?;
    }

    let peak = timeline.peak(CurveKind::Active);
    let rows = &mut parts.devices.rows;
    rows.rank.append_value(input.rank);
    rows.device.append_value(device);
    rows.entries.append_value(i64::from(replay.trace_len));
    rows.allocations
        .append_value(count(replay.allocations.len()));
    // Null where the source does not know the quantity (see `DeviceTimeline::known_curves`).
    let allocated_known = replay.allocated_known;
    rows.peak_bytes
        .append_option(allocated_known.then(|| big(peak.bytes)));
    rows.peak_event
        .append_option(allocated_known.then(|| i64::from(peak.event)));
    rows.peak_time
        .append_option(peak.time_us.filter(|_| allocated_known));
    rows.peak_reserved_bytes.append_option(
        replay
            .reserved_known()
            .then(|| big(timeline.peak(CurveKind::Reserved).bytes)),
    );
    rows.before_window_bytes
        .append_value(big(replay.before_window_bytes));
    rows.truncated.append_value(replay.truncated);
    rows.ooms.append_value(count(replay.oom_events.len()));
    rows.step_method.append_value(analysis.method.label());
    rows.steps.append_value(count(analysis.steps.len()));
    Ok(())
}

/// The segments of the final state (for files without traces, all there is).
fn write_segments(input: &Input, snapshot: &Snapshot, parts: &mut Parts) -> Result<()> {
    for seg in &snapshot.segments {
        let int = |value: u64, what: &str| {
            i64::try_from(value).map_err(|_| ParquetError::OutOfRange {
                file: input.file.clone(),
                device: seg.device,
                what: format!("the {what} of the segment at {:#x}", seg.address),
                value,
            })
        };
        let allocated = seg
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .fold(0u64, |sum, b| sum.saturating_add(b.size));
        let rows = &mut parts.segments.rows;
        rows.rank.append_value(input.rank);
        rows.device.append_value(seg.device);
        rows.address.append_value(int(seg.address, "address")?);
        rows.total_size
            .append_value(int(seg.total_size, "total_size")?);
        rows.allocated_size
            .append_value(int(allocated, "allocated bytes")?);
        rows.stream.append_value(seg.stream);
        rows.segment_type
            .append_option(seg.segment_type.map(|t| t.name(&snapshot.strings)));
        rows.is_expandable.append_option(seg.is_expandable);
        rows.blocks.append_value(count(seg.blocks.len()));
        parts.segments.flush_if_full()?;
    }
    Ok(())
}

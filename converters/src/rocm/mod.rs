//! Imports AMD ROCm memory-allocation traces: rocprofv3 CSV and JSON, and rocpd SQLite.
//!
//! `rocprofv3 --memory-allocation-trace` records the HSA allocations of a process
//! (`hsa_memory_allocate`, `hsa_amd_memory_pool_allocate`, `hsa_amd_vmem_handle_create`) and
//! their frees. `hipMalloc` lands there, so for PyTorch these are the caching allocator's
//! **segments** (plus the runtime's own and host-pool allocations). Three outputs hold them:
//!
//! | output | file | reader |
//! |---|---|---|
//! | CSV (`--output-format csv`) | `<pid>_memory_allocation_trace.csv` (+ `<pid>_agent_info.csv`) | [`csv`](self#csv) |
//! | JSON (`--output-format json`) | `<pid>_results.json` | [`json`](self#json) |
//! | rocpd (the default since ROCm 7.0) | `<pid>_results.db`, SQLite | [`rocpd`](self#rocpd) |
//!
//! # Mapping to the snapshot model
//! A driver-level allocation is both a segment and one block that fills it: each allocation
//! becomes `segment_alloc` + `alloc` (same address, size and time), each free
//! `free_requested` + `free_completed` + `segment_free`, so allocated == reserved and every
//! view works. Frees carry no size and no agent in any of the formats: both come from the
//! allocation at that address. Frees of address 0 (the runtime frees null on
//! `hipStreamDestroy`) are ignored; frees of an address never allocated in the trace (memory
//! allocated before tracing started) are skipped with a [`Warning::UnmatchedFrees`]. Allocations
//! on CPU agents (host pools) are skipped, and so are their frees. Allocations still live at
//! the end become the snapshot's segments. There are no stacks.
//!
//! The device is the GPU's ordinal (the n-th GPU of the process, what `HIP_VISIBLE_DEVICES`
//! numbering starts from). A process is a **rank**: a rocpd database, or a JSON file, may
//! hold several processes (and nodes); each becomes its own snapshot, labelled
//! `hostname/pid` ([`import_paths`]). Opening a ROCm file as one snapshot (what every memsnap
//! command does) puts the ranks side by side ([`Import::into_single`]): device `d` of the result is the `d`-th (rank, GPU) pair, named
//! in the snapshot's producer line.
//!
//! **Times** are ROCm's: nanoseconds of `CLOCK_BOOTTIME` (time since the machine booted), not
//! the Unix epoch PyTorch snapshots use. They are kept boot-relative, in µs (allocations at the
//! end of the call, frees at its start), and the snapshot's producer line says so.
//!
//! Problems that do not stop the import come back as [`Warning`]s, never printed here.
//!
//! ```no_run
//! use std::path::Path;
//! use memsnap_converters::rocm;
//!
//! // One or more files; several rocpd databases (one per process) are read together.
//! let import = rocm::import_paths(&[Path::new("node1/1234_results.db")])?;
//! for rank in &import.ranks {
//!     println!("{}: {} trace entries", rank.label, rank.snapshot.entry_count());
//! }
//! for warning in &import.warnings {
//!     eprintln!("warning: {warning}");
//! }
//! # Ok::<(), memsnap_converters::ConvertError>(())
//! ```
//!
//! # CSV
//! Every header variant rocprofv3 has written is read: columns are found by name (`Address`
//! or the 2024 `Starting_Address`; an optional leading `Guid` column from `rocpd convert`),
//! then checked by shape: when the `Allocation_Size` and `Address` columns hold each other's
//! kind of value (the 2025-07 header that moved `Allocation_Size` last while the rows kept
//! it 4th), they are swapped. Values may be quoted or bare; addresses padded or not, hex
//! (any case) or decimal. `Agent_Id` is `Agent N`, `GPU N`, `CPU N` or a bare node id; the
//! `<pid>_agent_info.csv` beside the trace tells CPU from GPU agents and gives each GPU's
//! ordinal. Without it, `Agent N` is taken as device N ([`Warning::NoAgentInfo`]).
//! A malformed row fails with its line number.
//!
//! # JSON
//! `{"rocprofiler-sdk-tool": [...]}`, one element per process: `kind` and `operation` are
//! resolved by name through `strings.buffer_records`, agents through `agents[]` (GPUs by
//! `logical_node_type_id`), the rank label from `metadata.node`/`metadata.pid`.
//!
//! # rocpd
//! A SQLite database, opened read-only. The memory table exists in three layouts, told apart
//! by its columns (`PRAGMA table_info`): A (what rocprofv3 writes today: `nid`, `pid`,
//! `agent_id`, `start`, `end` on the row), B (schema 4.1: a `track_id` into `rocpd_track`)
//! and C (a 2025 draft: `track_id` plus `start_id`/`end_id` into `rocpd_timestamp`). Tables
//! carry a per-run suffix (`rocpd_memory_allocate_<uuid>`) behind unsuffixed views; both are
//! read, every run of a merged database included. `SCRATCH` rows (scratch memory of kernels)
//! are skipped, `VIRTUAL` (vmem handles) kept. A database of the older, unrelated
//! rocmProfileData ("RPD", tables `rocpd_api`/`rocpd_op`) is refused as such.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use memsnap_format::Snapshot;

pub mod csv;
pub mod json;
mod mapping;
pub mod rocpd;

pub use mapping::Warning;

/// The ROCm outputs this module reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RocmFormat {
    /// rocprofv3 `<pid>_memory_allocation_trace.csv` (or a `rocpd convert` CSV).
    Csv,
    /// rocprofv3 `<pid>_results.json`.
    Json,
    /// A rocpd SQLite database (`<pid>_results.db`).
    Rocpd,
}

impl RocmFormat {
    /// `rocprofv3 CSV`, `rocprofv3 JSON`, `rocpd SQLite`.
    pub fn name(self) -> &'static str {
        match self {
            RocmFormat::Csv => "rocprofv3 CSV",
            RocmFormat::Json => "rocprofv3 JSON",
            RocmFormat::Rocpd => "rocpd SQLite",
        }
    }
}

impl fmt::Display for RocmFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a ROCm input cannot be imported. Every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RocmError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A CSV row (or the header) is malformed. `line` counts from 1, the header being line 1.
    #[error("{}: line {line}: {what}", path.display())]
    Csv {
        path: PathBuf,
        line: u64,
        what: String,
    },
    /// The JSON is malformed or lacks a field.
    #[error("{}: {what}", path.display())]
    Json { path: PathBuf, what: String },
    /// The output has no memory-allocation records at all.
    #[error("{}: no memory allocation records ({hint})", path.display())]
    NoRecords { path: PathBuf, hint: &'static str },
    /// The SQLite library failed.
    #[error("{}: SQLite: {source}", path.display())]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    /// The database lacks a table the import needs.
    #[error("{}: no {table} table{hint}", path.display())]
    MissingTable {
        path: PathBuf,
        table: String,
        hint: &'static str,
    },
    /// An old rocmProfileData ("RPD") database: same `rocpd_` prefix, unrelated schema.
    #[error(
        "{}: an rocmProfileData (RPD) database (tables rocpd_api/rocpd_op): its namesake rocpd is \
         supported, RPD is not (it holds no memory allocation table)",
        path.display()
    )]
    OldRpd { path: PathBuf },
    /// The memory table's columns match none of the known layouts.
    #[error("{}: {table} has none of the known layouts (columns: {columns})", path.display())]
    UnknownLayout {
        path: PathBuf,
        table: String,
        columns: String,
    },
    /// A value is not what the format allows (`place` says where: a row id, a record index).
    #[error("{}: {place}: {what}", path.display())]
    BadValue {
        path: PathBuf,
        place: String,
        what: String,
    },
    /// The input is none of the ROCm formats.
    #[error("{}: not a ROCm memory allocation trace (rocprofv3 CSV or JSON, rocpd SQLite)", path.display())]
    NotRocm { path: PathBuf },
    /// A rocpd database given as bytes (stdin, drag and drop): SQLite reads files.
    #[error("{}: a rocpd SQLite database must be opened from a file, not from a stream", path.display())]
    DatabaseFromBytes { path: PathBuf },
}

/// One process of the import, as its own snapshot.
#[derive(Clone, Debug)]
pub struct Rank {
    /// `hostname/pid` (or what of it the format records: `pid 1234`, the file name).
    pub label: String,
    /// The GPU ordinals this rank used, ascending (the snapshot's devices).
    pub devices: Vec<i64>,
    pub snapshot: Snapshot,
}

/// What [`import_paths`] read: one snapshot per process, and what was skipped.
#[derive(Clone, Debug)]
pub struct Import {
    pub format: RocmFormat,
    /// Ranks ordered by label (hostname, then pid).
    pub ranks: Vec<Rank>,
    pub warnings: Vec<Warning>,
}

impl Import {
    /// One snapshot of every rank side by side: with one rank, its snapshot; with several,
    /// device `d` is the `d`-th (rank, GPU) pair, named in the producer line.
    /// The warnings are summed up in the producer line (the readers have nowhere else to
    /// show them).
    pub fn into_single(self) -> Snapshot {
        let mut snapshot = mapping::merge_ranks(self.format, self.ranks);
        if let (Some(info), Some(first)) = (&mut snapshot.recorder_info, self.warnings.first()) {
            info.producer += &format!(
                "; {} import warning(s), the first: {first}",
                self.warnings.len()
            );
        }
        snapshot
    }
}

/// Tells a ROCm input from its first bytes (at least the first 4 KiB of the file, or all
/// of it when shorter); `None` when it is none of them.
pub fn sniff(head: &[u8]) -> Option<RocmFormat> {
    let head = &head[..head.len().min(SNIFF_BYTES)];
    if head.starts_with(b"SQLite format 3\0") {
        return Some(RocmFormat::Rocpd);
    }
    let text = skip_bom_and_space(head);
    if csv::is_rocprof_header(text) {
        return Some(RocmFormat::Csv);
    }
    if json::looks_like_rocprof_json(text) {
        return Some(RocmFormat::Json);
    }
    None
}

/// Whether a SQLite file is a rocpd database (rather than another SQLite file).
pub fn is_rocpd_database(path: &Path) -> bool {
    rocpd::is_rocpd(path)
}

/// Choices of an import; [`Options::default`] is what [`import_paths`] and the readers use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Options {
    /// Keep rocpd's `SCRATCH` rows (the scratch memory the runtime gives kernels, recorded
    /// with `--scratch-memory-trace`) as allocations; skipped by default, as they are no
    /// allocations of the program.
    pub keep_scratch: bool,
    /// Added to every time, in µs: ROCm's clock counts from the machine's boot, so the boot
    /// time as epoch µs (`date +%s%6N` minus the uptime) turns times into dates, and per-node
    /// offsets align nodes.
    pub time_offset_us: i64,
}

fn shift_times(snapshot: &mut Snapshot, offset_us: i64) {
    for trace in snapshot.device_traces.iter_mut().flatten() {
        for entry in trace {
            if let Some(t) = entry.time_us() {
                entry.set_time_us(Some(t.saturating_add(offset_us)));
            }
        }
    }
}

/// Imports ROCm files: one rocprofv3 CSV or JSON file, or one or more rocpd databases (one
/// per process, as rocprofv3 writes them; RocPD reads them together the same way). Each
/// process becomes a [`Rank`]. The format is told by content.
pub fn import_paths(paths: &[&Path]) -> Result<Import, RocmError> {
    import_paths_with(paths, Options::default())
}

/// [`import_paths`] with [`Options`].
pub fn import_paths_with(paths: &[&Path], options: Options) -> Result<Import, RocmError> {
    let mut ranks: BTreeMap<String, Rank> = BTreeMap::new();
    let mut warnings = Vec::new();
    let mut format = None;
    for path in paths {
        let this = sniff_path(path)?.ok_or_else(|| RocmError::NotRocm {
            path: path.to_path_buf(),
        })?;
        let mut import = match this {
            RocmFormat::Csv => csv::import_path(path)?,
            RocmFormat::Json => json::import_path(path)?,
            RocmFormat::Rocpd => rocpd::import_path_with(path, options)?,
        };
        format.get_or_insert(this);
        warnings.append(&mut import.warnings);
        for mut rank in import.ranks {
            // The same label from two files (a process recorded twice) stays apart.
            let mut label = rank.label.clone();
            let mut n = 2;
            while ranks.contains_key(&label) {
                label = format!("{} ({n})", rank.label);
                n += 1;
            }
            if options.time_offset_us != 0 {
                shift_times(&mut rank.snapshot, options.time_offset_us);
            }
            ranks.insert(label.clone(), Rank { label, ..rank });
        }
    }
    let mut ranks: Vec<Rank> = ranks.into_values().collect();
    ranks.sort_by_key(|r| mapping::natural_key(&r.label));
    Ok(Import {
        format: format.unwrap_or(RocmFormat::Rocpd),
        ranks,
        warnings,
    })
}

/// Imports one ROCm file already in memory (CSV or JSON; a database must come as a file:
/// [`RocmError::DatabaseFromBytes`]). `path` names the input in errors.
pub fn import_bytes(bytes: &[u8], path: &Path) -> Result<Import, RocmError> {
    match sniff(bytes) {
        Some(RocmFormat::Csv) => csv::import_bytes(bytes, path, None),
        Some(RocmFormat::Json) => json::import_bytes(bytes, path),
        Some(RocmFormat::Rocpd) => Err(RocmError::DatabaseFromBytes {
            path: path.to_path_buf(),
        }),
        None => Err(RocmError::NotRocm {
            path: path.to_path_buf(),
        }),
    }
}

/// [`sniff`] on the start of a file.
pub fn sniff_path(path: &Path) -> Result<Option<RocmFormat>, RocmError> {
    use std::io::Read;
    let io = |source| RocmError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    std::fs::File::open(path)
        .map_err(io)?
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(io)?;
    Ok(sniff(&head))
}

/// How much of a file [`sniff_path`] reads.
pub const SNIFF_BYTES: usize = 4096;

fn skip_bom_and_space(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    &bytes[start..]
}

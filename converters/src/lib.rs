//! To and from other tools' formats.
//!
//! memsnap's own model is PyTorch's memory snapshot ([`memsnap_format::Snapshot`]). Everything
//! that turns a snapshot into another tool's format, or another tool's recording into a
//! snapshot, lives here, so the CLI, the viewer and the Python package share one implementation.
//!
//! # Concepts
//! - **Opening** is one way in: [`OpenOptions::open`] tells the input apart by its content
//!   (never by its name) and falls back to memsnap's own readers (pickle, msgpack, JSON;
//!   gzip/zstd), so the command line, the viewer and every library caller open every
//!   supported input the same way. Its options carry what differs between callers: a
//!   progress callback, a preview of the entries read so far, reading only the segments, and
//!   validation. It returns an [`Import`]: the snapshot, its [`Source`], and for another
//!   tool's format what the import found (rounded sizes, memory from before the window, ...).
//!   A failure says what kind it is through [`ConvertError::failure`].
//! - **Imports** read another tool's recording into a [`Snapshot`]:
//!   [`torch`] imports torch.profiler traces (`[memory]` events), `export_memory_timeline`
//!   outputs and memsnap's own Chrome export.
//!   [`rocm`] imports AMD ROCm allocation traces (rocprofv3 CSV/JSON, rocpd SQLite).
//! - **Exports** write a snapshot, or a view of it, in another tool's format: [`memviz`],
//!   PyTorch's `_memory_viz.py` text reports, byte for byte; [`chrome`], a Chrome Trace Event
//!   JSON for ui.perfetto.dev (counters, allocation lifetimes, steps), optionally merged into
//!   a torch.profiler trace; [`parquet`], tables of many ranks' allocations, steps,
//!   segments, frames and stacks for DuckDB, Spark, Trino or Polars.
//! - **Profiles** are one device's live set at one instant ([`profile`]: the peak, the end, a
//!   trace entry or a time), drawn as a [`flamegraph`] SVG of live bytes by stack or site, or
//!   written as a gzipped [`pprof`] heap profile (`go tool pprof`, speedscope).
//!
//! Errors name the file and what is missing; bad input never panics.

pub mod chrome;
pub mod chrome_layout;
pub mod error;
pub mod flamegraph;
pub mod memviz;
pub mod open;
pub mod parquet;
pub mod pprof;
pub mod profile;
pub mod rocm;
pub mod sniff;
pub mod torch;

pub use error::{ConvertError, Failure, Result};
pub use memsnap_format::Snapshot;
pub use open::{open_path, Import, OpenOptions, Opened, Source};

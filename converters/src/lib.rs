//! To and from other tools' formats.
//!
//! memsnap's own model is PyTorch's memory snapshot ([`memsnap_format::Snapshot`]). Everything
//! that turns a snapshot into another tool's format, or another tool's recording into a
//! snapshot, lives here, so the CLI, the viewer and the Python package share one implementation.
//!
//! # Concepts
//! - **Imports** read another tool's recording into a [`Snapshot`]: [`open`] tells the input
//!   apart by its content (never by its name) and falls back to memsnap's own readers
//!   (pickle, msgpack, JSON; gzip/zstd), so every memsnap command opens every supported input.
//! - **Exports** write a snapshot, or a view of it, in another tool's format: [`memviz`],
//!   PyTorch's `_memory_viz.py` text reports, byte for byte; [`parquet`], tables of many
//!   ranks' allocations, steps, segments, frames and stacks for DuckDB, Spark, Trino or Polars.
//!
//! Errors name the file and what is missing; bad input never panics.

pub mod error;
pub mod memviz;
pub mod open;
pub mod parquet;

pub use error::{ConvertError, Result};
pub use memsnap_format::Snapshot;
pub use open::{open_bytes_with, open_path, open_path_with, Opened, Source};

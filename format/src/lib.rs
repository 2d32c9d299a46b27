//! # memsnap-format
//!
//! The data model of a PyTorch CUDA memory snapshot and its codecs.
//!
//! ## Concepts
//!
//! A **snapshot** ([`Snapshot`]) is what `torch.cuda.memory._snapshot()` returns: the
//! allocator's **segments** (one per `cudaMalloc`, each tiled by **blocks** that are allocated,
//! pending free or cached), one **trace** per device (the newest allocator events, oldest
//! first), the allocator settings and the `record_function` annotations. Every era from
//! PyTorch 2.0 to 2.15 is read, plus the bare segment list of `torch.cuda.memory_snapshot()`;
//! keys we do not know are kept in `extra` and written back, so a round trip loses nothing.
//!
//! **Frames and stacks are interned** ([`intern`]): a snapshot holds one [`FrameTable`] and
//! one [`StackTable`]; entries, blocks and segments hold a [`StackId`]. A real 1M-entry file
//! has a few thousand distinct stacks, so this keeps memory proportional to the distinct data.
//!
//! ## Codecs
//!
//! * [`pickle`]: our own reader and writer. The reader accepts protocols 2 to 5, shared
//!   (memoized) containers, and executes nothing: opcodes that would look up classes or call
//!   objects are refused. The writer emits protocol 4 with memoized strings and stacks.
//! * [`msgpack`]: memsnap's compact native format, with the frame and stack tables stored once.
//! * [`json`]: the same schema as the pickle, which PyTorch's browser viewer also loads.
//!
//! The schema (which keys each struct writes, in which order, per era) is written once, in the
//! private `schema` module; the writers and [`compare`] are built on it.
//!
//! [`io`] detects the format from the content, decompresses gzip and zstd, and writes files
//! atomically.
//!
//! [`validate()`] checks the invariants PyTorch's exporter guarantees.
//!
//! ## Numbers
//!
//! Every int is kept exactly, whatever its size or sign ([`int`]): typed fields hold the 64
//! bits analysis uses, and an [`ExactInts`] override beside them keeps a number those bits do
//! not say (a negative C++-path address, a stream ≥ 2^63, a 100-bit size); frame lines are
//! [`PyInt`]s. Each codec writes the exact value back (see the README's "Numbers").

pub mod compare;
pub mod era;
pub mod error;
pub mod int;
pub mod intern;
pub mod io;
pub mod json;
pub mod live;
mod live_segments;
pub mod model;
pub mod msgpack;
pub mod pickle;
pub mod progress;
mod schema;
pub mod source;
pub mod validate;
pub mod value;

pub use error::{FormatError, Result};
pub use int::{ExactInts, IntField, PyInt};
pub use intern::{Frame, FrameId, FrameTable, StackId, StackTable, StrId, StrTable};
pub use io::{read_bytes, read_path, write_path, Compression, Format};
pub use model::*;
pub use source::{EntryCategories, SourceInfo, Steps};
pub use validate::{validate, Violation};
pub use value::{Extras, Value};

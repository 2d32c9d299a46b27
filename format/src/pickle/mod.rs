//! The pickle codec: what `torch.cuda.memory._dump_snapshot()` writes.
//!
//! ## Reading
//!
//! [`read`] (a slice) and [`read_from`] (a stream, never held whole) accept protocols 2 to 5
//! (CPython's framed `MEMOIZE` pickles and TorchScript's `BINPUT` pickles) and **execute
//! nothing**: `GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ*`, `PERSID`,
//! `BINPERSID` and `EXT*` are refused with the opcode and its byte offset.
//!
//! The reader makes **one pass** over the input, seen through a window (`vm::Feed`: the slice
//! itself, or a 256 KiB buffer refilled from the stream):
//!
//! * a small VM (`vm`) runs the data opcodes into an arena: strings are copied to a string
//!   heap (the snapshot's keys and action names recognised once, as they are read), small
//!   ints are stored inline, containers are nodes whose items live in one flat vector, and a
//!   memo reference is the same node again (a frames list shared by a thousand entries is
//!   stored once);
//! * at each `EMPTY_DICT` the VM first tries the **speculative trace-entry fast path**
//!   (`vm::fast_path`): an entry laid out as PyTorch's exporter and our writer lay it out is
//!   decoded straight from the window into a [`crate::TraceEntry`], its frames into a
//!   [`crate::StackId`]. On anything else it gives up and rolls back (memo stores, string
//!   heap, caches, budget), and the generic VM reads the same bytes; that module's docs list
//!   the layout it accepts;
//! * an entry dict the generic VM completes is converted as soon as its `SETITEMS` runs
//!   (`convert::Conv::packed_entry`), so entries never stay in the arena;
//! * at `STOP` the conversion pass (`convert`) turns what remains of the arena (segments,
//!   settings, annotations, and entries in unusual layouts) into the typed [`Snapshot`],
//!   converting each shared frames list once (cached per node).
//!
//! Hostile input gets an error, never a panic: every length is checked against the remaining
//! input before anything is read, memo indices are checked, and the expansion of
//! memo-shared containers and the nesting of unknown values are bounded.
//!
//! ## Writing
//!
//! [`to_vec`] writes protocol 4 with framing and the CPython C pickler's encoding rules, with
//! every string, stack and frame written once and referenced by memo afterwards. The keys and
//! their order come from the crate's schema walk (`schema`); `writer` only spells them as
//! opcodes.

mod convert;
mod vm;
mod writer;

pub use vm::Observe;

use std::io::Read;

use crate::error::Result;
use crate::io::Progress;
use crate::model::Snapshot;

/// Decodes a snapshot pickle.
pub fn read(bytes: &[u8]) -> Result<Snapshot> {
    read_with(bytes, &mut |_, _| true)
}

/// [`read`], calling `progress(bytes_done, bytes_total)` about every MiB of input; returns
/// [`crate::FormatError::Cancelled`] when it returns `false`.
pub fn read_with(bytes: &[u8], progress: Progress<'_>) -> Result<Snapshot> {
    read_observing(bytes, progress, None)
}

/// [`read_with`], also showing `observe` the trace entries read so far at each progress tick
/// (a viewer draws them while a big file loads).
pub fn read_observing(
    bytes: &[u8],
    progress: Progress<'_>,
    observe: Option<Observe<'_>>,
) -> Result<Snapshot> {
    let (arena, state) = vm::run(
        vm::SliceFeed::new(bytes),
        bytes.len() as u64,
        progress,
        observe,
        true,
    )?;
    convert::convert(&arena, state)
}

/// Decodes a snapshot pickle from a stream of `len` bytes (a file), reading it through a
/// small buffer: the input is never held whole, so peak memory is the decoded snapshot plus
/// the reader's bookkeeping. `len` bounds every declared length, as for [`read`]; a stream
/// that ends early is reported as truncated, and a failing read as
/// [`crate::FormatError::Read`] with its byte offset.
pub fn read_from(reader: impl Read, len: u64, progress: Progress<'_>) -> Result<Snapshot> {
    read_from_observing(reader, len, progress, None)
}

/// [`read_from`], also showing `observe` the trace entries read so far at each progress tick.
pub fn read_from_observing(
    reader: impl Read,
    len: u64,
    progress: Progress<'_>,
    observe: Option<Observe<'_>>,
) -> Result<Snapshot> {
    let (arena, state) = vm::run(vm::ReaderFeed::new(reader), len, progress, observe, true)?;
    convert::convert(&arena, state)
}

/// [`read`] with the trace-entry fast path on or off, and how many entries it read: tests
/// check that both paths give the same snapshot. Not part of the API.
#[doc(hidden)]
pub fn read_with_fast_path(bytes: &[u8], fast: bool) -> Result<(Snapshot, usize)> {
    let (arena, state) = vm::run(
        vm::SliceFeed::new(bytes),
        bytes.len() as u64,
        &mut |_, _| true,
        None,
        fast,
    )?;
    let fast_entries = state.fast_entries;
    Ok((convert::convert(&arena, state)?, fast_entries))
}

/// Encodes a snapshot as a protocol-4 pickle.
pub fn to_vec(snapshot: &Snapshot) -> Vec<u8> {
    writer::to_vec(snapshot)
}

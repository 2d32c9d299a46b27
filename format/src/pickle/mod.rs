//! The pickle codec: what `torch.cuda.memory._dump_snapshot()` writes.
//!
//! ## Reading
//!
//! [`read`] accepts protocols 2 to 5 (CPython's framed `MEMOIZE` pickles and TorchScript's
//! `BINPUT` pickles) and **executes nothing**: `GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`,
//! `INST`, `OBJ`, `NEWOBJ*`, `PERSID`, `BINPERSID` and `EXT*` are refused with the opcode and
//! its byte offset. It runs in two passes:
//!
//! 1. a small VM turns the opcodes into an arena: strings stay byte ranges of the input,
//!    integers are stored inline, containers are nodes whose items live in one flat vector.
//!    A memo reference is the same node again, so a frames list shared by a thousand trace
//!    entries is stored once;
//! 2. a conversion pass turns the arena into the typed [`Snapshot`], converting each shared
//!    frames list to a [`crate::StackId`] once (cached per node).
//!
//! Hostile input gets an error, never a panic: every length is checked against the remaining
//! input before anything is read, memo indices are checked, and the expansion of
//! memo-shared containers and the nesting of unknown values are bounded.
//!
//! ## Writing
//!
//! [`to_vec`] writes protocol 4 with framing and the CPython C pickler's encoding rules, in
//! PyTorch's key order, with every string, stack and frame written once and referenced by
//! memo afterwards.

mod convert;
mod vm;
mod writer;

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
    let (arena, state) = vm::run(bytes, progress)?;
    convert::convert(&arena, state)
}

/// Encodes a snapshot as a protocol-4 pickle.
pub fn to_vec(snapshot: &Snapshot) -> Vec<u8> {
    writer::to_vec(snapshot)
}

//! The pickle codec: what `torch.cuda.memory._dump_snapshot()` writes.
//!
//! ## Reading
//!
//! [`read`] (a slice) and [`read_from`] (a stream, never held whole) accept protocols 2 to 5
//! (CPython's framed `MEMOIZE` pickles and TorchScript's `BINPUT` pickles) and **execute
//! nothing**: `GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ*`, `PERSID`,
//! `BINPERSID` and `EXT*` are refused with the opcode and its byte offset.
//!
//! The reader makes **one pass** over the input, seen through a window (`feed::Feed`: the slice
//! itself, or a 256 KiB buffer refilled from the stream):
//!
//! * the pickle machine ([`machine`]: the opcode loop, stack, marks and memo, `memo`) runs the
//!   data opcodes (told apart by the one opcode table, `opcodes`) for the snapshot builder
//!   (`vm`), which builds them into an arena (`arena`): strings are copied to a string
//!   heap (the snapshot's keys and action names recognised once, as they are read), small
//!   ints are stored inline, containers are nodes whose items live in one flat vector, and a
//!   memo reference is the same node again (a frames list shared by a thousand entries is
//!   stored once);
//! * at each `EMPTY_DICT` the snapshot builder first tries the **speculative trace-entry fast path**
//!   (`vm::fast_path`): an entry laid out as PyTorch's exporter and our writer lay it out is
//!   decoded straight from the window into a [`crate::TraceEntry`], its frames into a
//!   [`crate::StackId`]. On anything else it gives up and rolls back (memo stores, string
//!   heap, caches, budget), and the machine reads the same bytes generically; that module's docs list
//!   the layout it accepts;
//! * an entry dict the generic path completes is converted as soon as its `SETITEMS` runs
//!   (`convert::Conv::packed_entry`), so entries never stay in the arena;
//! * at `STOP` the conversion pass (`convert`) turns what remains of the arena (segments,
//!   settings, annotations, and entries in unusual layouts) into the typed [`Snapshot`],
//!   converting each shared frames list once (cached per node).
//!
//! Hostile input gets an error, never a panic: every length is checked against the remaining
//! input before anything is read, memo indices are checked, and the expansion of
//! memo-shared containers and the nesting of unknown values are bounded.
//!
//! [`machine`] runs a pickle for any [`machine::Build`]er: the `memsnap` Python package builds
//! Python objects with it (the same loop, checks and refusals as the snapshot reader), and
//! `tree` a plain value tree (tests, the `machine` fuzz target). [`ops`] exposes the opcode
//! table and an opcode-at-a-time decoder.
//!
//! ## Reading part of a file
//!
//! [`read_part`] decodes only what a report needs: with [`Part::Segments`], a snapshot laid
//! out as PyTorch writes it (`segments` first) is read up to where its segments end and the
//! rest of the file is not touched (`part` explains how, and what that does not check).
//!
//! ## Writing
//!
//! [`to_vec`] writes protocol 4 with framing and the CPython C pickler's encoding rules, with
//! every string, stack and frame written once and referenced by memo afterwards. The keys and
//! their order come from the crate's schema walk (`schema`); `writer` only spells them as
//! opcodes, through [`emit::Emitter`] (CPython's framing, encodings and container rules),
//! which `memsnap.dump` (the Python package) writes through too.

mod arena;
mod convert;
pub mod emit;
mod feed;
pub mod machine;
mod memo;
mod opcodes;
pub mod ops;
mod part;
mod sym;
#[doc(hidden)]
pub mod tree;
mod vm;
mod writer;

pub use vm::Observe;

use std::io::Read;

use crate::error::{FormatError, Result};
use crate::model::Snapshot;
use crate::progress::Progress;

/// Decodes a snapshot pickle.
pub fn read(bytes: &[u8]) -> Result<Snapshot> {
    read_with(bytes, &mut |_, _| true)
}

/// [`read`], calling `progress(bytes_done, bytes_total)` about every MiB of input; returns
/// [`crate::FormatError::Cancelled`] when it returns `false`. The trace entries read so far
/// can be watched at each tick through [`crate::io::read_bytes_with`].
pub fn read_with(bytes: &[u8], progress: Progress<'_>) -> Result<Snapshot> {
    read_part_observing(bytes, Part::Whole, progress, None)
}

/// What [`read_part`] decodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Part {
    /// The whole snapshot, every byte of the file checked ([`read`]).
    #[default]
    Whole,
    /// `snapshot["segments"]` at least. When the file is a snapshot dict with `segments`
    /// first (PyTorch's layout), reading stops where the segments end, and the snapshot has
    /// the segments only (no `device_traces`, settings or annotations, as if the file had none):
    /// the rest of the file is neither decoded nor checked. Any other file is read whole.
    Segments,
}

impl Part {
    /// `snapshot` cut down to this part: what [`read_part`] gives for its pickle.
    pub fn of(self, snapshot: &Snapshot) -> Snapshot {
        let mut part = snapshot.clone();
        if self == Part::Segments {
            part.device_traces = None;
            part.allocator_settings = None;
            part.external_annotations = None;
            part.host_segments = None;
            part.host_traces = None;
            part.recorder_info = None;
            // Unknown top-level keys stand behind `segments` too.
            part.extra = Default::default();
        }
        part
    }
}

/// Decodes the `part` of a snapshot pickle that a report needs, calling `progress` as
/// [`read_with`] does. Errors carry the byte offset in `bytes`, as with [`read`].
///
/// ```
/// use memsnap_format::{pickle, Segment, Snapshot};
///
/// let mut snapshot = Snapshot::new(1);
/// snapshot.segments.push(Segment::new(0, 0x7f00_0000_0000, 2 << 20, 0));
/// let bytes = pickle::to_vec(&snapshot);
/// let segments_only = pickle::read_part(&bytes, pickle::Part::Segments, &mut |_, _| true)?;
/// assert_eq!(segments_only.segments.len(), 1);
/// assert!(segments_only.device_traces.is_none(), "the trace was not read");
/// # Ok::<(), memsnap_format::FormatError>(())
/// ```
pub fn read_part(bytes: &[u8], part: Part, progress: Progress<'_>) -> Result<Snapshot> {
    read_part_observing(bytes, part, progress, None)
}

/// [`read_part`], also showing `observe` the trace entries read so far at each progress tick
/// (a viewer draws them while a big file loads).
pub(crate) fn read_part_observing(
    bytes: &[u8],
    part: Part,
    progress: Progress<'_>,
    observe: Option<Observe<'_>>,
) -> Result<Snapshot> {
    let end_at = match part {
        Part::Segments => match part::segments_end(bytes) {
            part::Scan::Cut(end) => Some(end),
            part::Scan::Whole | part::Scan::More => None,
        },
        Part::Whole => None,
    };
    let (arena, state) = vm::run(
        feed::SliceFeed::new(bytes),
        vm::Run {
            total: bytes.len() as u64,
            progress,
            observe,
            fast_entries: true,
            end_at,
        },
    )?;
    convert::convert(&arena, state)
}

/// Decodes a snapshot pickle from a stream of `len` bytes (a file), reading it through a
/// small buffer: the input is never held whole, so peak memory is the decoded snapshot plus
/// the reader's bookkeeping. `len` bounds every declared length, as for [`read`]; a stream
/// that ends early is reported as truncated, and a failing read as
/// [`crate::FormatError::Read`] with its byte offset.
pub fn read_from(reader: impl Read, len: u64, progress: Progress<'_>) -> Result<Snapshot> {
    let (arena, state) = vm::run(
        feed::ReaderFeed::new(reader),
        vm::Run {
            total: len,
            progress,
            observe: None,
            fast_entries: true,
            end_at: None,
        },
    )?;
    convert::convert(&arena, state)
}

/// [`read_from`] with the stream read (and inflated) on another thread, ahead of the
/// decoding ([`feed::read_ahead`]), also showing `observe` the trace entries read so far at
/// each progress tick: what [`crate::io::read_path_with`] reads a pickle file with.
pub(crate) fn read_ahead_observing(
    reader: impl Read + Send,
    len: u64,
    progress: Progress<'_>,
    observe: Option<Observe<'_>>,
) -> Result<Snapshot> {
    let (arena, state) = feed::read_ahead(reader, |feed| {
        vm::run(
            feed,
            vm::Run {
                total: len,
                progress,
                observe,
                fast_entries: true,
                end_at: None,
            },
        )
    })?;
    convert::convert(&arena, state)
}

/// [`read_from`] with the stream read on another thread, as [`crate::io::read_path`] reads
/// a file: tests and fuzzers check it against the other ways in. Not part of the API.
#[doc(hidden)]
pub fn read_ahead_from(
    reader: impl Read + Send,
    len: u64,
    progress: Progress<'_>,
) -> Result<Snapshot> {
    read_ahead_observing(reader, len, progress, None)
}

/// [`read_part`] from a stream of `len` bytes (a file). With [`Part::Segments`] and a file in
/// PyTorch's layout, only the bytes up to the end of the segments are read from `reader`
/// (in growing pieces, from 1 MiB); otherwise the whole stream is read as [`read_from`] reads it.
pub fn read_part_from(
    mut reader: impl Read,
    len: u64,
    part: Part,
    progress: Progress<'_>,
) -> Result<Snapshot> {
    if part == Part::Whole {
        return read_from(reader, len, progress);
    }
    let mut head = Vec::new();
    let mut want = PART_FIRST_READ;
    loop {
        let before = head.len() as u64;
        let grow = want.saturating_sub(before);
        (&mut reader)
            .take(grow)
            .read_to_end(&mut head)
            .map_err(|source| FormatError::Read {
                offset: head.len() as u64,
                source,
            })?;
        let at_end = (head.len() as u64) < want || head.len() as u64 >= len;
        match part::segments_end(&head) {
            part::Scan::Cut(end) => {
                let (arena, state) = vm::run(
                    feed::SliceFeed::new(&head),
                    vm::Run {
                        total: head.len() as u64,
                        progress,
                        observe: None,
                        fast_entries: true,
                        end_at: Some(end),
                    },
                )?;
                return convert::convert(&arena, state);
            }
            part::Scan::More if !at_end => want = want.saturating_mul(2),
            part::Scan::Whole | part::Scan::More => {
                let rest = std::io::Cursor::new(head).chain(reader);
                return read_from(rest, len, progress);
            }
        }
    }
}

/// The first piece [`read_part_from`] reads: the segments of most files fit.
const PART_FIRST_READ: u64 = 1 << 20;

/// [`read`] with the trace-entry fast path on or off, and how many entries it read: tests
/// check that both paths give the same snapshot. Not part of the API.
#[doc(hidden)]
pub fn read_with_fast_path(bytes: &[u8], fast: bool) -> Result<(Snapshot, usize)> {
    let (arena, state) = vm::run(
        feed::SliceFeed::new(bytes),
        vm::Run {
            total: bytes.len() as u64,
            progress: &mut |_, _| true,
            observe: None,
            fast_entries: fast,
            end_at: None,
        },
    )?;
    let fast_entries = state.fast_entries;
    Ok((convert::convert(&arena, state)?, fast_entries))
}

/// Encodes a snapshot as a protocol-4 pickle.
pub fn to_vec(snapshot: &Snapshot) -> Vec<u8> {
    writer::to_vec(snapshot)
}

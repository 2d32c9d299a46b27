//! Chrome Trace Event JSON (what ui.perfetto.dev and chrome://tracing open), both ways.
//!
//! # Export ([`write_trace`], [`export_path`])
//! Each device of the snapshot becomes one synthetic process,
//! `pid = 1_000_000_000 + rank * 1000 + device` (Kineto uses OS pids below 2^22 and device
//! indices as pids, so memsnap's rows never collide with a profiler's), named
//! `memsnap GPU 0 (rank 3)`. In it:
//!
//! - **counters** `allocated`, `active` and `reserved` (one name each, `args {"bytes": v}`,
//!   one event per change): the curves memsnap's viewer draws;
//! - **allocation lifetimes** as async slices (`cat "memsnap.alloc"`, name = the user's site,
//!   args `size`, `addr`, `stream`, `device`; the `b` event names its stack by `sf`, a node of
//!   the top-level `stackFrames` tree, so each stack is written once), from `alloc` to
//!   `free_completed`.
//!   Lifetimes overlap without nesting, so they are packed greedily into **lanes** (one async
//!   id per lane; lanes ≈ the most blocks live at once). Blocks never freed end at the trace's
//!   last time; blocks from before the window start at its first;
//! - **segments** the same way (`cat "memsnap.segment"`);
//! - instants `oom` and `snapshot`; `record_function` annotations as `B`/`E` slices on the
//!   thread `annotations`; the training step phases memsnap finds (setup, forward, backward,
//!   optimizer; [`memsnap_analysis::steps`]) as `X` slices on the thread `phases`.
//!
//! Every trace entry rides on exactly one event, in its `args.memsnap` (`[index, action,
//! addr, size, stream, time_us, stack, device_free]`), and the frame and stack tables and the
//! allocator's final state (`state`: segments, blocks, settings) sit in the top-level
//! `otherData.memsnap`: the importer ([`crate::torch`]) recognises memsnap's own export and
//! rebuilds the traces exactly (requested sizes, streams, frames, both free actions) and the
//! segments, not through torch.profiler's lossy `[memory]` events.
//!
//! Times are the trace's `time_us` (epoch µs). A trace without times uses the entry index
//! as its clock (`otherData.memsnap.devices[].timed` is `false`).
//!
//! The trace is written event by event to any [`std::io::Write`]: a million-entry snapshot
//! never becomes one big JSON value in memory.
//!
//! # Perfetto protobuf ([`perfetto`])
//! The same picture in Perfetto's native `.pftrace` format (hand-written `prost` messages),
//! names and stacks interned, written as the events come (in time order, memory bounded by the
//! slices open at once).
//!
//! # One event stream, two writers
//! Both exports are written from one stream (`events`): it walks each device's timeline once
//! and decides the events, their times, lanes and labels; the JSON writer (`write`, events kind
//! by kind) and the protobuf writer ([`perfetto`], events by start time) only decide how each
//! event looks in their format.
//!
//! # Merge ([`merge_path`])
//! `memsnap export --merge TRACE.json[.gz]` appends these events to a torch.profiler trace,
//! converted to its time base, so memory sits under the kernels; see [`merge`].

mod events;
pub mod merge;
pub mod perfetto;
mod write;

pub use events::{DeviceSummary, ExportSummary};
pub use merge::{merge_path, merge_write, MergeReport};
pub use perfetto::{export_perfetto_path, write_perfetto};
pub use write::{export_path, write_trace};

pub use crate::chrome_layout::{pid_of, tid, LAYOUT_VERSION, PID_BASE};

/// How event times are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimeBase {
    /// `ts` = epoch µs (the snapshot's `time_us`), as older Kineto traces write it.
    #[default]
    EpochMicros,
    /// `ts` = µs since this epoch nanosecond (Kineto's `baseTimeNanoseconds`, PyTorch ≥ 2.4).
    SinceNanos(i64),
}

/// What to export.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ChromeOptions {
    /// The rank, for the process names and pids (`None`: 0, and no rank in the names).
    pub rank: Option<u32>,
    /// Detect training steps and write their phases on the `phases` thread.
    pub phases: bool,
    /// The time base of `ts`.
    pub time_base: TimeBase,
}

impl Default for ChromeOptions {
    fn default() -> Self {
        ChromeOptions {
            rank: None,
            phases: true,
            time_base: TimeBase::EpochMicros,
        }
    }
}

impl ChromeOptions {
    /// Options with the given rank.
    pub fn with_rank(mut self, rank: Option<u32>) -> Self {
        self.rank = rank;
        self
    }

    /// Options with (or without) step phases.
    pub fn with_phases(mut self, phases: bool) -> Self {
        self.phases = phases;
        self
    }

    /// Options with a time base.
    pub fn with_time_base(mut self, time_base: TimeBase) -> Self {
        self.time_base = time_base;
        self
    }
}

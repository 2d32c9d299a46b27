//! # memsnap-analysis
//!
//! Derived views of a GPU memory snapshot ([`memsnap_format::Snapshot`]): what was live when,
//! how memory moves through training steps, where it was allocated. No UI here; the viewer
//! and the `memsnap` CLI are built on this crate.
//!
//! ## Concepts
//!
//! * **Replay** ([`Replay`]): a device trace turned into [`Allocation`] intervals on the
//!   **event axis** (trace entry index) and, when entries carry `time_us`, the **time axis**
//!   ([`TimeAxis`]). A bounded (ring-buffer) history starts mid-run; memory that existed
//!   before the window (frees without allocs, live blocks the trace never allocated) is
//!   counted from event 0, as PyTorch's viewer does, and reported as
//!   [`Replay::before_window_bytes`].
//! * **Lifetime** ([`Lifetime`]): an allocation ends at `free_requested` (allocated) or at
//!   `free_completed` (active, PyTorch's "Active Memory Timeline").
//! * **Curves** ([`Curves`]): allocated, active and reserved bytes after every event.
//! * **Steps and phases** ([`steps`], [`phases`]): training steps with their forward,
//!   backward and optimizer phases (and the set-up before the first step), from the stacks,
//!   annotations, or the curve's rise-and-fall shape; slopes per phase; drift across steps
//!   (leaks); warm-up steps that create optimizer state.
//! * **Leaking sites** ([`leaks`]): the code whose allocations, made step after step, are
//!   still held when the window ends: who raises a drifting floor.
//! * **Categories** ([`categories`]): parameter, optimizer state, gradient, activation,
//!   temporary or unknown for every allocation, from the phases that allocate and free it.
//! * **Sites** ([`sites`]): allocations grouped by stack, top frame or file; the live set at
//!   any [`Instant`]; top sites over the run.
//! * **Live set pictures** ([`live`]): the live set at an instant as a frame tree (flame
//!   graph) and as each segment's live blocks, allocated or pending free; the live set split by
//!   a size threshold, and the device with the highest peak (what reports show by default).
//! * **Size filter**: allocations below a byte threshold fold into one residual band whose
//!   total is exact at every instant ([`DeviceTimeline::residual_curve`]).
//! * **Layout** ([`layout`]): the stacked band chart for a range and pixel width, with level
//!   of detail and hit testing.
//! * **Fragmentation** ([`DeviceTimeline::fragmentation`]): per segment, reserved vs
//!   allocated and the largest free block at an instant.
//! * **Named ranges** ([`NamedRange`]): `record_function` annotations paired into ranges.
//!
//! [`DeviceTimeline::build`] does all the one-time work for a device (`Send + Sync`, so a
//! viewer can build it on a worker thread); everything else is a query on it.
//! [`summary`] and [`compare`] produce the reports of `memsnap summary`, `check`, `diff` and
//! `ranks`.
//!
//! ```
//! use memsnap_analysis::{DeviceTimeline, Lifetime, LayoutRequest, StepOptions, CurveKind};
//! use memsnap_format::{Action, Snapshot, TraceEntry};
//!
//! let mut snapshot = Snapshot::new(1);
//! let trace = &mut snapshot.device_traces.as_mut().unwrap()[0];
//! trace.push(TraceEntry::new(Action::Alloc, 0x1000, 512, 0));
//! trace.push(TraceEntry::new(Action::FreeCompleted, 0x1000, 512, 0));
//!
//! let timeline = DeviceTimeline::build(&snapshot, 0).unwrap();
//! assert_eq!(timeline.peak(CurveKind::Allocated).bytes, 512);
//! let layout = timeline.layout(&LayoutRequest::whole(&timeline, 800)).unwrap();
//! assert_eq!(layout.bands.len(), 1);
//! let _steps = timeline.steps(&StepOptions::default());
//! ```

pub mod categories;
pub mod category;
pub mod compare;
pub mod curve;
pub mod error;
pub mod instant;
pub mod layout;
pub mod leaks;
pub mod live;
pub mod modules;
pub mod phases;
pub mod ranges;
pub mod replay;
pub mod sites;
pub mod steps;
pub mod summary;
pub mod timeline;

/// A scoped thread's result; its panic goes on in the caller (the passes that run parts of
/// the analysis side by side).
pub(crate) fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

pub use categories::{Category, CategoryBytes};
pub use curve::{Curve, CurveKind, Curves, TimeAxis};
pub use error::{AnalysisError, Result};
pub use instant::{Instant, InstantParseError};
pub use layout::{Axis, Band, BandStep, Column, Hit, Layout, LayoutRequest};
pub use leaks::{leaking_sites, LeakingSite};
/// Sizes as people read them (`1.5 GiB`): the one formatter, from `memsnap-units`.
pub use memsnap_units::format_size;
pub use phases::{Evidence, Phase, PhaseKind};
pub use ranges::NamedRange;
pub use replay::{AllocId, Allocation, Lifetime, Origin, Replay, SegmentInterval};
pub use sites::{GroupBy, SiteKey};
pub use steps::{
    Drift, Slope, StackEvidence, Step, StepAnalysis, StepMethod, StepOptions, StepSource,
};
pub use summary::{summarize, summarize_owned, DeviceSummary, Summary, SummaryOptions};
pub use timeline::{DeviceTimeline, LiveGroup, Peak, SegmentUsage, SiteStats, SizeOrdered};

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn device_timeline_can_be_built_on_a_worker_thread() {
        assert_send_sync::<crate::DeviceTimeline>();
        assert_send_sync::<crate::Layout>();
    }
}

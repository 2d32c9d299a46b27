//! # memsnap-simulate
//!
//! Replays the trace of a PyTorch memory snapshot through memsnap's reimplementation of the
//! caching allocator ([`memsnap_recorder::CachingAllocator`]) to answer two questions: *does
//! our allocator make PyTorch's decisions?* and *would other settings (or a smaller GPU) have
//! avoided the OOM?*
//!
//! ## Replay
//!
//! A trace is a window of the run: the ring buffer keeps the newest entries, and recording
//! may start late. [`start`] rebuilds the allocator's state at the start of that window from
//! the file: the segments alive then (final segments, minus those allocated in the window,
//! plus those freed in it), the blocks allocated then (live blocks the window never touches,
//! plus blocks the window frees without allocating), the rest of each segment free, and
//! streams and pools from the file. The state is restored into a `CachingAllocator`
//! ([`CachingAllocator::restore_segment`](memsnap_recorder::CachingAllocator::restore_segment))
//! over a [`TraceDevice`], which hands out the addresses the trace recorded, so that the
//! replay's best fit breaks ties the way PyTorch did.
//!
//! Then every request of the window runs through it: `alloc` (a `malloc` of the recorded
//! size on the recorded stream), `free_requested` / `free_completed` (a free; when the
//! completion comes later, the block waits on an event completed at the recorded
//! `free_completed`), `oom` (the request that failed, replayed), and runs of `segment_free` /
//! `segment_unmap` that no request explains (`empty_cache()`; the OOM retry's release frees
//! the same blocks). Settings are the file's `allocator_settings`, else the PyTorch defaults of
//! its era, with expandable segments when its segments are expandable. The device's capacity
//! is what the file implies (an `oom` entry's `device_free` plus the reserved bytes then),
//! else [`DEFAULT_CAPACITY`](replay::DEFAULT_CAPACITY), unless a limit is given.
//!
//! ## Fidelity
//!
//! Each step's segment decisions (`cudaMalloc`, `cudaFree`, map, unmap) are compared with the
//! recorded entries of that step. [`Fidelity`] counts the recorded decisions the replay
//! reproduced (same step, action and size), the ones it added, the allocations placed at the
//! recorded address, and lists the steps that differ: the event, what PyTorch did, what the
//! replay did. Each difference is an allocator bug to fix or an era difference to document.
//!
//! ## What-if
//!
//! [`simulate`] with [`Options::config`] and/or [`Options::memory_limit`] replays the same
//! requests under other settings or on a smaller device: reserved and allocated peaks,
//! fragmentation at the reserved peak, device calls, and where it would run out of memory.
//! [`suggest()`] tries the settings people actually use and ranks them. The state before the
//! window is the recorded one in every scenario (what other settings would have made of it is
//! unknowable).
//!
//! ```no_run
//! use memsnap_simulate::{simulate, Options};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let snapshot = memsnap_format::io::read_path(std::path::Path::new("run.pickle"))?.0;
//! let own = simulate(&snapshot, &Options::default())?;
//! for d in &own.devices {
//!     println!("device {}: {}/{} decisions reproduced", d.device,
//!              d.fidelity.reproduced, d.fidelity.segment_decisions);
//! }
//! let what_if = simulate(&snapshot, &Options {
//!     config: Some(memsnap_recorder::AllocatorConfig::parse("expandable_segments:True")?),
//!     memory_limit: Some(24 << 30),
//!     device: None,
//! })?;
//! # let _ = what_if;
//! # Ok(()) }
//! ```

pub mod device;
pub mod error;
pub mod replay;
pub mod settings;
pub mod start;
pub mod suggest;

pub use device::{SegmentAction, SegmentDecision, TraceDevice};
pub use error::{Result, SimulateError};
pub use replay::{
    device_memory, replay_trace, simulate, CapacitySource, DeviceReport, Difference, Fidelity,
    OomAt, Options, Recorded, Simulation,
};
pub use suggest::{suggest, Candidate, Suggestions};

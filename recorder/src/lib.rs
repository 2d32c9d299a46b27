//! # memsnap-recorder
//!
//! A reimplementation of PyTorch's CUDA caching allocator that records the same memory
//! history `torch.cuda.memory._record_memory_history` does, and writes it as a snapshot that
//! PyTorch's `_memory_viz.py` and memsnap's viewer load.
//!
//! ## Concepts
//!
//! * A [`Device`] provides **segments** (`cudaMalloc`), events and, optionally, virtual memory
//!   for expandable segments. Backends: [`SimulatedDevice`] (an address range and a capacity,
//!   no memory behind it: 80 GB "GPUs" on a laptop, deterministic), [`HostDevice`] (real host
//!   memory), `CudaDevice` (feature `cuda`) and `HipDevice` (feature `hip`).
//! * The [`CachingAllocator`] splits segments into **blocks**, caches freed blocks per stream
//!   and pool (small: ≤ 1 MiB in 2 MiB segments; large: the rest), and reuses them by best
//!   fit — exactly PyTorch's rules (`round_size`, split thresholds, `max_split_size`, the OOM
//!   retry ladder, `record_stream`, `empty_cache`, memory fraction, garbage collection,
//!   expandable segments), configured by a `PYTORCH_CUDA_ALLOC_CONF`-style string
//!   ([`AllocatorConfig::parse`]). One lock per device; the allocator is `Send + Sync`.
//! * **History** ([`HistoryOptions`]): a ring buffer per device of the newest `max_entries`
//!   trace entries (`alloc`, `free_requested`, `free_completed`, `segment_*`, `oom`,
//!   `snapshot`), with timestamps in microseconds since the Unix epoch. Entries the ring drops
//!   are counted and written to the snapshot (`recorder_info.dropped_entries`).
//! * **Clock**: one reading per API call, shared by its entries. Like PyTorch's
//!   `getApproximateTime`, it reads the CPU's timestamp counter (x86-64 Linux, when the
//!   kernel's own clocksource is `tsc`) and scales it with a factor calibrated against the OS
//!   monotonic clock, resynchronising at least every 10 ms: readings stay within a few
//!   microseconds of the OS clock (usually well under one) and never go back on a device.
//!   Elsewhere every reading is the OS clock.
//! * **Native stacks** are captured as raw instruction pointers (by default a frame-pointer
//!   walk on x86-64 and AArch64 Linux, else DWARF unwinding; see [`Unwinder`]), interned per
//!   device so a stack seen before costs no allocation, and symbolised only when a snapshot is
//!   taken. The walk needs a program built with frame pointers (this workspace's
//!   `.cargo/config.toml` sets `-C force-frame-pointers=yes`); the first capture checks one
//!   walk against a DWARF unwind and warns once on stderr when frames are missing.
//! * **Deterministic recordings**: [`CachingAllocator::use_manual_clock`] and
//!   [`CachingAllocator::advance_clock`] give a fake clock; [`GivenStack`]s registered as
//!   frames ([`CachingAllocator::register_stack`]) are recorded by
//!   [`CachingAllocator::malloc_with_stack`] and [`CachingAllocator::free_with_stack`] instead
//!   of an unwound stack; [`CachingAllocator::record_annotation`] keeps `record_function`-style
//!   markers for the snapshot's `external_annotations`.
//! * [`CachingAllocator::snapshot`] returns the [`memsnap_format::Snapshot`] model;
//!   [`CachingAllocator::dump_snapshot`] writes it atomically;
//!   [`snapshot::merge_device_snapshots`] puts the snapshots of several devices in one.
//! * [`HostTensor`]: an `f32` buffer in a block of a [`HostDevice`] allocator, for Rust
//!   training code whose tensors should show in the history.
//!
//! This crate is a plain Rust library. The C ABI (`libmemsnap_recorder.so`/`.a`, `memsnap.h`),
//! PyTorch's `CUDAPluggableAllocator` entry points and the `MEMSNAP_*` environment
//! configuration are the `memsnap-recorder-ffi` crate (`recorder-ffi/`), built over this one.
//!
//! Nothing reachable from an allocation panics: out of memory is [`Error::OutOfMemory`]
//! (after the `oom` trace entry is recorded and the OOM observers ran, outside the lock).
//!
//! ## Usage
//!
//! ```
//! use memsnap_recorder::{CachingAllocator, HistoryOptions, SimulatedDevice, Stream};
//!
//! let alloc = CachingAllocator::new(SimulatedDevice::new(80 << 30));
//! alloc.record_memory_history(HistoryOptions::default());
//! let ptr = alloc.malloc(1 << 20, Stream::DEFAULT)?;
//! alloc.record_stream(ptr, Stream(7));
//! alloc.free(ptr)?;
//! alloc.empty_cache()?;
//! alloc.set_memory_fraction(0.5)?;
//! alloc.add_oom_observer(|oom| eprintln!("{oom}"));
//! let stats = alloc.stats();
//! assert_eq!(stats.allocated_bytes(), 0);
//! let snapshot = alloc.snapshot();
//! assert_eq!(snapshot.traces().len(), 1);
//! // alloc.dump_snapshot("out.pickle")?;
//! # Ok::<(), memsnap_recorder::Error>(())
//! ```
//!
//! A process-wide allocator (what a C ABI or a PyTorch pluggable allocator wraps):
//!
//! ```
//! use std::sync::OnceLock;
//! use memsnap_recorder::{CachingAllocator, SimulatedDevice, Stream};
//!
//! static ALLOCATOR: OnceLock<CachingAllocator<SimulatedDevice>> = OnceLock::new();
//! let alloc = ALLOCATOR.get_or_init(|| CachingAllocator::new(SimulatedDevice::new(1 << 30)));
//! // Dump on OOM: the observer runs outside the lock, so it may take a snapshot.
//! alloc.add_oom_observer(|_| {
//!     let _ = ALLOCATOR.get().map(|a| a.snapshot());
//! });
//! assert!(alloc.malloc(2 << 30, Stream::DEFAULT).is_err());
//! ```
//!
//! ## Feature flags
//!
//! * `cuda`: `CudaDevice` over cudarc's driver API, loaded at run time (`dynamic-loading`);
//!   without `libcuda.so.1` construction returns [`DeviceError::Unavailable`].
//! * `hip`: `HipDevice`, a `libloading` shim over `libamdhip64.so`.
//! * `frame-pointers`: kept for compatibility; the frame-pointer walk is the default unwinder
//!   wherever it is supported. It only gives complete stacks when the program is built with
//!   `-C force-frame-pointers=yes`.

mod allocator;
mod clock;
pub mod config;
pub mod device;
pub mod error;
pub mod global_alloc;
pub mod history;
pub mod live;
pub mod snapshot;
pub mod stacks;
pub mod stats;

pub use allocator::{CachingAllocator, OomObserver};
pub use config::AllocatorConfig;
#[cfg(feature = "cuda")]
pub use device::cuda::CudaDevice;
#[cfg(feature = "hip")]
pub use device::hip::HipDevice;
pub use device::{Device, Event, HostDevice, HostTensor, MemInfo, SimulatedDevice, Stream};
pub use error::{ConfigError, DeviceError, Error, OomInfo, Result};
pub use history::{ContextMode, HistoryMode, HistoryOptions, StackMode};
pub use live::{LiveAddr, LiveServer, ServeError};
pub use stacks::{GivenStack, Unwinder};
pub use stats::{DeviceStats, Stat, StatArray, StatType};

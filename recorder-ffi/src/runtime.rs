//! The process-wide state behind the C ABI: a [`CachingAllocator`] per device (created on
//! first use from the environment, see [`crate::env`]), the Python-stack log, the dumps
//! (on request, at exit, on out-of-memory and on `SIGUSR1`), and the live endpoints
//! (`MEMSNAP_LIVE`, `memsnap_serve_live`).
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Once, OnceLock};

use memsnap_format::{Action, Frame, Snapshot};
use parking_lot::Mutex;
use recorder::history::{ContextMode, HistoryMode, HistoryOptions, StackMode};
use recorder::live::{serve_with_stacks, LiveAddr, LiveServer, LiveStacks, LiveState, ServeError};
use recorder::snapshot::merge_device_snapshots;
use recorder::{AllocatorConfig, CachingAllocator, Error, Stream};

use crate::backend::AnyDevice;
use crate::env::{BackendKind, EnvConfig, StackSelection};
use crate::error::{FfiError, FfiResult, MEMSNAP_ERR_BACKEND};
use crate::exported::EXPORTED;
use crate::python;
use crate::python_stacks::PythonStacks;
use crate::signal;

/// Devices a process may use (CUDA ordinals 0..64).
pub const MAX_DEVICES: usize = 64;

/// History settings of the C ABI: the core's options plus whether Python frames are wanted.
#[derive(Clone, Copy, Debug)]
struct Recording {
    options: HistoryOptions,
    stacks: StackSelection,
}

/// Everything the C ABI shares between calls.
pub struct Runtime {
    config: EnvConfig,
    devices: Vec<OnceLock<Result<CachingAllocator<AnyDevice>, String>>>,
    recording: Mutex<Recording>,
    /// Python frames are captured (a Python interpreter is present and asked for).
    python_wanted: AtomicBool,
    /// The context level of the Python capture (a [`ContextMode`] as `u8`).
    python_context: AtomicU8,
    /// Python stacks of allocations; its lock also orders allocator calls when it is in use.
    python_log: Mutex<PythonStacks>,
    /// Some device is published live: the Python log then numbers its events as the live
    /// stream numbers the trace (see [`AbiLiveStacks`]).
    live_published: AtomicBool,
    /// Written on out-of-memory (`MEMSNAP_DUMP`, then `memsnap_set_oom_dump_path`).
    pub oom_dump_path: Mutex<Option<PathBuf>>,
    /// The live endpoints, by device index (at most one per device). Dropped at exit, which
    /// removes their sockets.
    live: Mutex<Vec<(usize, LiveServer)>>,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static RUNTIME_INIT: Mutex<()> = Mutex::new(());

/// The runtime, created from the environment on first use.
pub fn runtime() -> FfiResult<&'static Runtime> {
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    init_runtime(None)
}

/// Creates the runtime (once); `backend` overrides `MEMSNAP_BACKEND`.
pub fn init_runtime(backend: Option<BackendKind>) -> FfiResult<&'static Runtime> {
    let _serialise = RUNTIME_INIT.lock();
    if let Some(rt) = RUNTIME.get() {
        return match backend {
            Some(kind) if kind != rt.config.backend => Err(FfiError::invalid(format!(
                "memsnap already runs on the {} backend; it cannot switch to {}",
                rt.config.backend.name(),
                kind.name()
            ))),
            _ => Ok(rt),
        };
    }
    let mut config = EnvConfig::from_env().map_err(|e| FfiError::invalid(e.to_string()))?;
    if let Some(kind) = backend {
        config.backend = kind;
    }
    if let Some(conf) = &config.alloc_conf {
        // Fail early (and once) on a bad configuration string.
        AllocatorConfig::parse(conf).map_err(|e| FfiError::invalid(e.to_string()))?;
    }
    let rt = Runtime {
        devices: (0..MAX_DEVICES).map(|_| OnceLock::new()).collect(),
        recording: Mutex::new(Recording {
            options: HistoryOptions::off(),
            stacks: config.stacks,
        }),
        python_wanted: AtomicBool::new(false),
        python_context: AtomicU8::new(ContextMode::Never as u8),
        python_log: Mutex::new(PythonStacks::new(config.max_entries)),
        live_published: AtomicBool::new(false),
        oom_dump_path: Mutex::new(config.dump_path.clone()),
        live: Mutex::new(Vec::new()),
        config,
    };
    let rt = RUNTIME.get_or_init(|| rt);
    if rt.config.history != HistoryMode::Off {
        rt.set_recording(
            HistoryOptions {
                enabled: rt.config.history,
                context: rt.config.context,
                max_entries: rt.config.max_entries,
                ..HistoryOptions::default()
            },
            rt.config.stacks,
        );
    }
    if let Some(path) = rt.config.dump_path.clone() {
        register_exit_dump();
        if rt.config.dump_on_sigusr1 {
            let installed = signal::install(move || match dump_all(&path) {
                Ok(()) => eprintln!("memsnap: SIGUSR1: wrote {}", path.display()),
                Err(err) => eprintln!("memsnap: SIGUSR1: {err}"),
            });
            if let Err(err) = installed {
                eprintln!("memsnap: MEMSNAP_DUMP_ON_SIGUSR1: {err}");
            }
        }
    } else if rt.config.dump_on_sigusr1 {
        eprintln!(
            "memsnap: MEMSNAP_DUMP_ON_SIGUSR1 is set but MEMSNAP_DUMP is not; no dump on SIGUSR1"
        );
    }
    Ok(rt)
}

impl Runtime {
    /// The allocator of `device`, created on first use.
    pub fn device(&self, device: c_int) -> FfiResult<&CachingAllocator<AnyDevice>> {
        let index = usize::try_from(device)
            .ok()
            .filter(|&i| i < MAX_DEVICES)
            .ok_or_else(|| {
                FfiError::invalid(format!("device {device} is out of range 0..{MAX_DEVICES}"))
            })?;
        let mut created = false;
        let slot = self.devices[index].get_or_init(|| {
            created = true;
            self.open_device(index)
        });
        if created && slot.is_ok() {
            // Once per device, off the allocation path: the first call made it.
            self.serve_live_from_env(index);
        }
        slot.as_ref().map_err(|message| FfiError {
            code: MEMSNAP_ERR_BACKEND,
            message: message.clone(),
        })
    }

    /// `MEMSNAP_LIVE`: starts device `index`'s endpoint and says where on stderr, or says
    /// why it could not; the allocator works the same either way.
    fn serve_live_from_env(&self, index: usize) {
        let Some(spec) = self.config.live.as_deref() else {
            return;
        };
        let addr = LiveAddr::parse(spec)
            .map_err(|e| e.to_string())
            .and_then(|a| {
                a.for_device(index)
                    .ok_or_else(|| format!("no address for device {index} (the port overflows)"))
            });
        let result = addr.and_then(|addr| {
            self.serve_live(index, addr)
                .map_err(|e| e.message)
                .map(|_| ())
        });
        if let Err(message) = result {
            eprintln!(
                "memsnap: MEMSNAP_LIVE={spec}: {message}; recording goes on without live publishing"
            );
        }
    }

    /// Starts publishing device `index`'s history at `addr` (the device's allocator must
    /// exist) and prints the address once on stderr; returns it as `memsnap watch` takes it.
    /// An error when the device is served already or the endpoint cannot be made.
    pub fn serve_live(&self, index: usize, addr: LiveAddr) -> FfiResult<String> {
        let mut live = self.live.lock();
        if let Some((_, server)) = live.iter().find(|(d, _)| *d == index) {
            return Err(FfiError::invalid(format!(
                "device {index} is already published at {}",
                server.url()
            )));
        }
        let allocator = RUNTIME
            .get()
            .and_then(|rt| rt.devices.get(index)?.get()?.as_ref().ok())
            .ok_or_else(|| FfiError::invalid(format!("device {index} has no allocator")))?;
        // Numbered from now on: a listener's state at connect comes after this.
        self.live_published.store(true, Ordering::Relaxed);
        let stacks: Arc<dyn LiveStacks> = Arc::new(AbiLiveStacks);
        let token = self.config.live_token.clone();
        let server =
            serve_with_stacks(allocator, addr, token, Some(stacks)).map_err(|e| FfiError {
                code: match e {
                    ServeError::Address { .. } => crate::error::MEMSNAP_ERR_INVALID_ARGUMENT,
                    _ => crate::error::MEMSNAP_ERR_IO,
                },
                message: e.to_string(),
            })?;
        let url = server.url();
        eprintln!("memsnap: live at {url} (device {index}; memsnap watch {url})");
        live.push((index, server));
        register_live_cleanup();
        Ok(url)
    }

    /// The address device `index`'s history is published at, if it is.
    pub fn live_url(&self, index: usize) -> Option<String> {
        self.live
            .lock()
            .iter()
            .find(|(d, _)| *d == index)
            .map(|(_, server)| server.url())
    }

    fn open_device(&self, index: usize) -> Result<CachingAllocator<AnyDevice>, String> {
        let device = AnyDevice::open(self.config.backend, index, self.config.device_memory)
            .map_err(|e| format!("device {index}: {e}"))?;
        let allocator = match &self.config.alloc_conf {
            Some(conf) => CachingAllocator::with_conf(device, conf).map_err(|e| e.to_string())?,
            None => CachingAllocator::new(device),
        }
        .with_device_index(index as i64);
        let recording = *self.recording.lock();
        allocator.record_memory_history(core_options(recording));
        Ok(allocator)
    }

    /// Allocators created so far, by device index.
    pub fn open_devices(&self) -> impl Iterator<Item = &CachingAllocator<AnyDevice>> {
        self.devices
            .iter()
            .filter_map(|slot| slot.get()?.as_ref().ok())
    }

    pub fn set_recording(&self, options: HistoryOptions, stacks: StackSelection) {
        let recording = Recording { options, stacks };
        // The log lock first: no allocation may run between the two updates.
        let mut log = self.python_log.lock();
        *self.recording.lock() = recording;
        for allocator in self.open_devices() {
            allocator.record_memory_history(core_options(recording));
        }
        let python = options.enabled != HistoryMode::Off
            && stacks.wants_python()
            && options.context != ContextMode::Never
            && python::available();
        if options.enabled == HistoryMode::Off || options.clear_history {
            log.clear(options.max_entries);
        }
        log.set_capacity(match options.enabled {
            HistoryMode::State => 1,
            _ => options.max_entries,
        });
        self.python_context
            .store(options.context as u8, Ordering::Relaxed);
        self.python_wanted.store(python, Ordering::Relaxed);
    }

    /// The live number of the allocator's next trace entry, when some device is published
    /// (two more lock acquisitions per call then, none otherwise).
    fn live_seq(&self, allocator: &CachingAllocator<AnyDevice>) -> Option<u64> {
        self.live_published
            .load(Ordering::Relaxed)
            .then(|| allocator.live_entries())
    }

    fn python_context(&self) -> u8 {
        self.python_context.load(Ordering::Relaxed)
    }

    pub fn malloc(&self, size: u64, device: c_int, stream: Stream) -> FfiResult<u64> {
        let allocator = self.device(device)?;
        let result = if self.python_wanted.load(Ordering::Relaxed) {
            // Captured before any lock: reading Python frames needs the GIL, which the caller
            // holds; lock order is GIL, then memsnap's locks (as in PyTorch).
            let frames = python::capture(self.config.python_gil);
            let mut log = self.python_log.lock();
            let before = self.live_seq(allocator);
            let result = allocator.malloc(size, stream);
            if let Ok(ptr) = result {
                if ptr != 0 {
                    let seqs = before.map(|b| (b, allocator.live_entries()));
                    log.record_alloc(device as usize, ptr, frames, seqs);
                }
            }
            result
        } else {
            allocator.malloc(size, stream)
        };
        match result {
            Ok(ptr) => Ok(ptr),
            Err(err @ Error::OutOfMemory(_)) => {
                let mut failure = FfiError::from(err);
                // A caller such as PyTorch's CUDAPluggableAllocator may not check for NULL (torch
                // 2.11 does not: the tensor gets a NULL data pointer and no OutOfMemoryError is
                // raised), so the failure is said here, once per failed allocation.
                let _ = writeln!(std::io::stderr(), "memsnap: {}", failure.message);
                let path = self.oom_dump_path.lock().clone();
                if let Some(path) = path {
                    match self.dump(&path) {
                        Ok(()) => eprintln!("memsnap: out of memory; wrote {}", path.display()),
                        Err(dump_err) => {
                            failure.message =
                                format!("{}; the OOM dump failed: {dump_err}", failure.message)
                        }
                    }
                }
                Err(failure)
            }
            Err(err) => Err(err.into()),
        }
    }

    pub fn free(&self, ptr: u64, device: c_int) -> FfiResult<()> {
        let allocator = self.device(device)?;
        if self.python_wanted.load(Ordering::Relaxed) {
            let free_site = (self.python_context() >= ContextMode::All as u8)
                .then(|| python::capture(self.config.python_gil));
            let mut log = self.python_log.lock();
            let before = self.live_seq(allocator);
            allocator.free(ptr)?;
            let seqs = before.map(|b| (b, allocator.live_entries()));
            log.record_free(device as usize, ptr, free_site, seqs);
            Ok(())
        } else {
            Ok(allocator.free(ptr)?)
        }
    }

    /// Splices the Python frames of the log into `snapshot`'s trace and blocks, when there
    /// are any (the log's lock held by the caller: `log`).
    fn merge_python(&self, log: &PythonStacks, snapshot: &mut Snapshot) {
        if self.python_wanted.load(Ordering::Relaxed) || log.has_events() {
            let blocks_too = self.python_context() >= ContextMode::State as u8;
            log.merge_into(snapshot, blocks_too);
        }
    }

    /// The snapshot of every device used so far, with Python frames merged in.
    fn snapshot(&self) -> Snapshot {
        // Holding the log lock keeps the log and the allocators' traces in step.
        let log = self.python_log.lock();
        let snapshots: Vec<Snapshot> = self
            .open_devices()
            .map(CachingAllocator::snapshot)
            .collect();
        let mut snapshot = merge_device_snapshots(snapshots, trim_abi_frames);
        self.merge_python(&log, &mut snapshot);
        snapshot
    }

    pub fn dump(&self, path: &Path) -> FfiResult<()> {
        let snapshot = self.snapshot();
        memsnap_format::write_path(path, &snapshot, None)?;
        Ok(())
    }
}

/// The core allocator's options for the C ABI's settings (Python frames are added by the C ABI).
fn core_options(recording: Recording) -> HistoryOptions {
    HistoryOptions {
        stacks: if recording.stacks.wants_native() {
            StackMode::Native
        } else {
            StackMode::None
        },
        ..recording.options
    }
}

/// Drops the C ABI's own frames from the top of a stack: the exported function the program
/// called (`memsnap_alloc`, ...) and the plumbing under it (`catch_unwind`, the runtime). The
/// stack then starts at the program's code that called memsnap.
/// What live listeners get beside the allocator's own frames: the C ABI's frames trimmed and
/// the Python frames of its log spliced in, as in [`Runtime::dump`]. Entries after a
/// listener's state are paired with the log's events by their live numbers, which the log
/// notes once a device is published ([`PythonStacks::paired`]).
struct AbiLiveStacks;

impl LiveStacks for AbiLiveStacks {
    fn state(&self, take: &mut dyn FnMut() -> LiveState) -> LiveState {
        let Some(rt) = RUNTIME.get() else {
            return take();
        };
        // As in `Runtime::snapshot`: the log's lock keeps it in step with the trace.
        let log = rt.python_log.lock();
        let mut state = take();
        state.snapshot = merge_device_snapshots(vec![state.snapshot], trim_abi_frames);
        rt.merge_python(&log, &mut state.snapshot);
        state
    }

    fn extra(&self, device: i64, first_seq: u64, entries: &[(Action, u64)]) -> Vec<Option<u32>> {
        let (Some(rt), Ok(device)) = (RUNTIME.get(), usize::try_from(device)) else {
            return Vec::new();
        };
        let end = first_seq + entries.len() as u64;
        // Copied under the lock (O(entries)), paired after it: allocations wait for this
        // lock, never for the pairing.
        let window = rt.python_log.lock().window(device, first_seq, end);
        PythonStacks::paired(&window, first_seq, entries)
    }

    fn frames(&self, native: Vec<Frame>, extra: Option<u32>) -> Vec<Frame> {
        let native = trim_abi_frames(native);
        let python = extra.and_then(|id| RUNTIME.get()?.python_log.lock().stack(id));
        match python {
            Some(stack) => python::merge_stacks(native, python::frames(&stack)),
            None => native,
        }
    }
}

fn trim_abi_frames(mut frames: Vec<Frame>) -> Vec<Frame> {
    let ours = frames.iter().rposition(is_abi_frame).map_or(0, |i| i + 1);
    frames.drain(..ours);
    frames
}

/// Whether a frame is memsnap's: an exported function, memsnap.torch's out-of-memory shim
/// (`memsnap_oom_shim_alloc`, C++ in its own library) or memsnap's Rust code
/// (`memsnap_recorder::...`) by name, or this crate's code by source file.
fn is_abi_frame(frame: &Frame) -> bool {
    const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/");
    let name = frame.name.trim_start_matches('<');
    name.starts_with("memsnap_recorder::")
        || name.starts_with("memsnap_oom_shim_")
        || EXPORTED.contains(&name)
        || frame.filename.starts_with(SRC)
        || frame.filename.starts_with("recorder-ffi/src/")
}

/// Writes the snapshot of the running allocator (used by the exit and signal dumps).
fn dump_all(path: &Path) -> FfiResult<()> {
    match RUNTIME.get() {
        Some(rt) => rt.dump(path),
        None => Err(FfiError::invalid("memsnap was never used in this process")),
    }
}

fn register_exit_dump() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: `dump_at_exit` is an `extern "C" fn()` that never unwinds.
        if unsafe { libc::atexit(dump_at_exit) } != 0 {
            eprintln!("memsnap: cannot register the exit-time dump");
        }
    });
}

/// Removes the live endpoints' sockets at exit (dropping a server stops its threads within
/// about 100 ms and removes its socket and private directory).
/// How long the exit waits for live listeners to be sent the end of the run.
const LIVE_CATCH_UP_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(2);

fn register_live_cleanup() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: `close_live_at_exit` is an `extern "C" fn()` that never unwinds.
        if unsafe { libc::atexit(close_live_at_exit) } != 0 {
            eprintln!("memsnap: cannot register the exit-time removal of the live socket");
        }
    });
}

extern "C" fn close_live_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(rt) = RUNTIME.get() {
            // Taken out first: the servers are dropped without the lock held.
            let servers = std::mem::take(&mut *rt.live.lock());
            // The end of the run reaches the listeners (`memsnap watch` reports the last
            // step from it), unless one of them stopped reading: then the exit waits 2 s.
            for (_, server) in &servers {
                server.catch_up(LIVE_CATCH_UP_AT_EXIT);
            }
            drop(servers);
        }
    });
}

extern "C" fn dump_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(rt) = RUNTIME.get() else {
            return;
        };
        let Some(path) = rt.config.dump_path.as_ref() else {
            return;
        };
        match rt.dump(path) {
            Ok(()) => eprintln!("memsnap: wrote {}", path.display()),
            Err(err) => eprintln!(
                "memsnap: exit-time dump to {} failed: {err}",
                path.display()
            ),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(frames: &[Frame]) -> Vec<&str> {
        frames.iter().map(|f| f.name.as_str()).collect()
    }

    #[test]
    fn the_abi_frames_are_trimmed_from_the_top() {
        let frame = |name: &str, file: &str| Frame::new(name, file, 1);
        let ours = concat!(env!("CARGO_MANIFEST_DIR"), "/src/runtime.rs");
        let stack = vec![
            frame("std::panicking::try", "/rustc/library/std/src/panicking.rs"),
            frame("memsnap_recorder::runtime::Runtime::malloc", ours),
            frame("{closure#0}", ours),
            frame("memsnap_empty_cache", "??"),
            frame("memsnap_reset_hook", "??"),
            frame("memsnap_helper", "pattern.c"),
            frame("main", "pattern.c"),
        ];
        // A program's own function with memsnap's prefix stays.
        assert_eq!(names(&trim_abi_frames(stack)), ["memsnap_helper", "main"]);
        let theirs = vec![
            frame("forward_pass", "pattern.c"),
            frame("main", "pattern.c"),
        ];
        assert_eq!(names(&trim_abi_frames(theirs)), ["forward_pass", "main"]);
    }

    #[test]
    fn the_oom_shim_frame_is_trimmed_too() {
        // What a stack under memsnap.torch looked like on an H200 (torch 2.11) before: the
        // shim's frame was the top one and became the "site" of every allocation without
        // Python frames.
        let frame = |name: &str| Frame::new(name, "??", 0);
        let stack = vec![
            frame("memsnap_alloc_checked"),
            frame("memsnap_oom_shim_alloc"),
            frame("torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator::malloc(unsigned long, signed char, CUstream_st*)"),
            frame("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)"),
        ];
        assert_eq!(
            names(&trim_abi_frames(stack))[0],
            "torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator::malloc(unsigned long, signed char, CUstream_st*)"
        );
    }
}

//! The C ABI (`recorder/include/memsnap.h`): what `libmemsnap_recorder.so`/`.a` export to C,
//! C++ and PyTorch's `CUDAPluggableAllocator`.
//!
//! One process-wide [`Runtime`] holds a [`CachingAllocator`] per device (created on first use
//! from the environment, see [`env`]), the Python-stack log, and the dump paths. Every exported
//! function runs its body inside [`std::panic::catch_unwind`]: a bug in memsnap becomes
//! `MEMSNAP_ERR_INTERNAL` and a message in `memsnap_last_error()`, never an unwind into C.
#![allow(unsafe_code)]

mod backend;
pub mod env;
mod host_tensor;
pub mod python;
mod python_stacks;
mod signal;

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Once, OnceLock};

use memsnap_format::{FormatError, Snapshot};
use parking_lot::Mutex;

use crate::device::Stream;
use crate::error::Error;
use crate::history::{ContextMode, HistoryMode, HistoryOptions, StackMode};
use crate::CachingAllocator;
use backend::AnyDevice;
use env::{BackendKind, EnvConfig, StackSelection};
pub use host_tensor::HostTensor;
use python_stacks::PythonStacks;

/// Devices a process may use (CUDA ordinals 0..64).
pub const MAX_DEVICES: usize = 64;

pub const MEMSNAP_OK: c_int = 0;
pub const MEMSNAP_ERR_INVALID_ARGUMENT: c_int = 1;
pub const MEMSNAP_ERR_OUT_OF_MEMORY: c_int = 2;
pub const MEMSNAP_ERR_IO: c_int = 3;
pub const MEMSNAP_ERR_BACKEND: c_int = 4;
pub const MEMSNAP_ERR_INTERNAL: c_int = 5;

/// A failure of a C ABI call: a status code and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FfiError {
    pub code: c_int,
    pub message: String,
}

impl FfiError {
    fn invalid(message: impl Into<String>) -> Self {
        FfiError {
            code: MEMSNAP_ERR_INVALID_ARGUMENT,
            message: message.into(),
        }
    }
}

impl From<Error> for FfiError {
    fn from(err: Error) -> Self {
        let code = match &err {
            Error::OutOfMemory(_) => MEMSNAP_ERR_OUT_OF_MEMORY,
            Error::Device { .. } => MEMSNAP_ERR_BACKEND,
            Error::Dump(_) => MEMSNAP_ERR_IO,
            _ => MEMSNAP_ERR_INVALID_ARGUMENT,
        };
        FfiError {
            code,
            message: err.to_string(),
        }
    }
}

impl From<FormatError> for FfiError {
    fn from(err: FormatError) -> Self {
        FfiError {
            code: MEMSNAP_ERR_IO,
            message: err.to_string(),
        }
    }
}

type FfiResult<T> = Result<T, FfiError>;

// ---- The process-wide state. -------------------------------------------------------------

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
    oom_dump_path: Mutex<Option<PathBuf>>,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static RUNTIME_INIT: Mutex<()> = Mutex::new(());

/// The runtime, created from the environment on first use.
fn runtime() -> FfiResult<&'static Runtime> {
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    init_runtime(None)
}

/// Creates the runtime (once); `backend` overrides `MEMSNAP_BACKEND`.
fn init_runtime(backend: Option<BackendKind>) -> FfiResult<&'static Runtime> {
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
        crate::AllocatorConfig::parse(conf).map_err(|e| FfiError::invalid(e.to_string()))?;
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
        oom_dump_path: Mutex::new(config.dump_path.clone()),
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
    fn device(&self, device: c_int) -> FfiResult<&CachingAllocator<AnyDevice>> {
        let index = usize::try_from(device)
            .ok()
            .filter(|&i| i < MAX_DEVICES)
            .ok_or_else(|| {
                FfiError::invalid(format!("device {device} is out of range 0..{MAX_DEVICES}"))
            })?;
        let slot = self.devices[index].get_or_init(|| self.open_device(index));
        slot.as_ref().map_err(|message| FfiError {
            code: MEMSNAP_ERR_BACKEND,
            message: message.clone(),
        })
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
    fn open_devices(&self) -> impl Iterator<Item = &CachingAllocator<AnyDevice>> {
        self.devices
            .iter()
            .filter_map(|slot| slot.get()?.as_ref().ok())
    }

    fn set_recording(&self, options: HistoryOptions, stacks: StackSelection) {
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

    fn python_context(&self) -> u8 {
        self.python_context.load(Ordering::Relaxed)
    }

    fn malloc(&self, size: u64, device: c_int, stream: Stream) -> FfiResult<u64> {
        let allocator = self.device(device)?;
        let result = if self.python_wanted.load(Ordering::Relaxed) {
            // Captured before any lock: reading Python frames needs the GIL, which the caller
            // holds; lock order is GIL, then memsnap's locks (as in PyTorch).
            let frames = python::capture();
            let mut log = self.python_log.lock();
            let result = allocator.malloc(size, stream);
            if let Ok(ptr) = result {
                if ptr != 0 {
                    log.record_alloc(device as usize, ptr, frames);
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

    fn free(&self, ptr: u64, device: c_int) -> FfiResult<()> {
        let allocator = self.device(device)?;
        if self.python_wanted.load(Ordering::Relaxed) {
            let free_site = (self.python_context() >= ContextMode::All as u8).then(python::capture);
            let mut log = self.python_log.lock();
            allocator.free(ptr)?;
            log.record_free(device as usize, ptr, free_site);
            Ok(())
        } else {
            Ok(allocator.free(ptr)?)
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
        let mut snapshot = merge_device_snapshots(snapshots);
        if self.python_wanted.load(Ordering::Relaxed) || log.has_events() {
            let blocks_too = self.python_context() >= ContextMode::State as u8;
            log.merge_into(&mut snapshot, blocks_too);
        }
        snapshot
    }

    fn dump(&self, path: &Path) -> FfiResult<()> {
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

/// One snapshot of several devices: segments in device order, one trace per device index.
pub fn merge_device_snapshots(snapshots: Vec<Snapshot>) -> Snapshot {
    let devices = snapshots
        .iter()
        .flat_map(|s| s.devices())
        .max()
        .map_or(1, |d| usize::try_from(d).unwrap_or(0) + 1);
    let mut out = Snapshot::new(devices);
    let mut dropped = vec![0u64; devices];
    for source in snapshots {
        let restack = |out: &mut Snapshot, id: Option<memsnap_format::StackId>| {
            id.map(|id| {
                out.intern_stack(trim_to_entry_point(
                    source.stack_frames(id).cloned().collect(),
                ))
            })
        };
        for segment in &source.segments {
            let mut segment = segment.clone();
            segment.frames = restack(&mut out, segment.frames);
            for block in &mut segment.blocks {
                block.frames = restack(&mut out, block.frames);
            }
            out.segments.push(segment);
        }
        for (device, trace) in source.traces().iter().enumerate() {
            if trace.is_empty() {
                continue;
            }
            let mut entries = Vec::with_capacity(trace.len());
            for entry in trace {
                let mut entry = entry.clone();
                entry.frames = restack(&mut out, entry.frames);
                entry.compile_context = entry
                    .compile_context
                    .map(|id| out.strings.intern(source.str(id)));
                entry.user_metadata = entry
                    .user_metadata
                    .map(|id| out.strings.intern(source.str(id)));
                entries.push(entry);
            }
            if let Some(slot) = out.device_traces.as_mut().and_then(|t| t.get_mut(device)) {
                *slot = entries;
            }
        }
        if let Some(info) = &source.recorder_info {
            for (slot, &n) in dropped.iter_mut().zip(&info.dropped_entries) {
                *slot += n;
            }
            if out.recorder_info.is_none() {
                out.recorder_info = Some(info.clone());
            }
        }
        if out.allocator_settings.is_none() {
            out.allocator_settings = source.allocator_settings.clone();
            out.external_annotations = source.external_annotations.clone();
        }
    }
    if let Some(info) = out.recorder_info.as_mut() {
        info.dropped_entries = dropped;
    }
    out
}

/// Drops the frames of the C ABI's own plumbing (`catch_unwind`, the runtime) from the top of
/// a stack: it then starts at the exported function the program called (`memsnap_alloc`, ...).
fn trim_to_entry_point(frames: Vec<memsnap_format::Frame>) -> Vec<memsnap_format::Frame> {
    const ENTRY_POINTS: [&str; 4] = [
        "memsnap_alloc",
        "memsnap_free",
        "memsnap_empty_cache",
        "memsnap_reset_hook",
    ];
    match frames
        .iter()
        .position(|f| ENTRY_POINTS.contains(&f.name.as_str()))
    {
        Some(i) => frames.into_iter().skip(i).collect(),
        None => frames,
    }
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

extern "C" fn dump_at_exit() {
    let _ = catch_unwind(|| {
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

// ---- Errors across the boundary. ----------------------------------------------------------

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = text);
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

/// Runs `body`; a failure or a panic sets the last error and yields `fallback`.
fn guarded<T>(fallback: T, body: impl FnOnce() -> FfiResult<T>) -> (T, c_int) {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => (value, MEMSNAP_OK),
        Ok(Err(err)) => {
            set_last_error(&err.message);
            (fallback, err.code)
        }
        Err(payload) => {
            set_last_error(&format!(
                "internal error in memsnap (please report it): {}",
                panic_message(payload.as_ref())
            ));
            (fallback, MEMSNAP_ERR_INTERNAL)
        }
    }
}

/// [`guarded`] for functions that return only a status.
fn status(body: impl FnOnce() -> FfiResult<()>) -> c_int {
    guarded((), body).1
}

/// A required C string argument as UTF-8.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that outlives the call.
unsafe fn str_arg<'a>(ptr: *const c_char, what: &str) -> FfiResult<&'a str> {
    if ptr.is_null() {
        return Err(FfiError::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated (caller contract).
    unsafe { CStr::from_ptr(ptr) }
        .to_str()
        .map_err(|_| FfiError::invalid(format!("{what} is not UTF-8")))
}

/// An optional C string argument as UTF-8 (`None` for NULL).
///
/// # Safety
/// As [`str_arg`].
unsafe fn opt_str_arg<'a>(ptr: *const c_char, what: &str) -> FfiResult<Option<&'a str>> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: caller contract.
    unsafe { str_arg(ptr, what) }.map(Some)
}

/// A path argument (any bytes but NUL).
///
/// # Safety
/// As [`str_arg`].
unsafe fn path_arg(ptr: *const c_char, what: &str) -> FfiResult<PathBuf> {
    if ptr.is_null() {
        return Err(FfiError::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated (caller contract).
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    if bytes.is_empty() {
        return Err(FfiError::invalid(format!("{what} is empty")));
    }
    Ok(PathBuf::from(OsStr::from_bytes(bytes)))
}

fn stream_arg(stream: *mut c_void) -> Stream {
    Stream(stream as usize as i64)
}

// ---- The exported functions (see memsnap.h for the contract of each). --------------------

#[no_mangle]
pub extern "C" fn memsnap_alloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    let (ptr, _) = guarded(0u64, || {
        if size == 0 {
            return Ok(0);
        }
        runtime()?.malloc(size as u64, device, stream_arg(stream))
    });
    ptr as usize as *mut c_void
}

#[no_mangle]
pub extern "C" fn memsnap_free(
    ptr: *mut c_void,
    _size: usize,
    device: c_int,
    _stream: *mut c_void,
) {
    status(|| {
        if ptr.is_null() {
            return Ok(());
        }
        runtime()?.free(ptr as usize as u64, device)
    });
}

#[no_mangle]
pub extern "C" fn memsnap_init_hook(_device_count: c_int) {
    let code = status(|| runtime().map(|_| ()));
    if code != MEMSNAP_OK {
        eprintln!("memsnap: initialisation failed: {}", last_error_string());
    }
}

#[no_mangle]
pub extern "C" fn memsnap_reset_hook() {
    memsnap_empty_cache();
}

#[no_mangle]
pub extern "C" fn memsnap_memory_fraction_hook(fraction: f64, device: c_int) {
    memsnap_set_memory_fraction(fraction, device);
}

#[no_mangle]
pub extern "C" fn memsnap_record_stream_hook(ptr: *mut c_void, stream: *mut c_void) {
    memsnap_record_stream(ptr, stream);
}

/// # Safety
/// `backend` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memsnap_init(backend: *const c_char) -> c_int {
    status(|| {
        // SAFETY: caller contract.
        let kind = match unsafe { opt_str_arg(backend, "backend") }? {
            Some(name) => Some(BackendKind::parse(name).ok_or_else(|| {
                FfiError::invalid(format!("backend {name:?} is not {}", BackendKind::EXPECTED))
            })?),
            None => None,
        };
        init_runtime(kind).map(|_| ())
    })
}

/// # Safety
/// Each string is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn memsnap_record_history(
    enabled: *const c_char,
    context: *const c_char,
    stacks: *const c_char,
    max_entries: usize,
) -> c_int {
    status(|| {
        // SAFETY: caller contract (all three).
        let (enabled, context, stacks) = unsafe {
            (
                opt_str_arg(enabled, "enabled")?,
                opt_str_arg(context, "context")?,
                opt_str_arg(stacks, "stacks")?,
            )
        };
        let enabled = parse_choice(
            enabled,
            HistoryMode::Off,
            env::parse_history_mode,
            "enabled",
            env::HISTORY_EXPECTED,
        )?;
        let context = parse_choice(
            context,
            ContextMode::All,
            env::parse_context_mode,
            "context",
            env::CONTEXT_EXPECTED,
        )?;
        let stacks = match stacks {
            None => StackSelection::Native,
            Some(v) => StackSelection::parse(v).ok_or_else(|| {
                FfiError::invalid(format!("stacks {v:?} is not {}", StackSelection::EXPECTED))
            })?,
        };
        let max_entries = if max_entries == 0 {
            env::DEFAULT_MAX_ENTRIES
        } else {
            max_entries
        };
        let options = HistoryOptions {
            enabled,
            context,
            max_entries,
            ..HistoryOptions::default()
        };
        runtime()?.set_recording(options, stacks);
        Ok(())
    })
}

/// An optional option string: `default` when absent, an error naming the choices when unknown.
fn parse_choice<T>(
    value: Option<&str>,
    default: T,
    parse: fn(&str) -> Option<T>,
    what: &str,
    expected: &str,
) -> FfiResult<T> {
    match value {
        None => Ok(default),
        Some(v) => {
            parse(v).ok_or_else(|| FfiError::invalid(format!("{what} {v:?} is not {expected}")))
        }
    }
}

/// # Safety
/// `path` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn memsnap_dump_snapshot(path: *const c_char) -> c_int {
    status(|| {
        // SAFETY: caller contract.
        let path = unsafe { path_arg(path, "path") }?;
        runtime()?.dump(&path)
    })
}

/// # Safety
/// `path` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn memsnap_set_oom_dump_path(path: *const c_char) -> c_int {
    status(|| {
        let path = if path.is_null() {
            None
        } else {
            // SAFETY: caller contract.
            Some(unsafe { path_arg(path, "path") }?)
        };
        *runtime()?.oom_dump_path.lock() = path;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn memsnap_empty_cache() -> c_int {
    status(|| {
        let rt = runtime()?;
        for allocator in rt.open_devices() {
            allocator.empty_cache()?;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn memsnap_set_memory_fraction(fraction: f64, device: c_int) -> c_int {
    status(|| {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(FfiError::invalid(format!(
                "memory fraction {fraction} is not in (0, 1]"
            )));
        }
        Ok(runtime()?.device(device)?.set_memory_fraction(fraction)?)
    })
}

#[no_mangle]
pub extern "C" fn memsnap_record_stream(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    status(|| {
        let ptr = ptr as usize as u64;
        let rt = runtime()?;
        let owner = rt.open_devices().find(|a| a.block_size(ptr).is_some());
        match owner {
            Some(allocator) => {
                allocator.record_stream(ptr, stream_arg(stream));
                Ok(())
            }
            None => Err(FfiError::invalid(format!(
                "pointer {ptr:#x} was not allocated by memsnap"
            ))),
        }
    })
}

/// `memsnap_stats` of memsnap.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemsnapStats {
    pub allocated_bytes_current: u64,
    pub allocated_bytes_peak: u64,
    pub reserved_bytes_current: u64,
    pub reserved_bytes_peak: u64,
    pub active_bytes_current: u64,
    pub active_bytes_peak: u64,
    pub requested_bytes_current: u64,
    pub allocation_current: u64,
    pub segment_current: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
}

impl From<&crate::DeviceStats> for MemsnapStats {
    fn from(s: &crate::DeviceStats) -> Self {
        use crate::StatType::All;
        let v = |x: i64| u64::try_from(x).unwrap_or(0);
        MemsnapStats {
            allocated_bytes_current: v(s.allocated_bytes.get(All).current),
            allocated_bytes_peak: v(s.allocated_bytes.get(All).peak),
            reserved_bytes_current: v(s.reserved_bytes.get(All).current),
            reserved_bytes_peak: v(s.reserved_bytes.get(All).peak),
            active_bytes_current: v(s.active_bytes.get(All).current),
            active_bytes_peak: v(s.active_bytes.get(All).peak),
            requested_bytes_current: v(s.requested_bytes.get(All).current),
            allocation_current: v(s.allocation.get(All).current),
            segment_current: v(s.segment.get(All).current),
            num_alloc_retries: s.num_alloc_retries,
            num_ooms: s.num_ooms,
        }
    }
}

/// # Safety
/// `out` is NULL or points to a writable `memsnap_stats`.
#[no_mangle]
pub unsafe extern "C" fn memsnap_get_stats(device: c_int, out: *mut MemsnapStats) -> c_int {
    status(|| {
        if out.is_null() {
            return Err(FfiError::invalid("out is NULL"));
        }
        let stats = MemsnapStats::from(&runtime()?.device(device)?.stats());
        // SAFETY: non-NULL and writable (caller contract); `write` needs no initialised value.
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// The flat `torch.cuda.memory_stats()` dict as a JSON object.
pub fn stats_json(stats: &crate::DeviceStats) -> String {
    let fields: Vec<String> = stats
        .to_flat()
        .into_iter()
        .map(|(key, value)| format!("\"{key}\":{value}"))
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// # Safety
/// `buf` is NULL or has `capacity` writable bytes; `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memsnap_stats_json(
    device: c_int,
    buf: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> c_int {
    status(|| {
        let json = stats_json(&runtime()?.device(device)?.stats());
        if !needed.is_null() {
            // SAFETY: non-NULL and writable (caller contract).
            unsafe { needed.write(json.len()) };
        }
        if buf.is_null() || capacity <= json.len() {
            return Err(FfiError::invalid(format!(
                "the buffer holds {capacity} bytes; the statistics need {} (with the final NUL)",
                json.len() + 1
            )));
        }
        // SAFETY: `buf` has `capacity > json.len()` writable bytes (caller contract), so the
        // text and its NUL fit; the regions cannot overlap (`json` is ours).
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), json.len());
            buf.add(json.len()).write(0);
        }
        Ok(())
    })
}

/// The thread's last error message; valid until the next failing memsnap call on this thread.
#[no_mangle]
pub extern "C" fn memsnap_last_error() -> *const c_char {
    static EMPTY: &CStr = c"";
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| slot.borrow().as_ptr())
            .unwrap_or(EMPTY.as_ptr())
    })
    .unwrap_or(EMPTY.as_ptr())
}

fn last_error_string() -> String {
    LAST_ERROR
        .try_with(|slot| slot.borrow().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Runs `body` the way every exported function runs its body (for tests of the panic guard).
#[doc(hidden)]
pub fn guard_for_tests(body: impl FnOnce()) -> c_int {
    status(|| {
        body();
        Ok(())
    })
}

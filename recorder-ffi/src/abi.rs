//! The exported functions (`memsnap.h` gives the contract of each): PyTorch's pluggable
//! allocator pair `memsnap_alloc`/`memsnap_free` and its hooks, and the control functions.
//!
//! Each one checks its arguments, then runs its body in [`guarded`]/[`status`]: a bug in
//! memsnap becomes `MEMSNAP_ERR_INTERNAL` and a message in `memsnap_last_error()`, never an
//! unwind into C.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use recorder::history::{ContextMode, HistoryMode, HistoryOptions};
use recorder::live::LiveAddr;
use recorder::{DeviceStats, StatType, Stream};

use crate::env::{self, BackendKind, StackSelection};
use crate::error::{guarded, last_error_ptr, last_error_string, status, FfiError, FfiResult};
pub use crate::error::{
    MEMSNAP_ERR_BACKEND, MEMSNAP_ERR_INTERNAL, MEMSNAP_ERR_INVALID_ARGUMENT, MEMSNAP_ERR_IO,
    MEMSNAP_ERR_OUT_OF_MEMORY, MEMSNAP_OK,
};
use crate::runtime::{init_runtime, runtime};

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

/// `memsnap_alloc` with its status: the shim that turns an out-of-memory into PyTorch's
/// `OutOfMemoryError` (python/memsnap/_oom_shim.cpp) needs to tell it from other failures.
///
/// # Safety
/// `out` is NULL or points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn memsnap_alloc_checked(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    out: *mut *mut c_void,
) -> c_int {
    if out.is_null() {
        return status(|| Err(FfiError::invalid("out is NULL")));
    }
    let (ptr, code) = guarded(0u64, || {
        if size == 0 {
            return Ok(0);
        }
        runtime()?.malloc(size as u64, device, stream_arg(stream))
    });
    // SAFETY: `out` is non-NULL and writable (caller contract).
    unsafe { out.write(ptr as usize as *mut c_void) };
    code
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

impl From<&DeviceStats> for MemsnapStats {
    fn from(s: &DeviceStats) -> Self {
        use StatType::All;
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
pub fn stats_json(stats: &DeviceStats) -> String {
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
        // SAFETY: caller contract (forwarded).
        unsafe { write_text(&json, "the statistics", buf, capacity, needed) }
    })
}

/// Writes `text` and a NUL into `buf` and its length into `*needed` (the convention of
/// `memsnap_stats_json`): an error naming `what` when `buf` is NULL or too small.
///
/// # Safety
/// `buf` is NULL or has `capacity` writable bytes; `needed` is NULL or writable.
unsafe fn write_text(
    text: &str,
    what: &str,
    buf: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> FfiResult<()> {
    if !needed.is_null() {
        // SAFETY: non-NULL and writable (caller contract).
        unsafe { needed.write(text.len()) };
    }
    if buf.is_null() || capacity <= text.len() {
        return Err(FfiError::invalid(format!(
            "the buffer holds {capacity} bytes; {what} need {} (with the final NUL)",
            text.len() + 1
        )));
    }
    // SAFETY: `buf` has `capacity > text.len()` writable bytes (caller contract), so the
    // text and its NUL fit; the regions cannot overlap (`text` is ours).
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        buf.add(text.len()).write(0);
    }
    Ok(())
}

/// A device index argument of the live functions.
fn device_index(device: c_int) -> FfiResult<usize> {
    usize::try_from(device)
        .map_err(|_| FfiError::invalid(format!("device {device} is out of range")))
}

/// # Safety
/// `addr` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn memsnap_serve_live(device: c_int, addr: *const c_char) -> c_int {
    status(|| {
        // SAFETY: caller contract.
        let spec = unsafe { opt_str_arg(addr, "addr") }?.unwrap_or("1");
        let addr = LiveAddr::parse(spec).map_err(|e| FfiError::invalid(e.to_string()))?;
        let rt = runtime()?;
        // Creates the allocator (and, under MEMSNAP_LIVE, its endpoint: then this call is
        // refused as a second one for the device).
        rt.device(device)?;
        rt.serve_live(device_index(device)?, addr).map(|_| ())
    })
}

/// # Safety
/// `buf` is NULL or has `capacity` writable bytes; `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memsnap_live_address(
    device: c_int,
    buf: *mut c_char,
    capacity: usize,
    needed: *mut usize,
) -> c_int {
    status(|| {
        let url = runtime()?.live_url(device_index(device)?);
        let Some(url) = url else {
            if !needed.is_null() {
                // SAFETY: non-NULL and writable (caller contract).
                unsafe { needed.write(0) };
            }
            return Err(FfiError::invalid(format!(
                "device {device} is not published (memsnap_serve_live or MEMSNAP_LIVE)"
            )));
        };
        // SAFETY: caller contract (forwarded).
        unsafe { write_text(&url, "the address", buf, capacity, needed) }
    })
}

/// # Safety
/// `stage` and `name` are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn memsnap_annotate(
    device: c_int,
    stage: *const c_char,
    name: *const c_char,
) -> c_int {
    status(|| {
        // SAFETY: caller contract.
        let stage = unsafe { str_arg(stage, "stage") }?;
        // SAFETY: caller contract.
        let name = unsafe { str_arg(name, "name") }?;
        if stage.is_empty() {
            return Err(FfiError::invalid("stage is empty"));
        }
        runtime()?
            .device(device)?
            .record_annotation(&[("stage", stage), ("name", name)]);
        Ok(())
    })
}

/// The thread's last error message; valid until the next failing memsnap call on this thread.
#[no_mangle]
pub extern "C" fn memsnap_last_error() -> *const c_char {
    last_error_ptr()
}

//! `HipDevice`: segments from `hipMalloc` through a small `libloading` shim over
//! `libamdhip64.so`, opened at run time (no ROCm needed to build, or to start without a GPU).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::{Path, PathBuf};

use libloading::Library;

use super::{Device, Event, MemInfo, Stream};
use crate::error::DeviceError;

const HIP_SUCCESS: c_int = 0;
const HIP_ERROR_OUT_OF_MEMORY: c_int = 2;
const HIP_ERROR_NOT_READY: c_int = 600;
const HIP_EVENT_DISABLE_TIMING: c_uint = 2;

type HipEvent = *mut c_void;

/// The HIP runtime functions the allocator uses.
struct HipApi {
    get_device_count: unsafe extern "C" fn(*mut c_int) -> c_int,
    set_device: unsafe extern "C" fn(c_int) -> c_int,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int,
    free: unsafe extern "C" fn(*mut c_void) -> c_int,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    event_create_with_flags: unsafe extern "C" fn(*mut HipEvent, c_uint) -> c_int,
    event_record: unsafe extern "C" fn(HipEvent, *mut c_void) -> c_int,
    event_query: unsafe extern "C" fn(HipEvent) -> c_int,
    event_synchronize: unsafe extern "C" fn(HipEvent) -> c_int,
    event_destroy: unsafe extern "C" fn(HipEvent) -> c_int,
    /// Keeps the function pointers above valid.
    _library: Library,
}

/// One HIP (ROCm) device.
pub struct HipDevice {
    api: HipApi,
    ordinal: c_int,
    total: u64,
}

/// Library names tried by [`HipDevice::new`], then `$ROCM_PATH/lib/libamdhip64.so`.
pub const HIP_LIBRARY_NAMES: [&str; 4] = [
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

impl HipDevice {
    /// Opens HIP device `ordinal` through the usual `libamdhip64` names. Without a ROCm runtime
    /// or a device returns [`DeviceError::Unavailable`].
    pub fn new(ordinal: usize) -> Result<Self, DeviceError> {
        let mut candidates: Vec<PathBuf> = HIP_LIBRARY_NAMES.iter().map(PathBuf::from).collect();
        if let Some(rocm) = std::env::var_os("ROCM_PATH") {
            candidates.push(Path::new(&rocm).join("lib/libamdhip64.so"));
        }
        candidates.push(PathBuf::from("/opt/rocm/lib/libamdhip64.so"));
        for candidate in &candidates {
            // SAFETY: loading the HIP runtime runs its initialisers, which is what using HIP
            // means; nothing else is loaded.
            if let Ok(library) = unsafe { Library::new(candidate) } {
                return Self::from_library(library, ordinal);
            }
        }
        Err(DeviceError::Unavailable {
            backend: "hip",
            reason: format!(
                "the HIP runtime (libamdhip64.so) was not found (tried {}); is ROCm installed?",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }

    /// Opens device `ordinal` through the HIP runtime at `path`.
    pub fn open(path: &Path, ordinal: usize) -> Result<Self, DeviceError> {
        // SAFETY: as in `new`: the caller names a HIP runtime library.
        let library = unsafe { Library::new(path) }.map_err(|e| DeviceError::Unavailable {
            backend: "hip",
            reason: format!("cannot load {}: {e}", path.display()),
        })?;
        Self::from_library(library, ordinal)
    }

    fn from_library(library: Library, ordinal: usize) -> Result<Self, DeviceError> {
        let missing = |name: &str, e: libloading::Error| DeviceError::Unavailable {
            backend: "hip",
            reason: format!("the HIP runtime lacks {name}: {e}"),
        };
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol has the C signature of the field it is stored in (HIP
                // runtime API), and `library` outlives the pointer (stored beside it).
                *unsafe { library.get($name) }.map_err(|e| missing($name, e))?
            };
        }
        let api = HipApi {
            get_device_count: sym!("hipGetDeviceCount"),
            set_device: sym!("hipSetDevice"),
            malloc: sym!("hipMalloc"),
            free: sym!("hipFree"),
            mem_get_info: sym!("hipMemGetInfo"),
            get_error_string: sym!("hipGetErrorString"),
            event_create_with_flags: sym!("hipEventCreateWithFlags"),
            event_record: sym!("hipEventRecord"),
            event_query: sym!("hipEventQuery"),
            event_synchronize: sym!("hipEventSynchronize"),
            event_destroy: sym!("hipEventDestroy"),
            _library: library,
        };
        let ordinal = c_int::try_from(ordinal).map_err(|_| DeviceError::Unavailable {
            backend: "hip",
            reason: format!("device ordinal {ordinal} is out of range"),
        })?;
        let mut count: c_int = 0;
        // SAFETY: `count` is a live out-parameter.
        let rc = unsafe { (api.get_device_count)(&mut count) };
        if rc != HIP_SUCCESS || ordinal >= count {
            return Err(DeviceError::Unavailable {
                backend: "hip",
                reason: format!(
                    "HIP device {ordinal} not available ({} devices; hipGetDeviceCount: {})",
                    count.max(0),
                    error_string(&api, rc)
                ),
            });
        }
        let device = HipDevice {
            api,
            ordinal,
            total: 0,
        };
        let total = device.mem_info()?.total;
        Ok(HipDevice { total, ..device })
    }

    fn check(&self, call: &'static str, rc: c_int) -> Result<(), DeviceError> {
        match rc {
            HIP_SUCCESS => Ok(()),
            HIP_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory { requested: 0 }),
            code => Err(DeviceError::Driver {
                call,
                code: i64::from(code),
                message: error_string(&self.api, code),
            }),
        }
    }

    fn make_current(&self) -> Result<(), DeviceError> {
        // SAFETY: plain call with an ordinal checked against the device count.
        let rc = unsafe { (self.api.set_device)(self.ordinal) };
        self.check("hipSetDevice", rc)
    }
}

fn error_string(api: &HipApi, code: c_int) -> String {
    // SAFETY: hipGetErrorString returns a static NUL-terminated string (or null).
    let ptr = unsafe { (api.get_error_string)(code) };
    if ptr.is_null() {
        return format!("HIP error {code}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

impl Device for HipDevice {
    fn description(&self) -> String {
        format!("HIP device {} ({} bytes)", self.ordinal, self.total)
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        self.make_current()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both out-parameters are live locals.
        let rc = unsafe { (self.api.mem_get_info)(&mut free, &mut total) };
        self.check("hipMemGetInfo", rc)?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn malloc(&self, size: u64) -> Result<u64, DeviceError> {
        self.make_current()?;
        let bytes =
            usize::try_from(size).map_err(|_| DeviceError::OutOfMemory { requested: size })?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a live out-parameter.
        let rc = unsafe { (self.api.malloc)(&mut ptr, bytes) };
        match self.check("hipMalloc", rc) {
            Ok(()) if !ptr.is_null() => Ok(ptr as u64),
            Ok(()) | Err(DeviceError::OutOfMemory { .. }) => {
                Err(DeviceError::OutOfMemory { requested: size })
            }
            Err(e) => Err(e),
        }
    }

    fn free(&self, ptr: u64, _size: u64) -> Result<(), DeviceError> {
        self.make_current()?;
        // SAFETY: `ptr` came from hipMalloc and the allocator frees it once.
        let rc = unsafe { (self.api.free)(ptr as *mut c_void) };
        self.check("hipFree", rc)
    }

    fn record_event(&self, stream: Stream) -> Result<Event, DeviceError> {
        self.make_current()?;
        let mut event: HipEvent = std::ptr::null_mut();
        // SAFETY: `event` is a live out-parameter.
        let rc =
            unsafe { (self.api.event_create_with_flags)(&mut event, HIP_EVENT_DISABLE_TIMING) };
        self.check("hipEventCreateWithFlags", rc)?;
        // SAFETY: `event` was just created; `stream` is the caller's hipStream_t (0: null
        // stream).
        let rc = unsafe { (self.api.event_record)(event, stream.0 as usize as *mut c_void) };
        if let Err(e) = self.check("hipEventRecord", rc) {
            // SAFETY: `event` is valid and not used afterwards.
            unsafe { (self.api.event_destroy)(event) };
            return Err(e);
        }
        Ok(Event(event as usize as u64))
    }

    fn query_event(&self, event: Event) -> Result<bool, DeviceError> {
        // SAFETY: `event` was created by `record_event` and not destroyed yet.
        let rc = unsafe { (self.api.event_query)(event.0 as usize as HipEvent) };
        match rc {
            HIP_ERROR_NOT_READY => Ok(false),
            rc => self.check("hipEventQuery", rc).map(|()| true),
        }
    }

    fn synchronize_event(&self, event: Event) -> Result<(), DeviceError> {
        // SAFETY: `event` was created by `record_event` and not destroyed yet.
        let rc = unsafe { (self.api.event_synchronize)(event.0 as usize as HipEvent) };
        self.check("hipEventSynchronize", rc)
    }

    fn destroy_event(&self, event: Event) {
        // SAFETY: the allocator destroys each event once, after it completed.
        unsafe { (self.api.event_destroy)(event.0 as usize as HipEvent) };
    }
}

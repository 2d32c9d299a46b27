//! Python frames of the calling thread, read through CPython's C API looked up at run time.
//!
//! When the library is loaded into a Python process (ctypes, or PyTorch's
//! `CUDAPluggableAllocator`), the interpreter's symbols are visible to `dlsym(RTLD_DEFAULT)`.
//! Nothing is linked against libpython, so the same library also works in plain C and Rust
//! programs, where [`capture`] returns nothing.
//!
//! By default the GIL is taken for the read when the calling thread does not hold it, as
//! PyTorch's own recorder does: PyTorch releases the GIL inside its operators, so otherwise
//! almost no allocation of a training step would have Python frames (seen with torch 2.11 on
//! an H100: 0 of 6,598 entries). The frames are read before any memsnap lock is taken (lock
//! order: GIL, then memsnap's locks, as in PyTorch). [`PythonGil::HeldOnly`]
//! (`MEMSNAP_PYTHON_GIL=held`) never waits for the GIL: only allocations made while the
//! thread already holds it get frames.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use memsnap_format::Frame;

use crate::env::PythonGil;

/// Deepest Python stack recorded; deeper frames (the outermost) are dropped.
const MAX_PYTHON_FRAMES: usize = 128;

type PyObject = *mut c_void;

/// The CPython functions we call, all in the stable ABI since 3.9 (`PyFrame_GetBack`).
struct PythonApi {
    is_initialized: unsafe extern "C" fn() -> c_int,
    /// `Py_IsFinalizing` (3.13+) or `_Py_IsFinalizing` (earlier): the GIL must not be taken
    /// while the interpreter shuts down.
    is_finalizing: Option<unsafe extern "C" fn() -> c_int>,
    gil_check: unsafe extern "C" fn() -> c_int,
    gil_ensure: unsafe extern "C" fn() -> c_int,
    gil_release: unsafe extern "C" fn(c_int),
    eval_get_frame: unsafe extern "C" fn() -> PyObject,
    frame_get_back: unsafe extern "C" fn(PyObject) -> PyObject,
    frame_get_code: unsafe extern "C" fn(PyObject) -> PyObject,
    frame_get_line_number: unsafe extern "C" fn(PyObject) -> c_int,
    get_attr_string: unsafe extern "C" fn(PyObject, *const c_char) -> PyObject,
    unicode_as_utf8: unsafe extern "C" fn(PyObject) -> *const c_char,
    dec_ref: unsafe extern "C" fn(PyObject),
    err_fetch: unsafe extern "C" fn(*mut PyObject, *mut PyObject, *mut PyObject),
    err_restore: unsafe extern "C" fn(PyObject, PyObject, PyObject),
}

fn lookup(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads the loaded objects'
    // symbol tables.
    let ptr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!ptr.is_null()).then_some(ptr)
}

macro_rules! resolve {
    ($name:literal as $ty:ty) => {{
        let ptr = lookup($name)?;
        // SAFETY: the symbol is CPython's exported function of that name and `$ty` is its
        // documented C signature.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(ptr) }
    }};
}

impl PythonApi {
    fn load() -> Option<PythonApi> {
        Some(PythonApi {
            is_initialized: resolve!(c"Py_IsInitialized" as unsafe extern "C" fn() -> c_int),
            is_finalizing: (|| {
                Some(resolve!(
                    c"Py_IsFinalizing" as unsafe extern "C" fn() -> c_int
                ))
            })()
            .or_else(|| {
                Some(resolve!(
                    c"_Py_IsFinalizing" as unsafe extern "C" fn() -> c_int
                ))
            }),
            gil_check: resolve!(c"PyGILState_Check" as unsafe extern "C" fn() -> c_int),
            gil_ensure: resolve!(c"PyGILState_Ensure" as unsafe extern "C" fn() -> c_int),
            gil_release: resolve!(c"PyGILState_Release" as unsafe extern "C" fn(c_int)),
            eval_get_frame: resolve!(c"PyEval_GetFrame" as unsafe extern "C" fn() -> PyObject),
            frame_get_back: resolve!(
                c"PyFrame_GetBack" as unsafe extern "C" fn(PyObject) -> PyObject
            ),
            frame_get_code: resolve!(
                c"PyFrame_GetCode" as unsafe extern "C" fn(PyObject) -> PyObject
            ),
            frame_get_line_number: resolve!(
                c"PyFrame_GetLineNumber" as unsafe extern "C" fn(PyObject) -> c_int
            ),
            get_attr_string: resolve!(
                c"PyObject_GetAttrString"
                    as unsafe extern "C" fn(PyObject, *const c_char) -> PyObject
            ),
            unicode_as_utf8: resolve!(
                c"PyUnicode_AsUTF8" as unsafe extern "C" fn(PyObject) -> *const c_char
            ),
            dec_ref: resolve!(c"Py_DecRef" as unsafe extern "C" fn(PyObject)),
            err_fetch: resolve!(
                c"PyErr_Fetch" as unsafe extern "C" fn(*mut PyObject, *mut PyObject, *mut PyObject)
            ),
            err_restore: resolve!(
                c"PyErr_Restore" as unsafe extern "C" fn(PyObject, PyObject, PyObject)
            ),
        })
    }
}

fn api() -> Option<&'static PythonApi> {
    static API: OnceLock<Option<PythonApi>> = OnceLock::new();
    API.get_or_init(PythonApi::load).as_ref()
}

/// Whether this process has a Python interpreter whose C API we found.
pub fn available() -> bool {
    api().is_some()
}

/// The calling thread's Python frames, innermost first, or an empty list when there is no
/// interpreter, it is shutting down, or this thread does not hold the GIL and `gil` says not
/// to take it.
pub fn capture(gil: PythonGil) -> Vec<Frame> {
    let Some(api) = api() else {
        return Vec::new();
    };
    // SAFETY: Py_IsInitialized, Py_IsFinalizing and PyGILState_Check may be called from any
    // thread without the GIL. PyGILState_Ensure may be called from any thread of an
    // initialized interpreter that is not finalizing (it creates a thread state if needed) and
    // is paired with PyGILState_Release on the same thread below.
    unsafe {
        if (api.is_initialized)() == 0 || api.is_finalizing.is_some_and(|f| f() != 0) {
            return Vec::new();
        }
        if (api.gil_check)() != 0 {
            return read_frames(api);
        }
        if gil == PythonGil::HeldOnly {
            return Vec::new();
        }
        let state = (api.gil_ensure)();
        let frames = read_frames(api);
        (api.gil_release)(state);
        frames
    }
}

/// The frames of the current thread, leaving any pending exception as it was.
///
/// # Safety
/// The calling thread holds the GIL.
unsafe fn read_frames(api: &PythonApi) -> Vec<Frame> {
    // SAFETY: GIL held (caller contract), which keeps every object we touch alive and
    // unchanged while we read it.
    unsafe {
        // A pending exception must survive our attribute lookups untouched.
        let (mut ty, mut value, mut traceback) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        (api.err_fetch)(&mut ty, &mut value, &mut traceback);
        let frames = walk_frames(api);
        (api.err_restore)(ty, value, traceback);
        frames
    }
}

/// Reads the frame chain of the current thread.
///
/// # Safety
/// The calling thread holds the GIL and no exception is pending.
unsafe fn walk_frames(api: &PythonApi) -> Vec<Frame> {
    let mut out = Vec::new();
    // GIL held (caller contract) throughout. PyFrame_GetBack and PyFrame_GetCode return new
    // references, released below.
    // SAFETY: PyEval_GetFrame returns the current thread's frame, borrowed, or NULL.
    let mut frame = unsafe { (api.eval_get_frame)() };
    let mut frame_is_owned = false;
    while !frame.is_null() && out.len() < MAX_PYTHON_FRAMES {
        // SAFETY: `frame` is a live frame object (borrowed or owned by us).
        let code = unsafe { (api.frame_get_code)(frame) };
        // SAFETY: as above.
        let line = unsafe { (api.frame_get_line_number)(frame) };
        if !code.is_null() {
            // SAFETY: `code` is a live code object we own a reference to.
            let filename = unsafe { string_attr(api, code, c"co_filename") };
            // SAFETY: as above.
            let name = unsafe { string_attr(api, code, c"co_name") };
            // SAFETY: releases the reference PyFrame_GetCode gave us.
            unsafe { (api.dec_ref)(code) };
            out.push(Frame::new(name, filename, i64::from(line)));
        }
        // SAFETY: `frame` is live; the result is a new reference or NULL.
        let back = unsafe { (api.frame_get_back)(frame) };
        if frame_is_owned {
            // SAFETY: releases the reference an earlier PyFrame_GetBack gave us.
            unsafe { (api.dec_ref)(frame) };
        }
        frame = back;
        frame_is_owned = true;
    }
    if frame_is_owned && !frame.is_null() {
        // SAFETY: the frame left over when the depth limit stopped the walk is ours.
        unsafe { (api.dec_ref)(frame) };
    }
    out
}

/// A `str` attribute of `object` as a Rust string (`"??"` when missing or not a string).
///
/// # Safety
/// GIL held; `object` is a live Python object.
unsafe fn string_attr(api: &PythonApi, object: PyObject, attr: &CStr) -> String {
    // SAFETY: caller contract; the result is a new reference or NULL with an exception set.
    let value = unsafe { (api.get_attr_string)(object, attr.as_ptr()) };
    if value.is_null() {
        clear_error(api);
        return "??".to_owned();
    }
    // SAFETY: `value` is live; the UTF-8 buffer it returns lives as long as `value`.
    let utf8 = unsafe { (api.unicode_as_utf8)(value) };
    let text = if utf8.is_null() {
        clear_error(api);
        "??".to_owned()
    } else {
        // SAFETY: a NUL-terminated buffer owned by `value`, copied before `value` is released.
        unsafe { CStr::from_ptr(utf8) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: releases the reference PyObject_GetAttrString gave us.
    unsafe { (api.dec_ref)(value) };
    text
}

/// Drops an exception our own lookup raised.
fn clear_error(api: &PythonApi) {
    let (mut ty, mut value, mut traceback) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: GIL held by every caller; fetching takes the references, which we release.
    unsafe {
        (api.err_fetch)(&mut ty, &mut value, &mut traceback);
        for object in [ty, value, traceback] {
            if !object.is_null() {
                (api.dec_ref)(object);
            }
        }
    }
}

/// Whether a native frame is CPython's bytecode interpreter loop.
pub fn is_interpreter_frame(frame: &Frame) -> bool {
    frame.name.contains("PyEval_EvalFrame")
}

/// Splices Python frames into a native stack the way PyTorch's `stacks="all"` does: each
/// interpreter-loop frame of the native stack is replaced by the next Python frame, and the
/// Python frames left over go at the end. Both stacks are innermost first.
pub fn merge_stacks(native: Vec<Frame>, python: Vec<Frame>) -> Vec<Frame> {
    if python.is_empty() {
        return native;
    }
    let mut python = python.into_iter();
    let mut out = Vec::with_capacity(native.len() + python.len());
    for frame in native {
        if is_interpreter_frame(&frame) {
            if let Some(py) = python.next() {
                out.push(py);
            }
        } else {
            out.push(frame);
        }
    }
    out.extend(python);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str) -> Frame {
        Frame::new(name, "x", 0)
    }

    fn names(frames: &[Frame]) -> Vec<&str> {
        frames.iter().map(|f| f.name.as_str()).collect()
    }

    #[test]
    fn python_frames_replace_interpreter_frames_in_order() {
        let native = vec![
            f("memsnap_alloc"),
            f("at::empty"),
            f("_PyEval_EvalFrameDefault"),
            f("PyObject_Call"),
            f("_PyEval_EvalFrameDefault"),
            f("main"),
        ];
        let python = vec![f("forward"), f("train"), f("<module>")];
        let merged = merge_stacks(native, python);
        assert_eq!(
            names(&merged),
            [
                "memsnap_alloc",
                "at::empty",
                "forward",
                "PyObject_Call",
                "train",
                "main",
                "<module>"
            ]
        );
    }

    #[test]
    fn without_python_frames_the_native_stack_is_unchanged() {
        let native = vec![f("a"), f("_PyEval_EvalFrameDefault"), f("b")];
        assert_eq!(
            names(&merge_stacks(native.clone(), Vec::new())),
            names(&native)
        );
    }

    #[test]
    fn python_only_stacks_pass_through() {
        let merged = merge_stacks(Vec::new(), vec![f("forward"), f("<module>")]);
        assert_eq!(names(&merged), ["forward", "<module>"]);
    }

    #[test]
    fn capture_outside_python_is_empty() {
        // The Rust test binary has no interpreter (no Py_IsInitialized symbol).
        assert!(!available());
        assert!(capture(PythonGil::Acquire).is_empty());
        assert!(capture(PythonGil::HeldOnly).is_empty());
    }
}

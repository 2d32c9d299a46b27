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
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::env::PythonGil;

/// Deepest Python stack recorded; deeper frames (the outermost) are dropped.
const MAX_PYTHON_FRAMES: usize = 128;

type PyObject = *mut c_void;

/// Most code objects the table keeps; frames of code objects beyond it read "??" (a program
/// that makes code objects without end, e.g. `exec` in a loop, must not grow memsnap without
/// end).
const MAX_CODE_OBJECTS: usize = 1 << 20;

/// Most (code object, instruction) pairs whose line is remembered; past it lines are computed
/// at each capture.
const MAX_CACHED_LINES: usize = 1 << 22;

/// The code-table index of frames whose code object did not fit in the table.
const UNKNOWN_CODE: u32 = u32::MAX;

/// One captured Python frame: its code object (an index into the code table) and its line.
/// A capture costs no string work: names and file names are read once per code object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PyFrameRef {
    pub code: u32,
    pub line: i32,
}

/// The code objects seen so far. Each keeps the strong reference `PyFrame_GetCode` gave us
/// (never released, as a traceback holds its code objects), so its address keeps naming that
/// code object and no other; its name and file name are read once, when first seen.
///
/// Lines are remembered per (code object, instruction offset) when CPython has
/// `PyFrame_GetLasti` (3.11+): `PyFrame_GetLineNumber` scans the code's line table, which cost
/// more than everything else a capture does together.
#[derive(Default)]
struct CodeTable {
    by_object: FxHashMap<usize, u32>,
    names: Vec<(String, String)>,
    lines: FxHashMap<(u32, c_int), c_int>,
}

/// Lock order: the GIL, then this (it is never held while waiting for anything else).
static CODES: Mutex<Option<CodeTable>> = Mutex::new(None);

/// The frames of a captured stack, innermost first.
pub fn frames(stack: &[PyFrameRef]) -> Vec<Frame> {
    let codes = CODES.lock();
    stack
        .iter()
        .map(|f| {
            let (name, filename) = codes
                .as_ref()
                .and_then(|t| t.names.get(f.code as usize))
                .map_or(("??", "??"), |(n, file)| (n.as_str(), file.as_str()));
            Frame::new(name, filename, i64::from(f.line))
        })
        .collect()
}

/// A code-table entry with no code object behind it (tests of the stack log).
#[cfg(test)]
pub fn code_for_test(name: &str, filename: &str) -> u32 {
    let mut codes = CODES.lock();
    let table = codes.get_or_insert_with(CodeTable::default);
    table.names.push((name.to_owned(), filename.to_owned()));
    (table.names.len() - 1) as u32
}

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
    /// `PyFrame_GetLasti` (3.11+): the frame's instruction offset, the key of the line cache.
    frame_get_lasti: Option<unsafe extern "C" fn(PyObject) -> c_int>,
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
            frame_get_lasti: (|| {
                Some(resolve!(
                    c"PyFrame_GetLasti" as unsafe extern "C" fn(PyObject) -> c_int
                ))
            })(),
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
pub fn capture(gil: PythonGil) -> Vec<PyFrameRef> {
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

/// The frames of the current thread, innermost first.
///
/// # Safety
/// The calling thread holds the GIL.
unsafe fn read_frames(api: &PythonApi) -> Vec<PyFrameRef> {
    let mut out = Vec::with_capacity(32);
    let mut codes = CODES.lock();
    let codes = codes.get_or_insert_with(CodeTable::default);
    // GIL held (caller contract) throughout. PyFrame_GetBack and PyFrame_GetCode return new
    // references, released below (or, for a code object seen the first time, kept by the
    // table).
    // SAFETY: PyEval_GetFrame returns the current thread's frame, borrowed, or NULL.
    let mut frame = unsafe { (api.eval_get_frame)() };
    let mut frame_is_owned = false;
    while !frame.is_null() && out.len() < MAX_PYTHON_FRAMES {
        // SAFETY: `frame` is a live frame object (borrowed or owned by us).
        let code = unsafe { (api.frame_get_code)(frame) };
        if !code.is_null() {
            let id = match codes.by_object.get(&(code as usize)) {
                Some(&id) => {
                    // SAFETY: the table holds its own reference; this one is ours to release.
                    unsafe { (api.dec_ref)(code) };
                    id
                }
                None if codes.names.len() < MAX_CODE_OBJECTS => {
                    // SAFETY: `code` is a live code object we own a reference to, which the
                    // table keeps from now on.
                    let names = unsafe { code_names(api, code) };
                    codes.names.push(names);
                    let id = (codes.names.len() - 1) as u32;
                    codes.by_object.insert(code as usize, id);
                    id
                }
                None => {
                    // SAFETY: releases the reference PyFrame_GetCode gave us.
                    unsafe { (api.dec_ref)(code) };
                    UNKNOWN_CODE
                }
            };
            // SAFETY: `frame` is a live frame object.
            let line = unsafe { frame_line(api, codes, frame, id) };
            out.push(PyFrameRef { code: id, line });
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

/// The line a frame is at: from the cache when its (code object, instruction offset) was seen
/// before.
///
/// # Safety
/// GIL held; `frame` is a live frame object whose code object is `code` in the table.
unsafe fn frame_line(api: &PythonApi, codes: &mut CodeTable, frame: PyObject, code: u32) -> c_int {
    let Some(get_lasti) = api.frame_get_lasti.filter(|_| code != UNKNOWN_CODE) else {
        // SAFETY: caller contract.
        return unsafe { (api.frame_get_line_number)(frame) };
    };
    // SAFETY: caller contract.
    let lasti = unsafe { get_lasti(frame) };
    if let Some(&line) = codes.lines.get(&(code, lasti)) {
        return line;
    }
    // SAFETY: caller contract.
    let line = unsafe { (api.frame_get_line_number)(frame) };
    if codes.lines.len() < MAX_CACHED_LINES {
        codes.lines.insert((code, lasti), line);
    }
    line
}

/// A code object's `co_name` and `co_filename`, leaving any pending exception as it was.
///
/// # Safety
/// GIL held; `code` is a live code object.
unsafe fn code_names(api: &PythonApi, code: PyObject) -> (String, String) {
    // A pending exception must survive our attribute lookups untouched: it is taken out here
    // and put back below.
    let [ty, value, traceback] = take_error(api);
    // SAFETY: GIL held (caller contract); restoring hands the taken references back.
    unsafe {
        let name = string_attr(api, code, c"co_name");
        let filename = string_attr(api, code, c"co_filename");
        (api.err_restore)(ty, value, traceback);
        (name, filename)
    }
}

/// Takes the pending exception out (type, value, traceback; NULL where none): the caller
/// owns the references. The GIL is held by every caller.
fn take_error(api: &PythonApi) -> [PyObject; 3] {
    let (mut ty, mut value, mut traceback) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: GIL held by every caller; the out-pointers point to live locals.
    unsafe { (api.err_fetch)(&mut ty, &mut value, &mut traceback) };
    [ty, value, traceback]
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
    for object in take_error(api) {
        if !object.is_null() {
            // SAFETY: GIL held by every caller; the reference is ours (taken above).
            unsafe { (api.dec_ref)(object) };
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

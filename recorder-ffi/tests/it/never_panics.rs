//! The C ABI on bad input: status codes and messages, never a panic or a crash. Runs in
//! process: the test loads `libmemsnap_recorder.so` with `dlopen`, as a C program would, and
//! its first `memsnap_init` picks the host backend.
//! Calling the C ABI from Rust is unsafe by nature, hence the local allowance.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::unix::ffi::OsStringExt;
use std::sync::OnceLock;

use super::built_library;

// Status codes of memsnap.h.
const MEMSNAP_OK: c_int = 0;
const MEMSNAP_ERR_INVALID_ARGUMENT: c_int = 1;
const MEMSNAP_ERR_IO: c_int = 3;

/// `memsnap_stats` of memsnap.h: 11 `uint64_t` counters, `allocated_bytes_current` first.
type Stats = [u64; 11];

/// The functions of memsnap.h this test calls, from the loaded library.
struct Abi {
    alloc: unsafe extern "C" fn(usize, c_int, *mut c_void) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void, usize, c_int, *mut c_void),
    init: unsafe extern "C" fn(*const c_char) -> c_int,
    record_history:
        unsafe extern "C" fn(*const c_char, *const c_char, *const c_char, usize) -> c_int,
    dump_snapshot: unsafe extern "C" fn(*const c_char) -> c_int,
    empty_cache: unsafe extern "C" fn() -> c_int,
    set_memory_fraction: unsafe extern "C" fn(f64, c_int) -> c_int,
    record_stream: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    get_stats: unsafe extern "C" fn(c_int, *mut Stats) -> c_int,
    stats_json: unsafe extern "C" fn(c_int, *mut c_char, usize, *mut usize) -> c_int,
    serve_live: unsafe extern "C" fn(c_int, *const c_char) -> c_int,
    live_address: unsafe extern "C" fn(c_int, *mut c_char, usize, *mut usize) -> c_int,
    last_error: unsafe extern "C" fn() -> *const c_char,
}

/// The library, loaded once and never unloaded (the function pointers stay valid).
fn abi() -> &'static Abi {
    static ABI: OnceLock<Abi> = OnceLock::new();
    ABI.get_or_init(|| {
        let path = built_library("libmemsnap_recorder.so");
        let path = CString::new(path.into_os_string().into_vec()).expect("a path without NUL");
        // SAFETY: loads a library by a NUL-terminated path; its initialisers are Rust's.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen {path:?} failed");
        // SAFETY: memsnap.h declares each function with the C signature of its field.
        unsafe {
            Abi {
                alloc: symbol(handle, c"memsnap_alloc"),
                free: symbol(handle, c"memsnap_free"),
                init: symbol(handle, c"memsnap_init"),
                record_history: symbol(handle, c"memsnap_record_history"),
                dump_snapshot: symbol(handle, c"memsnap_dump_snapshot"),
                empty_cache: symbol(handle, c"memsnap_empty_cache"),
                set_memory_fraction: symbol(handle, c"memsnap_set_memory_fraction"),
                record_stream: symbol(handle, c"memsnap_record_stream"),
                get_stats: symbol(handle, c"memsnap_get_stats"),
                stats_json: symbol(handle, c"memsnap_stats_json"),
                serve_live: symbol(handle, c"memsnap_serve_live"),
                live_address: symbol(handle, c"memsnap_live_address"),
                last_error: symbol(handle, c"memsnap_last_error"),
            }
        }
    })
}

/// The function `name` of the library `handle`, as a `T` (a function pointer type).
///
/// # Safety
/// `T` is the C signature of `name`, and `handle` stays open while the result is used.
unsafe fn symbol<T: Copy>(handle: *mut c_void, name: &CStr) -> T {
    assert_eq!(
        size_of::<T>(),
        size_of::<*mut c_void>(),
        "T is a function pointer"
    );
    // SAFETY: looks a NUL-terminated name up in a handle dlopen returned.
    let ptr = unsafe { libc::dlsym(handle, name.as_ptr()) };
    assert!(!ptr.is_null(), "{name:?} is not exported");
    // SAFETY: a function pointer has the size of a data pointer (checked) and `ptr` is the
    // function's address (caller contract on `T`).
    unsafe { std::mem::transmute_copy::<*mut c_void, T>(&ptr) }
}

fn last_error() -> String {
    // SAFETY: memsnap_last_error returns a NUL-terminated string valid until the next
    // failing call on this thread.
    unsafe { CStr::from_ptr((abi().last_error)()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn bad_input_gives_status_codes_and_messages() {
    // Every call below passes NULL, NUL-terminated literals or valid out-pointers, as
    // memsnap.h requires; the point is what memsnap does with bad *values*.
    let abi = abi();
    // SAFETY: see above.
    unsafe {
        assert_eq!((abi.init)(c"host".as_ptr()), MEMSNAP_OK, "{}", last_error());
        assert_eq!((abi.init)(c"tpu".as_ptr()), MEMSNAP_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("tpu"), "{}", last_error());
        assert_eq!(
            (abi.init)(c"simulated".as_ptr()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("cannot switch"), "{}", last_error());

        // Free of an unknown pointer: nothing happens, the message names the pointer.
        (abi.free)(0xdead_0000usize as *mut c_void, 16, 0, std::ptr::null_mut());
        assert!(last_error().contains("0xdead0000"), "{}", last_error());
        // Free of NULL is a no-op that sets no error.
        (abi.free)(std::ptr::null_mut(), 0, 0, std::ptr::null_mut());
        assert!(last_error().contains("0xdead0000"));

        // Devices out of range.
        assert!((abi.alloc)(16, -1, std::ptr::null_mut()).is_null());
        assert!(last_error().contains("device -1"), "{}", last_error());
        assert!((abi.alloc)(16, 100_000, std::ptr::null_mut()).is_null());
        (abi.free)(0x1000usize as *mut c_void, 16, -7, std::ptr::null_mut());
        assert!(last_error().contains("device -7"), "{}", last_error());

        // Size 0 is NULL without error; an impossible size is out of memory.
        assert!((abi.alloc)(0, 0, std::ptr::null_mut()).is_null());
        assert!((abi.alloc)(1 << 60, 0, std::ptr::null_mut()).is_null());
        assert!(last_error().contains("out of memory"), "{}", last_error());

        // NULL and malformed strings.
        assert_eq!(
            (abi.dump_snapshot)(std::ptr::null()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("NULL"), "{}", last_error());
        assert_eq!(
            (abi.dump_snapshot)(c"".as_ptr()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            (abi.dump_snapshot)(c"/nonexistent-dir/x/y.pickle".as_ptr()),
            MEMSNAP_ERR_IO
        );
        assert_eq!(
            (abi.record_history)(c"sometimes".as_ptr(), std::ptr::null(), std::ptr::null(), 0),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        let not_utf8: &[u8] = b"\xff\xfe\0";
        assert_eq!(
            (abi.record_history)(
                not_utf8.as_ptr().cast::<c_char>(),
                std::ptr::null(),
                std::ptr::null(),
                0
            ),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            (abi.record_history)(c"all".as_ptr(), c"all".as_ptr(), c"cpp++".as_ptr(), 0),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );

        // Numbers out of range.
        assert_eq!(
            (abi.set_memory_fraction)(2.0, 0),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            (abi.set_memory_fraction)(f64::NAN, 0),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            (abi.set_memory_fraction)(0.5, -1),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            (abi.record_stream)(0x4242usize as *mut c_void, std::ptr::null_mut()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );

        // Output pointers.
        assert_eq!(
            (abi.get_stats)(0, std::ptr::null_mut()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        let mut needed = 0usize;
        assert_eq!(
            (abi.stats_json)(0, std::ptr::null_mut(), 0, &mut needed),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert!(needed > 100, "the JSON has every PyTorch key");
        let mut small = [0 as c_char; 8];
        assert_eq!(
            (abi.stats_json)(0, small.as_mut_ptr(), small.len(), std::ptr::null_mut()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        let mut buf = vec![0 as c_char; needed + 1];
        assert_eq!(
            (abi.stats_json)(0, buf.as_mut_ptr(), buf.len(), &mut needed),
            MEMSNAP_OK
        );
        let json = CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
        assert!(json.starts_with('{') && json.ends_with('}'));
        assert!(
            json.contains("\"num_ooms\":1"),
            "the 1 << 60 request counted: {json}"
        );

        // Live endpoints: bad addresses and devices, an address asked before any exists.
        let mut needed = 7usize;
        assert_eq!(
            (abi.live_address)(0, std::ptr::null_mut(), 0, &mut needed),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(needed, 0, "no address: nothing needed");
        assert!(last_error().contains("not published"), "{}", last_error());
        for bad in [c"tcp:8.8.8.8:80", c"bogus", c"unix:"] {
            assert_eq!(
                (abi.serve_live)(0, bad.as_ptr()),
                MEMSNAP_ERR_INVALID_ARGUMENT
            );
            assert!(last_error().contains("live address"), "{}", last_error());
        }
        assert_eq!(
            (abi.serve_live)(0, c"unix:/nonexistent-dir/x/live.sock".as_ptr()),
            MEMSNAP_ERR_IO
        );
        assert_eq!(
            (abi.serve_live)(-1, c"tcp:127.0.0.1:0".as_ptr()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            (abi.serve_live)(0, not_utf8.as_ptr().cast::<c_char>()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            (abi.live_address)(-3, std::ptr::null_mut(), 0, std::ptr::null_mut()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );

        // A working call still works after all that.
        let ptr = (abi.alloc)(4096, 0, std::ptr::null_mut());
        assert!(!ptr.is_null(), "{}", last_error());
        let mut stats = [0u64; 11];
        assert_eq!((abi.get_stats)(0, &mut stats), MEMSNAP_OK);
        assert!(stats[0] >= 4096, "allocated_bytes_current");
        (abi.free)(ptr, 4096, 0, std::ptr::null_mut());
        assert_eq!((abi.empty_cache)(), MEMSNAP_OK);
    }
}

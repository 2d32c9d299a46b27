//! The C ABI on bad input: status codes and messages, never a panic or a crash. Runs in
//! process on the host backend (the first `memsnap_init` of this test binary).
//! Calling the C ABI from Rust is unsafe by nature, hence the local allowance.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr};

use memsnap_recorder::ffi::*;

fn last_error() -> String {
    // SAFETY: memsnap_last_error returns a NUL-terminated string valid until the next
    // failing call on this thread.
    unsafe { CStr::from_ptr(memsnap_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn bad_input_gives_status_codes_and_messages() {
    // Every call below passes NULL, NUL-terminated literals or valid out-pointers, as
    // memsnap.h requires; the point is what memsnap does with bad *values*.
    // SAFETY: see above.
    unsafe {
        assert_eq!(
            memsnap_init(c"host".as_ptr()),
            MEMSNAP_OK,
            "{}",
            last_error()
        );
        assert_eq!(memsnap_init(c"tpu".as_ptr()), MEMSNAP_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("tpu"), "{}", last_error());
        assert_eq!(
            memsnap_init(c"simulated".as_ptr()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("cannot switch"), "{}", last_error());

        // Free of an unknown pointer: nothing happens, the message names the pointer.
        memsnap_free(0xdead_0000usize as *mut c_void, 16, 0, std::ptr::null_mut());
        assert!(last_error().contains("0xdead0000"), "{}", last_error());
        // Free of NULL is a no-op that sets no error.
        memsnap_free(std::ptr::null_mut(), 0, 0, std::ptr::null_mut());
        assert!(last_error().contains("0xdead0000"));

        // Devices out of range.
        assert!(memsnap_alloc(16, -1, std::ptr::null_mut()).is_null());
        assert!(last_error().contains("device -1"), "{}", last_error());
        assert!(memsnap_alloc(16, 100_000, std::ptr::null_mut()).is_null());
        memsnap_free(0x1000usize as *mut c_void, 16, -7, std::ptr::null_mut());
        assert!(last_error().contains("device -7"), "{}", last_error());

        // Size 0 is NULL without error; an impossible size is out of memory.
        assert!(memsnap_alloc(0, 0, std::ptr::null_mut()).is_null());
        assert!(memsnap_alloc(1 << 60, 0, std::ptr::null_mut()).is_null());
        assert!(last_error().contains("out of memory"), "{}", last_error());

        // NULL and malformed strings.
        assert_eq!(
            memsnap_dump_snapshot(std::ptr::null()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("NULL"), "{}", last_error());
        assert_eq!(
            memsnap_dump_snapshot(c"".as_ptr()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            memsnap_dump_snapshot(c"/nonexistent-dir/x/y.pickle".as_ptr()),
            MEMSNAP_ERR_IO
        );
        assert_eq!(
            memsnap_record_history(c"sometimes".as_ptr(), std::ptr::null(), std::ptr::null(), 0),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        let not_utf8: &[u8] = b"\xff\xfe\0";
        assert_eq!(
            memsnap_record_history(
                not_utf8.as_ptr().cast::<c_char>(),
                std::ptr::null(),
                std::ptr::null(),
                0
            ),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            memsnap_record_history(c"all".as_ptr(), c"all".as_ptr(), c"cpp++".as_ptr(), 0),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );

        // Numbers out of range.
        assert_eq!(
            memsnap_set_memory_fraction(2.0, 0),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            memsnap_set_memory_fraction(f64::NAN, 0),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            memsnap_set_memory_fraction(0.5, -1),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            memsnap_record_stream(0x4242usize as *mut c_void, std::ptr::null_mut()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );

        // Output pointers.
        assert_eq!(
            memsnap_get_stats(0, std::ptr::null_mut()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        let mut needed = 0usize;
        assert_eq!(
            memsnap_stats_json(0, std::ptr::null_mut(), 0, &mut needed),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        assert!(needed > 100, "the JSON has every PyTorch key");
        let mut small = [0 as c_char; 8];
        assert_eq!(
            memsnap_stats_json(0, small.as_mut_ptr(), small.len(), std::ptr::null_mut()),
            MEMSNAP_ERR_INVALID_ARGUMENT
        );
        let mut buf = vec![0 as c_char; needed + 1];
        assert_eq!(
            memsnap_stats_json(0, buf.as_mut_ptr(), buf.len(), &mut needed),
            MEMSNAP_OK
        );
        let json = CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
        assert!(json.starts_with('{') && json.ends_with('}'));
        assert!(
            json.contains("\"num_ooms\":1"),
            "the 1 << 60 request counted: {json}"
        );

        // A working call still works after all that.
        let ptr = memsnap_alloc(4096, 0, std::ptr::null_mut());
        assert!(!ptr.is_null(), "{}", last_error());
        let mut stats = MemsnapStats::default();
        assert_eq!(memsnap_get_stats(0, &mut stats), MEMSNAP_OK);
        assert!(stats.allocated_bytes_current >= 4096);
        memsnap_free(ptr, 4096, 0, std::ptr::null_mut());
        assert_eq!(memsnap_empty_cache(), MEMSNAP_OK);
    }
}

#[test]
fn panics_inside_are_caught_and_reported() {
    // The guard every exported function uses: a panic becomes MEMSNAP_ERR_INTERNAL.
    let code = memsnap_recorder::ffi::guard_for_tests(|| panic!("boom"));
    assert_eq!(code, MEMSNAP_ERR_INTERNAL);
    assert!(last_error().contains("boom"), "{}", last_error());
}

//! The pickle reader on arbitrary bytes: errors are fine, panics, aborts, timeouts and
//! unbounded allocations are bugs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memsnap_format::pickle::read(data);
});

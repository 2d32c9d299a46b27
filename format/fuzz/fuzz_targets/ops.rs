//! The opcode decoder (`pickle::ops`) on arbitrary bytes: it never panics, hands out opcodes
//! back to back (each starts where the last one ended, its argument inside the input), and
//! stops only at STOP or with an error at the cursor. Differential: whatever the full reader
//! accepts, the decoder walks to a STOP without an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memsnap_format::pickle::ops::{op, Ops};

fuzz_target!(|data: &[u8]| {
    let mut ops = Ops::new(data);
    let mut reached_stop = false;
    loop {
        let at = ops.offset();
        match ops.next_op() {
            Ok(decoded) => {
                assert_eq!(decoded.offset, at);
                assert!(ops.offset() > at && ops.offset() <= data.len());
                assert!(decoded.arg.len() < ops.offset() - at);
                let arg_start = decoded.arg.as_ptr() as usize - data.as_ptr() as usize;
                assert!(arg_start > at && arg_start + decoded.arg.len() <= ops.offset());
                if decoded.code == op::STOP {
                    reached_stop = true;
                    break;
                }
            }
            Err(_) => {
                assert_eq!(ops.offset(), at, "an error moved the cursor");
                break;
            }
        }
    }
    if memsnap_format::pickle::read(data).is_ok() {
        assert!(reached_stop, "the reader accepted what the decoder could not walk");
    }
});

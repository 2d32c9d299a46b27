//! Differential: the pickle reader's trace-entry fast path against its generic VM, and a
//! stream read in small pieces (on this thread, and read ahead on another) against a slice.
//! All must accept the same inputs with the same snapshot, or refuse them with the same error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memsnap_format::{compare, pickle};

#[path = "pieces.rs"]
mod pieces;
use pieces::Pieces;

fuzz_target!(|data: &[u8]| {
    let fast = pickle::read_with_fast_path(data, true).map(|(s, _)| s);
    let generic = pickle::read_with_fast_path(data, false).map(|(s, _)| s);
    let streamed = pickle::read_from(Pieces(data), data.len() as u64, &mut |_, _| true);
    let ahead = pickle::read_ahead_from(Pieces(data), data.len() as u64, &mut |_, _| true);
    for (name, other) in [
        ("generic", generic),
        ("streamed", streamed),
        ("read ahead", ahead),
    ] {
        match (&fast, other) {
            (Ok(a), Ok(b)) => {
                if let Some(d) = compare::diff(a, &b) {
                    panic!("fast vs {name}: {d}");
                }
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "fast vs {name}"),
            (a, b) => panic!("fast {:?} vs {name} {:?}", a.is_ok(), b.is_ok()),
        }
    }
});

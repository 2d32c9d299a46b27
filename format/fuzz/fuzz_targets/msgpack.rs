//! memsnap's msgpack reader on arbitrary bytes: it must return, never panic; whatever it
//! accepts, the writer writes (or refuses with an error) and the reader reads back the same
//! snapshot.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memsnap_format::{compare, msgpack};

fuzz_target!(|data: &[u8]| {
    let Ok(snapshot) = msgpack::read(data) else {
        return;
    };
    // The writer may refuse a model it cannot write faithfully (an id out of range).
    let Ok(bytes) = msgpack::to_vec(&snapshot) else {
        return;
    };
    let again = msgpack::read(&bytes).expect("our own output must read back");
    if let Some(d) = compare::diff(&snapshot, &again) {
        panic!("msgpack round trip: {d}");
    }
});

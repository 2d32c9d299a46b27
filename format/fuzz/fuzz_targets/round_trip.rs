//! Whatever the reader accepts, the writer must write and the reader read back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memsnap_format::pickle;

fuzz_target!(|data: &[u8]| {
    if let Ok(snapshot) = pickle::read(data) {
        let bytes = pickle::to_vec(&snapshot);
        let again = pickle::read(&bytes).expect("our own output must read back");
        assert_eq!(snapshot.entry_count(), again.entry_count());
        assert_eq!(snapshot.segments.len(), again.segments.len());
    }
});

//! The live protocol reader (`live::FrameReader` then `live::LiveSnapshot::apply`) on
//! arbitrary bytes, fed in two pieces at a point the input chooses: it never panics, an error
//! is final, and what it accepted keeps the snapshot's ids resolving.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memsnap_format::live::{FrameReader, LiveSnapshot};

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |&b| b as usize).min(data.len());
    let mut reader = FrameReader::new();
    let mut live = LiveSnapshot::new();
    'feed: for piece in [&data[..split], &data[split..]] {
        reader.push(piece);
        loop {
            match reader.next_message() {
                Ok(Some(message)) => {
                    if live.apply(message).is_err() {
                        break 'feed;
                    }
                }
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
    }
    if let Some(snapshot) = live.snapshot() {
        assert!(memsnap_format::compare::check_ids(snapshot).is_ok());
    }
});

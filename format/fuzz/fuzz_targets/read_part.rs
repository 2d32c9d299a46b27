//! Differential: reading only the segments (`pickle::read_part`, from a slice and from a
//! stream read in 7-byte pieces) against the whole read. Whatever the whole read accepts, the
//! part read accepts with the same segments; where the part read fails, the whole read fails
//! too; the slice and the stream always agree.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use memsnap_format::pickle::{self, Part};
use memsnap_format::Snapshot;

/// Hands out 7 bytes per read, so the first piece read ends inside an opcode.
struct Pieces<'a>(&'a [u8]);

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.0.len()).min(7);
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

/// The snapshot as a pickle of its segments alone (stack ids differ between the two reads).
fn segments_of(s: &Snapshot) -> Vec<u8> {
    let mut only = s.clone();
    only.device_traces = None;
    only.allocator_settings = None;
    only.external_annotations = None;
    only.host_segments = None;
    only.host_traces = None;
    only.recorder_info = None;
    pickle::to_vec(&only)
}

fuzz_target!(|data: &[u8]| {
    let part = pickle::read_part(data, Part::Segments, &mut |_, _| true);
    let stream = pickle::read_part_from(Pieces(data), data.len() as u64, Part::Segments, &mut |_, _| true);
    match (&part, &stream) {
        (Ok(a), Ok(b)) => assert_eq!(segments_of(a), segments_of(b), "slice vs stream"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "slice vs stream"),
        _ => panic!("slice {:?} vs stream {:?}", part.is_ok(), stream.is_ok()),
    }
    match (pickle::read(data), part) {
        (Ok(w), Ok(p)) => assert_eq!(segments_of(&w), segments_of(&p), "whole vs part"),
        // Both fail; the whole read may name a later error first (it runs the VM to the end
        // before converting the segments).
        (Err(_), Err(_)) => {}
        (Err(_), Ok(_)) => {} // damage behind the segments is not read
        (Ok(_), Err(p)) => panic!("only the part read fails: {p}"),
    }
});

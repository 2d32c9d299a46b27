//! Differential: reading only the segments (`pickle::read_part`, from a slice and from a
//! stream read in 7-byte pieces) against the whole read. Whatever the whole read accepts, the
//! part read accepts with the same segments; where the part read fails, the whole read fails
//! too; the slice and the stream always agree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memsnap_format::pickle::{self, Part};
use memsnap_format::{Shape, Snapshot};

#[path = "pieces.rs"]
mod pieces;
use pieces::Pieces;

/// The segments as a pickle (stack ids differ between the reads; the written bytes do not).
fn segments_of(s: &Snapshot) -> Vec<u8> {
    pickle::to_vec(&Part::Segments.of(s))
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
        // A STOP behind the segments can make another value the root (a bare list): the part
        // read does not read that far, as documented.
        (Ok(w), _) if w.shape != Shape::Dict => {}
        (Ok(w), Ok(p)) => assert_eq!(segments_of(&w), segments_of(&p), "whole vs part"),
        // Both fail; the whole read may name a later error first (it runs the VM to the end
        // before converting the segments).
        (Err(_), Err(_)) => {}
        (Err(_), Ok(_)) => {} // damage behind the segments is not read
        (Ok(_), Err(p)) => panic!("only the part read fails: {p}"),
    }
});

//! `pickle::read_part`: reading only the segments gives the segments of the whole read, stops
//! before the trace, and turns damaged input into errors with byte offsets, never panics.

use std::io::Cursor;

use memsnap_format::pickle::{self, Part};
use memsnap_format::{
    Action, Block, BlockState, FormatError, Frame, Segment, Snapshot, TraceEntry,
};

use crate::common::real_snapshots;

/// The segments of `s` as a pickle (stack ids differ between reads; the written bytes do not).
fn segments_of(s: &Snapshot) -> Vec<u8> {
    pickle::to_vec(&Part::Segments.of(s))
}

fn segments_only(bytes: &[u8]) -> memsnap_format::Result<Snapshot> {
    pickle::read_part(bytes, Part::Segments, &mut |_, _| true)
}

fn streamed(bytes: &[u8]) -> memsnap_format::Result<Snapshot> {
    pickle::read_part_from(
        Cursor::new(bytes),
        bytes.len() as u64,
        Part::Segments,
        &mut |_, _| true,
    )
}

/// Two segments with blocks and stacks, then a short trace.
fn small_file() -> Vec<u8> {
    let mut s = Snapshot::new(1);
    let stack = s.intern_stack([
        Frame::new("forward", "model.py", 7u64),
        Frame::new("main", "train.py", 1u64),
    ]);
    for (i, base) in [0x7f00_0000_0000u64, 0x7f00_0400_0000]
        .into_iter()
        .enumerate()
    {
        let mut seg = Segment::new(0, base, 4 << 20, i as i64);
        let mut used = Block::new(base, 3 << 20, BlockState::ActiveAllocated);
        used.requested_size = Some((3 << 20) - 100);
        used.frames = Some(stack);
        seg.blocks = vec![
            used,
            Block::new(base + (3 << 20), 1 << 20, BlockState::Inactive),
        ];
        seg.allocated_size = Some(3 << 20);
        seg.active_size = Some(3 << 20);
        seg.requested_size = Some((3 << 20) - 100);
        s.segments.push(seg);
    }
    let trace = &mut s.device_traces.as_mut().expect("traces")[0];
    for i in 0..20u64 {
        let mut e = TraceEntry::new(Action::Alloc, 0x7f00_0000_0000 + 512 * i, 512, 0);
        e.frames = Some(stack);
        trace.push(e);
    }
    pickle::to_vec(&s)
}

#[test]
fn segments_only_read_matches_the_whole_read_on_every_real_file() {
    let Some(files) = real_snapshots() else {
        return;
    };
    for file in files {
        let bytes = std::fs::read(&file).expect("real file");
        let name = file.display();
        let whole = pickle::read(&bytes).expect("whole read");
        let part = segments_only(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(segments_of(&part), segments_of(&whole), "{name}");
        let from_stream = streamed(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(segments_of(&from_stream), segments_of(&whole), "{name}");
        // Every dict file has PyTorch's layout: the trace behind the segments is never read.
        if whole.device_traces.is_some() {
            assert!(part.device_traces.is_none(), "{name}: the trace was read");
        }
    }
}

#[test]
fn a_file_cut_anywhere_gives_the_segments_or_an_error_with_its_offset() {
    let bytes = small_file();
    let whole = pickle::read(&bytes).expect("whole");
    for len in 0..bytes.len() {
        let cut = &bytes[..len];
        let (slice, stream) = (segments_only(cut), streamed(cut));
        match (&slice, &stream) {
            (Ok(a), Ok(b)) => {
                assert_eq!(segments_of(a), segments_of(&whole), "cut at {len}");
                assert_eq!(segments_of(b), segments_of(&whole), "cut at {len}");
            }
            (Err(FormatError::Pickle { offset, .. }), Err(b)) => {
                assert!(
                    *offset <= len as u64,
                    "cut at {len}: error at byte {offset}"
                );
                assert_eq!(
                    slice.as_ref().err().map(|e| e.to_string()),
                    Some(b.to_string())
                );
            }
            _ => panic!("cut at {len}: slice {slice:?} vs stream {stream:?}"),
        }
    }
}

/// Every byte of a small file replaced by a few values: the segments-only read never panics,
/// accepts whatever the whole read accepts (with the same segments), and fails only where the
/// whole read fails too.
#[test]
fn hostile_bytes_fail_as_the_whole_read_fails() {
    let bytes = small_file();
    for at in 0..bytes.len() {
        for value in [0x00, 0x28, 0x75, 0x8c, 0x93, 0xff] {
            let mut bad = bytes.clone();
            bad[at] = value;
            let whole = pickle::read(&bad);
            let part = segments_only(&bad);
            match (&whole, &part) {
                (Ok(w), Ok(p)) => {
                    assert_eq!(segments_of(p), segments_of(w), "byte {at} = {value:#x}")
                }
                // Both fail; the whole read may name a later error first (the VM runs to
                // the end before the segments are converted).
                (Err(_), Err(_)) => {}
                // Damage behind the segments is not read.
                (Err(_), Ok(_)) => {}
                (Ok(_), Err(p)) => panic!("byte {at} = {value:#x}: only the part fails: {p}"),
            }
        }
    }
}

/// Regression (found by the `read_part` fuzz target): an unknown top-level key behind the
/// segments is kept by the whole read in `extra` and never seen by the segments-only read;
/// `Part::Segments.of` must drop it too.
#[test]
fn unknown_top_level_keys_behind_the_segments_are_not_read() {
    let mut s = pickle::read(&small_file()).expect("small file");
    s.extra = vec![("allocatorOsettings".into(), memsnap_format::Value::Int(1))];
    let bytes = pickle::to_vec(&s);
    let part = segments_only(&bytes).expect("segments");
    assert!(part.extra.is_empty());
    assert_eq!(
        segments_of(&part),
        segments_of(&pickle::read(&bytes).expect("whole"))
    );
}

/// Documented limit (found by the `read_part` fuzz target): bytes behind the segments are not
/// read, so a `STOP` there that makes a later value the root (as CPython would) goes unseen.
#[test]
fn a_stop_behind_the_segments_that_changes_the_root_is_not_read() {
    let mut bytes = b"\x80\x04}(\x8c\x08segments]".to_vec();
    bytes.extend_from_slice(b"\x8c\x0ddevice_traces].");
    let whole = pickle::read(&bytes).expect("whole");
    assert_eq!(whole.shape, memsnap_format::Shape::SegmentList);
    let part = segments_only(&bytes).expect("part");
    assert_eq!(part.shape, memsnap_format::Shape::Dict);
    assert!(part.segments.is_empty());
}

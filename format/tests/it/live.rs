//! The live protocol (`format::live`): what a listener accepts, and the clear errors for what
//! it refuses.

use memsnap_format::live::{
    encode, Applied, Bytes, EntryBatch, FrameReader, LiveAnnotation, LiveEntry, LiveError,
    LiveSnapshot, Message, MAX_FRAME_BYTES, PROTOCOL_VERSION,
};
use memsnap_format::{msgpack, Frame, Snapshot};
use proptest::prelude::*;

fn hello() -> Message {
    Message::Hello {
        protocol: PROTOCOL_VERSION,
        producer: "test".into(),
        device: 0,
    }
}

fn state() -> Message {
    Message::State {
        snapshot: Bytes(msgpack::to_vec(&Snapshot::new(1)).unwrap()),
        next_seq: 5,
    }
}

fn entry(stack: Option<u32>) -> LiveEntry {
    LiveEntry {
        action: 0,
        addr: 0x1000,
        size: 512,
        stream: 0,
        time_us: 1,
        stack,
    }
}

fn batch() -> Message {
    Message::Entries(EntryBatch {
        first_seq: 5,
        frames: vec![Frame::new("forward", "model.py", 3)],
        stacks: vec![vec![0, 0]],
        entries: vec![entry(Some(0)), entry(None)],
    })
}

/// The messages as one byte stream.
fn stream(messages: &[Message]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        encode(m, &mut out).unwrap();
    }
    out
}

/// Feeds `bytes` one byte at a time (the worst split) and applies what comes out.
fn apply_all(bytes: &[u8]) -> Result<LiveSnapshot, LiveError> {
    let mut reader = FrameReader::new();
    let mut live = LiveSnapshot::new();
    for b in bytes {
        reader.push(std::slice::from_ref(b));
        while let Some(m) = reader.next_message()? {
            live.apply(m)?;
        }
    }
    Ok(live)
}

#[test]
fn a_stream_split_anywhere_rebuilds_the_same_trace() {
    let bytes = stream(&[hello(), state(), batch()]);
    if let Some(dir) = std::env::var_os("MEMSNAP_LIVE_FUZZ_SEEDS") {
        let dir = std::path::Path::new(&dir);
        std::fs::write(dir.join("valid"), &bytes).unwrap();
        std::fs::write(dir.join("segments"), stream(&segment_stream())).unwrap();
    }
    let live = apply_all(&bytes).unwrap();
    assert_eq!(live.next_seq(), 7);
    let snap = live.into_snapshot().unwrap();
    let trace = &snap.traces()[0];
    assert_eq!(trace.len(), 2);
    let stack = snap.stacks.get(trace[0].frames.unwrap());
    assert_eq!(stack.len(), 2);
    assert_eq!(trace[1].frames, None);
}

/// Segments made, split, freed, mapped and unmapped after the state, and annotations: what
/// the listener's segment model and annotation list take in.
fn segment_stream() -> Vec<Message> {
    use memsnap_format::live::action_tag;
    use memsnap_format::Action::*;
    const MIB: u64 = 1 << 20;
    let entries = [
        (SegmentAlloc, 0, 2 * MIB),
        (Alloc, 0, 4096),
        (Alloc, 4096, 1000),
        (FreeRequested, 0, 4096),
        (FreeCompleted, 0, 4096),
        (SegmentMap, 64 * MIB, 4 * MIB),
        (SegmentMap, 68 * MIB, 4 * MIB),
        (Alloc, 64 * MIB, 3 * MIB),
        (SegmentUnmap, 69 * MIB, 2 * MIB),
        (FreeCompleted, 4096, 1000),
        (SegmentFree, 0, 2 * MIB),
    ]
    .map(|(action, addr, size)| LiveEntry {
        action: action_tag(action).unwrap(),
        addr,
        size,
        ..entry(None)
    });
    vec![
        hello(),
        state(),
        Message::Entries(EntryBatch {
            first_seq: 5,
            entries: entries.to_vec(),
            ..Default::default()
        }),
        annotations(&["ProfilerStep#1"]),
    ]
}

#[test]
fn segments_follow_the_entries_after_the_state() {
    let mut live = apply_all(&stream(&segment_stream())).unwrap();
    let snap = live.snapshot().unwrap();
    assert_eq!(memsnap_format::validate(snap), vec![]);
    let shape: Vec<(u64, u64, usize)> = snap
        .segments
        .iter()
        .map(|s| (s.address, s.total_size, s.blocks.len()))
        .collect();
    const MIB: u64 = 1 << 20;
    // The 2 MiB segment was freed; the expandable range [64, 72) MiB lost [69, 71) MiB.
    assert_eq!(shape, [(64 * MIB, 5 * MIB, 2), (71 * MIB, MIB, 1)]);
    assert_eq!(snap.segments[0].allocated_size, Some(3 * MIB));
}

#[test]
fn an_oversized_frame_is_refused_before_its_body_arrives() {
    let mut reader = FrameReader::new();
    reader.push(&(MAX_FRAME_BYTES + 1).to_le_bytes());
    assert!(matches!(
        reader.next_message(),
        Err(LiveError::FrameTooLong { .. })
    ));
}

#[test]
fn malformed_and_out_of_order_messages_are_refused_with_what_was_wrong() {
    let refused = |messages: &[Message]| apply_all(&stream(messages)).unwrap_err().to_string();
    assert!(refused(&[state()]).contains("first message must be Hello"));
    assert!(refused(&[hello(), hello()]).contains("a second Hello"));
    assert!(refused(&[hello(), batch()]).contains("Entries before State"));
    let future = Message::Hello {
        protocol: PROTOCOL_VERSION + 1,
        producer: String::new(),
        device: 0,
    };
    assert!(refused(&[future]).contains("unsupported live protocol version"));
    let gap = Message::Entries(EntryBatch {
        first_seq: 9,
        ..Default::default()
    });
    assert!(refused(&[hello(), state(), gap]).contains("entries start at 9, expected 5"));
    let bad_stack = Message::Entries(EntryBatch {
        first_seq: 5,
        entries: vec![entry(Some(3))],
        ..Default::default()
    });
    assert!(refused(&[hello(), state(), bad_stack]).contains("names stack 3"));
    let bad_frame = Message::Entries(EntryBatch {
        first_seq: 5,
        stacks: vec![vec![7]],
        ..Default::default()
    });
    assert!(refused(&[hello(), state(), bad_frame]).contains("names frame 7"));
    let bad_action = Message::Entries(EntryBatch {
        first_seq: 5,
        entries: vec![LiveEntry {
            action: 200,
            ..entry(None)
        }],
        ..Default::default()
    });
    assert!(refused(&[hello(), state(), bad_action]).contains("unknown action tag 200"));
    let backwards = Message::Dropped {
        missed: 3,
        resume_seq: 2,
    };
    assert!(refused(&[hello(), state(), backwards]).contains("Dropped 3 entries"));
    // A body that is not one message, and trailing bytes after one.
    let mut garbage = 3u32.to_le_bytes().to_vec();
    garbage.extend_from_slice(&[0xc1, 0xc1, 0xc1]);
    assert!(matches!(
        apply_all(&garbage),
        Err(LiveError::Malformed { frame: 0, .. })
    ));
    let mut trailing = stream(&[hello()]);
    let len = u32::from_le_bytes(trailing[..4].try_into().unwrap()) + 1;
    trailing[..4].copy_from_slice(&len.to_le_bytes());
    trailing.push(0xc0);
    assert!(apply_all(&trailing)
        .unwrap_err()
        .to_string()
        .contains("1 bytes after the message"));
    // A state that is not a snapshot.
    let not_a_snapshot = Message::State {
        snapshot: Bytes(vec![1, 2, 3]),
        next_seq: 0,
    };
    assert!(matches!(
        apply_all(&stream(&[hello(), not_a_snapshot])),
        Err(LiveError::State(_))
    ));
}

fn annotations(names: &[&str]) -> Message {
    Message::Annotations {
        missed: 0,
        annotations: names
            .iter()
            .enumerate()
            .map(|(i, name)| LiveAnnotation {
                time_us: 10 + i as i64,
                metadata: vec![
                    ("stage".into(), "START".into()),
                    ("name".into(), (*name).into()),
                ],
            })
            .collect(),
    }
}

#[test]
fn annotations_are_appended_to_the_snapshots_external_annotations() {
    let mut live = apply_all(&stream(&[
        hello(),
        state(),
        annotations(&["ProfilerStep#1"]),
    ]))
    .unwrap();
    let lost = Message::Annotations {
        missed: 4,
        annotations: vec![],
    };
    assert_eq!(
        live.apply(lost).unwrap(),
        Applied::Annotations {
            count: 0,
            missed: 4
        }
    );
    live.apply(annotations(&["ProfilerStep#2", "forward"]))
        .unwrap();
    assert_eq!(live.missed_annotations(), 4);
    let snap = live.snapshot().unwrap();
    let got: Vec<(Option<&str>, Option<&str>, i64, i64)> = snap
        .external_annotations
        .as_ref()
        .unwrap()
        .iter()
        .map(|a| (a.stage(), a.name(), a.time_us, a.device))
        .collect();
    assert_eq!(
        got,
        [
            (Some("START"), Some("ProfilerStep#1"), 10, 0),
            (Some("START"), Some("ProfilerStep#2"), 10, 0),
            (Some("START"), Some("forward"), 11, 0),
        ]
    );
    // Written and read back as a file, they are the snapshot's (what `watch --save` keeps).
    let again = msgpack::read(&msgpack::to_vec(snap).unwrap()).unwrap();
    assert_eq!(again.external_annotations, snap.external_annotations);
}

/// A reader of version 1 (before `Annotations`) meets a version-2 `Hello` first and stops
/// there with the versions named; this reader does the same for version 1.
#[test]
fn a_reader_of_another_version_stops_at_hello_with_both_versions_named() {
    assert_eq!(PROTOCOL_VERSION, 2);
    let old = Message::Hello {
        protocol: 1,
        producer: "memsnap-recorder 0.1.0".into(),
        device: 0,
    };
    let err = apply_all(&stream(&[old, state(), batch()])).unwrap_err();
    assert!(matches!(err, LiveError::Version { version: 1 }), "{err}");
    assert_eq!(
        err.to_string(),
        "unsupported live protocol version 1 (this reader knows 2)"
    );
    let refused = apply_all(&stream(&[hello(), annotations(&["x"])])).unwrap_err();
    assert!(
        refused.to_string().contains("Annotations before State"),
        "{refused}"
    );
}

#[test]
fn a_dropped_marker_moves_the_next_expected_entry() {
    let dropped = Message::Dropped {
        missed: 10,
        resume_seq: 15,
    };
    let mut live = apply_all(&stream(&[hello(), state()])).unwrap();
    assert_eq!(
        live.apply(dropped).unwrap(),
        Applied::Dropped { missed: 10 }
    );
    assert_eq!((live.next_seq(), live.missed()), (15, 10));
}

proptest! {
    #[test]
    fn any_bytes_after_a_valid_start_give_an_answer_not_a_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut bytes = stream(&[hello(), state(), batch(), annotations(&["step"])]);
        bytes.extend_from_slice(&tail);
        let _ = apply_all(&bytes);
    }
}

#[test]
fn a_refusal_is_an_error_with_the_recorders_reason_and_a_token_from_a_recorder_is_refused() {
    let refused = Message::Refused {
        reason: "wrong token".into(),
    };
    let err = apply_all(&stream(&[hello(), refused])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the recorder refused this listener: wrong token"
    );
    let token = Message::Token { token: "x".into() };
    let err = apply_all(&stream(&[hello(), state(), token])).unwrap_err();
    assert!(err.to_string().contains("listeners send it"), "{err}");
}

#[test]
fn tokens_match_only_when_equal() {
    use memsnap_format::live::token_matches;
    assert!(token_matches(b"0123456789abcdef", b"0123456789abcdef"));
    for other in [
        &b"0123456789abcdeF"[..],
        b"0123456789abcde",
        b"0123456789abcdef0",
        b"",
    ] {
        assert!(!token_matches(other, b"0123456789abcdef"), "{other:?}");
    }
}

//! Hostile and broken pickles: each gives an error that says what and where, never a panic,
//! never an unbounded allocation.

use memsnap_format::{pickle, FormatError};
use proptest::prelude::*;

use crate::common::real_snapshots;

fn pickle_error(bytes: &[u8]) -> (u64, String) {
    match pickle::read(bytes) {
        Err(FormatError::Pickle { offset, what }) => (offset, what),
        Err(other) => panic!("expected a pickle error, got {other}"),
        Ok(_) => panic!("expected an error, the pickle was accepted"),
    }
}

fn schema_error(bytes: &[u8]) -> (String, String) {
    match pickle::read(bytes) {
        Err(FormatError::Schema { path, what }) => (path, what),
        Err(other) => panic!("expected a schema error, got {other}"),
        Ok(_) => panic!("expected an error, the pickle was accepted"),
    }
}

/// Protocol-4 prefix, then `body`, then STOP (no FRAME: it is optional).
fn p4(body: &[u8]) -> Vec<u8> {
    let mut v = vec![0x80, 4];
    v.extend_from_slice(body);
    v.push(b'.');
    v
}

fn short_str(s: &str) -> Vec<u8> {
    let mut v = vec![0x8c, s.len() as u8];
    v.extend_from_slice(s.as_bytes());
    v
}

/// `{'segments': [], <key>: <value>}` with `value` given as opcodes.
fn snapshot_with(key: &str, value: &[u8]) -> Vec<u8> {
    let mut body = vec![b'}', b'('];
    body.extend(short_str("segments"));
    body.push(b']');
    body.extend(short_str(key));
    body.extend_from_slice(value);
    body.push(b'u');
    p4(&body)
}

#[test]
fn os_system_through_global_and_reduce_is_refused() {
    // cos\nsystem\n (X 'ls') TUPLE1 REDUCE STOP
    let bytes = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.";
    let (offset, what) = pickle_error(bytes);
    assert_eq!(offset, 2);
    assert!(
        what.contains("refusing to execute GLOBAL 'os system'"),
        "{what}"
    );
    let message = pickle::read(bytes).unwrap_err().to_string();
    assert!(message.contains("at byte 2"), "{message}");
}

#[test]
fn os_system_through_stack_global_is_refused() {
    let mut body = short_str("os");
    body.push(0x94);
    body.extend(short_str("system"));
    body.push(0x94);
    body.push(0x93); // STACK_GLOBAL
    body.extend(short_str("ls"));
    body.extend([0x85, b'R']);
    let bytes = p4(&body);
    let (offset, what) = pickle_error(&bytes);
    assert_eq!(offset, 16);
    assert!(what.contains("STACK_GLOBAL 'os system'"), "{what}");
}

#[test]
fn every_code_executing_opcode_is_refused_by_name() {
    let cases: &[(u8, &str)] = &[
        (b'R', "REDUCE"),
        (b'b', "BUILD"),
        (b'i', "INST"),
        (b'o', "OBJ"),
        (0x81, "NEWOBJ"),
        (0x92, "NEWOBJ_EX"),
        (b'P', "PERSID"),
        (b'Q', "BINPERSID"),
        (0x82, "EXT1"),
        (0x83, "EXT2"),
        (0x84, "EXT4"),
    ];
    for &(code, name) in cases {
        let bytes = p4(&[b'N', b'N', code, 0, 0, 0, 0]);
        let (offset, what) = pickle_error(&bytes);
        assert_eq!(offset, 4, "{name}");
        assert!(
            what.contains(&format!("refusing to execute {name}")),
            "{what}"
        );
    }
}

#[test]
fn unknown_and_unsupported_opcodes_are_named() {
    let (offset, what) = pickle_error(&p4(&[0xff]));
    assert_eq!(offset, 2);
    assert!(what.contains("unknown opcode 0xff"), "{what}");
    let (_, what) = pickle_error(&p4(&[0x8f])); // EMPTY_SET
    assert!(what.contains("EMPTY_SET"), "{what}");
    let (_, what) = pickle_error(b"\x80\x06N.");
    assert!(what.contains("unsupported pickle protocol 6"), "{what}");
}

#[test]
fn huge_declared_lengths_are_checked_before_allocating() {
    let cases: &[(&[u8], &str)] = &[
        (
            b"\x80\x04X\xff\xff\xff\xff",
            "BINUNICODE declares 4294967295 bytes",
        ),
        (
            b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f",
            "BINUNICODE8 declares",
        ),
        (
            b"\x80\x04B\xff\xff\xff\xffabc",
            "BINBYTES declares 4294967295 bytes but only 3 remain",
        ),
        (b"\x80\x04\x8b\xff\xff\xff\x7f", "LONG4 declares"),
        (
            b"\x80\x04\x8b\xff\xff\xff\xff",
            "LONG4 with a negative length",
        ),
        (
            b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff",
            "FRAME declares",
        ),
        (
            b"\x80\x04\x8c\x10abc",
            "SHORT_BINUNICODE declares 16 bytes but only 3 remain",
        ),
    ];
    for (bytes, expected) in cases {
        let (offset, what) = pickle_error(bytes);
        assert_eq!(offset, 2, "{what}");
        assert!(what.contains(expected), "{what}");
    }
}

#[test]
fn deep_nesting_of_unknown_values_is_bounded() {
    // 100,000 nested lists under an unknown key: push them all, then APPEND each into the one
    // below it.
    let depth = 100_000;
    let mut value = vec![b']'; depth];
    value.extend(std::iter::repeat_n(b'a', depth - 1));
    let (path, what) = schema_error(&snapshot_with("nested", &value));
    assert!(what.contains("nested deeper than 256"), "{what}");
    assert!(path.starts_with("nested[0][0]"), "{path}");
}

#[test]
fn a_list_that_contains_itself_is_an_error() {
    // L = []; L.append(L) under an unknown key.
    let (_, what) = schema_error(&snapshot_with("loop", b"]\x94h\x00a"));
    assert!(what.contains("nested deeper"), "{what}");
}

/// `[x]*10` nested `levels` deep through memo references: 10^levels values when expanded.
fn laughs(levels: usize) -> Vec<u8> {
    let mut v = short_str("lol");
    v.extend([0x94, b'0']); // memo 0, popped
    for level in 0..levels {
        v.extend([b']', 0x94, b'(']); // memo level + 1
        v.extend(std::iter::repeat_n([b'h', level as u8], 10).flatten());
        v.push(b'e');
        if level + 1 < levels {
            v.push(b'0');
        }
    }
    v
}

#[test]
fn billion_laughs_in_an_unknown_key_hits_the_budget() {
    let bytes = snapshot_with("laughs", &laughs(9));
    assert!(bytes.len() < 300);
    let (path, what) = schema_error(&bytes);
    assert!(what.contains("memo bomb"), "{what}");
    assert!(path.starts_with("laughs"), "{path}");
}

#[test]
fn billion_laughs_through_segments_hits_the_budget() {
    // One block dict shared by a blocks list of 1000, one segment sharing that list, and a
    // segments list of 1000 references to that segment: 10^6 blocks from ~5 KB.
    // block dict -> memo 0
    let mut body = vec![b'}', 0x94, b'('];
    body.extend(short_str("size"));
    body.extend([b'K', 0]);
    body.extend(short_str("state"));
    body.extend(short_str("inactive"));
    body.extend([b'u', b'0']);
    // blocks list -> memo 1: [block] * 1000
    body.extend([b']', 0x94, b'(']);
    body.extend(std::iter::repeat_n([b'h', 0], 1000).flatten());
    body.extend([b'e', b'0']);
    // segment dict -> memo 2
    body.extend([b'}', 0x94, b'(']);
    for key in ["device", "address", "total_size", "stream"] {
        body.extend(short_str(key));
        body.extend([b'K', 0]);
    }
    body.extend(short_str("blocks"));
    body.extend([b'h', 1]);
    body.extend([b'u', b'0']);
    // {'segments': [segment] * 1000}
    body.extend([b'}', b'(']);
    body.extend(short_str("segments"));
    body.extend([b']', b'(']);
    body.extend(std::iter::repeat_n([b'h', 2], 1000).flatten());
    body.extend([b'e', b'u']);
    let bytes = p4(&body);
    let (path, what) = schema_error(&bytes);
    assert!(what.contains("memo bomb"), "{what}");
    assert!(path.starts_with("segments["), "{path}");
}

#[test]
fn memo_indices_are_checked() {
    let (offset, what) = pickle_error(&p4(b"h\x05"));
    assert_eq!(offset, 2);
    assert!(what.contains("memo entry 5 was never stored"), "{what}");
    let (_, what) = pickle_error(&p4(b"j\x00\x00\x00\x80"));
    assert!(what.contains("memo entry 2147483648"), "{what}");
    // A far-away LONG_BINPUT is legal and must not allocate a dense 4-billion-slot memo.
    let bytes = p4(b"]r\xff\xff\xff\xff0}(\x8c\x08segmentsj\xff\xff\xff\xffu");
    assert!(pickle::read(&bytes).is_ok());
}

#[test]
fn stack_and_mark_underflow_are_errors() {
    let cases: &[(&[u8], &str)] = &[
        (b"a", "stack underflow in APPEND"),
        (b"Na", "stack underflow in APPEND"),
        (b"Ne", "APPENDS without a MARK"),
        (b"(e", "APPENDS with no list below the MARK"),
        (b"N(e", "APPENDS on a None"),
        (b"}(Nu", "SETITEMS with an odd number of items"),
        (b"1", "POP_MARK without a MARK"),
        (b"N\x87", "stack underflow in TUPLE3"),
        (b"N(N\x86", "stack underflow in TUPLE2"),
        (b"\x94", "stack underflow in MEMOIZE"),
        (b"}NNNs", "SETITEM on a None"),
        (b"N(Ns", "stack underflow in SETITEM"),
        (b"]NNs", "SETITEM on a list"),
        (b"(NNNd", "DICT with an odd number of items"),
    ];
    for (body, expected) in cases {
        let (offset, what) = pickle_error(&p4(body));
        assert!(what.contains(expected), "{body:?}: {what}");
        assert!(
            offset >= 2 && offset < 2 + body.len() as u64,
            "{body:?}: offset {offset}"
        );
    }
    let (_, what) = pickle_error(b"\x80\x04.");
    assert!(what.contains("STOP with an empty stack"), "{what}");
}

#[test]
fn schema_errors_name_the_path() {
    // device_traces[0][1].size is a str.
    let mut traces = vec![b']', b']', b'('];
    for size in [&[b'K', 1][..], &short_str("big")[..]] {
        traces.extend([b'}', b'(']);
        traces.extend(short_str("action"));
        traces.extend(short_str("alloc"));
        traces.extend(short_str("addr"));
        traces.extend([b'K', 0]);
        traces.extend(short_str("size"));
        traces.extend_from_slice(size);
        traces.extend(short_str("stream"));
        traces.extend([b'K', 0]);
        traces.push(b'u');
    }
    traces.extend([b'e', b'a']);
    let (path, what) = schema_error(&snapshot_with("device_traces", &traces));
    assert_eq!(path, "device_traces[0][1].size");
    assert_eq!(what, "expected an int, found str");
}

#[test]
fn invalid_utf8_is_reported_at_its_byte() {
    let bytes = snapshot_with("x", &[0x8c, 3, b'a', 0xff, b'b']);
    let (offset, what) = pickle_error(&bytes);
    assert_eq!(bytes[offset as usize], 0xff);
    assert!(what.contains("invalid UTF-8"), "{what}");
}

fn real_file(prefix: &str) -> Option<Vec<u8>> {
    let files = real_snapshots()?;
    let path = files
        .iter()
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))?;
    Some(std::fs::read(path).unwrap())
}

/// Every proper prefix of a pickle lacks its STOP, so each must be a pickle error at an
/// offset inside the prefix.
fn check_prefix(bytes: &[u8], len: usize) {
    match pickle::read(&bytes[..len]) {
        Err(FormatError::Pickle { offset, .. }) => {
            assert!(offset <= len as u64, "prefix {len}: offset {offset}")
        }
        Err(other) => panic!("prefix {len}: expected a pickle error, got {other}"),
        Ok(_) => panic!("prefix {len} was accepted"),
    }
}

#[test]
fn every_truncation_of_a_small_real_file_is_an_error() {
    let Some(bytes) = real_file("03_") else {
        return;
    };
    for len in 0..bytes.len() {
        check_prefix(&bytes, len);
    }
}

#[test]
fn sampled_truncations_of_larger_real_files_are_errors() {
    let Some(files) = real_snapshots() else {
        return;
    };
    // Debug builds parse about 10 MB/s; keep to the mid-sized files.
    let mid_sized = |p: &&std::path::PathBuf| {
        (100_000..1_100_000).contains(&std::fs::metadata(p).unwrap().len())
    };
    for path in files.iter().filter(mid_sized) {
        let bytes = std::fs::read(path).unwrap();
        let step = bytes.len() / 12;
        for k in 0..12 {
            let len = k * step + (k * 7919) % step.max(1);
            check_prefix(&bytes, len);
        }
        // The ends matter most: inside the last opcodes and the frame headers.
        for len in (bytes.len() - 8)..bytes.len() {
            check_prefix(&bytes, len);
        }
    }
}

/// xorshift64*: deterministic and dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn random_byte_flips_in_real_files_never_panic() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut outcomes = (0usize, 0usize);
    for prefix in ["02_", "03_", "04_", "05_"] {
        let Some(original) = real_file(prefix) else {
            return;
        };
        for _ in 0..1000 {
            let mut bytes = original.clone();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(bytes.len());
                bytes[at] ^= 1 << rng.below(8);
            }
            match pickle::read(&bytes) {
                Ok(_) => outcomes.0 += 1,
                Err(FormatError::Pickle { offset, .. }) => {
                    assert!(offset <= bytes.len() as u64);
                    outcomes.1 += 1;
                }
                Err(_) => outcomes.1 += 1,
            }
        }
    }
    eprintln!(
        "byte flips: {} still read, {} errors",
        outcomes.0, outcomes.1
    );
    assert!(outcomes.1 > 0);
}

/// Opcodes a snapshot pickle uses, with well-formed arguments, for random programs.
fn opcode() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(vec![b'(']),
        Just(vec![b'}']),
        Just(vec![b']']),
        Just(vec![b')']),
        Just(vec![b'u']),
        Just(vec![b's']),
        Just(vec![b'a']),
        Just(vec![b'e']),
        Just(vec![b'l']),
        Just(vec![b'd']),
        Just(vec![b't']),
        Just(vec![0x85]),
        Just(vec![0x86]),
        Just(vec![0x94]),
        Just(vec![b'N']),
        Just(vec![0x88]),
        Just(vec![b'0']),
        Just(vec![b'2']),
        any::<u8>().prop_map(|i| vec![b'h', i % 8]),
        any::<u8>().prop_map(|i| vec![b'K', i]),
        any::<u32>().prop_map(|i| {
            let mut v = vec![b'J'];
            v.extend(i.to_le_bytes());
            v
        }),
        prop::sample::select(vec![
            "segments",
            "device_traces",
            "frames",
            "action",
            "addr",
            "size",
            "stream",
            "blocks",
            "name",
            "filename",
            "line",
            "state",
            "device",
            "address",
            "total_size",
        ])
        .prop_map(short_str),
    ]
}

proptest! {
    // Self-referencing lists expand until the budget stops them, so each case costs a few ms.
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn random_data_opcode_programs_never_panic(ops in prop::collection::vec(opcode(), 0..80)) {
        let mut bytes = vec![0x80, 4];
        bytes.extend(ops.concat());
        bytes.push(b'.');
        let _ = pickle::read(&bytes);
    }

    #[test]
    fn random_bytes_never_panic(tail in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut bytes = vec![0x80, 4];
        bytes.extend(tail);
        let _ = pickle::read(&bytes);
    }
}

/// `{'action': 'alloc', 'addr': 1, 'size': 2, 'stream': 0}`, memoized (MEMOIZE after `}`).
fn entry_dict() -> Vec<u8> {
    let mut v = vec![b'}', 0x94, b'('];
    for (key, value) in [
        ("action", None),
        ("addr", Some(1)),
        ("size", Some(2)),
        ("stream", Some(0)),
    ] {
        v.extend(short_str(key));
        match value {
            None => v.extend(short_str("alloc")),
            Some(n) => v.extend([b'K', n]),
        }
    }
    v.push(b'u');
    v
}

#[test]
fn an_entry_dict_shared_through_the_memo_is_read_in_both_traces() {
    // device_traces = [[E], [E]] with the second E a memo reference (E is memo 0).
    let mut traces = vec![b']', b'(', b']'];
    traces.extend(entry_dict());
    traces.extend([b'a', b']', b'h', 0, b'a', b'e']);
    let snap = pickle::read(&snapshot_with("device_traces", &traces)).unwrap();
    let t = snap.traces();
    assert_eq!(t.len(), 2);
    assert_eq!(t[0], t[1]);
    assert_eq!((t[0][0].addr, t[0][0].size), (1, 2));
}

#[test]
fn an_entry_shaped_dict_under_an_unknown_key_stays_a_value_in_key_order() {
    let mut value = vec![b']'];
    value.extend(entry_dict());
    value.push(b'a');
    let snap = pickle::read(&snapshot_with("other", &value)).unwrap();
    let (key, v) = &snap.extra[0];
    assert_eq!(key, "other");
    let memsnap_format::Value::List(items) = v else {
        panic!("{v:?}")
    };
    let memsnap_format::Value::Dict(pairs) = &items[0] else {
        panic!("{items:?}")
    };
    let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str().unwrap()).collect();
    assert_eq!(keys, ["action", "addr", "size", "stream"]);
    assert_eq!(
        items[0].get("action").and_then(|a| a.as_str()),
        Some("alloc")
    );
    assert_eq!(items[0].get("size").and_then(|s| s.as_i64()), Some(2));
}

#[test]
fn changing_a_trace_entry_after_it_was_complete_is_an_error() {
    // E complete; then E['extra'] = None through a memo reference.
    let mut value = vec![b']'];
    value.extend(entry_dict());
    value.extend([b'a', b'h', 0]);
    value.extend(short_str("extra"));
    value.extend([b'N', b's', b'0']);
    let (_, what) = pickle_error(&snapshot_with("device_traces", &value));
    assert!(
        what.contains("SETITEM modifies a dict or list after it was read"),
        "{what}"
    );
}

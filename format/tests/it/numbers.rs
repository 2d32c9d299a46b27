//! Lossless numbers: any int PyTorch can write (unsigned 64-bit, negative, beyond 64 bits) in
//! any int field loads, survives every codec exactly, and compares by its exact value.

use std::process::Command;

use memsnap_format::{
    compare, json, msgpack, pickle, validate, Action, AllocatorSettings, Annotation, Block,
    BlockState, ExactInts, Frame, HistoryItem, IntField, PyInt, RecorderInfo, Segment, Snapshot,
    TraceEntry, Value,
};
use proptest::prelude::*;

fn hex(text: &[&str]) -> Vec<u8> {
    let text: String = text.concat();
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn big(text: &str) -> PyInt {
    PyInt::parse_decimal(text).unwrap()
}

/// 2^100.
const TWO_100: &str = "1267650600228229401496703205376";

/// CPython 3.11's `pickle.dumps(d, protocol=4)` of a snapshot dict whose address is 2^63 + 4096
/// (a 9-byte `LONG1`) and whose first frame has `line` 2^64 − 1 (`8a 09 ff×8 00`), as
/// `torch.compile`d runs write it.
fn cpython_line_u64_max() -> Vec<u8> {
    hex(&[
        "800495f2010000000000007d94288c087365676d656e7473945d947d94288c06646576696365944b008c076164647265",
        "7373948a090010000000000080008c0a746f74616c5f73697a65944a000020008c0e616c6c6f63617465645f73697a65",
        "944a000020008c0b6163746976655f73697a65944a000020008c0e7265717565737465645f73697a65944df4018c0673",
        "747265616d944b008c0c7365676d656e745f74797065948c056c61726765948c0f7365676d656e745f706f6f6c5f6964",
        "944b004b0086948c0d69735f657870616e6461626c6594898c06626c6f636b73945d947d942868058a09001000000000",
        "0080008c0473697a65944a0000200068094df4018c057374617465948c106163746976655f616c6c6f63617465649475",
        "6175618c0d6465766963655f747261636573945d945d947d94288c06616374696f6e948c05616c6c6f63948c04616464",
        "72948a0900100000000000800068134df401680a4b008c0774696d655f7573948a0700401e18240a068c066672616d65",
        "73945d94287d94288c046e616d65948c0b636f6d70696c65645f666e948c0866696c656e616d65948c182f746d702f74",
        "6f726368696e647563746f722f78792e7079948c046c696e65948a09ffffffffffffffff00757d942868218c07666f72",
        "776172649468238c086d6f64656c2e70799468254b367565756161752e",
    ])
}

/// Every codec gives back the same snapshot and, re-encoded, the same bytes.
fn assert_round_trips(snap: &Snapshot) -> Vec<u8> {
    let bytes = pickle::to_vec(snap);
    let back = pickle::read(&bytes).expect("pickle read");
    assert_eq!(compare::diff(snap, &back), None, "pickle");
    assert_eq!(pickle::to_vec(&back), bytes, "pickle -> pickle bytes");
    let (generic, _) = pickle::read_with_fast_path(&bytes, false).expect("generic path");
    assert_eq!(compare::diff(snap, &generic), None, "generic pickle path");

    let text = json::to_vec(snap).expect("json write");
    let from_json = json::read(&text).expect("json read");
    assert_eq!(compare::diff(snap, &from_json), None, "json");
    assert_eq!(
        json::to_vec(&from_json).unwrap(),
        text,
        "json -> json bytes"
    );
    assert_eq!(
        pickle::to_vec(&from_json),
        bytes,
        "pickle -> json -> pickle bytes"
    );

    let packed = msgpack::to_vec(snap).expect("msgpack write");
    let from_msgpack = msgpack::read(&packed).expect("msgpack read");
    assert_eq!(compare::diff(snap, &from_msgpack), None, "msgpack");
    assert_eq!(
        msgpack::to_vec(&from_msgpack).unwrap(),
        packed,
        "msgpack bytes"
    );
    assert_eq!(
        pickle::to_vec(&from_msgpack),
        bytes,
        "pickle -> msgpack -> pickle bytes"
    );
    bytes
}

#[test]
fn frame_line_u64_max_from_cpython_loads_and_writes_back_byte_identical() {
    let bytes = cpython_line_u64_max();
    let snap = pickle::read(&bytes).expect("a torch.compile frame line must load");
    let frames: Vec<&Frame> = snap
        .stack_frames(snap.traces()[0][0].frames.unwrap())
        .collect();
    assert_eq!(frames[0].line, PyInt::from(u64::MAX));
    assert_eq!(frames[0].line.to_string(), "18446744073709551615");
    assert_eq!(frames[1].line, 54);
    let e = &snap.traces()[0][0];
    assert_eq!(e.addr, (1 << 63) + 4096);
    assert!(!e.has_exact_ints(), "a u64 address needs no override");
    assert_eq!(snap.segments[0].address, (1 << 63) + 4096);
    assert_eq!(pickle::to_vec(&snap), bytes, "write(read(x)) == x");
    assert_eq!(assert_round_trips(&snap), bytes);
    assert!(validate(&snap).is_empty(), "{:?}", validate(&snap));
}

#[test]
fn frame_line_u64_max_from_our_writer_is_what_cpython_writes() {
    let mut snap = Snapshot::new(1);
    let stack = snap.intern_stack([
        Frame::new("compiled_fn", "/tmp/torchinductor/xy.py", u64::MAX),
        Frame::new("forward", "model.py", 54),
    ]);
    let mut e = TraceEntry::new(Action::Alloc, 4096, 500, 0);
    e.frames = Some(stack);
    snap.device_traces.as_mut().unwrap()[0].push(e);
    let bytes = assert_round_trips(&snap);
    let long1_u64_max = [0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0];
    assert!(bytes.windows(11).any(|w| w == long1_u64_max));
    let text = String::from_utf8(json::to_vec(&snap).unwrap()).unwrap();
    assert!(text.contains("\"line\":18446744073709551615"), "{text}");

    // Where CPython is installed, it reads our bytes as the same int.
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("notice: python3 not found; skipping the CPython check");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.pickle");
    std::fs::write(&path, &bytes).unwrap();
    let out = Command::new("python3")
        .arg("-c")
        .arg("import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); print(d['device_traces'][0][0]['frames'][0]['line'])")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "18446744073709551615"
    );
}

#[test]
fn frame_lines_minus_one_and_u64_max_are_different_frames() {
    let mut a = Snapshot::new(1);
    let stack = a.intern_stack([Frame::new("f", "x.py", -1)]);
    let mut e = TraceEntry::new(Action::Alloc, 4096, 512, 0);
    e.frames = Some(stack);
    a.device_traces.as_mut().unwrap()[0].push(e.clone());
    let mut b = Snapshot::new(1);
    let stack = b.intern_stack([Frame::new("f", "x.py", u64::MAX)]);
    e.frames = Some(stack);
    b.device_traces.as_mut().unwrap()[0].push(e);
    assert_eq!(compare::diff(&a, &a), None);
    let d = compare::diff(&a, &b).expect("-1 is not 2^64 - 1");
    assert!(d.contains("line: -1 vs 18446744073709551615"), "{d}");
    assert_round_trips(&a);
    assert_round_trips(&b);
}

/// PyTorch's C++ path (`_memory_snapshot_pickled`): PROTO 2, `BINPUT` memo, every int outside
/// int32 as an 8-byte `LONG1`, and addresses and sizes cast to `int64_t`, so an address
/// ≥ 2^63 arrives negative.
fn cpp_path_pickle(addr: i64, size: i64, stream: i64) -> Vec<u8> {
    let mut out = vec![0x80, 2];
    let mut memo = 0u8;
    let mut put = |out: &mut Vec<u8>| {
        out.extend_from_slice(&[b'q', memo]);
        memo += 1;
    };
    let s = |out: &mut Vec<u8>, text: &str, put: &mut dyn FnMut(&mut Vec<u8>)| {
        out.push(b'X');
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
        put(out);
    };
    let long8 = |out: &mut Vec<u8>, v: i64| {
        out.extend_from_slice(&[0x8a, 8]);
        out.extend_from_slice(&v.to_le_bytes());
    };
    out.push(b'}');
    put(&mut out);
    out.push(b'(');
    s(&mut out, "segments", &mut put);
    out.push(b']');
    put(&mut out);
    s(&mut out, "device_traces", &mut put);
    out.push(b']');
    put(&mut out);
    out.push(b']');
    put(&mut out);
    out.push(b'}');
    put(&mut out);
    out.push(b'(');
    s(&mut out, "action", &mut put);
    s(&mut out, "alloc", &mut put);
    s(&mut out, "addr", &mut put);
    long8(&mut out, addr);
    s(&mut out, "size", &mut put);
    long8(&mut out, size);
    s(&mut out, "stream", &mut put);
    long8(&mut out, stream);
    s(&mut out, "compile_context", &mut put);
    s(&mut out, "N/A", &mut put);
    s(&mut out, "user_metadata", &mut put);
    s(&mut out, "", &mut put);
    s(&mut out, "time_us", &mut put);
    long8(&mut out, 1_700_000_000_000_000);
    out.extend_from_slice(b"ua"); // SETITEMS into the entry, APPEND to the trace
    out.extend_from_slice(b"a"); // the trace into device_traces
    out.extend_from_slice(b"u."); // SETITEMS into the top dict, STOP
    out
}

#[test]
fn cpp_path_negative_int64_address_is_the_same_pointer_and_stays_negative() {
    let addr = (1u64 << 63) + 0x20_0000;
    let bytes = cpp_path_pickle(addr as i64, -512, -1);
    let snap = pickle::read(&bytes).expect("negative address, size and stream load");
    let e = &snap.traces()[0][0];
    assert_eq!(e.addr, addr, "the typed address is the pointer's bits");
    assert_eq!(e.size, (-512i64) as u64);
    assert_eq!(e.stream, -1);
    assert_eq!(e.exact_int(IntField::Addr), Some(PyInt::Small(addr as i64)));
    assert_eq!(e.exact_int(IntField::Size), Some(PyInt::Small(-512)));
    assert_eq!(e.exact_int(IntField::Stream), Some(PyInt::Small(-1)));
    assert_round_trips(&snap);
    let text = String::from_utf8(json::to_vec(&snap).unwrap()).unwrap();
    assert!(
        text.contains(&format!(
            "\"addr\":{},\"size\":-512,\"stream\":-1",
            addr as i64
        )),
        "{text}"
    );
    // The Python path writes the same pointer as a positive 9-byte LONG1: equal bits, another
    // value.
    let mut python = snap.clone();
    python.device_traces.as_mut().unwrap()[0][0]
        .rare_mut()
        .exact
        .set(IntField::Addr, None);
    let d = compare::diff(&snap, &python).expect("-2^63.. is not 2^63..");
    assert!(d.contains(".addr:"), "{d}");
    // A negative size is reported, not refused.
    let violations = validate(&snap);
    assert!(
        violations
            .iter()
            .any(|v| v.what.contains("size -512 is negative")),
        "{violations:?}"
    );
}

/// A snapshot with an odd number in every int field.
fn odd_snapshot(n: &dyn Fn(usize) -> PyInt) -> Snapshot {
    let mut snap = Snapshot::new(1);
    let stack = snap.intern_stack([
        Frame::new("f", "a.py", n(0)),
        Frame::new("g", "b.py", u64::MAX),
        Frame::new("h", "c.py", -1),
    ]);
    let mut seg = Segment::new(0, 0, 0, 0);
    let x = &mut seg.exact;
    seg.device = x.store_i64(IntField::Device, n(1));
    seg.address = x.store_u64(IntField::Address, n(2));
    seg.total_size = x.store_u64(IntField::TotalSize, n(3));
    seg.allocated_size = Some(x.store_u64(IntField::AllocatedSize, n(4)));
    seg.active_size = Some(x.store_u64(IntField::ActiveSize, n(5)));
    seg.requested_size = Some(x.store_u64(IntField::RequestedSize, n(6)));
    seg.stream = x.store_i64(IntField::Stream, n(7));
    seg.segment_pool_id = Some((
        x.store_i64(IntField::PoolId0, n(8)),
        x.store_i64(IntField::PoolId1, n(9)),
    ));
    let mut block = Block {
        state: BlockState::ActiveAllocated,
        frames: Some(stack),
        ..Block::default()
    };
    let x = &mut block.exact;
    block.address = Some(x.store_u64(IntField::Address, n(10)));
    block.size = x.store_u64(IntField::Size, n(11));
    block.requested_size = Some(x.store_u64(IntField::RequestedSize, n(12)));
    let mut legacy = Block {
        size: 7,
        ..Block::default()
    };
    let mut item = HistoryItem {
        addr: 0,
        real_size: 0,
        frames: Some(stack),
        extra: Vec::new(),
        exact: ExactInts::default(),
    };
    item.addr = item.exact.store_u64(IntField::Addr, n(13));
    item.real_size = item.exact.store_u64(IntField::RealSize, n(14));
    legacy.history = Some(vec![item]);
    seg.blocks = vec![block, legacy];
    snap.segments.push(seg);

    let mut e = TraceEntry::new(Action::Alloc, 0, 0, 0);
    let mut x = ExactInts::default();
    e.addr = x.store_u64(IntField::Addr, n(15));
    e.size = x.store_u64(IntField::Size, n(16));
    e.stream = x.store_i64(IntField::Stream, n(17));
    e.set_time_us(Some(x.store_i64(IntField::TimeUs, n(18))));
    e.frames = Some(stack);
    if !x.is_empty() {
        e.rare_mut().exact = x;
    }
    let mut oom = TraceEntry::new(Action::Oom, 0, 0, 0);
    let mut x = ExactInts::default();
    oom.size = x.store_u64(IntField::Size, n(19));
    oom.stream = x.store_i64(IntField::Stream, n(20));
    let free = x.store_u64(IntField::DeviceFree, n(21));
    let rare = oom.rare_mut();
    rare.no_addr = true;
    rare.device_free = Some(free);
    rare.exact = x;
    snap.device_traces.as_mut().unwrap()[0] = vec![e, oom];

    let mut a = Annotation::new(
        vec![("stage".into(), Value::Str("START".into()))].into(),
        0,
        0,
    );
    a.device = a.exact_mut().store_i64(IntField::Device, n(22));
    a.time_us = a.exact_mut().store_i64(IntField::TimeUs, n(23));
    snap.external_annotations = Some(vec![a]);
    snap.allocator_settings = Some(AllocatorSettings {
        alloc_conf: Some(String::new()),
        max_split_size: Some(n(24)),
        pinned_num_register_threads: Some(n(25)),
        roundup_power2_divisions: Some(vec![("1".into(), n(26)), ("2".into(), n(27))]),
        max_round_threshold: Some(n(28)),
        max_cached_size: Some(n(29)),
        ..Default::default()
    });
    let mut info = RecorderInfo {
        producer: "test".into(),
        ..Default::default()
    };
    info.set_dropped_entries(vec![n(30), PyInt::Small(3)]);
    snap.recorder_info = Some(info);
    snap.extra.push(("x".into(), n(31).to_value()));
    snap
}

#[test]
fn every_int_field_keeps_u64_negative_and_100_bit_values() {
    let values = [
        PyInt::from(u64::MAX),
        PyInt::from((1u64 << 63) + 4096),
        PyInt::Small(-1),
        PyInt::Small(i64::MIN),
        big(TWO_100),
        big(&format!("-{TWO_100}")),
        PyInt::Small(0),
    ];
    for (k, _) in values.iter().enumerate() {
        let n = |i: usize| values[(i + k) % values.len()].clone();
        let snap = odd_snapshot(&n);
        assert_round_trips(&snap);
        // Equal to itself, different from a neighbour (one value changed).
        assert_eq!(compare::diff(&snap, &snap.clone()), None);
        let shifted = odd_snapshot(&|i| if i == 16 { n(17) } else { n(i) });
        if n(16) != n(17) {
            assert!(compare::diff(&snap, &shifted).is_some());
        }
    }
}

#[test]
fn big_ints_in_a_size_and_a_frame_line_round_trip() {
    let n = |i: usize| match i {
        0 | 16 => big(TWO_100),
        _ => PyInt::Small(i as i64),
    };
    let snap = odd_snapshot(&n);
    let e = &snap.traces()[0][0];
    assert_eq!(e.exact_int(IntField::Size), Some(big(TWO_100)));
    assert_eq!(e.size, 0, "the typed size is the low 64 bits");
    let bytes = assert_round_trips(&snap);
    // 2^100 as LONG1: 13 bytes, the last 0x10.
    let mut long1 = vec![0x8a, 13];
    long1.extend_from_slice(&[0; 12]);
    long1.push(0x10);
    assert!(bytes.windows(15).any(|w| w == long1));
    let text = String::from_utf8(json::to_vec(&snap).unwrap()).unwrap();
    assert!(text.contains(&format!("\"size\":{TWO_100}")), "{text}");
    assert!(text.contains(&format!("\"line\":{TWO_100}")), "{text}");
    let v = validate(&snap);
    assert!(
        v.iter().any(|v| v.what.contains("does not fit 64 bits")),
        "{v:?}"
    );
}

#[test]
fn max_split_size_minus_one_is_kept() {
    let snap = odd_snapshot(&|i| PyInt::Small(if i == 24 { -1 } else { i as i64 }));
    assert_round_trips(&snap);
    let s = snap.allocator_settings.as_ref().unwrap();
    assert_eq!(s.max_split_size, Some(PyInt::Small(-1)));
}

#[test]
fn a_stale_override_is_ignored() {
    let mut snap = odd_snapshot(&|i| PyInt::Small(-(i as i64) - 1));
    // Code that sets the typed field and not the override: the typed field wins.
    snap.device_traces.as_mut().unwrap()[0][0].size = 4096;
    let e = &snap.traces()[0][0];
    assert_eq!(e.exact_int(IntField::Size), Some(PyInt::Small(4096)));
    let back = pickle::read(&pickle::to_vec(&snap)).unwrap();
    assert_eq!(
        back.traces()[0][0].exact_int(IntField::Size),
        Some(PyInt::Small(4096))
    );
}

#[test]
fn trace_entries_stay_small() {
    // The exact-int overrides live in the boxed `rare` part; issue 13 (a 10M-entry trace
    // took 800 MB at 80 bytes an entry) brought it to 48.
    assert_eq!(std::mem::size_of::<TraceEntry>(), 48);
}

#[test]
fn msgpack_version_1_files_still_read() {
    let snap = odd_snapshot(&|i| PyInt::Small(i as i64));
    let mut bytes = msgpack::to_vec(&snap).unwrap();
    let at = 2 + "memsnap_msgpack".len();
    assert_eq!(bytes[at], msgpack::FORMAT_VERSION);
    bytes[at] = 1;
    let back = msgpack::read(&bytes).unwrap();
    assert_eq!(compare::diff(&snap, &back), None);
}

/// Ints in `i64 ∪ u64`, and big ones up to 20 bytes.
fn any_int() -> impl Strategy<Value = PyInt> {
    prop_oneof![
        any::<i64>().prop_map(PyInt::Small),
        any::<u64>().prop_map(PyInt::from),
        prop::collection::vec(any::<u8>(), 9..20).prop_map(|b| PyInt::from_le_bytes(&b)),
        Just(PyInt::from(u64::MAX)),
        Just(PyInt::Small(-1)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn random_ints_in_every_field_round_trip(ints in prop::collection::vec(any_int(), 32)) {
        let snap = odd_snapshot(&|i| ints[i].clone());
        assert_round_trips(&snap);
        let e = &snap.traces()[0][0];
        prop_assert_eq!(e.exact_int(IntField::Addr), Some(ints[15].clone()));
        prop_assert_eq!(
            snap.segments[0].blocks[0].exact_int(IntField::Size),
            Some(ints[11].clone())
        );
    }
}

//! The pickle reader's ways in and two ways through must agree: a slice (`pickle::read`), a
//! stream read through a small window (`pickle::read_from`) and one read on another thread
//! (`pickle::read_ahead_from`, what `io::read_path` uses); the trace-entry fast path and the
//! generic opcode-by-opcode VM.

use std::collections::HashMap;
use std::io::Read;

use memsnap_format::{compare, io, pickle, FormatError, Snapshot};
use memsnap_workload::{generate, TrainingRun};

use super::common::real_snapshots;

/// Reads in pieces of 1 to `max` bytes (a deterministic pseudo-random sequence), so every
/// opcode and payload of a file sooner or later straddles the reader's window.
struct Trickle<'a> {
    data: &'a [u8],
    pos: usize,
    max: usize,
    state: u64,
    /// Fail with an I/O error once this many bytes were handed out.
    fail_at: Option<usize>,
}

impl<'a> Trickle<'a> {
    fn new(data: &'a [u8], max: usize) -> Self {
        Trickle {
            data,
            pos: 0,
            max,
            state: 0x9e37_79b9_7f4a_7c15,
            fail_at: None,
        }
    }
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.fail_at.is_some_and(|at| self.pos >= at) {
            return Err(std::io::Error::other("the disk went away"));
        }
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let want = 1 + (self.state % self.max as u64) as usize;
        let mut n = want.min(buf.len()).min(self.data.len() - self.pos);
        if let Some(at) = self.fail_at {
            n = n.min(at - self.pos);
        }
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The two ways to read a stream: on this thread, or on another one ahead of the decoding.
const AHEAD: [bool; 2] = [false, true];

/// `reader` (of `len` bytes) read as a stream, on another thread when `ahead`.
fn read_stream(reader: Trickle<'_>, len: u64, ahead: bool) -> Result<Snapshot, FormatError> {
    if ahead {
        pickle::read_ahead_from(reader, len, &mut |_, _| true)
    } else {
        pickle::read_from(reader, len, &mut |_, _| true)
    }
}

fn streamed(bytes: &[u8], max_piece: usize, ahead: bool) -> Result<Snapshot, FormatError> {
    read_stream(Trickle::new(bytes, max_piece), bytes.len() as u64, ahead)
}

fn assert_same(a: &Snapshot, b: &Snapshot, what: &str) {
    if let Some(d) = compare::diff(a, b) {
        panic!("{what}: {d}");
    }
}

/// Both paths agree, and the fast path really took the entries (else this tests nothing).
fn assert_fast_path_agrees(bytes: &[u8], what: &str) -> usize {
    let (fast, hits) = pickle::read_with_fast_path(bytes, true).unwrap();
    let (generic, generic_hits) = pickle::read_with_fast_path(bytes, false).unwrap();
    assert_eq!(
        generic_hits, 0,
        "{what}: the fast path ran while switched off"
    );
    assert_same(&fast, &generic, what);
    hits
}

fn synthetic(seed: u64, target_entries: usize) -> Vec<u8> {
    let (snapshot, _) = generate(&TrainingRun {
        target_entries: Some(target_entries),
        seed,
        with_annotations: seed.is_multiple_of(2),
        ..TrainingRun::default()
    });
    pickle::to_vec(&snapshot)
}

#[test]
fn fast_path_and_generic_vm_agree_on_synthetic_runs() {
    for seed in 0..4 {
        let bytes = synthetic(seed, 20_000);
        let entries = pickle::read(&bytes).unwrap().entry_count();
        let hits = assert_fast_path_agrees(&bytes, &format!("synthetic run {seed}"));
        let stacks = pickle::read(&bytes).unwrap().stacks.len();
        // Left to the generic VM: the first use of each action name (not memoized yet) and
        // of each frames list (written inline the first time).
        assert!(
            hits > 0 && entries - hits <= stacks + 12,
            "seed {seed}: the fast path read {hits} of {entries} entries ({stacks} stacks)"
        );
    }
}

#[test]
fn fast_path_and_generic_vm_agree_on_every_real_snapshot() {
    let Some(files) = real_snapshots() else {
        return;
    };
    let mut total_hits = 0;
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let hits = assert_fast_path_agrees(&bytes, &name);
        eprintln!("{name}: {hits} entries through the fast path");
        total_hits += hits;
    }
    assert!(total_hits > 0, "no real entry took the fast path");
}

#[test]
fn streamed_reads_equal_slice_reads_of_synthetic_runs() {
    let bytes = synthetic(7, 30_000);
    let whole = pickle::read(&bytes).unwrap();
    for max_piece in [1, 3, 64, 70_000] {
        for ahead in AHEAD {
            let s = streamed(&bytes, max_piece, ahead).unwrap();
            assert_same(
                &whole,
                &s,
                &format!("pieces of up to {max_piece} bytes, read ahead: {ahead}"),
            );
        }
    }
}

#[test]
fn streamed_reads_equal_slice_reads_of_every_real_snapshot() {
    let Some(files) = real_snapshots() else {
        return;
    };
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        for ahead in AHEAD {
            let whole = pickle::read(&bytes);
            let s = streamed(&bytes, 4096, ahead);
            match (whole, s) {
                (Ok(a), Ok(b)) => assert_same(&a, &b, &name),
                (a, b) => panic!("{name}: slice {:?} vs stream {:?}", a.err(), b.err()),
            }
        }
        let (through_io, _) = io::read_path(&path).unwrap();
        assert_same(&pickle::read(&bytes).unwrap(), &through_io, &name);
    }
}

fn pickle_error(result: Result<Snapshot, FormatError>) -> (u64, String) {
    match result {
        Err(FormatError::Pickle { offset, what }) => (offset, what),
        Err(other) => panic!("expected a pickle error, got {other}"),
        Ok(_) => panic!("a damaged pickle was accepted"),
    }
}

#[test]
fn a_truncated_stream_reports_the_same_error_as_a_truncated_slice() {
    let bytes = synthetic(3, 300);
    let step = (bytes.len() / 400).max(1);
    for len in (0..bytes.len()).step_by(step) {
        let cut = &bytes[..len];
        let from_slice = pickle_error(pickle::read(cut));
        for ahead in AHEAD {
            let from_stream =
                pickle_error(read_stream(Trickle::new(cut, 5), cut.len() as u64, ahead));
            assert_eq!(from_slice, from_stream, "cut at {len}, read ahead: {ahead}");
        }
    }
}

#[test]
fn a_failing_stream_is_an_error_with_its_offset() {
    let bytes = synthetic(5, 2_000);
    for ahead in AHEAD {
        let mut reader = Trickle::new(&bytes, 512);
        reader.fail_at = Some(bytes.len() / 2);
        match read_stream(reader, bytes.len() as u64, ahead) {
            Err(FormatError::Read { offset, source }) => {
                assert!(
                    offset <= (bytes.len() / 2) as u64 && offset > 0,
                    "offset {offset}, read ahead: {ahead}"
                );
                assert!(source.to_string().contains("went away"));
            }
            other => panic!("expected a read error, got {other:?} (read ahead: {ahead})"),
        }
    }
}

#[test]
fn a_stream_shorter_than_declared_is_truncated_not_hung() {
    let bytes = synthetic(9, 1_000);
    let cut = &bytes[..bytes.len() / 3];
    for ahead in AHEAD {
        let (offset, what) = pickle_error(read_stream(
            Trickle::new(cut, 100),
            bytes.len() as u64,
            ahead,
        ));
        assert!(what.contains("truncated"), "{what}");
        assert!(offset <= cut.len() as u64);
    }
}

// ------------------------------------------------------------------ hand-made entries

/// Writes pickles opcode by opcode, memoizing strings the way CPython does.
struct Pickler {
    out: Vec<u8>,
    memo: HashMap<String, u32>,
    next: u32,
    /// Protocol 2 style: `BINPUT`/`LONG_BINPUT` instead of `MEMOIZE`.
    binput: bool,
}

impl Pickler {
    fn new(binput: bool) -> Self {
        Pickler {
            out: vec![0x80, if binput { 2 } else { 4 }],
            memo: HashMap::new(),
            next: 0,
            binput,
        }
    }

    fn memoize(&mut self) -> u32 {
        let i = self.next;
        self.next += 1;
        if !self.binput {
            self.out.push(0x94);
        } else if i < 256 {
            self.out.extend([b'q', i as u8]);
        } else {
            self.out.push(b'r');
            self.out.extend(i.to_le_bytes());
        }
        i
    }

    fn get(&mut self, i: u32) {
        if i < 256 {
            self.out.extend([b'h', i as u8]);
        } else {
            self.out.push(b'j');
            self.out.extend(i.to_le_bytes());
        }
    }

    /// A string, memoized on first use and fetched from the memo after.
    fn str(&mut self, s: &str) {
        match self.memo.get(s) {
            Some(&i) => self.get(i),
            None => {
                self.fresh_str(s);
                let i = self.next - 1;
                self.memo.insert(s.to_owned(), i);
            }
        }
    }

    /// A new string object (memoized, never looked up by content).
    fn fresh_str(&mut self, s: &str) {
        self.out.extend([0x8c, s.len() as u8]);
        self.out.extend(s.as_bytes());
        self.memoize();
    }

    /// An int with CPython's opcode choice.
    fn int(&mut self, v: i128) {
        if (0..256).contains(&v) {
            self.out.extend([b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            self.out.push(b'M');
            self.out.extend((v as u16).to_le_bytes());
        } else if (i32::MIN as i128..=i32::MAX as i128).contains(&v) {
            self.out.push(b'J');
            self.out.extend((v as i32).to_le_bytes());
        } else {
            let mut bytes = v.to_le_bytes().to_vec();
            while bytes.len() > 1 {
                let last = bytes[bytes.len() - 1];
                let prev_sign = bytes[bytes.len() - 2] & 0x80;
                if (last == 0 && prev_sign == 0) || (last == 0xff && prev_sign != 0) {
                    bytes.pop();
                } else {
                    break;
                }
            }
            self.out.extend([0x8a, bytes.len() as u8]);
            self.out.extend(bytes);
        }
    }

    /// A frames list of one frame, memoized; returns the memo indices of the list and of
    /// the frame dict.
    fn frames(&mut self, name: &str) -> (u32, u32) {
        self.out.push(b']');
        let list = self.memoize();
        self.out.push(b'}');
        let dict = self.memoize();
        self.out.push(b'(');
        self.str("name");
        self.str(name);
        self.str("filename");
        self.str("train.py");
        self.str("line");
        self.int(7);
        self.out.push(b'u');
        self.out.push(b'a');
        (list, dict)
    }
}

/// One value of a hand-made entry.
enum V<'a> {
    Int(i128),
    /// A string memoized on first use.
    Str(&'a str),
    /// A new string object each time, as PyTorch writes `compile_context`.
    FreshStr(&'a str),
    /// The last `FreshStr` of this entry again, through the memo.
    SameAsLastFresh,
    /// One of the two frames lists made up front.
    Frames(usize),
    /// A new frames list of this many frames (the frame dicts made up front), as PyTorch
    /// writes most entries.
    InlineFrames(usize),
    /// The first frame dict made up front, its `name` set to this in place (`SETITEM`).
    RenameFrame(&'a str),
    /// A new frame dict with this name, stored over the memo slot of the first frame dict
    /// made up front.
    ReplaceFrame(&'a str),
    /// The last `InlineFrames` list from the memo, then `APPEND` (`b'a'`) or `SETITEM`
    /// (`b's'`) of the first frame dict made up front onto it.
    ModifyLastList(u8),
    /// The memo slots of two strings read before swapped (each stored over the other's with
    /// `BINPUT`): the references written afterwards to one name the other.
    SwapStrs(&'a str, &'a str),
}

type Entry<'a> = Vec<(&'a str, V<'a>)>;

/// `{'segments': [], 'device_traces': [[entry, ...]]}` with the given entries.
fn snapshot_of(binput: bool, entries: &[Entry]) -> Vec<u8> {
    let mut p = Pickler::new(binput);
    // Frames lists first (then popped), so entries can fetch them from the memo.
    let (frames, dicts): (Vec<u32>, Vec<u32>) = [p.frames("forward"), p.frames("backward")]
        .into_iter()
        .unzip();
    p.out.extend([b'0', b'0']);
    p.out.push(b'}');
    p.memoize();
    p.out.push(b'(');
    p.str("segments");
    p.out.push(b']');
    p.memoize();
    p.str("device_traces");
    p.out.push(b']');
    p.memoize();
    p.out.push(b']');
    p.memoize();
    p.out.push(b'(');
    let mut last_list = None;
    for entry in entries {
        p.out.push(b'}');
        p.memoize();
        p.out.push(b'(');
        let mut last_fresh = None;
        for (key, value) in entry {
            p.str(key);
            match value {
                V::Int(i) => p.int(*i),
                V::Str(s) => p.str(s),
                V::FreshStr(s) => {
                    p.fresh_str(s);
                    last_fresh = Some(p.next - 1);
                }
                V::SameAsLastFresh => p.get(last_fresh.expect("a fresh string before")),
                V::Frames(i) => p.get(frames[*i]),
                V::InlineFrames(n) => {
                    p.out.push(b']');
                    last_list = Some(p.memoize());
                    match n {
                        0 => {}
                        1 => {
                            p.get(dicts[0]);
                            p.out.push(b'a');
                        }
                        _ => {
                            p.out.push(b'(');
                            for k in 0..*n {
                                p.get(dicts[k % 2]);
                            }
                            p.out.push(b'e');
                        }
                    }
                }
                V::RenameFrame(name) => {
                    p.get(dicts[0]);
                    p.str("name");
                    p.str(name);
                    p.out.push(b's');
                }
                V::ModifyLastList(op) => {
                    p.get(last_list.expect("an inline frames list before"));
                    p.get(dicts[0]);
                    if *op == b's' {
                        p.get(dicts[0]);
                    }
                    p.out.push(*op);
                }
                V::SwapStrs(a, b) => {
                    let slot = |p: &Pickler, s: &str| {
                        u8::try_from(p.memo[s]).expect("an early memo index")
                    };
                    let (slot_a, slot_b) = (slot(&p, a), slot(&p, b));
                    p.out.extend([0x8c, b.len() as u8]);
                    p.out.extend(b.as_bytes());
                    p.out.extend([b'q', slot_a, b'0']);
                    p.out.extend([0x8c, a.len() as u8]);
                    p.out.extend(a.as_bytes());
                    p.out.extend([b'q', slot_b]);
                }
                V::ReplaceFrame(name) => {
                    p.out.extend([b'}', b'(']);
                    p.str("name");
                    p.str(name);
                    p.str("filename");
                    p.str("train.py");
                    p.str("line");
                    p.int(7);
                    p.out.push(b'u');
                    let slot = u8::try_from(dicts[0]).expect("an early memo index");
                    p.out.extend([b'q', slot]);
                }
            }
        }
        p.out.push(b'u');
    }
    // APPENDS the entries, APPEND the trace to the device list, SETITEMS the top dict.
    p.out.extend([b'e', b'a', b'u', b'.']);
    p.out
}

fn plain_entry(action: &str, addr: i128, frames: usize) -> Entry<'_> {
    vec![
        ("action", V::Str(action)),
        ("addr", V::Int(addr)),
        ("size", V::Int(512)),
        ("stream", V::Int(0)),
        ("time_us", V::Int(1_760_000_000_000_000)),
        ("frames", V::Frames(frames)),
    ]
}

fn plain_run() -> Vec<Entry<'static>> {
    (0..40)
        .map(|i| {
            let action = if i % 2 == 0 {
                "alloc"
            } else {
                "free_requested"
            };
            plain_entry(action, 0x7f00_0000_0000 + i * 512, (i % 2) as usize)
        })
        .collect()
}

/// Reads `bytes` through both paths and a trickling stream; they must agree, in success or
/// in the error they report.
fn check_both_paths(bytes: &[u8], what: &str) -> usize {
    let generic = pickle::read_with_fast_path(bytes, false);
    match pickle::read_with_fast_path(bytes, true) {
        Ok((fast, hits)) => {
            let (generic, _) = generic.unwrap_or_else(|e| panic!("{what}: generic path: {e}"));
            assert_same(&fast, &generic, what);
            assert_same(&fast, &streamed(bytes, 2, false).unwrap(), what);
            assert_same(&fast, &streamed(bytes, 2, true).unwrap(), what);
            hits
        }
        Err(e) => {
            let generic = generic
                .err()
                .unwrap_or_else(|| panic!("{what}: only fast failed"));
            assert_eq!(e.to_string(), generic.to_string(), "{what}");
            0
        }
    }
}

#[test]
fn hand_made_entry_layouts_read_the_same_through_both_paths() {
    type Change = fn(&mut Entry<'static>);
    let changes: [(&str, Change); 17] = [
        ("none", |_| {}),
        ("an unknown key", |e| e.push(("mystery", V::Int(1)))),
        ("keys out of order", |e| e.swap(1, 2)),
        ("a negative addr", |e| e[1] = ("addr", V::Int(-5))),
        ("addr 2^63", |e| e[1] = ("addr", V::Int(1 << 63))),
        ("addr 2^64", |e| e[1] = ("addr", V::Int(1 << 64))),
        ("an unknown action", |e| {
            e[0] = ("action", V::Str("teleport"))
        }),
        ("frames first", |e| {
            let frames = e.pop().expect("frames");
            e.insert(0, frames);
        }),
        ("a str stream", |e| e[3] = ("stream", V::Str("default"))),
        ("no addr", |e| e.retain(|(k, _)| *k != "addr")),
        ("device_free", |e| {
            e.insert(2, ("device_free", V::Int(1 << 30)))
        }),
        ("frames an int", |e| e[5] = ("frames", V::Int(3))),
        ("time_us -1", |e| e[4] = ("time_us", V::Int(-1))),
        ("compile_context shared with user_metadata", |e| {
            e.insert(5, ("compile_context", V::FreshStr("N/A")));
            e.insert(6, ("user_metadata", V::SameAsLastFresh));
        }),
        ("an empty inline frames list", |e| {
            e[5] = ("frames", V::InlineFrames(0))
        }),
        ("a one-frame inline list", |e| {
            e[5] = ("frames", V::InlineFrames(1))
        }),
        ("an inline list of 1001 frames", |e| {
            e[5] = ("frames", V::InlineFrames(1001))
        }),
    ];
    for binput in [false, true] {
        for (name, change) in &changes {
            let mut run = plain_run();
            change(&mut run[5]);
            let bytes = snapshot_of(binput, &run);
            let what = format!("{name} (binput: {binput})");
            let hits = check_both_paths(&bytes, &what);
            eprintln!("{what}: {hits} fast");
        }
        // Every entry in PyTorch's layout: a fresh 'N/A' and a fresh frames list each.
        let mut run = plain_run();
        for (i, e) in run.iter_mut().enumerate() {
            e[5] = ("frames", V::InlineFrames(i % 5));
            e.insert(5, ("compile_context", V::FreshStr("N/A")));
            e.insert(6, ("user_metadata", V::SameAsLastFresh));
        }
        let hits = check_both_paths(&snapshot_of(binput, &run), "fresh strings");
        assert!(hits >= 37, "fresh strings: only {hits} of 40 fast");
    }
}

/// Entries 1.. hold the same fresh frames list bytes (the two frame dicts made up front);
/// entry 0 has an empty list (it introduces the keys). `change` is added to entry `at` as
/// the value of an unknown key. Returns the innermost frame's name of every entry from 1 on.
fn same_list_bytes_with(binput: bool, at: usize, change: V<'static>) -> Vec<String> {
    let mut run: Vec<Entry> = (0..6)
        .map(|i| {
            let mut e = plain_entry("alloc", 4096 * (i + 1), 0);
            e[5] = ("frames", V::InlineFrames(if i == 0 { 0 } else { 2 }));
            e
        })
        .collect();
    run[at].push(("mystery", change));
    let bytes = snapshot_of(binput, &run);
    let hits = check_both_paths(&bytes, &format!("change at {at} (binput: {binput})"));
    assert!(hits >= 4, "only {hits} entries through the fast path");
    let snap = pickle::read(&bytes).unwrap();
    let trace = &snap.device_traces.as_ref().unwrap()[0];
    trace[1..]
        .iter()
        .map(|e| {
            let innermost = snap.stacks.get(e.frames.expect("frames"))[0];
            snap.frames.get(innermost).name.clone()
        })
        .collect()
}

#[test]
fn a_frames_list_read_again_sees_a_frame_renamed_after_the_fast_path_gave_up() {
    // Entry 1's fast-path attempt reads the list (converting its frames), then gives up at the
    // unknown key; the generic VM then renames the first frame before it is read as a frame.
    // Entries 2.. have the same list bytes: they must not get the stack from before.
    for binput in [false, true] {
        let names = same_list_bytes_with(binput, 1, V::RenameFrame("renamed"));
        assert_eq!(names, ["renamed"; 5], "binput: {binput}");
    }
}

#[test]
fn a_frames_list_read_again_sees_a_frame_replaced_in_the_memo() {
    // Entry 1 is read by the fast path; entry 2 stores another frame dict over the first
    // frame's memo slot. Entries 3.. have entry 1's list bytes but reference the new frame.
    for binput in [false, true] {
        let names = same_list_bytes_with(binput, 2, V::ReplaceFrame("replaced"));
        assert_eq!(
            names,
            ["forward", "forward", "replaced", "replaced", "replaced"],
            "binput: {binput}"
        );
    }
}

#[test]
fn changing_a_frames_list_read_as_a_stack_is_the_same_error_on_both_paths() {
    // Found by fuzzing `reader_paths`: a fresh frames list the fast path read is a stack in
    // the memo, the generic VM's is a frozen list; APPEND or SETITEM onto it from the memo
    // said "APPEND on a list, expected a list" on one path and "modifies ... after it was
    // read" on the other.
    for op in [b'a', b's'] {
        for binput in [false, true] {
            let mut run: Vec<Entry> = (0..4)
                .map(|i| {
                    let mut e = plain_entry("alloc", 4096 * (i + 1), 0);
                    e[5] = ("frames", V::InlineFrames(if i == 0 { 0 } else { 2 }));
                    e
                })
                .collect();
            // Entry 3 modifies entry 2's list (and has a shared one of its own).
            run[3][5] = ("frames", V::Frames(0));
            run[3].push(("mystery", V::ModifyLastList(op)));
            let bytes = snapshot_of(binput, &run);
            let what = format!("op {} (binput: {binput})", op as char);
            let error = pickle::read(&bytes).expect_err(&what).to_string();
            assert!(error.contains("after it was read"), "{what}: {error}");
            check_both_paths(&bytes, &what);
        }
    }
}

#[test]
fn an_entry_key_or_action_rebound_in_the_memo_is_read_as_what_it_now_names() {
    // The fast path matches the references to entry keys and action names by their bytes,
    // as the last entry had them. Entry 10 swaps the memo slots of two keys or two action
    // names: the same bytes in entries 11.. name the other one.
    for binput in [false, true] {
        let mut run = plain_run();
        run[10].push(("mystery", V::SwapStrs("alloc", "free_requested")));
        let bytes = snapshot_of(binput, &run);
        let hits = check_both_paths(&bytes, &format!("actions swapped (binput: {binput})"));
        assert!(
            hits >= 35,
            "only {hits} of 40 entries through the fast path"
        );
        let snap = pickle::read(&bytes).unwrap();
        let trace = &snap.device_traces.as_ref().unwrap()[0];
        // Written as free_requested (odd) and alloc (even), read as what the slots now hold.
        assert_eq!(trace[9].action, memsnap_format::Action::FreeRequested);
        assert_eq!(trace[11].action, memsnap_format::Action::Alloc);
        assert_eq!(trace[12].action, memsnap_format::Action::FreeRequested);

        let mut run = plain_run();
        run[10].push(("mystery", V::SwapStrs("addr", "size")));
        let bytes = snapshot_of(binput, &run);
        check_both_paths(&bytes, &format!("keys swapped (binput: {binput})"));
        let snap = pickle::read(&bytes).unwrap();
        let trace = &snap.device_traces.as_ref().unwrap()[0];
        assert_eq!(
            (trace[9].addr, trace[9].size),
            (0x7f00_0000_0000 + 9 * 512, 512)
        );
        assert_eq!(
            (trace[11].addr, trace[11].size),
            (512, 0x7f00_0000_0000 + 11 * 512)
        );
    }
}

#[test]
fn entries_the_fast_path_leaves_are_still_read_exactly() {
    let mut entries: Vec<Entry> = (0..10)
        .map(|i| plain_entry("alloc", 4096 * (i + 1), 0))
        .collect();
    entries[4].push(("mystery", V::Int(42)));
    entries[6][1] = ("addr", V::Int(1 << 63));
    let bytes = snapshot_of(false, &entries);
    let (snap, hits) = pickle::read_with_fast_path(&bytes, true).unwrap();
    // The first entry introduces the keys and the action name; the two odd ones are left to
    // the generic VM.
    assert_eq!(hits, 7);
    let trace = &snap.device_traces.as_ref().unwrap()[0];
    assert_eq!(trace.len(), 10);
    assert_eq!(trace[6].addr, 1 << 63);
    let extra = &trace[4].rare.as_ref().unwrap().extra;
    assert_eq!(extra[0].0, "mystery");
    assert_eq!(trace[9].addr, 4096 * 10);
}

#[test]
fn a_pickle_from_a_pipe_is_read_whole_not_checked_against_a_zero_length() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("snapshot.pickle");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("notice: no mkfifo here; skipping the pipe test");
        return;
    }
    let bytes = synthetic(11, 3_000);
    let writer = {
        let (fifo, bytes) = (fifo.clone(), bytes.clone());
        std::thread::spawn(move || std::fs::write(fifo, bytes).unwrap())
    };
    let (from_pipe, _) = io::read_path(&fifo).unwrap();
    writer.join().unwrap();
    assert_same(&pickle::read(&bytes).unwrap(), &from_pipe, "pipe");
}

/// The fast path, the generic VM and a trickling stream (read here and read ahead) accept
/// the same input with the same snapshot, or refuse it with the same error.
fn assert_paths_agree(bytes: &[u8], what: &str) {
    let fast = pickle::read_with_fast_path(bytes, true).map(|(s, _)| s);
    let generic = pickle::read_with_fast_path(bytes, false).map(|(s, _)| s);
    let stream = streamed(bytes, 7, false);
    let ahead = streamed(bytes, 7, true);
    for (name, other) in [
        ("generic", generic),
        ("stream", stream),
        ("stream read ahead", ahead),
    ] {
        match (&fast, other) {
            (Ok(a), Ok(b)) => assert_same(a, &b, &format!("{what}: fast vs {name}")),
            (Err(a), Err(b)) => {
                assert_eq!(a.to_string(), b.to_string(), "{what}: fast vs {name}")
            }
            (a, b) => panic!(
                "{what}: fast {:?} vs {name} {:?}",
                a.as_ref().err().map(ToString::to_string),
                b.err().map(|e| e.to_string())
            ),
        }
    }
}

#[test]
fn damaged_pickles_read_the_same_through_every_path() {
    // Our writer's layout, and PyTorch's (fresh strings, a fresh frames list per entry).
    let ours = synthetic(13, 400);
    let mut run = plain_run();
    for (i, e) in run.iter_mut().enumerate() {
        e[5] = ("frames", V::InlineFrames(i % 4));
        e.insert(5, ("compile_context", V::FreshStr("N/A")));
        e.insert(6, ("user_metadata", V::SameAsLastFresh));
    }
    let theirs = snapshot_of(false, &run);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    for (name, original) in [("ours", &ours), ("pytorch", &theirs)] {
        assert_paths_agree(original, name);
        for round in 0..300 {
            let mut bytes = original.clone();
            for _ in 0..1 + next(3) {
                let at = next(bytes.len());
                bytes[at] = next(256) as u8;
            }
            assert_paths_agree(&bytes, &format!("{name}, damage round {round}"));
        }
    }
}

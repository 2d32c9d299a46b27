//! The pickle writer: protocol 4 with framing, following the CPython C pickler's encoding
//! rules (spec §4.2) and PyTorch's key orders (spec §1), with more memo sharing than PyTorch:
//! every string is written once and referenced after, each stack once as a list and each
//! frame once as a dict. So the output is never larger than `_dump_snapshot`'s. The opcodes
//! and frames are spelled by the shared [`Emitter`] (`emit`).

use std::collections::HashMap;

use std::convert::Infallible;

use crate::int::PyInt;
use crate::intern::{FrameId, StackId, StrId};
use crate::model::*;
use crate::schema::{self, Emit, Key, Walk};
use crate::value::Value;

use super::emit::Emitter;
use super::opcodes::op;

const NO_MEMO: u32 = u32::MAX;

/// Encodes a snapshot as a protocol-4 pickle.
pub(crate) fn to_vec(snapshot: &Snapshot) -> Vec<u8> {
    let mut w = Writer {
        snap: snapshot,
        e: Emitter::new(64 * 1024 + 32 * snapshot.entry_count()),
        statics: vec![NO_MEMO; Key::ALL.len()],
        str_ids: vec![NO_MEMO; snapshot.strings.len()],
        stack_ids: vec![NO_MEMO; snapshot.stacks.len()],
        frame_ids: vec![NO_MEMO; snapshot.frames.len()],
        dyn_strs: HashMap::new(),
    };
    let Ok(()) = schema::snapshot(&mut w, snapshot);
    w.e.finish()
}

pub(crate) struct Writer<'s> {
    snap: &'s Snapshot,
    e: Emitter,
    statics: Vec<u32>,
    str_ids: Vec<u32>,
    stack_ids: Vec<u32>,
    frame_ids: Vec<u32>,
    dyn_strs: HashMap<&'s str, u32>,
}

impl<'s> Writer<'s> {
    // ---------------------------------------------------------------- strings

    /// Any int, as CPython writes it (`LONG1`, or `LONG4` past 255 bytes).
    fn pyint(&mut self, v: &PyInt) {
        match v {
            PyInt::Small(i) => self.e.int(*i),
            PyInt::Big(bytes) => self.e.long(bytes),
        }
    }

    /// A string written in full and memoized; returns its memo index.
    fn str_fresh(&mut self, s: &str) -> u32 {
        self.e.str(s.as_bytes());
        self.e.memoize()
    }

    /// A memo reference, unless writing a short string again is smaller than `LONG_BINGET`.
    #[inline]
    fn str_ref(&mut self, idx: u32, s: &str) {
        if idx >= 256 && s.len() <= 2 {
            self.e.str(s.as_bytes());
        } else {
            self.e.get(idx);
        }
    }

    #[inline]
    fn s(&mut self, key: Key) {
        let idx = self.statics[key as usize];
        let text = key.text();
        if idx == NO_MEMO {
            self.statics[key as usize] = self.str_fresh(text);
        } else {
            self.str_ref(idx, text);
        }
    }

    fn str_id(&mut self, id: StrId) {
        let snap = self.snap;
        let text = snap.strings.get(id);
        let idx = self.str_ids[id.index()];
        if idx == NO_MEMO {
            self.str_ids[id.index()] = self.str_fresh(text);
        } else {
            self.str_ref(idx, text);
        }
    }

    /// Any other string, memoized by value.
    fn str(&mut self, s: &'s str) {
        match self.dyn_strs.get(s) {
            Some(&idx) => self.str_ref(idx, s),
            None => {
                let idx = self.str_fresh(s);
                self.dyn_strs.insert(s, idx);
            }
        }
    }

    // ---------------------------------------------------------------- containers

    /// `EMPTY_DICT MEMOIZE` and, for two or more pairs, `MARK`.
    fn dict_begin(&mut self, pairs: usize) {
        self.e.op(op::EMPTY_DICT);
        self.e.memoize();
        if pairs >= 2 {
            self.e.op(op::MARK);
        }
    }

    fn dict_end(&mut self, pairs: usize) {
        match pairs {
            0 => {}
            1 => self.e.op(op::SETITEM),
            _ => self.e.op(op::SETITEMS),
        }
        self.e.boundary();
    }

    /// A list in CPython's batches ([`Emitter::batch_item_begin`]): one item with `APPEND`,
    /// more in `MARK ... APPENDS` batches of at most 1000 (a final batch of one included).
    fn list_of<T>(&mut self, items: &'s [T], mut item: impl FnMut(&mut Self, &'s T)) -> u32 {
        self.e.op(op::EMPTY_LIST);
        let idx = self.e.memoize();
        let len = items.len();
        for (i, x) in items.iter().enumerate() {
            self.e.batch_item_begin(i, len);
            item(self, x);
            if len > 1 {
                self.e.boundary();
            }
            self.e.batch_item_end(i, len, false);
        }
        self.e.boundary();
        idx
    }

    pub(crate) fn value(&mut self, v: &'s Value) {
        match v {
            Value::None => self.e.op(op::NONE),
            Value::Bool(b) => self.e.bool(*b),
            Value::Int(i) => self.e.int(*i),
            Value::BigInt(bytes) => self.e.long(bytes),
            Value::Float(f) => self.e.float(*f),
            Value::Str(s) => self.str(s),
            Value::Bytes(b) => {
                // Inside the frame whatever its size (unlike `Emitter::bytes`, which follows
                // CPython): what this writer has always written for a bytes extra.
                let out = &mut self.e.out;
                if let Ok(n) = u8::try_from(b.len()) {
                    out.extend_from_slice(&[op::SHORT_BINBYTES, n]);
                } else {
                    out.push(op::BINBYTES);
                    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                }
                out.extend_from_slice(b);
                self.e.memoize();
            }
            Value::List(items) => {
                self.list_of(items, |w, x| w.value(x));
            }
            Value::Tuple(items) => {
                let len = items.len();
                self.e.tuple_begin(len);
                for x in items {
                    self.value(x);
                    if len > 3 {
                        self.e.boundary();
                    }
                }
                if self.e.tuple_end(len).is_none() {
                    // CPython does not memoize `()`; this writer always has (readers do not
                    // mind, and its output stays what it was).
                    self.e.memoize();
                }
            }
            Value::Dict(pairs) => {
                self.e.op(op::EMPTY_DICT);
                self.e.memoize();
                let len = pairs.len();
                for (i, (k, v)) in pairs.iter().enumerate() {
                    self.e.batch_item_begin(i, len);
                    self.value(k);
                    self.value(v);
                    if len > 1 {
                        self.e.boundary();
                    }
                    self.e.batch_item_end(i, len, true);
                }
            }
        }
        self.e.boundary();
    }

    // ---------------------------------------------------------------- stacks

    fn stack(&mut self, id: StackId) {
        let idx = self.stack_ids[id.index()];
        if idx != NO_MEMO {
            self.e.get(idx);
            return;
        }
        let snap = self.snap;
        let idx = self.list_of(snap.stacks.get(id), |w, f| w.frame(*f));
        self.stack_ids[id.index()] = idx;
    }

    fn frame(&mut self, id: FrameId) {
        let idx = self.frame_ids[id.index()];
        if idx != NO_MEMO {
            self.e.get(idx);
            return;
        }
        let snap = self.snap;
        // The dict's own memo index: `dict_begin` memoizes it first.
        self.frame_ids[id.index()] = self.e.memo_next();
        let Ok(()) = schema::frame(self, snap.frames.get(id));
    }
}

/// The pickle spelling of the schema ([`schema`] decides the keys and their order).
impl<'s> Emit<'s> for Writer<'s> {
    type Error = Infallible;
    const COUNTS_PAIRS: bool = true;

    #[inline(always)]
    fn dict_begin(&mut self, pairs: usize) {
        Writer::dict_begin(self, pairs);
    }

    #[inline(always)]
    fn dict_end(&mut self, pairs: usize) {
        Writer::dict_end(self, pairs);
    }

    #[inline(always)]
    fn key(&mut self, key: Key) {
        self.s(key);
    }

    #[inline]
    fn extra_key(&mut self, key: &'s str) {
        self.str(key);
    }

    #[inline(always)]
    fn known(&mut self, value: Key) {
        self.s(value);
    }

    #[inline(always)]
    fn uint(&mut self, v: u64) {
        self.e.uint(v);
    }

    #[inline(always)]
    fn int(&mut self, v: i64) {
        self.e.int(v);
    }

    #[inline]
    fn pyint(&mut self, v: &'s PyInt) -> Result<(), Infallible> {
        Writer::pyint(self, v);
        Ok(())
    }

    fn float(&mut self, v: f64) {
        self.e.float(v);
    }

    fn bool(&mut self, v: bool) {
        self.e.bool(v);
    }

    #[inline]
    fn str(&mut self, s: &'s str) {
        Writer::str(self, s);
    }

    #[inline(always)]
    fn strings(&self) -> Option<&'s crate::intern::StrTable> {
        Some(&self.snap.strings)
    }

    fn str_id(&mut self, id: StrId) {
        Writer::str_id(self, id);
    }

    #[inline(always)]
    fn stack(&mut self, id: StackId) -> Result<(), Infallible> {
        Writer::stack(self, id);
        Ok(())
    }

    #[inline]
    fn value(&mut self, v: &'s Value) -> Result<(), Infallible> {
        Writer::value(self, v);
        Ok(())
    }

    #[inline(always)]
    fn list<T: Walk<'s>>(&mut self, items: &'s [T]) -> Result<(), Infallible> {
        self.list_of(items, |w, x| {
            let Ok(()) = x.walk(w);
        });
        Ok(())
    }

    fn pair_begin(&mut self) {}

    fn pair_next(&mut self) {}

    fn pair_end(&mut self) {
        self.e.op(op::TUPLE2);
        self.e.memoize();
    }

    fn divisions(&mut self, d: &'s [(String, PyInt)]) -> Result<(), Infallible> {
        self.e.op(op::EMPTY_DICT);
        self.e.memoize();
        for (i, (k, v)) in d.iter().enumerate() {
            self.e.batch_item_begin(i, d.len());
            Writer::str(self, k);
            Writer::pyint(self, v);
            self.e.batch_item_end(i, d.len(), true);
        }
        self.e.boundary();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::emit::{FRAME_HEADER, FRAME_TARGET};
    use super::*;
    use crate::intern::Frame;

    fn encode<'s>(f: impl FnOnce(&mut Writer<'s>)) -> Vec<u8> {
        // Leaked so that values borrowed by the writer may live shorter than the snapshot.
        let snap: &'s Snapshot = Box::leak(Box::default());
        let mut w = Writer {
            snap,
            e: Emitter::new(0),
            statics: vec![NO_MEMO; Key::ALL.len()],
            str_ids: Vec::new(),
            stack_ids: Vec::new(),
            frame_ids: Vec::new(),
            dyn_strs: HashMap::new(),
        };
        f(&mut w);
        // After `PROTO 4` and the open frame's header.
        w.e.out.split_off(2 + FRAME_HEADER)
    }

    #[test]
    fn ints_use_the_smallest_cpython_opcode() {
        let cases: &[(i64, &[u8])] = &[
            (0, &[b'K', 0]),
            (255, &[b'K', 255]),
            (256, &[b'M', 0, 1]),
            (65535, &[b'M', 0xff, 0xff]),
            (65536, &[b'J', 0, 0, 1, 0]),
            (-1, &[b'J', 0xff, 0xff, 0xff, 0xff]),
            (i32::MIN as i64, &[b'J', 0, 0, 0, 0x80]),
            (1 << 31, &[0x8a, 5, 0, 0, 0, 0x80, 0]),
            (
                0x7fe9_c3b0_8000,
                &[0x8a, 6, 0, 0x80, 0xb0, 0xc3, 0xe9, 0x7f],
            ),
            (-(1 << 31) - 1, &[0x8a, 5, 0xff, 0xff, 0xff, 0x7f, 0xff]),
            (i64::MIN, &[0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x80]),
        ];
        for &(v, expected) in cases {
            assert_eq!(encode(|w| w.e.int(v)), expected, "{v}");
        }
        assert_eq!(
            encode(|w| w.e.uint(1 << 63)),
            [0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0x80, 0]
        );
        assert_eq!(
            encode(|w| w.e.uint(u64::MAX)),
            [0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]
        );
    }

    #[test]
    fn lists_are_batched_by_1000_like_the_c_pickler() {
        let list = |n: usize| Value::List(vec![Value::Int(7); n]);
        let one = list(1);
        assert_eq!(encode(|w| w.value(&one)), [b']', 0x94, b'K', 7, b'a']);
        let two = list(2);
        assert_eq!(
            encode(|w| w.value(&two)),
            [b']', 0x94, b'(', b'K', 7, b'K', 7, b'e']
        );
        // 1001 items: a full batch, then a batch of one that still uses MARK ... APPENDS.
        let big = list(1001);
        let out = encode(|w| w.value(&big));
        let mut expected = vec![b']', 0x94, b'('];
        expected.extend([b'K', 7].repeat(1000));
        expected.extend([b'e', b'(', b'K', 7, b'e']);
        assert_eq!(out, expected);
        let dict = Value::Dict(vec![(Value::None, Value::None); 2500]);
        let out = encode(|w| w.value(&dict));
        assert_eq!(out.iter().filter(|&&b| b == b'u').count(), 3);
        assert_eq!(out.iter().filter(|&&b| b == b'(').count(), 3);
    }

    #[test]
    fn strings_are_written_once_then_referenced() {
        let out = encode(|w| {
            w.str("abc");
            w.str("abc");
        });
        assert_eq!(out, [0x8c, 3, b'a', b'b', b'c', 0x94, b'h', 0]);
        let long = "x".repeat(300);
        let out = encode(|w| w.str(&long));
        assert_eq!(&out[..5], &[b'X', 44, 1, 0, 0]);
    }

    /// Walks the top-level framing: every frame but the last holds at least 64 KiB, and
    /// anything between frames is a string of at least 64 KiB.
    fn frames_of(out: &[u8]) -> Vec<usize> {
        assert_eq!(&out[..2], &[op::PROTO, 4]);
        let mut pos = 2;
        let mut frames = Vec::new();
        while pos < out.len() {
            match out[pos] {
                op::FRAME => {
                    let len = u64::from_le_bytes(out[pos + 1..pos + 9].try_into().unwrap());
                    frames.push(len as usize);
                    pos += 9 + len as usize;
                }
                op::BINUNICODE => {
                    let len = u32::from_le_bytes(out[pos + 1..pos + 5].try_into().unwrap());
                    assert!(len as usize >= FRAME_TARGET, "short unframed string");
                    pos += 5 + len as usize;
                }
                // CPython leaves a last frame of under 4 bytes without a header.
                other => {
                    assert!(
                        out.len() - pos < 4,
                        "unframed opcode 0x{other:02x} at {pos}"
                    );
                    break;
                }
            }
        }
        frames
    }

    fn big_snapshot(entries: usize) -> Snapshot {
        let mut snap = Snapshot::new(1);
        let stack = snap.intern_stack([
            Frame::new("forward", "/home/user/model.py", 54),
            Frame::new("<module>", "/home/user/train.py", 10),
        ]);
        let na = snap.strings.intern("N/A");
        let trace: Vec<TraceEntry> = (0..entries as u64)
            .map(|i| {
                let mut e = TraceEntry::new(Action::Alloc, 0x7f00_0000_0000 + i * 512, 512, 0);
                e.set_time_us(Some(1_700_000_000_000_000 + i as i64));
                e.set_compile_context(Some(na), &snap.strings);
                e.frames = Some(stack);
                e
            })
            .collect();
        snap.device_traces = Some(vec![trace]);
        snap
    }

    #[test]
    fn frames_close_at_the_first_boundary_after_64_kib() {
        let out = to_vec(&big_snapshot(20_000));
        let frames = frames_of(&out);
        assert!(frames.len() > 3);
        let (last, full) = frames.split_last().unwrap();
        for &len in full {
            // One trace entry is the largest step between boundaries here.
            assert!((FRAME_TARGET..FRAME_TARGET + 64).contains(&len), "{len}");
        }
        assert!(*last < FRAME_TARGET + 64);
        assert_eq!(out.last(), Some(&op::STOP));
    }

    #[test]
    fn small_pickles_have_no_frame_header_for_under_4_bytes() {
        let snap = Snapshot {
            shape: Shape::SegmentList,
            ..Default::default()
        };
        // `] MEMOIZE .` is 3 bytes: no FRAME.
        assert_eq!(to_vec(&snap), [op::PROTO, 4, b']', 0x94, b'.']);
    }

    #[test]
    fn strings_of_64_kib_or_more_are_written_between_frames() {
        let mut snap = big_snapshot(10);
        let long = "y".repeat(FRAME_TARGET + 5);
        snap.extra.push(("note".into(), Value::Str(long.clone())));
        let out = to_vec(&snap);
        let frames = frames_of(&out);
        assert_eq!(frames.len(), 1, "one frame before the string");
        let at = out
            .windows(5)
            .position(|w| w == [b'X', 5, 0, 1, 0])
            .expect("BINUNICODE header");
        assert_eq!(&out[at + 5..at + 5 + long.len()], long.as_bytes());
        // Then MEMOIZE, SETITEMS, STOP: 3 bytes, too few for a frame header.
        assert_eq!(
            &out[at + 5 + long.len()..],
            [op::MEMOIZE, op::SETITEMS, op::STOP]
        );
    }

    #[test]
    fn each_stack_and_frame_is_written_once() {
        let out = to_vec(&big_snapshot(50));
        let count = |needle: &[u8]| out.windows(needle.len()).filter(|w| *w == needle).count();
        assert_eq!(count(b"/home/user/model.py"), 1);
        assert_eq!(count(b"forward"), 1);
        assert_eq!(count(b"N/A"), 1);
        assert_eq!(count(b"compile_context"), 1);
    }
}

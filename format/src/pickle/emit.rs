//! The opcode emitter: protocol 4 with framing, spelled as CPython's C pickler spells it
//! (spec §4.2). It knows opcodes and frames, not objects: what to write, in which order, and
//! what to memoize is the caller's. The snapshot writer (`writer`) and the `memsnap` Python
//! package's `memsnap.dump` both write through it, so both give the bytes CPython gives.
//!
//! ```
//! use memsnap_format::pickle::emit::{op, Emitter};
//!
//! let mut e = Emitter::new(64);
//! e.op(op::EMPTY_LIST);
//! e.memoize();
//! e.int(300);
//! e.op(op::APPEND);
//! let bytes = e.finish();
//! // pickle.dumps([300], protocol=4)
//! assert_eq!(bytes, b"\x80\x04\x95\x07\x00\x00\x00\x00\x00\x00\x00]\x94M,\x01a.");
//! ```

pub use super::opcodes::op;

/// A frame is closed at the first opcode boundary once it holds this many bytes, and payloads
/// of this size or more are written between frames.
pub const FRAME_TARGET: usize = 64 * 1024;
/// Items per `MARK ... APPENDS` / `MARK ... SETITEMS` batch (CPython's).
pub const BATCH: usize = 1000;
/// `FRAME` and its 8-byte length.
pub(crate) const FRAME_HEADER: usize = 9;

/// Writes opcodes into a protocol-4 pickle (see the module docs).
#[derive(Clone, Debug)]
pub struct Emitter {
    pub(crate) out: Vec<u8>,
    /// Offset of the open frame's header.
    frame_start: usize,
    /// The index the next `MEMOIZE` stores at.
    memo_next: u32,
}

impl Emitter {
    /// `PROTO 4` and an open frame, in a buffer of `capacity` bytes to start with.
    pub fn new(capacity: usize) -> Self {
        let mut e = Emitter {
            out: Vec::with_capacity(capacity),
            frame_start: 0,
            memo_next: 0,
        };
        e.out.extend_from_slice(&[op::PROTO, 4]);
        e.start_frame();
        e
    }

    /// `STOP`, the last frame closed: the pickle.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(op::STOP);
        self.commit_frame();
        self.out
    }

    fn start_frame(&mut self) {
        self.frame_start = self.out.len();
        self.out
            .extend_from_slice(&[op::FRAME, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    /// Writes the open frame's length, or drops its header when it holds under 4 bytes
    /// (as CPython does).
    fn commit_frame(&mut self) {
        let body = self.out.len() - self.frame_start - FRAME_HEADER;
        if body >= 4 {
            let len = (body as u64).to_le_bytes();
            self.out[self.frame_start + 1..self.frame_start + FRAME_HEADER].copy_from_slice(&len);
        } else {
            self.out
                .drain(self.frame_start..self.frame_start + FRAME_HEADER);
        }
    }

    /// An opcode boundary: starts a new frame once the open one holds [`FRAME_TARGET`] bytes.
    /// Where the boundaries are decides where frames end, so a caller that must match
    /// CPython's bytes calls it where CPython checks (at the start of every `save`).
    #[inline]
    pub fn boundary(&mut self) {
        if self.out.len() - self.frame_start - FRAME_HEADER >= FRAME_TARGET {
            self.commit_frame();
            self.start_frame();
        }
    }

    /// An opcode without an argument (`MARK`, `EMPTY_DICT`, `APPENDS`, `TUPLE2`, ...).
    #[inline]
    pub fn op(&mut self, code: u8) {
        self.out.push(code);
    }

    /// `MEMOIZE`; returns the memo index it stores at.
    #[inline]
    pub fn memoize(&mut self) -> u32 {
        self.out.push(op::MEMOIZE);
        let index = self.memo_next;
        self.memo_next += 1;
        index
    }

    /// The memo index the next [`Emitter::memoize`] returns.
    #[inline]
    pub fn memo_next(&self) -> u32 {
        self.memo_next
    }

    /// A memo reference: `BINGET`, or `LONG_BINGET` from index 256.
    #[inline]
    pub fn get(&mut self, index: u32) {
        if let Ok(small) = u8::try_from(index) {
            self.out.extend_from_slice(&[op::BINGET, small]);
        } else {
            self.out.push(op::LONG_BINGET);
            self.out.extend_from_slice(&index.to_le_bytes());
        }
    }

    /// Before item `i` of the `len` items of a list, or pair `i` of the `len` pairs of a dict
    /// (after its `EMPTY_LIST`/`EMPTY_DICT` and `MEMOIZE`): `MARK` where a batch of [`BATCH`]
    /// starts, when there are two or more. CPython's C pickler writes a lone item with
    /// `APPEND`/`SETITEM`, more in `MARK ... APPENDS` batches (a final batch of one included);
    /// [`Emitter::batch_item_end`] closes them.
    #[inline]
    pub fn batch_item_begin(&mut self, i: usize, len: usize) {
        if len > 1 && i.is_multiple_of(BATCH) {
            self.op(op::MARK);
        }
    }

    /// After item (or pair) `i` of `len`: `APPENDS` (`SETITEMS` for a dict's pairs) where a
    /// batch ends, `APPEND` (`SETITEM`) after a lone one.
    #[inline]
    pub fn batch_item_end(&mut self, i: usize, len: usize, dict: bool) {
        let (one, batch) = if dict {
            (op::SETITEM, op::SETITEMS)
        } else {
            (op::APPEND, op::APPENDS)
        };
        if len == 1 {
            self.op(one);
        } else if (i + 1).is_multiple_of(BATCH) || i + 1 == len {
            self.op(batch);
        }
    }

    /// Before the `len` items of a tuple: `EMPTY_TUPLE` for none (the whole tuple: CPython
    /// writes no items and does not memoize it), `MARK` for more than three.
    #[inline]
    pub fn tuple_begin(&mut self, len: usize) {
        match len {
            0 => self.op(op::EMPTY_TUPLE),
            1..=3 => {}
            _ => self.op(op::MARK),
        }
    }

    /// After the `len` items of a tuple: `TUPLE1`, `TUPLE2`, `TUPLE3` or `TUPLE`, then
    /// `MEMOIZE` (a tuple is memoized after its items); its memo index. Nothing for the empty
    /// tuple (`None`).
    #[inline]
    pub fn tuple_end(&mut self, len: usize) -> Option<u32> {
        let code = match len {
            0 => return None,
            1 => op::TUPLE1,
            2 => op::TUPLE2,
            3 => op::TUPLE3,
            _ => op::TUPLE,
        };
        self.op(code);
        Some(self.memoize())
    }

    /// An int in the smallest opcode: `BININT1`, `BININT2`, `BININT`, else `LONG1`.
    #[inline]
    pub fn int(&mut self, v: i64) {
        if let Ok(v) = u8::try_from(v) {
            self.out.extend_from_slice(&[op::BININT1, v]);
        } else if let Ok(v) = u16::try_from(v) {
            self.out.push(op::BININT2);
            self.out.extend_from_slice(&v.to_le_bytes());
        } else if let Ok(v) = i32::try_from(v) {
            self.out.push(op::BININT);
            self.out.extend_from_slice(&v.to_le_bytes());
        } else {
            self.long_minimal(v.into());
        }
    }

    /// [`Emitter::int`] for an unsigned value (`LONG1` above `i64::MAX`).
    #[inline]
    pub fn uint(&mut self, v: u64) {
        match i64::try_from(v) {
            Ok(i) => self.int(i),
            Err(_) => self.long_minimal(v.into()),
        }
    }

    /// `LONG1` with the shortest little-endian two's complement that keeps the sign
    /// (CPython's `encode_long`); only reached outside `i32`, so never empty.
    fn long_minimal(&mut self, v: i128) {
        self.long_shortest(&v.to_le_bytes());
    }

    /// `LONG1` (or `LONG4`) with the shortest little-endian two's complement of the same
    /// value as `bytes` (redundant sign bytes dropped, as CPython's `encode_long` writes it;
    /// zero as no bytes).
    pub fn long_shortest(&mut self, bytes: &[u8]) {
        let mut n = bytes.len();
        while n > 1 {
            let (top, below) = (bytes[n - 1], bytes[n - 2] & 0x80);
            if (top == 0 && below == 0) || (top == 0xff && below != 0) {
                n -= 1;
            } else {
                break;
            }
        }
        if n == 1 && bytes[0] == 0 {
            n = 0;
        }
        self.long(&bytes[..n]);
    }

    /// `LONG1` (or `LONG4` past 255 bytes) with these little-endian two's complement bytes.
    pub fn long(&mut self, bytes: &[u8]) {
        if let Ok(n) = u8::try_from(bytes.len()) {
            self.out.extend_from_slice(&[op::LONG1, n]);
        } else {
            self.out.push(op::LONG4);
            self.out
                .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        }
        self.out.extend_from_slice(bytes);
    }

    /// `BINFLOAT` (big-endian).
    #[inline]
    pub fn float(&mut self, v: f64) {
        self.out.push(op::BINFLOAT);
        self.out.extend_from_slice(&v.to_be_bytes());
    }

    /// `NEWTRUE` or `NEWFALSE`.
    #[inline]
    pub fn bool(&mut self, v: bool) {
        self.out.push(if v { op::NEWTRUE } else { op::NEWFALSE });
    }

    /// A `str` (its UTF-8 bytes; lone surrogates as `surrogatepass` encodes them), not
    /// memoized: `SHORT_BINUNICODE`, `BINUNICODE` or `BINUNICODE8`, between frames from
    /// [`FRAME_TARGET`] bytes.
    #[inline]
    pub fn str(&mut self, utf8: &[u8]) {
        self.sized(
            utf8,
            [op::SHORT_BINUNICODE, op::BINUNICODE, op::BINUNICODE8],
        );
    }

    /// A `bytes`, not memoized: `SHORT_BINBYTES`, `BINBYTES` or `BINBYTES8`, between frames
    /// from [`FRAME_TARGET`] bytes.
    pub fn bytes(&mut self, bytes: &[u8]) {
        self.sized(bytes, [op::SHORT_BINBYTES, op::BINBYTES, op::BINBYTES8]);
    }

    /// A `bytearray`, not memoized: `BYTEARRAY8`.
    pub fn bytearray(&mut self, bytes: &[u8]) {
        self.out.push(op::BYTEARRAY8);
        self.out
            .extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        self.out.extend_from_slice(bytes);
    }

    /// A payload with a 1-, 4- or 8-byte length (`codes` in that order); a large one goes
    /// between frames (CPython's rule), so readers can pass it through without buffering a
    /// frame.
    #[inline]
    fn sized(&mut self, payload: &[u8], codes: [u8; 3]) {
        let n = payload.len();
        let unframed = n >= FRAME_TARGET;
        if unframed {
            self.commit_frame();
        }
        if let Ok(short) = u8::try_from(n) {
            self.out.extend_from_slice(&[codes[0], short]);
        } else if let Ok(long) = u32::try_from(n) {
            self.out.push(codes[1]);
            self.out.extend_from_slice(&long.to_le_bytes());
        } else {
            self.out.push(codes[2]);
            self.out.extend_from_slice(&(n as u64).to_le_bytes());
        }
        self.out.extend_from_slice(payload);
        if unframed {
            self.start_frame();
        }
    }
}

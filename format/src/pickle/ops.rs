//! Opcode-level decoding of a pickle held in memory, for readers that build their own objects
//! (the `memsnap` Python package builds Python objects with it).
//!
//! [`Ops`] walks the input one opcode at a time and hands out each opcode with its name, its
//! byte offset and its argument, decoded by the codec's one opcode table ([`opcode_info`], shared with the reader and the
//! writer).
//! It runs nothing and builds nothing: what an opcode means, and which opcodes to refuse, is
//! the caller's ([`executes_code`] names the ones that would import or call code). Every
//! length is checked against the rest of the input before anything is sliced, so hostile
//! input gets an [`OpError`] with its byte offset, never a panic.
//!
//! ```
//! use memsnap_format::pickle::ops::{op, Ops};
//!
//! // pickle.dumps([1, "a"], protocol=2)
//! let mut ops = Ops::new(b"\x80\x02]q\x00(K\x01X\x01\x00\x00\x00aq\x01e.");
//! let proto = ops.next_op()?;
//! assert_eq!((proto.code, proto.arg), (op::PROTO, &[2][..]));
//! let mut names = vec![];
//! loop {
//!     let op = ops.next_op()?;
//!     names.push(op.name);
//!     if op.code == op::BINUNICODE {
//!         assert_eq!((op.offset, op.arg), (8, &b"a"[..]));
//!     }
//!     if op.code == op::STOP {
//!         break;
//!     }
//! }
//! assert_eq!(names, ["EMPTY_LIST", "BINPUT", "MARK", "BININT1", "BINUNICODE", "BINPUT", "APPENDS", "STOP"]);
//! # Ok::<(), memsnap_format::pickle::ops::OpError>(())
//! ```

pub use super::opcodes::{executes_code, op, opcode_info, Arg};

/// Why the next opcode could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// No bytes left where an opcode should start (every pickle ends with `STOP`).
    #[error("the input ends at byte {offset} without the STOP opcode: the file is truncated")]
    End { offset: usize },
    /// A byte that is no pickle opcode.
    #[error("byte {offset}: unknown opcode 0x{code:02x}: not a pickle, or a corrupt one")]
    Unknown { offset: usize, code: u8 },
    /// The argument (or its length) runs past the end of the input: `needed` bytes were
    /// declared or required where `left` remain.
    #[error("byte {offset}: the input ends inside opcode {name} (needs {needed} more bytes, {left} left): the file is truncated")]
    Truncated {
        offset: usize,
        name: &'static str,
        needed: u64,
        left: usize,
    },
    /// A text argument (protocol 0 and 1 opcodes) has no end of line before the input ends.
    #[error("byte {offset}: the input ends inside opcode {name} (its text argument has no end of line): the file is truncated")]
    NoNewline { offset: usize, name: &'static str },
}

/// One decoded opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op<'a> {
    /// Byte offset of the opcode in the input.
    pub offset: usize,
    /// The opcode byte (one of [`op`]).
    pub code: u8,
    /// Its name, as in CPython's `pickle.py` (`BINUNICODE`).
    pub name: &'static str,
    /// The argument: for [`Arg::Fixed`] its bytes, for [`Arg::Counted`] the payload after the
    /// length, for [`Arg::Lines`] the text before the last newline (two lines are joined by
    /// `\n`, as in the input).
    pub arg: &'a [u8],
}

impl Op<'_> {
    /// The argument as an array, for fixed-width arguments (`let [protocol] = op.array();`,
    /// `u32::from_le_bytes(op.array())`): with `N` the opcode's width it is exactly the
    /// argument; otherwise it is cut or zero-padded to `N` bytes.
    #[inline]
    pub fn array<const N: usize>(&self) -> [u8; N] {
        match <[u8; N]>::try_from(self.arg) {
            Ok(exact) => exact,
            Err(_) => {
                let mut out = [0; N];
                let n = N.min(self.arg.len());
                out[..n].copy_from_slice(&self.arg[..n]);
                out
            }
        }
    }
}

/// A cursor over the opcodes of a pickle in memory (see the module docs).
#[derive(Clone, Debug)]
pub struct Ops<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Ops<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Ops { data, pos: 0 }
    }

    /// Byte offset of the next opcode.
    /// Decodes `data` from byte `pos` on (offsets stay those of `data`): where a caller that
    /// read some opcodes itself continues.
    pub fn new_at(data: &'a [u8], pos: usize) -> Self {
        Ops {
            data,
            pos: pos.min(data.len()),
        }
    }

    #[inline]
    pub fn offset(&self) -> usize {
        self.pos
    }

    /// The next opcode byte (`None` at the end of the input), without decoding or moving on:
    /// a caller can refuse an opcode before anything of its argument is read.
    #[inline]
    pub fn peek(&self) -> Option<u8> {
        self.data.get(self.pos).copied()
    }

    /// Decodes the next opcode and its argument, and moves past them. On an error the cursor
    /// stays where it was.
    #[inline]
    pub fn next_op(&mut self) -> Result<Op<'a>, OpError> {
        let offset = self.pos;
        let Some(&code) = self.data.get(offset) else {
            return Err(OpError::End { offset });
        };
        let Some((name, layout)) = opcode_info(code) else {
            return Err(OpError::Unknown { offset, code });
        };
        let start = offset + 1;
        let (arg, end) = match layout {
            Arg::Fixed(0) => (&self.data[start..start], start),
            Arg::Fixed(n) => self.take(offset, name, start, n as u64)?,
            Arg::Counted(width) => {
                let (len, at) = self.take(offset, name, start, width as u64)?;
                let len = len
                    .iter()
                    .rev()
                    .fold(0u64, |len, &b| (len << 8) | u64::from(b));
                self.take(offset, name, at, len)?
            }
            Arg::Lines(lines) => self.lines(offset, name, start, lines)?,
        };
        self.pos = end;
        Ok(Op {
            offset,
            code,
            name,
            arg,
        })
    }

    /// `n` bytes from `start`, and where they end.
    #[inline]
    fn take(
        &self,
        offset: usize,
        name: &'static str,
        start: usize,
        n: u64,
    ) -> Result<(&'a [u8], usize), OpError> {
        let data = self.data;
        match usize::try_from(n) {
            Ok(n) if n <= data.len() - start => Ok((&data[start..start + n], start + n)),
            _ => Err(OpError::Truncated {
                offset,
                name,
                needed: n,
                left: data.len() - start,
            }),
        }
    }

    /// `lines` text lines from `start`: the text before the last newline, and where it ends.
    fn lines(
        &self,
        offset: usize,
        name: &'static str,
        start: usize,
        lines: usize,
    ) -> Result<(&'a [u8], usize), OpError> {
        let rest = &self.data[start..];
        let mut end = 0;
        for _ in 0..lines {
            let newline = rest[end..]
                .iter()
                .position(|&b| b == b'\n')
                .ok_or(OpError::NoNewline { offset, name })?;
            end += newline + 1;
        }
        Ok((&rest[..end.saturating_sub(1)], start + end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(data: &[u8]) -> Result<Vec<Op<'_>>, OpError> {
        let mut ops = Ops::new(data);
        let mut out = Vec::new();
        loop {
            let op = ops.next_op()?;
            out.push(op);
            if op.code == op::STOP {
                return Ok(out);
            }
        }
    }

    #[test]
    fn each_argument_layout_is_sliced_and_offsets_advance() {
        let data = b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00\x8c\x02hiJ\xff\xff\xff\xffI42\ncos\nsystem\n.";
        let ops = decode_all(data).unwrap();
        let seen: Vec<_> = ops.iter().map(|o| (o.offset, o.name, o.arg)).collect();
        assert_eq!(
            seen,
            [
                (0, "PROTO", &[4][..]),
                (2, "FRAME", &[5, 0, 0, 0, 0, 0, 0, 0][..]),
                (11, "SHORT_BINUNICODE", &b"hi"[..]),
                (15, "BININT", &[0xff; 4][..]),
                (20, "INT", &b"42"[..]),
                (24, "GLOBAL", &b"os\nsystem"[..]),
                (35, "STOP", &[][..]),
            ]
        );
        assert_eq!(i32::from_le_bytes(ops[3].array()), -1);
        assert_eq!(ops[2].array::<3>(), [b'h', b'i', 0], "padded");
        let [protocol] = ops[0].array();
        assert_eq!(protocol, 4);
    }

    #[test]
    fn errors_carry_the_opcode_offset_and_the_cursor_stays() {
        let mut ops = Ops::new(b"K\x01\x8d\x00\x00\x00\x00\x00\x00\x00\x40x");
        ops.next_op().unwrap();
        let err = ops.next_op().unwrap_err();
        assert_eq!(
            err,
            OpError::Truncated {
                offset: 2,
                name: "BINUNICODE8",
                needed: 1 << 62,
                left: 1
            }
        );
        assert_eq!(ops.offset(), 2, "the cursor did not move");
        assert_eq!(ops.peek(), Some(op::BINUNICODE8));
        // The length itself cut short.
        assert_eq!(
            Ops::new(b"X\x01\x00").next_op(),
            Err(OpError::Truncated {
                offset: 0,
                name: "BINUNICODE",
                needed: 4,
                left: 2
            })
        );
        assert_eq!(
            Ops::new(b"\x00").next_op(),
            Err(OpError::Unknown { offset: 0, code: 0 })
        );
        assert_eq!(Ops::new(b"").peek(), None);
        assert_eq!(Ops::new(b"").next_op(), Err(OpError::End { offset: 0 }));
        assert_eq!(
            Ops::new(b"cos\nsystem").next_op(),
            Err(OpError::NoNewline {
                offset: 0,
                name: "GLOBAL"
            })
        );
    }

    #[test]
    fn every_prefix_of_a_real_pickle_is_an_error_not_a_panic() {
        let mut snapshot = crate::Snapshot::new(1);
        snapshot
            .segments
            .push(crate::Segment::new(0, 0x7f00_0000_0000, 2 << 20, 0));
        let bytes = super::super::to_vec(&snapshot);
        let whole = decode_all(&bytes).unwrap();
        assert_eq!(whole.last().map(|o| o.offset), Some(bytes.len() - 1));
        for cut in 0..bytes.len() {
            assert!(decode_all(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}

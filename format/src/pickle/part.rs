//! Reading only part of a snapshot pickle: what an output needs, and no more.
//!
//! PyTorch's `_dump_snapshot()` (and our writer) put `segments` first in the snapshot dict:
//!
//! ```text
//! PROTO  EMPTY_DICT MEMOIZE  MARK  'segments' [ ...blocks... ]  'device_traces' [ ... ]  ...  SETITEMS STOP
//! ```
//!
//! A report over the segments alone (`memsnap memviz stats`) needs the first few percent of a
//! file whose trace holds a million entries. [`segments_end`] walks the opcodes from the start,
//! skipping each by its argument layout from the reader's one opcode table
//! ([`super::opcodes::opcode_info`]) and building nothing, to the offset where the second top-level
//! key starts. The VM then runs up to that offset and closes the dict there, as if
//! `SETITEMS STOP` stood in its place: the result is the snapshot `{'segments': [...]}`.
//!
//! The walk recognises only that layout and gives up (the whole file is read instead) on
//! anything else: a bare segment list, another key first, a key pushed from the memo,
//! protocol 0/1 text opcodes, or bytes that end or break before the cut. So a damaged file
//! gets the full reader's error, with its byte offset; a file damaged only *after* its
//! segments is not noticed, since those bytes are never read: read the whole file (or run
//! `memsnap validate`) to check it. That includes a hostile tail that would change what the
//! file *is*: a `STOP` right after a later value makes that value the root for CPython (and
//! for the whole read), where the part read has already closed the dict.

use super::opcodes::{executes_code, op, opcode_info, Arg};

/// The keys PyTorch writes after `segments` at the top level of a snapshot dict. The cut is
/// made only before one of these, so the bytes read are exactly the segments entry.
const LATER_TOP_KEYS: [&[u8]; 6] = [
    b"device_traces",
    b"allocator_settings",
    b"external_annotations",
    b"host_segments",
    b"host_traces",
    b"memsnap",
];

/// What [`segments_end`] found in the first bytes of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    /// The top-level key after `segments` starts at this offset: read up to there.
    Cut(u64),
    /// Not PyTorch's layout (or damaged before the cut): read the whole file.
    Whole,
    /// The bytes ended before the cut: look at more of the file (or, at its end, read it whole).
    More,
}

/// Where the top-level key that follows `segments` starts, when `bytes` (the start of a file)
/// is a snapshot dict pickle with `segments` first and another known key after it.
pub(crate) fn segments_end(bytes: &[u8]) -> Scan {
    let mut walk = Walk {
        bytes,
        at: 0,
        ran_out: false,
    };
    match walk.segments_end() {
        Some(cut) => Scan::Cut(cut),
        None if walk.ran_out => Scan::More,
        None => Scan::Whole,
    }
}

impl Walk<'_> {
    /// [`segments_end`]; `None` with `ran_out` set when the bytes ended first.
    fn segments_end(&mut self) -> Option<u64> {
        let walk = self;
        let bytes = walk.bytes;
        let (code, arg) = walk.next_op()?;
        if code != op::PROTO || !(2..=5).contains(bytes.get(arg)?) {
            return None;
        }
        if walk.next_op()?.0 != op::EMPTY_DICT {
            return None;
        }
        let mut code = walk.next_op()?.0;
        if matches!(code, op::MEMOIZE | op::BINPUT | op::LONG_BINPUT) {
            code = walk.next_op()?.0;
        }
        if code != op::MARK {
            return None;
        }
        let (code, arg) = walk.next_op()?;
        if walk.text(code, arg)? != b"segments" {
            return None;
        }

        // Count the values on the stack above the top-level MARK: the key is one, its value makes
        // two, and the cut goes before the string that would make three. Only opcodes at depth 1
        // (inside that MARK, not in a nested one) change the count; a nested MARK comes back to
        // depth 1 at the opcode that closes it.
        let mut items = 1usize;
        let mut depth = 1usize;
        loop {
            let start = walk.at;
            let (code, arg) = walk.next_op()?;
            match code {
                op::MARK => depth += 1,
                // Close a MARK, pushing nothing (the container is below it).
                op::APPENDS | op::SETITEMS | op::ADDITEMS | op::POP_MARK => {
                    depth = depth.checked_sub(1).filter(|&d| d >= 1)?;
                }
                // Close a MARK, pushing the new container.
                op::TUPLE | op::LIST | op::DICT | op::FROZENSET => {
                    depth = depth.checked_sub(1).filter(|&d| d >= 1)?;
                    if depth == 1 {
                        items += 1;
                    }
                }
                op::STOP => return None,
                _ if depth > 1 => {
                    // POP may pop a MARK (the pure-Python unpickler allows it): not followed here.
                    if code == op::POP {
                        return None;
                    }
                }
                op::MEMOIZE | op::BINPUT | op::LONG_BINPUT | op::PROTO => {}
                op::APPEND | op::TUPLE2 | op::POP => items = items.checked_sub(1)?,
                op::SETITEM | op::TUPLE3 => items = items.checked_sub(2)?,
                op::TUPLE1 => {}
                _ => {
                    // A string pushed over the key and its value, with a value pushed after
                    // it, is the next key; a known one is where the cut goes. (A one-item list
                    // is written `EMPTY_LIST item APPEND`: that item is pushed at depth 1 too.)
                    if items == 2 {
                        if let Some(key) = walk.text(code, arg) {
                            if walk.value_follows() {
                                return LATER_TOP_KEYS.contains(&key).then_some(start as u64);
                            }
                        }
                    }
                    items += 1;
                }
            }
            if !(1..=3).contains(&items) {
                return None;
            }
        }
    }
}

/// A cursor over the opcodes of a pickle, FRAME opcodes skipped.
struct Walk<'a> {
    bytes: &'a [u8],
    at: usize,
    /// The last [`Walk::next_op`] failed because the bytes ended.
    ran_out: bool,
}

impl<'a> Walk<'a> {
    /// The next opcode and where its argument starts; `None` at the end of the input, on an
    /// unknown opcode, on a text (protocol 0/1) or code-executing opcode, or on an argument
    /// that runs past the end.
    fn next_op(&mut self) -> Option<(u8, usize)> {
        loop {
            let Some(&code) = self.bytes.get(self.at) else {
                self.ran_out = true;
                return None;
            };
            let arg = self.at + 1;
            let end = match opcode_info(code)?.1 {
                Arg::Fixed(n) => arg.checked_add(n)?,
                Arg::Counted(n) => {
                    let Some(len_bytes) = self.bytes.get(arg..arg.checked_add(n)?) else {
                        self.ran_out = true;
                        return None;
                    };
                    let len = len_bytes
                        .iter()
                        .rev()
                        .fold(0u128, |acc, &b| (acc << 8) | u128::from(b));
                    arg.checked_add(n)?
                        .checked_add(usize::try_from(len).ok()?)?
                }
                Arg::Lines(_) => return None,
            };
            if end > self.bytes.len() {
                self.ran_out = true;
                return None;
            }
            if is_code(code) {
                return None;
            }
            self.at = end;
            if code != op::FRAME {
                return Some((code, arg));
            }
        }
    }

    /// Whether the next opcode (after memo stores) starts a value, as a dict value does, rather
    /// than consuming the value before it (`APPEND`, `TUPLE1`, ...).
    fn value_follows(&mut self) -> bool {
        let mut peek = Walk {
            bytes: self.bytes,
            at: self.at,
            ran_out: false,
        };
        loop {
            match peek.next_op() {
                Some((op::MEMOIZE | op::BINPUT | op::LONG_BINPUT, _)) => {}
                Some((code, _)) => {
                    return matches!(
                        code,
                        op::EMPTY_LIST
                            | op::EMPTY_DICT
                            | op::EMPTY_TUPLE
                            | op::MARK
                            | op::NONE
                            | op::NEWTRUE
                            | op::NEWFALSE
                            | op::BININT
                            | op::BININT1
                            | op::BININT2
                            | op::LONG1
                            | op::BINFLOAT
                            | op::SHORT_BINUNICODE
                            | op::BINUNICODE
                            | op::BINGET
                            | op::LONG_BINGET
                    )
                }
                None => {
                    self.ran_out |= peek.ran_out;
                    return false;
                }
            }
        }
    }

    /// The payload of a `str` opcode (`None` for any other opcode).
    fn text(&self, code: u8, arg: usize) -> Option<&'a [u8]> {
        let len_size = match code {
            op::SHORT_BINUNICODE => 1,
            op::BINUNICODE => 4,
            op::BINUNICODE8 => 8,
            _ => return None,
        };
        self.bytes.get(arg + len_size..self.at)
    }
}

/// Opcodes that import or call code: the walk stops and the full reader refuses them.
fn is_code(code: u8) -> bool {
    executes_code(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pickle.dumps({'segments': [1], 'device_traces': [[]]}, protocol=4)`.
    const SMALL: &[u8] = b"\x80\x04\x95\x2a\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94K\x01a\x8c\x0ddevice_traces\x94]\x94]\x94au.";

    #[test]
    fn the_cut_is_where_the_key_after_segments_starts() {
        let Scan::Cut(end) = segments_end(SMALL) else {
            panic!("not recognised");
        };
        let end = end as usize;
        assert_eq!(&SMALL[end..end + 15], b"\x8c\x0ddevice_traces");
    }

    #[test]
    fn anything_unusual_reads_the_whole_file() {
        // The start of a file, up to the cut: more is needed.
        assert_eq!(segments_end(&SMALL[..30]), Scan::More);
        assert_eq!(segments_end(&SMALL[..20]), Scan::More);
        // A bare list.
        assert_eq!(segments_end(b"\x80\x04]\x94."), Scan::Whole);
        // A global inside the segments.
        let mut global = SMALL.to_vec();
        global[29] = op::STACK_GLOBAL;
        assert_eq!(segments_end(&global), Scan::Whole);
        // An unknown key after the segments.
        let mut unknown = SMALL.to_vec();
        unknown[42] = b'X';
        assert_eq!(segments_end(&unknown), Scan::Whole);
        // A value that is a string where the key would be: not a cut (the count is off).
        assert_eq!(
            segments_end(b"\x80\x04}(\x8c\x08segments\x8c\x07memsnapu."),
            Scan::Whole
        );
        assert_eq!(segments_end(b""), Scan::More);
        // A one-item segments list whose item is the string 'memsnap': an item, not a key.
        assert_eq!(
            segments_end(b"\x80\x04}(\x8c\x08segments]\x8c\x07memsnapau."),
            Scan::Whole
        );
    }
}

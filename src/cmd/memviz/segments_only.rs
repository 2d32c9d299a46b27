//! A shortcut for `stats`, `segments` and `memory`, which read only `snapshot["segments"]`:
//! cut the pickle after the segments and decode that, instead of decoding a trace of a
//! million entries the report never looks at.
//!
//! PyTorch's pickle is `{` MARK `'segments'` [...] `'device_traces'` [...] ... SETITEMS `}`.
//! We walk the opcodes (lengths only, no objects), find where the second top-level key
//! starts, and hand the format crate's reader the prefix plus SETITEMS and STOP. FRAME
//! opcodes are dropped, since the cut breaks their lengths and framing is optional. The walk
//! goes on to the end so a truncated or malformed file still gets the full reader's error.
//! Whenever the file does not look exactly like that, `None` sends the caller to the full read.

/// The keys that can follow `segments` at the top level of a snapshot dict.
const LATER_TOP_KEYS: [&[u8]; 6] = [
    b"device_traces",
    b"allocator_settings",
    b"external_annotations",
    b"host_segments",
    b"host_traces",
    b"memsnap",
];

mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const SETITEMS: u8 = b'u';
    pub const EMPTY_DICT: u8 = b'}';
    pub const PROTO: u8 = 0x80;
    pub const FRAME: u8 = 0x95;
    pub const MEMOIZE: u8 = 0x94;
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE: u8 = b'X';
    pub const BINUNICODE8: u8 = 0x8d;
}

/// How an opcode's argument is laid out.
enum Arg {
    Fixed(usize),
    /// A little-endian length of this many bytes, then that many bytes.
    Counted(usize),
}

/// The data opcodes a snapshot uses; anything else (globals, objects, protocol 0 text
/// opcodes) makes the shortcut give up and leaves the decision to the full reader.
fn arg_layout(code: u8) -> Option<Arg> {
    Some(match code {
        // MARK STOP POP POP_MARK DUP NONE NEWTRUE NEWFALSE TUPLE TUPLE1-3 EMPTY_TUPLE
        // EMPTY_LIST EMPTY_DICT APPEND APPENDS SETITEM SETITEMS LIST DICT MEMOIZE
        // EMPTY_SET ADDITEMS FROZENSET
        b'(' | b'.' | b'0' | b'1' | b'2' | b'N' | 0x88 | 0x89 | b't' | 0x85 | 0x86 | 0x87
        | b')' | b']' | b'}' | b'a' | b'e' | b's' | b'u' | b'l' | b'd' | 0x94 | 0x8f | 0x90
        | 0x91 => Arg::Fixed(0),
        // PROTO BININT1 BINPUT BINGET
        0x80 | b'K' | b'q' | b'h' => Arg::Fixed(1),
        // BININT2
        b'M' => Arg::Fixed(2),
        // BININT LONG_BINPUT LONG_BINGET
        b'J' | b'r' | b'j' => Arg::Fixed(4),
        // BINFLOAT FRAME
        b'G' | 0x95 => Arg::Fixed(8),
        // SHORT_BINUNICODE SHORT_BINSTRING SHORT_BINBYTES LONG1
        0x8c | b'U' | b'C' | 0x8a => Arg::Counted(1),
        // BINUNICODE BINSTRING BINBYTES LONG4
        b'X' | b'T' | b'B' | 0x8b => Arg::Counted(4),
        // BINUNICODE8 BINBYTES8 BYTEARRAY8
        0x8d | 0x8e | 0x96 => Arg::Counted(8),
        _ => return None,
    })
}

/// One opcode: its code, where its argument starts, and where the next opcode starts.
fn next_op(bytes: &[u8], at: usize) -> Option<(u8, usize, usize)> {
    let code = *bytes.get(at)?;
    let arg = at + 1;
    let end = match arg_layout(code)? {
        Arg::Fixed(n) => arg.checked_add(n)?,
        Arg::Counted(n) => {
            let len_bytes = bytes.get(arg..arg.checked_add(n)?)?;
            let len = len_bytes
                .iter()
                .rev()
                .fold(0u128, |acc, &b| (acc << 8) | u128::from(b));
            let len = usize::try_from(len).ok()?;
            arg.checked_add(n)?.checked_add(len)?
        }
    };
    (end <= bytes.len()).then_some((code, arg, end))
}

/// The next opcode other than FRAME, copied to `out` when given.
fn step(bytes: &[u8], at: &mut usize, mut out: Option<&mut Vec<u8>>) -> Option<(u8, usize, usize)> {
    loop {
        let (code, arg, end) = next_op(bytes, *at)?;
        let start = *at;
        *at = end;
        if code == op::FRAME {
            continue;
        }
        if let Some(out) = out.as_mut() {
            out.extend_from_slice(&bytes[start..end]);
        }
        return Some((code, arg, end));
    }
}

/// The string argument of a text opcode.
fn text_arg(bytes: &[u8], code: u8, arg: usize, end: usize) -> Option<&[u8]> {
    let len_size = match code {
        op::SHORT_BINUNICODE => 1,
        op::BINUNICODE => 4,
        op::BINUNICODE8 => 8,
        _ => return None,
    };
    bytes.get(arg + len_size..end)
}

/// A pickle of `{'segments': <the file's segments>}`, or `None` when the file is not a
/// well-formed snapshot dict pickle with `segments` first and more keys after it.
pub fn segments_only_pickle(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut at = 0;
    let mut out = Vec::new();
    // PROTO 2..5, the top-level dict, its memo entry, MARK, then the key 'segments'.
    let (code, arg, _) = step(bytes, &mut at, Some(&mut out))?;
    if code != op::PROTO || !(2..=5).contains(bytes.get(arg)?) {
        return None;
    }
    if step(bytes, &mut at, Some(&mut out))?.0 != op::EMPTY_DICT {
        return None;
    }
    let mut code = step(bytes, &mut at, Some(&mut out))?.0;
    if matches!(code, op::MEMOIZE | op::BINPUT | op::LONG_BINPUT) {
        code = step(bytes, &mut at, Some(&mut out))?.0;
    }
    if code != op::MARK {
        return None;
    }
    let (code, arg, end) = step(bytes, &mut at, Some(&mut out))?;
    if text_arg(bytes, code, arg, end)? != b"segments" {
        return None;
    }

    // Walk the segments value; the next string pushed directly inside the top-level MARK is
    // the next key. Depth 1 = inside the top-level dict's MARK.
    let mut depth = 1usize;
    let mut cut = None;
    while cut.is_none() {
        let before = out.len();
        let (code, arg, end) = step(bytes, &mut at, Some(&mut out))?;
        match code {
            op::MARK => depth += 1,
            // APPENDS SETITEMS TUPLE LIST DICT POP_MARK ADDITEMS FROZENSET
            b'e' | b'u' | b't' | b'l' | b'd' | b'1' | 0x90 | 0x91 => {
                depth = depth.checked_sub(1).filter(|d| *d >= 1)?;
            }
            op::STOP => return None,
            _ if depth == 1 => {
                if let Some(key) = text_arg(bytes, code, arg, end) {
                    if !LATER_TOP_KEYS.contains(&key) {
                        return None;
                    }
                    out.truncate(before);
                    cut = Some(());
                }
            }
            _ => {}
        }
    }
    // The rest must be well-formed opcodes up to STOP at the very end; otherwise the full
    // reader should produce its error.
    loop {
        let (code, _, end) = step(bytes, &mut at, None)?;
        if code == op::STOP {
            if end != bytes.len() {
                return None;
            }
            break;
        }
    }
    out.push(op::SETITEMS);
    out.push(op::STOP);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pickle.dumps({'segments': [1], 'device_traces': [[]]}, protocol=4)`.
    const SMALL: &[u8] = b"\x80\x04\x95\x2a\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94K\x01a\x8c\x0ddevice_traces\x94]\x94]\x94au.";

    #[test]
    fn cuts_after_the_segments_and_drops_frames() {
        let cut = segments_only_pickle(SMALL).expect("recognised");
        assert_eq!(cut, b"\x80\x04}\x94(\x8c\x08segments\x94]\x94K\x01au.");
    }

    #[test]
    fn anything_unusual_falls_back_to_the_full_reader() {
        // Truncated.
        assert!(segments_only_pickle(&SMALL[..SMALL.len() - 1]).is_none());
        // Trailing bytes after STOP.
        let mut trailing = SMALL.to_vec();
        trailing.push(b'N');
        assert!(segments_only_pickle(&trailing).is_none());
        // A bare list.
        assert!(segments_only_pickle(b"\x80\x04]\x94.").is_none());
        // A global after the segments.
        let mut global = SMALL[..SMALL.len() - 3].to_vec();
        global.extend_from_slice(b"\x93au.");
        assert!(segments_only_pickle(&global).is_none());
        assert!(segments_only_pickle(b"").is_none());
    }
}

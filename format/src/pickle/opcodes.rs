//! The pickle opcodes: their bytes, names and argument layouts, in one table.
//!
//! This is the bottom of the pickle codec: the reader (`vm`), the segments scanner (`part`),
//! the opcode decoder ([`super::ops`]), the emitter ([`super::emit`]) and the snapshot writer
//! all take opcodes from here, and it imports nothing of theirs. Names and layouts are
//! CPython's (`pickle.py`, `pickletools.opcodes`); a test checks them against a copy of
//! `pickletools`' table.

/// Opcodes (names as in CPython's `pickle.py`).
pub mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const PERSID: u8 = b'P';
    pub const BINPERSID: u8 = b'Q';
    pub const REDUCE: u8 = b'R';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const BUILD: u8 = b'b';
    pub const GLOBAL: u8 = b'c';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const INST: u8 = b'i';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const OBJ: u8 = b'o';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    pub const PROTO: u8 = 0x80;
    pub const NEWOBJ: u8 = 0x81;
    pub const EXT1: u8 = 0x82;
    pub const EXT2: u8 = 0x83;
    pub const EXT4: u8 = 0x84;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const NEWOBJ_EX: u8 = 0x92;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    pub const BYTEARRAY8: u8 = 0x96;
    pub const NEXT_BUFFER: u8 = 0x97;
    pub const READONLY_BUFFER: u8 = 0x98;
}

/// How an opcode's argument follows the opcode byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// This many bytes.
    Fixed(usize),
    /// A little-endian length in this many bytes, then that many bytes.
    Counted(usize),
    /// This many lines of text, each ending in `\n` (protocol 0 and 1 opcodes).
    Lines(usize),
}

/// [`describe`] for every byte, built at compile time: one indexed load per opcode (the
/// decoder of the `memsnap` Python package looks each one up on the hot path of a load).
static OPCODES: [Option<(&str, Arg)>; 256] = {
    let mut table = [None; 256];
    let mut code = 0;
    while code < 256 {
        table[code] = describe(code as u8);
        code += 1;
    }
    table
};

/// The one opcode table: an opcode's name (as in CPython's `pickle.py`) and argument layout,
/// `None` for a byte that is no opcode. The VM names opcodes in errors with it, and the
/// segments scanner and [`super::ops::Ops`] skip or slice arguments with it without running
/// anything.
#[inline]
pub fn opcode_info(code: u8) -> Option<(&'static str, Arg)> {
    OPCODES[usize::from(code)]
}

/// What [`OPCODES`] is built from: a `match`, so a byte listed twice is an unreachable-pattern
/// warning.
const fn describe(code: u8) -> Option<(&'static str, Arg)> {
    use Arg::{Counted, Fixed, Lines};
    Some(match code {
        op::MARK => ("MARK", Fixed(0)),
        op::STOP => ("STOP", Fixed(0)),
        op::POP => ("POP", Fixed(0)),
        op::POP_MARK => ("POP_MARK", Fixed(0)),
        op::DUP => ("DUP", Fixed(0)),
        op::FLOAT => ("FLOAT", Lines(1)),
        op::INT => ("INT", Lines(1)),
        op::BININT => ("BININT", Fixed(4)),
        op::BININT1 => ("BININT1", Fixed(1)),
        op::LONG => ("LONG", Lines(1)),
        op::BININT2 => ("BININT2", Fixed(2)),
        op::NONE => ("NONE", Fixed(0)),
        op::PERSID => ("PERSID", Lines(1)),
        op::BINPERSID => ("BINPERSID", Fixed(0)),
        op::REDUCE => ("REDUCE", Fixed(0)),
        op::STRING => ("STRING", Lines(1)),
        op::BINSTRING => ("BINSTRING", Counted(4)),
        op::SHORT_BINSTRING => ("SHORT_BINSTRING", Counted(1)),
        op::UNICODE => ("UNICODE", Lines(1)),
        op::BINUNICODE => ("BINUNICODE", Counted(4)),
        op::APPEND => ("APPEND", Fixed(0)),
        op::BUILD => ("BUILD", Fixed(0)),
        op::GLOBAL => ("GLOBAL", Lines(2)),
        op::DICT => ("DICT", Fixed(0)),
        op::EMPTY_DICT => ("EMPTY_DICT", Fixed(0)),
        op::APPENDS => ("APPENDS", Fixed(0)),
        op::GET => ("GET", Lines(1)),
        op::BINGET => ("BINGET", Fixed(1)),
        op::INST => ("INST", Lines(2)),
        op::LONG_BINGET => ("LONG_BINGET", Fixed(4)),
        op::LIST => ("LIST", Fixed(0)),
        op::EMPTY_LIST => ("EMPTY_LIST", Fixed(0)),
        op::OBJ => ("OBJ", Fixed(0)),
        op::PUT => ("PUT", Lines(1)),
        op::BINPUT => ("BINPUT", Fixed(1)),
        op::LONG_BINPUT => ("LONG_BINPUT", Fixed(4)),
        op::SETITEM => ("SETITEM", Fixed(0)),
        op::TUPLE => ("TUPLE", Fixed(0)),
        op::EMPTY_TUPLE => ("EMPTY_TUPLE", Fixed(0)),
        op::SETITEMS => ("SETITEMS", Fixed(0)),
        op::BINFLOAT => ("BINFLOAT", Fixed(8)),
        op::PROTO => ("PROTO", Fixed(1)),
        op::NEWOBJ => ("NEWOBJ", Fixed(0)),
        op::EXT1 => ("EXT1", Fixed(1)),
        op::EXT2 => ("EXT2", Fixed(2)),
        op::EXT4 => ("EXT4", Fixed(4)),
        op::TUPLE1 => ("TUPLE1", Fixed(0)),
        op::TUPLE2 => ("TUPLE2", Fixed(0)),
        op::TUPLE3 => ("TUPLE3", Fixed(0)),
        op::NEWTRUE => ("NEWTRUE", Fixed(0)),
        op::NEWFALSE => ("NEWFALSE", Fixed(0)),
        op::LONG1 => ("LONG1", Counted(1)),
        op::LONG4 => ("LONG4", Counted(4)),
        op::BINBYTES => ("BINBYTES", Counted(4)),
        op::SHORT_BINBYTES => ("SHORT_BINBYTES", Counted(1)),
        op::SHORT_BINUNICODE => ("SHORT_BINUNICODE", Counted(1)),
        op::BINUNICODE8 => ("BINUNICODE8", Counted(8)),
        op::BINBYTES8 => ("BINBYTES8", Counted(8)),
        op::EMPTY_SET => ("EMPTY_SET", Fixed(0)),
        op::ADDITEMS => ("ADDITEMS", Fixed(0)),
        op::FROZENSET => ("FROZENSET", Fixed(0)),
        op::NEWOBJ_EX => ("NEWOBJ_EX", Fixed(0)),
        op::STACK_GLOBAL => ("STACK_GLOBAL", Fixed(0)),
        op::MEMOIZE => ("MEMOIZE", Fixed(0)),
        op::FRAME => ("FRAME", Fixed(8)),
        op::BYTEARRAY8 => ("BYTEARRAY8", Counted(8)),
        op::NEXT_BUFFER => ("NEXT_BUFFER", Fixed(0)),
        op::READONLY_BUFFER => ("READONLY_BUFFER", Fixed(0)),
        _ => return None,
    })
}

/// Whether an opcode would import or call something (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`,
/// `BUILD`, `INST`, `OBJ`, `NEWOBJ*`, `PERSID`, `BINPERSID`, `EXT*`): what a reader that
/// executes nothing refuses.
#[inline]
pub const fn executes_code(code: u8) -> bool {
    matches!(
        code,
        op::GLOBAL
            | op::STACK_GLOBAL
            | op::REDUCE
            | op::BUILD
            | op::INST
            | op::OBJ
            | op::NEWOBJ
            | op::NEWOBJ_EX
            | op::PERSID
            | op::BINPERSID
            | op::EXT1
            | op::EXT2
            | op::EXT4
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use Arg::{Counted, Fixed, Lines};

    /// CPython 3.11's `pickletools.opcodes`: code, name and argument layout (`UP_TO_NEWLINE`
    /// is one line, two for the `stringnl_noescape_pair` of `GLOBAL` and `INST`;
    /// `TAKEN_FROM_ARGUMENT<n>[U]` is a length of `n` bytes).
    const PICKLETOOLS: [(u8, &str, Arg); 68] = [
        (0x49, "INT", Lines(1)),
        (0x4a, "BININT", Fixed(4)),
        (0x4b, "BININT1", Fixed(1)),
        (0x4d, "BININT2", Fixed(2)),
        (0x4c, "LONG", Lines(1)),
        (0x8a, "LONG1", Counted(1)),
        (0x8b, "LONG4", Counted(4)),
        (0x53, "STRING", Lines(1)),
        (0x54, "BINSTRING", Counted(4)),
        (0x55, "SHORT_BINSTRING", Counted(1)),
        (0x42, "BINBYTES", Counted(4)),
        (0x43, "SHORT_BINBYTES", Counted(1)),
        (0x8e, "BINBYTES8", Counted(8)),
        (0x96, "BYTEARRAY8", Counted(8)),
        (0x97, "NEXT_BUFFER", Fixed(0)),
        (0x98, "READONLY_BUFFER", Fixed(0)),
        (0x4e, "NONE", Fixed(0)),
        (0x88, "NEWTRUE", Fixed(0)),
        (0x89, "NEWFALSE", Fixed(0)),
        (0x56, "UNICODE", Lines(1)),
        (0x8c, "SHORT_BINUNICODE", Counted(1)),
        (0x58, "BINUNICODE", Counted(4)),
        (0x8d, "BINUNICODE8", Counted(8)),
        (0x46, "FLOAT", Lines(1)),
        (0x47, "BINFLOAT", Fixed(8)),
        (0x5d, "EMPTY_LIST", Fixed(0)),
        (0x61, "APPEND", Fixed(0)),
        (0x65, "APPENDS", Fixed(0)),
        (0x6c, "LIST", Fixed(0)),
        (0x29, "EMPTY_TUPLE", Fixed(0)),
        (0x74, "TUPLE", Fixed(0)),
        (0x85, "TUPLE1", Fixed(0)),
        (0x86, "TUPLE2", Fixed(0)),
        (0x87, "TUPLE3", Fixed(0)),
        (0x7d, "EMPTY_DICT", Fixed(0)),
        (0x64, "DICT", Fixed(0)),
        (0x73, "SETITEM", Fixed(0)),
        (0x75, "SETITEMS", Fixed(0)),
        (0x8f, "EMPTY_SET", Fixed(0)),
        (0x90, "ADDITEMS", Fixed(0)),
        (0x91, "FROZENSET", Fixed(0)),
        (0x30, "POP", Fixed(0)),
        (0x32, "DUP", Fixed(0)),
        (0x28, "MARK", Fixed(0)),
        (0x31, "POP_MARK", Fixed(0)),
        (0x67, "GET", Lines(1)),
        (0x68, "BINGET", Fixed(1)),
        (0x6a, "LONG_BINGET", Fixed(4)),
        (0x70, "PUT", Lines(1)),
        (0x71, "BINPUT", Fixed(1)),
        (0x72, "LONG_BINPUT", Fixed(4)),
        (0x94, "MEMOIZE", Fixed(0)),
        (0x82, "EXT1", Fixed(1)),
        (0x83, "EXT2", Fixed(2)),
        (0x84, "EXT4", Fixed(4)),
        (0x63, "GLOBAL", Lines(2)),
        (0x93, "STACK_GLOBAL", Fixed(0)),
        (0x52, "REDUCE", Fixed(0)),
        (0x62, "BUILD", Fixed(0)),
        (0x69, "INST", Lines(2)),
        (0x6f, "OBJ", Fixed(0)),
        (0x81, "NEWOBJ", Fixed(0)),
        (0x92, "NEWOBJ_EX", Fixed(0)),
        (0x80, "PROTO", Fixed(1)),
        (0x2e, "STOP", Fixed(0)),
        (0x95, "FRAME", Fixed(8)),
        (0x50, "PERSID", Lines(1)),
        (0x51, "BINPERSID", Fixed(0)),
    ];

    #[test]
    fn the_table_is_cpythons() {
        for (code, name, arg) in PICKLETOOLS {
            assert_eq!(opcode_info(code), Some((name, arg)), "0x{code:02x}");
        }
        let known = (0..=255u8).filter(|&c| opcode_info(c).is_some()).count();
        assert_eq!(known, PICKLETOOLS.len(), "no opcode pickletools lacks");
        assert!(executes_code(op::STACK_GLOBAL) && !executes_code(op::BINUNICODE));
    }
}

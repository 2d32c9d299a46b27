//! The pickle machine (`pickle::machine`) is one for every builder: the snapshot reader
//! (`pickle::read`) and the plain tree builder (`pickle::tree`, which reads what the Python
//! package's loader reads, protocol-0 numbers and sets too) refuse the same opcodes at the same
//! byte with the same message, fail the same way on broken input, and share what the memo
//! shares. (The Python package's builder, the third, is checked the same way by
//! `python/tests/test_load.py`.)

use memsnap_format::pickle::machine::Container;
use memsnap_format::pickle::tree::{self, Value};
use memsnap_format::{pickle, FormatError};

/// The pickle error both builders give for `bytes`: they must agree.
fn same_error_on_both(bytes: &[u8]) -> (u64, String) {
    let snapshot = match pickle::read(bytes) {
        Err(FormatError::Pickle { offset, what }) => (offset, what),
        Err(other) => panic!("snapshot reader: expected a pickle error, got {other}"),
        Ok(_) => panic!("snapshot reader accepted {bytes:?}"),
    };
    let tree = match tree::load(bytes) {
        Err(FormatError::Pickle { offset, what }) => (offset, what),
        Err(other) => panic!("tree builder: expected a pickle error, got {other}"),
        Ok(_) => panic!("tree builder accepted {bytes:?}"),
    };
    assert_eq!(snapshot, tree, "the builders disagree on {bytes:?}");
    snapshot
}

#[test]
fn every_builder_refuses_code_executing_opcodes_at_the_same_byte() {
    let cases: &[(&[u8], &str, u64)] = &[
        (
            b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.",
            "GLOBAL 'os system'",
            2,
        ),
        (
            b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93.",
            "STACK_GLOBAL 'os system'",
            16,
        ),
        (b"\x80\x04NNR.", "REDUCE", 4),
        (b"\x80\x04NNb.", "BUILD", 4),
        (b"\x80\x04(ios\nsystem\n.", "INST", 3),
        (b"\x80\x04(No.", "OBJ", 4),
        (b"\x80\x04NN\x81.", "NEWOBJ", 4),
        (b"\x80\x04NNN\x92.", "NEWOBJ_EX", 5),
        (b"\x80\x04Pfoo\n.", "PERSID", 2),
        (b"\x80\x04NQ.", "BINPERSID", 3),
        (b"\x80\x04\x82\x01.", "EXT1", 2),
        (b"\x80\x04\x83\x01\x00.", "EXT2", 2),
        (b"\x80\x04\x84\x01\x00\x00\x00.", "EXT4", 2),
    ];
    for &(bytes, what, at) in cases {
        let (offset, message) = same_error_on_both(bytes);
        assert_eq!(offset, at, "{message}");
        let name = what.split(' ').next().unwrap_or(what);
        let code = bytes[at as usize];
        assert!(
            message.contains(&format!("opcode {name} (0x{code:02x}) refused"))
                && message.contains(&format!("refusing to execute {what}")),
            "{message}"
        );
    }
}

#[test]
fn every_builder_fails_the_same_way_on_broken_input() {
    let cases: &[(&[u8], &str)] = &[
        (b"", "ended before the STOP opcode"),
        (b"\x80\x04K\x01", "ended before the STOP opcode"),
        (b"\x80\x09N.", "unsupported pickle protocol 9"),
        (b"\x80\x04h\x05.", "memo entry 5 was never stored"),
        (b"\x80\x04.", "STOP with an empty stack"),
        (b"\x80\x04]K\x01e.", "APPENDS without a MARK"),
        (b"\x80\x04\x8c\x02\xff\xfe.", "invalid UTF-8"),
        (
            b"\x80\x04\x8b\xff\xff\xff\xff.",
            "LONG4 with a negative length",
        ),
        (
            b"\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x40x.",
            "truncated input: BINUNICODE8 declares",
        ),
        (
            b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N.",
            "FRAME declares",
        ),
        (b"\x80\x04\xff", "unknown opcode 0xff"),
        (b"\x80\x04N(\x85.", "stack underflow in TUPLE1"),
        (b"\x80\x04}(K\x01u.", "odd number of items"),
    ];
    for &(bytes, needle) in cases {
        let (_, message) = same_error_on_both(bytes);
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
}

#[test]
fn the_tree_builder_shares_what_the_memo_shares_and_reads_python_s_extras() {
    // [l, l, {1}, frozenset({2}), bytearray(b'x'), 12345678901234567890 (INT), 1.5 (FLOAT)]
    // with l = [] memoized once, and protocol-0 PUT/GET.
    let bytes = b"\x80\x04](]p0\ng0\n\x8f(K\x01\x90(K\x02\x91\x96\x01\x00\x00\x00\x00\x00\x00\x00xI12345678901234567890\nF1.5\ne.";
    let (root, tree) = tree::load(bytes).expect("a plain pickle");
    let Value::Node(list) = root else {
        panic!("{root:?}");
    };
    let items = &tree.nodes[list].items;
    assert_eq!(items.len(), 7, "{items:?}");
    match (&items[0], &items[1]) {
        (Value::Node(a), Value::Node(b)) => assert_eq!(a, b, "one list, pushed twice"),
        other => panic!("{other:?}"),
    }
    assert_eq!(tree.shared, 1);
    let kind = |v: &Value| match v {
        Value::Node(id) => Some(tree.nodes[*id].kind),
        _ => None,
    };
    assert_eq!(kind(&items[2]), Some(Container::Set));
    assert_eq!(kind(&items[3]), Some(Container::FrozenSet));
    assert!(matches!(&items[4], Value::ByteArray(b) if &b[..] == b"x"));
    assert!(matches!(&items[5], Value::Decimal(d) if &d[..] == "12345678901234567890"));
    assert!(matches!(items[6], Value::Float(f) if f == 1.5));
    // The snapshot reader reads none of these extras.
    assert!(pickle::read(bytes).is_err());
}

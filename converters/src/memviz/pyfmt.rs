//! Python's text formatting, reproduced exactly: `_memory_viz.py`'s `_format_size`, and the
//! `repr()` of the dicts, strings, ints and floats it prints for trace entries it has no
//! special line for.

use std::fmt::Write;

use memsnap_format::{Frame, Snapshot, StackId, Value};

/// `_format_size(num)`: `f"{num:3.1f}{unit}B"` after dividing by 1024 while `|num| >= 1024`.
///
/// `num` starts as a Python int; the first comparison is exact, later ones are on floats, as in
/// Python. Rust's `{:.1}` rounds half to even on the exact binary value, like Python's.
pub fn format_size(out: &mut String, num: i128) {
    const UNITS: [&str; 8] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi"];
    if num.abs() < 1024 {
        let _ = write!(out, "{:.1}B", num as f64);
        return;
    }
    let mut value = num as f64 / 1024.0;
    for unit in &UNITS[1..] {
        if value.abs() < 1024.0 {
            let _ = write!(out, "{value:.1}{unit}B");
            return;
        }
        value /= 1024.0;
    }
    let _ = write!(out, "{value:.1}YiB");
}

/// [`format_size`] into a new string.
pub fn size(num: i128) -> String {
    let mut s = String::new();
    format_size(&mut s, num);
    s
}

/// `repr(str)`: single quotes unless the text has `'` and no `"`; backslash escapes for the
/// quote, `\\`, `\t`, `\n`, `\r` and non-printable characters.
pub fn str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c => {
                let code = c as u32;
                let _ = if code < 0x100 {
                    write!(out, "\\x{code:02x}")
                } else if code < 0x10000 {
                    write!(out, "\\u{code:04x}")
                } else {
                    write!(out, "\\U{code:08x}")
                };
            }
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable()` for one character. Exact for ASCII and Latin-1; beyond that it
/// knows the control, separator and common format characters but not unassigned code points
/// (std has no Unicode category table), which real snapshots do not contain.
fn is_printable(c: char) -> bool {
    if c.is_ascii() {
        return (' '..='~').contains(&c);
    }
    if c.is_control() || c == '\u{a0}' || c == '\u{ad}' {
        return false;
    }
    // Separators (Zs, Zl, Zp) other than the ASCII space.
    if c.is_whitespace() {
        return false;
    }
    let format_chars = [
        0x600..=0x605,
        0x61c..=0x61c,
        0x6dd..=0x6dd,
        0x70f..=0x70f,
        0x180e..=0x180e,
        0x200b..=0x200f,
        0x202a..=0x202e,
        0x2060..=0x2064,
        0x2066..=0x206f,
        0xfeff..=0xfeff,
        0xfff9..=0xfffb,
        0xe000..=0xf8ff,
        0xf0000..=0x10ffff,
        0xe0001..=0xe007f,
    ];
    let code = c as u32;
    !format_chars.iter().any(|r| r.contains(&code))
}

/// `repr(bytes)`: `b'...'` with `\xNN` for bytes outside printable ASCII.
fn bytes_repr(out: &mut String, bytes: &[u8]) {
    let quote = if bytes.contains(&b'\'') && !bytes.contains(&b'"') {
        b'"'
    } else {
        b'\''
    };
    out.push('b');
    out.push(quote as char);
    for &b in bytes {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b if b == quote => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            b => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out.push(quote as char);
}

/// `repr(float)`: the shortest digits that round-trip, in fixed notation when the decimal
/// exponent is in `-4..16` (with `.0` for whole numbers), else `1.5e-05` / `1e+16`.
pub fn float_repr(out: &mut String, x: f64) {
    if x.is_nan() {
        out.push_str("nan");
        return;
    }
    if x.is_infinite() {
        out.push_str(if x > 0.0 { "inf" } else { "-inf" });
        return;
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python's repr.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if x.is_sign_negative() {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if exp < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exp.abs());
    }
}

/// The decimal text of a little-endian two's-complement integer (pickle `LONG1`).
fn big_int_decimal(out: &mut String, le_bytes: &[u8]) {
    let _ = write!(out, "{}", memsnap_format::PyInt::from_le_bytes(le_bytes));
}

/// `repr()` of a generic value.
pub fn value_repr(out: &mut String, value: &Value) {
    match value {
        Value::None => out.push_str("None"),
        Value::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::BigInt(bytes) => big_int_decimal(out, bytes),
        Value::Float(f) => float_repr(out, *f),
        Value::Str(s) => str_repr(out, s),
        Value::Bytes(b) => bytes_repr(out, b),
        Value::List(items) => {
            out.push('[');
            comma_separated(out, items, value_repr);
            out.push(']');
        }
        Value::Tuple(items) => {
            out.push('(');
            comma_separated(out, items, value_repr);
            if items.len() == 1 {
                out.push(',');
            }
            out.push(')');
        }
        Value::Dict(items) => {
            out.push('{');
            for (i, (k, v)) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                value_repr(out, k);
                out.push_str(": ");
                value_repr(out, v);
            }
            out.push('}');
        }
    }
}

fn comma_separated<T>(out: &mut String, items: &[T], mut each: impl FnMut(&mut String, &T)) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        each(out, item);
    }
}

/// Writes the dict entry `'key': ` (with the leading `, ` unless it is the first).
pub struct DictWriter<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> DictWriter<'a> {
    pub fn open(out: &'a mut String) -> Self {
        out.push('{');
        DictWriter { out, first: true }
    }

    /// Starts the entry for `key` and returns the buffer to write its value into.
    pub fn key(&mut self, key: &str) -> &mut String {
        if !self.first {
            self.out.push_str(", ");
        }
        self.first = false;
        str_repr(self.out, key);
        self.out.push_str(": ");
        self.out
    }

    pub fn int(&mut self, key: &str, value: impl std::fmt::Display) {
        let out = self.key(key);
        let _ = write!(out, "{value}");
    }

    pub fn str(&mut self, key: &str, value: &str) {
        let out = self.key(key);
        str_repr(out, value);
    }

    pub fn value(&mut self, key: &str, value: &Value) {
        let out = self.key(key);
        value_repr(out, value);
    }

    pub fn close(self) {
        self.out.push('}');
    }
}

/// `repr()` of one frame dict: `{'name': ..., 'filename': ..., 'line': ...}` plus extra keys.
pub fn frame_repr(out: &mut String, frame: &Frame) {
    let mut dict = DictWriter::open(out);
    dict.str("name", &frame.name);
    dict.str("filename", &frame.filename);
    dict.int("line", &frame.line);
    for (k, v) in &frame.extra {
        dict.value(k, v);
    }
    dict.close();
}

/// `repr()` of a frames list, innermost frame first as stored.
pub fn stack_repr(out: &mut String, snapshot: &Snapshot, stack: StackId) {
    out.push('[');
    for (i, frame) in snapshot.stack_frames(stack).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        frame_repr(out, frame);
    }
    out.push(']');
}

/// `repr()` of a list of strings.
pub fn str_list_repr(out: &mut String, items: &[String]) {
    out.push('[');
    comma_separated(out, items, |o, s| str_repr(o, s));
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(v: &Value) -> String {
        let mut s = String::new();
        value_repr(&mut s, v);
        s
    }

    fn float(x: f64) -> String {
        let mut s = String::new();
        float_repr(&mut s, x);
        s
    }

    #[test]
    fn sizes_match_python_format_size() {
        assert_eq!(size(0), "0.0B");
        assert_eq!(size(512), "512.0B");
        assert_eq!(size(1023), "1023.0B");
        assert_eq!(size(1024), "1.0KiB");
        assert_eq!(size(-3_276_800), "-3.1MiB");
        assert_eq!(size(20 << 20), "20.0MiB");
        // 1023.95 KiB rounds up to 1024.0 without moving to the next unit, as in Python.
        assert_eq!(size(1_048_525), "1024.0KiB");
        // Ties round to even on the exact binary value: 0.25 KiB... 2.25 KiB -> 2.2KiB.
        assert_eq!(size(2304), "2.2KiB");
        assert_eq!(size(2816), "2.8KiB"); // 2.75 -> 2.8
        assert_eq!(size(i128::from(u64::MAX)), "16.0EiB");
        // Negative sizes (C++-path int64 casts) divide on `abs`, as Python's loop does.
        assert_eq!(size(-512), "-512.0B");
        assert_eq!(size(-1024), "-1.0KiB");
        assert_eq!(size(i128::from(i64::MIN)), "-8.0EiB");
        // Past ZiB: the loop ends and prints YiB (2^100 bytes is 2^20 YiB).
        assert_eq!(size(1 << 100), "1048576.0YiB");
    }

    #[test]
    fn strings_pick_quotes_and_escape_like_python() {
        let s = |t: &str| {
            let mut o = String::new();
            str_repr(&mut o, t);
            o
        };
        assert_eq!(s("N/A"), "'N/A'");
        assert_eq!(s(""), "''");
        assert_eq!(s("it's"), "\"it's\"");
        assert_eq!(s("both ' and \""), "'both \\' and \"'");
        assert_eq!(s("a\\b\tc\nd\re"), "'a\\\\b\\tc\\nd\\re'");
        assert_eq!(s("\u{1}\u{7f}"), "'\\x01\\x7f'");
        assert_eq!(s("caf\u{e9} \u{4e2d}"), "'caf\u{e9} \u{4e2d}'");
        assert_eq!(s("\u{a0}\u{200b}\u{2028}"), "'\\xa0\\u200b\\u2028'");
    }

    #[test]
    fn floats_use_python_repr() {
        assert_eq!(float(0.0), "0.0");
        assert_eq!(float(-0.0), "-0.0");
        assert_eq!(float(1.5), "1.5");
        assert_eq!(float(0.1), "0.1");
        assert_eq!(float(0.0001), "0.0001");
        assert_eq!(float(0.00001), "1e-05");
        assert_eq!(float(1.5e-7), "1.5e-07");
        assert_eq!(float(1e15), "1000000000000000.0");
        assert_eq!(float(1e16), "1e+16");
        assert_eq!(float(1.2345e300), "1.2345e+300");
        assert_eq!(float(f64::INFINITY), "inf");
        assert_eq!(float(f64::NAN), "nan");
        assert_eq!(float(123456.789), "123456.789");
    }

    #[test]
    fn containers_and_scalars_use_python_repr() {
        let v = Value::Dict(vec![
            (
                Value::Str("a".into()),
                Value::Tuple(vec![Value::Int(0), Value::Int(-1)]),
            ),
            (Value::Str("b".into()), Value::Tuple(vec![Value::None])),
            (
                Value::Int(3),
                Value::List(vec![Value::Bool(true), Value::Bool(false)]),
            ),
            (Value::Str("c".into()), Value::Tuple(vec![])),
            (Value::Str("d".into()), Value::Bytes(b"x'\x00".to_vec())),
        ]);
        assert_eq!(
            repr(&v),
            "{'a': (0, -1), 'b': (None,), 3: [True, False], 'c': (), 'd': b\"x'\\x00\"}"
        );
    }

    #[test]
    fn big_ints_print_in_decimal() {
        // 2**64 as LONG1 bytes: 00 x8, 01.
        let mut b = vec![0u8; 8];
        b.push(1);
        assert_eq!(repr(&Value::BigInt(b)), "18446744073709551616");
        // -2**63 - 1: ff ff ff ff ff ff ff 7f ff (two's complement, 9 bytes).
        let b = vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff];
        assert_eq!(repr(&Value::BigInt(b)), "-9223372036854775809");
        assert_eq!(repr(&Value::BigInt(vec![])), "0");
    }
}

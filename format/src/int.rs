//! Integers exactly as Python holds them, and the typed fields' exact values.
//!
//! Every integer of a snapshot is a Python `int`, of any size. The typed model keeps the
//! 64-bit value analysis uses (addresses and sizes as `u64`, streams, times and devices as
//! `i64`), which is the exact value's **low 64 bits** (two's complement). Nearly always that is
//! the whole story. When it is not, because the file spells the number differently from how
//! writing the typed field back would (a negative address or size, which PyTorch's C++ path
//! writes for values ≥ 2^63 since it casts them to `int64_t`; a stream or time ≥ 2^63; anything
//! beyond 64 bits), the exact value is kept beside the struct in an [`ExactInts`] override, so
//! writers emit it and printers print it exactly. Fields that few values have and analysis
//! does not use (frame lines, allocator settings) are [`PyInt`]s outright.
//!
//! An override whose low 64 bits disagree with the typed field is stale (code changed the
//! typed field and not the override) and is ignored: the typed field wins.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::value::Value;

/// A Python `int` of any size.
///
/// Canonical: values in `i64` are always [`PyInt::Small`]; [`PyInt::Big`] holds the minimal
/// little-endian two's-complement bytes of a value outside `i64` (as pickle's `LONG1` writes
/// them). `Debug` and `Display` print the decimal value, as Python's `repr` does.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum PyInt {
    Small(i64),
    Big(Box<[u8]>),
}

impl Default for PyInt {
    fn default() -> Self {
        PyInt::Small(0)
    }
}

impl From<i64> for PyInt {
    fn from(v: i64) -> Self {
        PyInt::Small(v)
    }
}

impl From<i32> for PyInt {
    fn from(v: i32) -> Self {
        PyInt::Small(v.into())
    }
}

impl From<u32> for PyInt {
    fn from(v: u32) -> Self {
        PyInt::Small(v.into())
    }
}

impl From<u64> for PyInt {
    fn from(v: u64) -> Self {
        match i64::try_from(v) {
            Ok(i) => PyInt::Small(i),
            Err(_) => {
                let mut bytes = v.to_le_bytes().to_vec();
                bytes.push(0);
                PyInt::Big(bytes.into())
            }
        }
    }
}

impl From<i128> for PyInt {
    fn from(v: i128) -> Self {
        match i64::try_from(v) {
            Ok(i) => PyInt::Small(i),
            Err(_) => PyInt::from_le_bytes(&v.to_le_bytes()),
        }
    }
}

impl PyInt {
    /// The integer of little-endian two's-complement bytes of any length (empty is 0).
    pub fn from_le_bytes(bytes: &[u8]) -> PyInt {
        let n = minimal_len(bytes);
        let bytes = &bytes[..n];
        if n <= 8 {
            let fill = if bytes.last().is_some_and(|b| b & 0x80 != 0) {
                0xff
            } else {
                0
            };
            let mut buf = [fill; 8];
            buf[..n].copy_from_slice(bytes);
            return PyInt::Small(i64::from_le_bytes(buf));
        }
        PyInt::Big(bytes.into())
    }

    /// The minimal little-endian two's-complement bytes (0 is empty, as `LONG1` writes it).
    pub fn to_le_bytes(&self) -> Cow<'_, [u8]> {
        match self {
            PyInt::Small(i) => {
                let bytes = i.to_le_bytes();
                Cow::Owned(bytes[..minimal_len(&bytes)].to_vec())
            }
            PyInt::Big(b) => Cow::Borrowed(b),
        }
    }

    pub fn is_negative(&self) -> bool {
        match self {
            PyInt::Small(i) => *i < 0,
            PyInt::Big(b) => b.last().is_some_and(|x| x & 0x80 != 0),
        }
    }

    /// The low 64 bits (two's complement): what the typed fields hold.
    pub fn low_u64(&self) -> u64 {
        match self {
            PyInt::Small(i) => *i as u64,
            PyInt::Big(b) => {
                let fill = if self.is_negative() { 0xff } else { 0 };
                let mut buf = [fill; 8];
                let n = b.len().min(8);
                buf[..n].copy_from_slice(&b[..n]);
                u64::from_le_bytes(buf)
            }
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            PyInt::Small(i) => Some(*i),
            PyInt::Big(_) => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            PyInt::Small(i) => u64::try_from(*i).ok(),
            PyInt::Big(b) => (b.len() == 9 && b[8] == 0).then(|| self.low_u64()),
        }
    }

    pub fn as_i128(&self) -> Option<i128> {
        match self {
            PyInt::Small(i) => Some((*i).into()),
            PyInt::Big(b) if b.len() <= 16 => {
                let fill = if self.is_negative() { 0xff } else { 0 };
                let mut buf = [fill; 16];
                buf[..b.len()].copy_from_slice(b);
                Some(i128::from_le_bytes(buf))
            }
            PyInt::Big(_) => None,
        }
    }

    /// Python's `float(n)`: correctly rounded (half to even); `None` where Python raises
    /// `OverflowError` (the value is too large for a float).
    pub fn to_f64(&self) -> Option<f64> {
        let bytes = match self {
            PyInt::Small(i) => return Some(*i as f64),
            PyInt::Big(b) => b,
        };
        let negative = self.is_negative();
        let magnitude = magnitude(bytes, negative);
        let bits = bit_len(&magnitude);
        let f = if bits <= 64 {
            le_u64(&magnitude) as f64
        } else {
            // The top 64 bits, with a sticky bit for anything below: 64 > 53 + 2, so rounding
            // that to 53 bits rounds the whole value correctly.
            let shift = bits - 64;
            let mut top = shifted_u64(&magnitude, shift);
            if any_bits_below(&magnitude, shift) {
                top |= 1;
            }
            let exp = i32::try_from(shift).ok()?;
            (top as f64) * 2f64.powi(exp)
        };
        let f = if negative { -f } else { f };
        f.is_finite().then_some(f)
    }

    /// The generic value of this int ([`Value::Int`] or a canonical [`Value::BigInt`]).
    pub fn to_value(&self) -> Value {
        match self {
            PyInt::Small(i) => Value::Int(*i),
            PyInt::Big(b) => Value::BigInt(b.to_vec()),
        }
    }

    /// The int a generic value holds (`bool` is not an int here).
    pub fn from_value(v: &Value) -> Option<PyInt> {
        match v {
            Value::Int(i) => Some(PyInt::Small(*i)),
            Value::BigInt(b) => Some(PyInt::from_le_bytes(b)),
            _ => None,
        }
    }

    /// Decimal text (`-` for negatives), as Python's `str(n)`.
    pub fn to_decimal(&self) -> String {
        match self {
            PyInt::Small(i) => i.to_string(),
            PyInt::Big(b) => le_to_decimal(b),
        }
    }

    /// Parses decimal text (an optional `-`, then ASCII digits); `None` on anything else.
    pub fn parse_decimal(text: &str) -> Option<PyInt> {
        if let Ok(i) = text.parse::<i64>() {
            return Some(PyInt::Small(i));
        }
        let (negative, digits) = match text.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, text),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(PyInt::from_le_bytes(&decimal_to_le(
            negative,
            digits.as_bytes(),
        )))
    }
}

impl fmt::Display for PyInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PyInt::Small(i) => fmt::Display::fmt(i, f),
            PyInt::Big(b) => f.pad_integral(
                !self.is_negative(),
                "",
                le_to_decimal(b).trim_start_matches('-'),
            ),
        }
    }
}

impl fmt::Debug for PyInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl PartialEq<i64> for PyInt {
    fn eq(&self, other: &i64) -> bool {
        self.as_i64() == Some(*other)
    }
}

/// msgpack (and any serde format): a native integer when the value fits `i64` or `u64`,
/// otherwise its minimal little-endian two's-complement bytes as a byte string.
impl Serialize for PyInt {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PyInt::Small(i) => s.serialize_i64(*i),
            PyInt::Big(b) => match self.as_u64() {
                Some(u) => s.serialize_u64(u),
                None => s.serialize_bytes(b),
            },
        }
    }
}

impl<'de> Deserialize<'de> for PyInt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'v> serde::de::Visitor<'v> for V {
            type Value = PyInt;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer, or its little-endian two's-complement bytes")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<PyInt, E> {
                Ok(PyInt::Small(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<PyInt, E> {
                Ok(PyInt::from(v))
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<PyInt, E> {
                Ok(PyInt::from_le_bytes(v))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<PyInt, E> {
                Ok(PyInt::from_le_bytes(&v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'v>>(self, mut seq: A) -> Result<PyInt, A::Error> {
                let mut bytes = Vec::new();
                while let Some(b) = seq.next_element::<u8>()? {
                    bytes.push(b);
                }
                Ok(PyInt::from_le_bytes(&bytes))
            }
        }
        d.deserialize_any(V)
    }
}

/// The int fields of the typed model that keep a 64-bit value (see the module docs). Named
/// after their keys; the same key in different structs is one variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum IntField {
    /// Trace entry `addr`, history item `addr` (u64).
    Addr,
    /// Segment and block `address` (u64).
    Address,
    /// `oom` entries' `device_free` (u64).
    DeviceFree,
    /// Trace entry and block `size` (u64).
    Size,
    /// Segment `total_size` (u64).
    TotalSize,
    /// Segment `allocated_size` (u64).
    AllocatedSize,
    /// Segment `active_size` (u64).
    ActiveSize,
    /// Segment and block `requested_size` (u64).
    RequestedSize,
    /// History item `real_size` (u64).
    RealSize,
    /// Trace entry and segment `stream` (i64).
    Stream,
    /// Trace entry and annotation `time_us` (i64).
    TimeUs,
    /// Segment and annotation `device` (i64).
    Device,
    /// The first int of a segment's `segment_pool_id` tuple (i64).
    PoolId0,
    /// The second int of a segment's `segment_pool_id` tuple (i64).
    PoolId1,
}

impl IntField {
    /// Whether the typed field is a `u64` (else an `i64`).
    pub fn is_unsigned(self) -> bool {
        !matches!(
            self,
            IntField::Stream
                | IntField::TimeUs
                | IntField::Device
                | IntField::PoolId0
                | IntField::PoolId1
        )
    }

    /// The field's key in the file.
    pub fn key(self) -> &'static str {
        match self {
            IntField::Addr => "addr",
            IntField::Address => "address",
            IntField::DeviceFree => "device_free",
            IntField::Size => "size",
            IntField::TotalSize => "total_size",
            IntField::AllocatedSize => "allocated_size",
            IntField::ActiveSize => "active_size",
            IntField::RequestedSize => "requested_size",
            IntField::RealSize => "real_size",
            IntField::Stream => "stream",
            IntField::TimeUs => "time_us",
            IntField::Device => "device",
            IntField::PoolId0 | IntField::PoolId1 => "segment_pool_id",
        }
    }

    /// The value writing the typed field's `bits` back gives (no override).
    pub fn natural(self, bits: u64) -> PyInt {
        if self.is_unsigned() {
            PyInt::from(bits)
        } else {
            PyInt::Small(bits as i64)
        }
    }

    /// Splits an exact value into the typed field's bits and the override it needs, if any.
    pub fn split(self, exact: PyInt) -> (u64, Option<PyInt>) {
        let bits = exact.low_u64();
        let fits = if self.is_unsigned() {
            exact.as_u64().is_some()
        } else {
            exact.as_i64().is_some()
        };
        (bits, (!fits).then_some(exact))
    }
}

/// Exact values of a struct's [`IntField`]s where they differ from what the typed field
/// would write (see the module docs). Empty for nearly every struct, and then allocates
/// nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExactInts(Vec<(IntField, PyInt)>);

impl ExactInts {
    /// No overrides.
    pub const NONE: ExactInts = ExactInts(Vec::new());

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The stored override of `field`, stale or not.
    pub fn get(&self, field: IntField) -> Option<&PyInt> {
        self.0.iter().find(|(f, _)| *f == field).map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = &(IntField, PyInt)> {
        self.0.iter()
    }

    /// Sets (or with `None` removes) the override of `field`.
    pub fn set(&mut self, field: IntField, exact: Option<PyInt>) {
        self.0.retain(|(f, _)| *f != field);
        if let Some(v) = exact {
            self.0.push((field, v));
        }
    }

    /// Records `exact` for `field`: returns the typed field's bits and keeps an override when
    /// the typed field alone would not write it back (and drops an earlier one otherwise).
    pub fn store(&mut self, field: IntField, exact: PyInt) -> u64 {
        let (bits, over) = field.split(exact);
        if over.is_some() || !self.is_empty() {
            self.set(field, over);
        }
        bits
    }

    /// [`ExactInts::store`] for an unsigned field.
    pub fn store_u64(&mut self, field: IntField, exact: PyInt) -> u64 {
        self.store(field, exact)
    }

    /// [`ExactInts::store`] for a signed field.
    pub fn store_i64(&mut self, field: IntField, exact: PyInt) -> i64 {
        self.store(field, exact) as i64
    }

    /// The exact value of `field` whose typed value has these `bits` (an `i64` field's value
    /// cast to `u64`): the override when there is a current one, else the natural value.
    pub fn exact(&self, field: IntField, bits: u64) -> PyInt {
        match self.get(field) {
            Some(v) if v.low_u64() == bits => v.clone(),
            _ => field.natural(bits),
        }
    }

    /// The override of `field` when it is current (its low bits are `bits`).
    pub fn current(&self, field: IntField, bits: u64) -> Option<&PyInt> {
        self.get(field).filter(|v| v.low_u64() == bits)
    }

    /// [`ExactInts::exact`] of an unsigned field.
    pub fn u(&self, field: IntField, v: u64) -> PyInt {
        self.exact(field, v)
    }

    /// [`ExactInts::exact`] of a signed field.
    pub fn i(&self, field: IntField, v: i64) -> PyInt {
        self.exact(field, v as u64)
    }
}

// ------------------------------------------------------------------------ byte arithmetic

/// Length of `bytes` without redundant sign-extension bytes.
fn minimal_len(bytes: &[u8]) -> usize {
    let mut n = bytes.len();
    while n > 0 {
        let top = bytes[n - 1];
        let below_sign = if n >= 2 { bytes[n - 2] & 0x80 } else { 0 };
        if (top == 0 && below_sign == 0) || (top == 0xff && n >= 2 && below_sign != 0) {
            n -= 1;
        } else {
            break;
        }
    }
    n
}

/// The absolute value's little-endian bytes.
fn magnitude(bytes: &[u8], negative: bool) -> Vec<u8> {
    let mut m = bytes.to_vec();
    if negative {
        let mut carry = true;
        for b in &mut m {
            let (v, c) = (!*b).overflowing_add(u8::from(carry));
            *b = v;
            carry = c;
        }
    }
    m
}

fn bit_len(magnitude: &[u8]) -> u32 {
    match magnitude.iter().rposition(|&b| b != 0) {
        Some(i) => i as u32 * 8 + (8 - magnitude[i].leading_zeros()),
        None => 0,
    }
}

fn bit(magnitude: &[u8], i: u32) -> bool {
    magnitude
        .get((i / 8) as usize)
        .is_some_and(|b| b >> (i % 8) & 1 != 0)
}

fn le_u64(magnitude: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    let n = magnitude.len().min(8);
    buf[..n].copy_from_slice(&magnitude[..n]);
    u64::from_le_bytes(buf)
}

/// Bits `shift..shift + 64` of the magnitude.
fn shifted_u64(magnitude: &[u8], shift: u32) -> u64 {
    (0..64).fold(0u64, |acc, i| {
        acc | (u64::from(bit(magnitude, shift + i)) << i)
    })
}

fn any_bits_below(magnitude: &[u8], shift: u32) -> bool {
    (0..shift).any(|i| bit(magnitude, i))
}

/// Decimal text of little-endian two's-complement bytes.
pub(crate) fn le_to_decimal(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    let magnitude = magnitude(bytes, negative);
    // Repeated division by 10^9, most significant limb first.
    let mut limbs: Vec<u32> = magnitude
        .chunks(4)
        .rev()
        .map(|c| {
            c.iter()
                .rev()
                .fold(0u32, |acc, &b| (acc << 8) | u32::from(b))
        })
        .collect();
    let mut groups = Vec::new();
    while limbs.iter().any(|&l| l != 0) {
        let mut rem = 0u64;
        for limb in &mut limbs {
            let cur = (rem << 32) | u64::from(*limb);
            *limb = (cur / 1_000_000_000) as u32;
            rem = cur % 1_000_000_000;
        }
        groups.push(rem as u32);
    }
    let mut text = String::new();
    if negative {
        text.push('-');
    }
    match groups.split_last() {
        None => text.push('0'),
        Some((most, rest)) => {
            let _ = write!(text, "{most}");
            for g in rest.iter().rev() {
                let _ = write!(text, "{g:09}");
            }
        }
    }
    text
}

/// Minimal little-endian two's complement of a decimal integer (`digits` are ASCII digits).
pub(crate) fn decimal_to_le(negative: bool, digits: &[u8]) -> Vec<u8> {
    let mut magnitude: Vec<u8> = vec![0];
    for &d in digits {
        let mut carry = u32::from(d - b'0');
        for b in &mut magnitude {
            let v = u32::from(*b) * 10 + carry;
            *b = v as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            magnitude.push(carry as u8);
            carry >>= 8;
        }
    }
    magnitude.push(0); // room for the sign bit
    if negative {
        let mut carry = true;
        for b in &mut magnitude {
            let (v, c) = (!*b).overflowing_add(u8::from(carry));
            *b = v;
            carry = c;
        }
    }
    let n = minimal_len(&magnitude).max(1);
    magnitude.truncate(n);
    magnitude
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms() {
        assert_eq!(PyInt::from_le_bytes(&[]), PyInt::Small(0));
        assert_eq!(PyInt::from_le_bytes(&[0xff; 12]), PyInt::Small(-1));
        assert_eq!(
            PyInt::from_le_bytes(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0]),
            PyInt::from(1u64 << 63)
        );
        assert_eq!(
            PyInt::from(u64::MAX).to_le_bytes().as_ref(),
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0][..]
        );
        assert_eq!(PyInt::Small(0).to_le_bytes().as_ref(), &[] as &[u8]);
        assert_eq!(PyInt::Small(-1).to_le_bytes().as_ref(), &[0xff]);
        assert_eq!(PyInt::Small(128).to_le_bytes().as_ref(), &[0x80, 0]);
        assert_ne!(PyInt::from(u64::MAX), PyInt::Small(-1));
        assert_eq!(PyInt::from(u64::MAX).low_u64(), u64::MAX);
        assert_eq!(PyInt::from(i128::MIN).as_i128(), Some(i128::MIN));
    }

    #[test]
    fn decimal_both_ways() {
        for text in [
            "0",
            "-1",
            "18446744073709551615",
            "9223372036854775808",
            "-9223372036854775809",
            "1267650600228229401496703205376",
            "-1267650600228229401496703205376",
        ] {
            let n = PyInt::parse_decimal(text).unwrap();
            assert_eq!(n.to_string(), text);
            assert_eq!(format!("{n:?}"), text);
        }
        assert_eq!(
            format!("{:>22}", PyInt::from(u64::MAX)),
            "  18446744073709551615"
        );
        assert!(PyInt::parse_decimal("1e3").is_none());
        assert!(PyInt::parse_decimal("-").is_none());
    }

    #[test]
    fn floats_round_like_python() {
        assert_eq!(PyInt::from(u64::MAX).to_f64(), Some(18446744073709551615.0));
        let two100 = PyInt::parse_decimal("1267650600228229401496703205376").unwrap();
        assert_eq!(two100.to_f64(), Some(2f64.powi(100)));
        // 2^100 + 2^47 is exactly between two floats: half to even goes down.
        let halfway = PyInt::from((1i128 << 100) + (1i128 << 47));
        assert_eq!(halfway.to_f64(), Some(2f64.powi(100)));
        let above = PyInt::from((1i128 << 100) + (1i128 << 47) + 1);
        assert_eq!(above.to_f64(), Some(2f64.powi(100) + 2f64.powi(48)));
        assert_eq!(
            PyInt::from(-(1i128 << 100)).to_f64(),
            Some(-(2f64.powi(100)))
        );
        let mut huge = vec![0u8; 129];
        huge[128] = 1; // 2^1024
        assert_eq!(PyInt::from_le_bytes(&huge).to_f64(), None);
    }

    #[test]
    fn fields_split_into_bits_and_overrides() {
        let (bits, over) = IntField::Address.split(PyInt::Small(-4096));
        assert_eq!(bits, (-4096i64) as u64);
        assert_eq!(over, Some(PyInt::Small(-4096)));
        assert_eq!(
            IntField::Address.split(PyInt::from(u64::MAX)),
            (u64::MAX, None)
        );
        let (bits, over) = IntField::Stream.split(PyInt::from(u64::MAX));
        assert_eq!(bits as i64, -1);
        assert!(over.is_some());
        let mut exact = ExactInts::default();
        assert_eq!(exact.store_u64(IntField::Size, PyInt::Small(-1)), u64::MAX);
        assert_eq!(exact.u(IntField::Size, u64::MAX), PyInt::Small(-1));
        // Stale: the typed field changed.
        assert_eq!(exact.u(IntField::Size, 5), PyInt::Small(5));
        assert_eq!(exact.u(IntField::Addr, u64::MAX), PyInt::from(u64::MAX));
        // A repeated key: the later value replaces the override, even with the same bits.
        assert_eq!(
            exact.store_u64(IntField::Size, PyInt::from(u64::MAX)),
            u64::MAX
        );
        assert_eq!(exact.u(IntField::Size, u64::MAX), PyInt::from(u64::MAX));
        assert!(exact.is_empty());
    }
}

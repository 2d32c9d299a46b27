//! Comparing snapshots by value, and checking that a snapshot's ids resolve.
//!
//! Two snapshots read from different codecs hold the same data under different ids: the
//! interning tables are filled in reading order, and a table may hold entries nothing uses.
//! [`diff`] therefore resolves every [`StackId`] to its frames and every [`StrId`] to its text
//! before comparing, and reports the first difference with its path
//! (`device_traces[0][17].frames[3].line: 54 vs 55`).
//!
//! The comparison follows the schema walk the writers use (`crate::schema`): each side's walk
//! is recorded (lists left unexpanded, then walked item by item) and the two recordings are
//! compared, so two snapshots are equal exactly when they would be written with the same keys,
//! in the same order, with the same values; a key one side lacks is reported as
//! `path.key: present vs absent`.
//!
//! Integers compare by value whatever their encoding (`Value::Int` or `Value::BigInt`), floats
//! by their bits (so `NaN` equals itself and `-0.0` differs from `0.0`). Typed int fields
//! compare by their exact values (`exact_int`): a size of −1 differs from one of 2^64 − 1,
//! though both hold the same 64 bits.

use std::fmt::Debug;

use std::convert::Infallible;

use crate::error::{FormatError, Result};
use crate::int::PyInt;
use crate::intern::{StackId, StrId};
use crate::model::*;
use crate::schema::{self, Emit, Key, Walk};
use crate::value::Value;

/// The first difference between `a` and `b` with its path, or `None` when they hold the same
/// data. A snapshot whose ids do not resolve is reported as a difference, not a panic.
pub fn diff(a: &Snapshot, b: &Snapshot) -> Option<String> {
    if let Err(e) = check_ids(a) {
        return Some(format!("first snapshot: {e}"));
    }
    if let Err(e) = check_ids(b) {
        return Some(format!("second snapshot: {e}"));
    }
    Cmp { a, b }.snapshot().err()
}

/// Checks that every id in `snapshot` resolves in its tables (stack ids, frame ids inside
/// stacks, string ids), so code that looks them up cannot panic. The error names the first
/// dangling id and where it is.
pub fn check_ids(snapshot: &Snapshot) -> Result<()> {
    let frames = snapshot.frames.len();
    for (id, stack) in snapshot.stacks.iter() {
        if let Some((i, f)) = stack.iter().enumerate().find(|(_, f)| f.index() >= frames) {
            return Err(FormatError::Schema {
                path: format!("stacks[{}][{i}]", id.index()),
                what: format!("frame id {} is out of range ({frames} frames)", f.index()),
            });
        }
    }
    let ids = IdCheck {
        stacks: snapshot.stacks.len(),
        strings: snapshot.strings.len(),
    };
    for (si, seg) in snapshot.segments.iter().enumerate() {
        let at = |field: &str| format!("segments[{si}].{field}");
        ids.stack(seg.frames, || at("frames"))?;
        if let Some(SegmentType::Other(s)) = seg.segment_type {
            ids.string(s, || at("segment_type"))?;
        }
        for (bi, block) in seg.blocks.iter().enumerate() {
            let at = |field: &str| format!("segments[{si}].blocks[{bi}].{field}");
            ids.stack(block.frames, || at("frames"))?;
            if let BlockState::Other(s) = block.state {
                ids.string(s, || at("state"))?;
            }
            for (hi, item) in block.history.iter().flatten().enumerate() {
                ids.stack(item.frames, || at(&format!("history[{hi}].frames")))?;
            }
        }
    }
    for (d, trace) in snapshot.traces().iter().enumerate() {
        for (i, e) in trace.iter().enumerate() {
            let at = |field: &str| format!("device_traces[{d}][{i}].{field}");
            ids.stack(e.frames, || at("frames"))?;
            if e.action == Action::Other {
                let Some(s) = e.other_action() else {
                    return Err(FormatError::Schema {
                        path: at("action"),
                        what: "an unknown action without its name".into(),
                    });
                };
                ids.string(s, || at("action"))?;
            }
            let table = &snapshot.strings;
            let defaults = [
                (
                    "compile_context",
                    e.has_compile_context(),
                    e.compile_context(table),
                ),
                (
                    "user_metadata",
                    e.has_user_metadata(),
                    e.user_metadata(table),
                ),
            ];
            for (field, present, id) in defaults {
                if present && id.is_none() {
                    return Err(FormatError::Schema {
                        path: at(field),
                        what: "the value is missing (a default the string table lacks)".into(),
                    });
                }
            }
            let strings = [
                ("compile_context", e.compile_context(table)),
                ("user_metadata", e.user_metadata(table)),
                (
                    "internal_metadata",
                    e.rare.as_ref().and_then(|r| r.internal_metadata),
                ),
            ];
            for (field, id) in strings {
                if let Some(id) = id {
                    ids.string(id, || at(field))?;
                }
            }
        }
    }
    Ok(())
}

/// How deeply the values under unknown keys nest (a scalar is 1, a list of scalars 2), for
/// writers that must not write what their reader would refuse.
pub(crate) fn deepest_value(snapshot: &Snapshot) -> usize {
    fn depth(v: &Value) -> usize {
        // Iterative, so a deep value cannot overflow the stack here.
        let mut deepest = 0;
        let mut todo = vec![(v, 1usize)];
        while let Some((v, d)) = todo.pop() {
            deepest = deepest.max(d);
            match v {
                Value::List(items) | Value::Tuple(items) => {
                    todo.extend(items.iter().map(|i| (i, d + 1)));
                }
                Value::Dict(pairs) => {
                    for (k, v) in pairs {
                        todo.push((k, d + 1));
                        todo.push((v, d + 1));
                    }
                }
                _ => {}
            }
        }
        deepest
    }
    let extras = |e: &[(String, Value)]| e.iter().map(|(_, v)| depth(v)).max().unwrap_or(0);
    let mut deepest = extras(&snapshot.extra);
    for v in [&snapshot.host_segments, &snapshot.host_traces]
        .into_iter()
        .flatten()
    {
        deepest = deepest.max(depth(v));
    }
    for f in snapshot.frames.iter() {
        deepest = deepest.max(extras(&f.extra));
    }
    for seg in &snapshot.segments {
        deepest = deepest.max(extras(&seg.extra));
        for b in &seg.blocks {
            deepest = deepest.max(extras(&b.extra));
            for h in b.history.iter().flatten() {
                deepest = deepest.max(extras(&h.extra));
            }
        }
    }
    for e in snapshot.traces().iter().flatten() {
        if let Some(rare) = &e.rare {
            deepest = deepest.max(extras(&rare.extra));
        }
    }
    if let Some(s) = &snapshot.allocator_settings {
        deepest = deepest.max(extras(&s.extra));
    }
    for a in snapshot.external_annotations.iter().flatten() {
        let metadata = a.metadata.iter().map(|(_, v)| depth(v)).max().unwrap_or(0);
        deepest = deepest.max(metadata).max(extras(a.extra()));
    }
    if let Some(info) = &snapshot.recorder_info {
        deepest = deepest.max(extras(&info.extra));
    }
    deepest
}

struct IdCheck {
    stacks: usize,
    strings: usize,
}

impl IdCheck {
    fn stack(&self, id: Option<StackId>, path: impl Fn() -> String) -> Result<()> {
        match id {
            Some(id) if id.index() >= self.stacks => Err(FormatError::Schema {
                path: path(),
                what: format!(
                    "stack id {} is out of range ({} stacks)",
                    id.index(),
                    self.stacks
                ),
            }),
            _ => Ok(()),
        }
    }

    fn string(&self, id: StrId, path: impl Fn() -> String) -> Result<()> {
        if id.index() >= self.strings {
            return Err(FormatError::Schema {
                path: path(),
                what: format!(
                    "string id {} is out of range ({} strings)",
                    id.index(),
                    self.strings
                ),
            });
        }
        Ok(())
    }
}

/// `Err` carries the first difference; paths are prefixed on the way out.
type Diff = std::result::Result<(), String>;

fn field<T: PartialEq + Debug + ?Sized>(name: &str, a: &T, b: &T) -> Diff {
    if a == b {
        Ok(())
    } else {
        Err(format!("{name}: {a:?} vs {b:?}"))
    }
}

fn at<T>(prefix: impl Fn() -> String, r: std::result::Result<T, String>) -> Diff {
    r.map(|_| ()).map_err(|e| format!("{}{e}", prefix()))
}

fn list<T>(name: &str, a: &[T], b: &[T], mut item: impl FnMut(&T, &T) -> Diff) -> Diff {
    if a.len() != b.len() {
        return Err(format!("{name}: {} items vs {}", a.len(), b.len()));
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        at(|| format!("{name}[{i}]"), item(x, y))?;
    }
    Ok(())
}

// ------------------------------------------------------------------ comparing by the schema

/// What the schema walk emits, recorded for comparison. Lists are kept unexpanded and
/// recorded item by item when compared, so memory stays at one item per nesting level.
enum Tok<'s> {
    DictBegin,
    DictEnd,
    Key(&'s str),
    Int(PyInt),
    Float(f64),
    Bool(bool),
    Str(&'s str),
    Stack(StackId),
    Value(&'s Value),
    PairBegin,
    PairEnd,
    List(Box<dyn Items<'s> + 's>),
    Divisions(&'s [(String, PyInt)]),
}

impl Tok<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Tok::DictBegin => "a dict",
            Tok::DictEnd => "the end of a dict",
            Tok::Key(_) => "a key",
            Tok::Int(_) => "an int",
            Tok::Float(_) => "a float",
            Tok::Bool(_) => "a bool",
            Tok::Str(_) => "a str",
            Tok::Stack(_) => "a frames list",
            Tok::Value(_) => "a value",
            Tok::PairBegin => "a tuple",
            Tok::PairEnd => "the end of a tuple",
            Tok::List(_) => "a list",
            Tok::Divisions(_) => "a dict of divisions",
        }
    }
}

/// A list the walk met, walked item by item on demand.
trait Items<'s> {
    fn len(&self) -> usize;
    fn record(&self, i: usize, r: &mut Recorder<'s>);
}

struct ListOf<'s, T>(&'s [T]);

impl<'s, T: Walk<'s>> Items<'s> for ListOf<'s, T> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn record(&self, i: usize, r: &mut Recorder<'s>) {
        if let Some(item) = self.0.get(i) {
            let Ok(()) = item.walk(r);
        }
    }
}

/// The emitter that records one side's walk, ids resolved to text.
struct Recorder<'s> {
    snap: &'s Snapshot,
    toks: Vec<Tok<'s>>,
}

impl<'s> Emit<'s> for Recorder<'s> {
    type Error = Infallible;
    const COUNTS_PAIRS: bool = false;

    fn dict_begin(&mut self, _: usize) {
        self.toks.push(Tok::DictBegin);
    }
    fn dict_end(&mut self, _: usize) {
        self.toks.push(Tok::DictEnd);
    }
    fn key(&mut self, key: Key) {
        self.toks.push(Tok::Key(key.text()));
    }
    fn extra_key(&mut self, key: &'s str) {
        self.toks.push(Tok::Key(key));
    }
    fn known(&mut self, value: Key) {
        self.toks.push(Tok::Str(value.text()));
    }
    fn uint(&mut self, v: u64) {
        self.toks.push(Tok::Int(PyInt::from(v)));
    }
    fn int(&mut self, v: i64) {
        self.toks.push(Tok::Int(PyInt::from(v)));
    }
    fn pyint(&mut self, v: &'s PyInt) -> std::result::Result<(), Infallible> {
        self.toks.push(Tok::Int(v.clone()));
        Ok(())
    }
    fn float(&mut self, v: f64) {
        self.toks.push(Tok::Float(v));
    }
    fn bool(&mut self, v: bool) {
        self.toks.push(Tok::Bool(v));
    }
    fn str(&mut self, s: &'s str) {
        self.toks.push(Tok::Str(s));
    }
    #[inline(always)]
    fn strings(&self) -> Option<&'s crate::intern::StrTable> {
        Some(&self.snap.strings)
    }

    fn str_id(&mut self, id: StrId) {
        self.toks.push(Tok::Str(self.snap.str(id)));
    }
    fn stack(&mut self, id: StackId) -> std::result::Result<(), Infallible> {
        self.toks.push(Tok::Stack(id));
        Ok(())
    }
    fn value(&mut self, v: &'s Value) -> std::result::Result<(), Infallible> {
        self.toks.push(Tok::Value(v));
        Ok(())
    }
    fn list<T: Walk<'s>>(&mut self, items: &'s [T]) -> std::result::Result<(), Infallible> {
        self.toks.push(Tok::List(Box::new(ListOf(items))));
        Ok(())
    }
    fn pair_begin(&mut self) {
        self.toks.push(Tok::PairBegin);
    }
    fn pair_next(&mut self) {}
    fn pair_end(&mut self) {
        self.toks.push(Tok::PairEnd);
    }
    fn divisions(&mut self, d: &'s [(String, PyInt)]) -> std::result::Result<(), Infallible> {
        self.toks.push(Tok::Divisions(d));
        Ok(())
    }
}

/// Whether `key` comes later in the dict `toks[from..]` is in.
fn later_key(toks: &[Tok<'_>], from: usize, key: &str) -> bool {
    let mut depth = 0usize;
    for t in toks.iter().skip(from) {
        match t {
            Tok::DictBegin | Tok::PairBegin => depth += 1,
            Tok::DictEnd | Tok::PairEnd => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            Tok::Key(k) if depth == 0 && *k == key => return true,
            _ => {}
        }
    }
    false
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

struct Cmp<'a> {
    a: &'a Snapshot,
    b: &'a Snapshot,
}

impl<'a> Cmp<'a> {
    fn snapshot(&self) -> Diff {
        field("shape", &self.a.shape, &self.b.shape)?;
        let (mut ra, mut rb) = (self.recorder(self.a), self.recorder(self.b));
        let Ok(()) = schema::snapshot(&mut ra, self.a);
        let Ok(()) = schema::snapshot(&mut rb, self.b);
        self.tokens("", &ra.toks, &rb.toks)
    }

    fn recorder(&self, snap: &'a Snapshot) -> Recorder<'a> {
        Recorder {
            snap,
            toks: Vec::new(),
        }
    }

    /// Compares two recorded walks; `prefix` is the path of what they are.
    fn tokens(&self, prefix: &str, ta: &[Tok<'a>], tb: &[Tok<'a>]) -> Diff {
        // The path below `prefix`: the key last seen in each open dict.
        let mut keys: Vec<Option<&str>> = Vec::new();
        let path = |keys: &[Option<&str>]| {
            keys.iter()
                .flatten()
                .fold(prefix.to_owned(), |p, k| join(&p, k))
        };
        for (i, (x, y)) in ta.iter().zip(tb).enumerate() {
            match (x, y) {
                (Tok::DictBegin, Tok::DictBegin) | (Tok::PairBegin, Tok::PairBegin) => {
                    keys.push(None)
                }
                (Tok::DictEnd, Tok::DictEnd) | (Tok::PairEnd, Tok::PairEnd) => {
                    keys.pop();
                }
                (Tok::Key(p), Tok::Key(q)) if p == q => {
                    if let Some(last) = keys.last_mut() {
                        *last = Some(p);
                    }
                }
                (Tok::Key(p), Tok::Key(q)) => {
                    let here = path(&keys[..keys.len().saturating_sub(1)]);
                    return Err(if later_key(tb, i, p) {
                        format!("{}: absent vs present", join(&here, q))
                    } else {
                        format!("{}: present vs absent", join(&here, p))
                    });
                }
                (Tok::Key(p), Tok::DictEnd) => {
                    let here = path(&keys[..keys.len().saturating_sub(1)]);
                    return Err(format!("{}: present vs absent", join(&here, p)));
                }
                (Tok::DictEnd, Tok::Key(q)) => {
                    let here = path(&keys[..keys.len().saturating_sub(1)]);
                    return Err(format!("{}: absent vs present", join(&here, q)));
                }
                (Tok::Int(p), Tok::Int(q)) => field(&path(&keys), p, q)?,
                (Tok::Bool(p), Tok::Bool(q)) => field(&path(&keys), p, q)?,
                (Tok::Str(p), Tok::Str(q)) => field(&path(&keys), p, q)?,
                (Tok::Float(p), Tok::Float(q)) => {
                    if p.to_bits() != q.to_bits() {
                        return Err(format!("{}: {p:?} vs {q:?}", path(&keys)));
                    }
                }
                (Tok::Value(p), Tok::Value(q)) => value(&path(&keys), p, q)?,
                (Tok::Divisions(p), Tok::Divisions(q)) => field(&path(&keys), p, q)?,
                (Tok::Stack(p), Tok::Stack(q)) => self.stack(&path(&keys), *p, *q)?,
                (Tok::List(p), Tok::List(q)) => self.list(&path(&keys), &**p, &**q)?,
                (p, q) => {
                    return Err(format!("{}: {} vs {}", path(&keys), p.kind(), q.kind()));
                }
            }
        }
        if ta.len() != tb.len() {
            return Err(format!("{prefix}: the walks differ in length"));
        }
        Ok(())
    }

    fn list(&self, name: &str, a: &dyn Items<'a>, b: &dyn Items<'a>) -> Diff {
        if a.len() != b.len() {
            return Err(format!("{name}: {} items vs {}", a.len(), b.len()));
        }
        let (mut ra, mut rb) = (self.recorder(self.a), self.recorder(self.b));
        for i in 0..a.len() {
            ra.toks.clear();
            rb.toks.clear();
            a.record(i, &mut ra);
            b.record(i, &mut rb);
            self.tokens(&format!("{name}[{i}]"), &ra.toks, &rb.toks)?;
        }
        Ok(())
    }

    fn stack(&self, name: &str, a: StackId, b: StackId) -> Diff {
        let fa: Vec<_> = self.a.stack_frames(a).collect();
        let fb: Vec<_> = self.b.stack_frames(b).collect();
        if fa.len() != fb.len() {
            return Err(format!("{name}: {} items vs {}", fa.len(), fb.len()));
        }
        let (mut ra, mut rb) = (self.recorder(self.a), self.recorder(self.b));
        for (i, (x, y)) in fa.into_iter().zip(fb).enumerate() {
            ra.toks.clear();
            rb.toks.clear();
            let Ok(()) = schema::frame(&mut ra, x);
            let Ok(()) = schema::frame(&mut rb, y);
            self.tokens(&format!("{name}[{i}]"), &ra.toks, &rb.toks)?;
        }
        Ok(())
    }
}

/// The integer a value holds, as a canonical big integer (little-endian two's complement,
/// no redundant sign bytes), whichever way it is stored.
fn canonical_int(v: &Value) -> Option<Vec<u8>> {
    let mut bytes = match v {
        Value::Int(i) => i.to_le_bytes().to_vec(),
        Value::BigInt(b) if b.is_empty() => vec![0],
        Value::BigInt(b) => b.clone(),
        _ => return None,
    };
    while bytes.len() > 1 {
        let last = bytes[bytes.len() - 1];
        let next_sign = bytes[bytes.len() - 2] & 0x80;
        if (last == 0 && next_sign == 0) || (last == 0xff && next_sign != 0) {
            bytes.pop();
        } else {
            break;
        }
    }
    Some(bytes)
}

fn value(name: &str, a: &Value, b: &Value) -> Diff {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => {
            field(name, &x.to_bits(), &y.to_bits()).map_err(|_| format!("{name}: {x:?} vs {y:?}"))
        }
        (Value::List(x), Value::List(y)) | (Value::Tuple(x), Value::Tuple(y)) => {
            list(name, x, y, |p, q| value("", p, q))
        }
        (Value::Dict(x), Value::Dict(y)) => list(name, x, y, |(ka, va), (kb, vb)| {
            at(|| "(key)".to_owned(), value("", ka, kb))?;
            value("", va, vb)
        }),
        (Value::Int(_) | Value::BigInt(_), Value::Int(_) | Value::BigInt(_)) => {
            if canonical_int(a) == canonical_int(b) {
                Ok(())
            } else {
                Err(format!("{name}: {a:?} vs {b:?}"))
            }
        }
        _ if std::mem::discriminant(a) != std::mem::discriminant(b) => Err(format!(
            "{name}: a {} vs a {} ({a:?} vs {b:?})",
            a.type_name(),
            b.type_name()
        )),
        _ => field(name, a, b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intern::Frame;

    fn small() -> Snapshot {
        let mut s = Snapshot::new(1);
        let stack = s.intern_stack([Frame::new("forward", "model.py", 54)]);
        let mut e = TraceEntry::new(Action::Alloc, 0x1000, 800, 0);
        e.frames = Some(stack);
        s.device_traces.as_mut().unwrap()[0].push(e);
        s
    }

    #[test]
    fn equal_data_under_different_ids_is_equal() {
        let a = small();
        let mut b = Snapshot::new(1);
        b.intern_stack([Frame::new("unused", "x.py", 1)]);
        let stack = b.intern_stack([Frame::new("forward", "model.py", 54)]);
        let mut e = TraceEntry::new(Action::Alloc, 0x1000, 800, 0);
        e.frames = Some(stack);
        b.device_traces.as_mut().unwrap()[0].push(e);
        assert_eq!(diff(&a, &b), None);
    }

    #[test]
    fn reports_the_path_of_the_first_difference() {
        let a = small();
        let mut b = small();
        let stack = b.intern_stack([Frame::new("forward", "model.py", 55)]);
        b.device_traces.as_mut().unwrap()[0][0].frames = Some(stack);
        assert_eq!(
            diff(&a, &b).as_deref(),
            Some("device_traces[0][0].frames[0].line: 54 vs 55")
        );
        let mut c = small();
        c.device_traces.as_mut().unwrap()[0][0].size = 801;
        assert_eq!(
            diff(&a, &c).as_deref(),
            Some("device_traces[0][0].size: 800 vs 801")
        );
    }

    #[test]
    fn integers_compare_by_value_and_floats_by_bits() {
        assert!(value("", &Value::Int(-1), &Value::BigInt(vec![0xff, 0xff])).is_ok());
        assert!(value("", &Value::Int(255), &Value::BigInt(vec![0xff, 0x00])).is_ok());
        assert!(value("", &Value::Int(255), &Value::BigInt(vec![0xff])).is_err());
        assert!(value("", &Value::Float(f64::NAN), &Value::Float(f64::NAN)).is_ok());
        assert!(value("", &Value::Float(0.0), &Value::Float(-0.0)).is_err());
        assert!(value("", &Value::List(vec![]), &Value::Tuple(vec![])).is_err());
    }

    #[test]
    fn dangling_ids_are_reported_not_panicked_on() {
        let a = small();
        let mut b = small();
        b.device_traces.as_mut().unwrap()[0][0].frames = Some(StackId::from_index(99));
        let d = diff(&a, &b).unwrap();
        assert!(
            d.contains("device_traces[0][0].frames") && d.contains("99"),
            "{d}"
        );
    }
}

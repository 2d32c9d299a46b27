//! Comparing snapshots by value, and checking that a snapshot's ids resolve.
//!
//! Two snapshots read from different codecs hold the same data under different ids: the
//! interning tables are filled in reading order, and a table may hold entries nothing uses.
//! [`diff`] therefore resolves every [`StackId`] to its frames and every [`StrId`] to its text
//! before comparing, and reports the first difference with its path
//! (`device_traces[0][17].frames[3].line: 54 vs 55`).
//!
//! Integers compare by value whatever their encoding (`Value::Int` or `Value::BigInt`), floats
//! by their bits (so `NaN` equals itself and `-0.0` differs from `0.0`). Typed int fields
//! compare by their exact values (`exact_int`): a size of −1 differs from one of 2^64 − 1,
//! though both hold the same 64 bits.

use std::fmt::Debug;

use crate::error::{FormatError, Result};
use crate::int::IntField;
use crate::intern::{StackId, StrId};
use crate::model::*;
use crate::value::{Extras, Value};

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
        if let Some((i, f)) = stack
            .iter()
            .enumerate()
            .find(|(_, f)| f.0 as usize >= frames)
        {
            return Err(FormatError::Schema {
                path: format!("stacks[{}][{i}]", id.0),
                what: format!("frame id {} is out of range ({frames} frames)", f.0),
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
            if let Action::Other(s) = e.action {
                ids.string(s, || at("action"))?;
            }
            let strings = [
                ("compile_context", e.compile_context),
                ("user_metadata", e.user_metadata),
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
    let extras = |e: &Extras| e.iter().map(|(_, v)| depth(v)).max().unwrap_or(0);
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
        deepest = deepest.max(extras(&a.metadata)).max(extras(&a.extra));
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
            Some(id) if id.0 as usize >= self.stacks => Err(FormatError::Schema {
                path: path(),
                what: format!("stack id {} is out of range ({} stacks)", id.0, self.stacks),
            }),
            _ => Ok(()),
        }
    }

    fn string(&self, id: StrId, path: impl Fn() -> String) -> Result<()> {
        if id.0 as usize >= self.strings {
            return Err(FormatError::Schema {
                path: path(),
                what: format!(
                    "string id {} is out of range ({} strings)",
                    id.0, self.strings
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

fn option<T>(name: &str, a: &Option<T>, b: &Option<T>, item: impl FnOnce(&T, &T) -> Diff) -> Diff {
    match (a, b) {
        (None, None) => Ok(()),
        (Some(x), Some(y)) => at(|| name.to_owned(), item(x, y)),
        (Some(_), None) => Err(format!("{name}: present vs absent")),
        (None, Some(_)) => Err(format!("{name}: absent vs present")),
    }
}

struct Cmp<'a> {
    a: &'a Snapshot,
    b: &'a Snapshot,
}

impl Cmp<'_> {
    fn snapshot(&self) -> Diff {
        let (a, b) = (self.a, self.b);
        field("shape", &a.shape, &b.shape)?;
        list("segments", &a.segments, &b.segments, |x, y| {
            self.segment(x, y)
        })?;
        option(
            "device_traces",
            &a.device_traces,
            &b.device_traces,
            |x, y| {
                list("", x, y, |tx, ty| {
                    list("", tx, ty, |ex, ey| self.entry(ex, ey))
                })
            },
        )?;
        option(
            "allocator_settings",
            &a.allocator_settings,
            &b.allocator_settings,
            settings,
        )?;
        option(
            "external_annotations",
            &a.external_annotations,
            &b.external_annotations,
            |x, y| {
                list("", x, y, |p, q| {
                    extras(".metadata", &p.metadata, &q.metadata)?;
                    ints(
                        p,
                        q,
                        &[IntField::Device, IntField::TimeUs],
                        Annotation::exact_int,
                    )?;
                    extras(".extra", &p.extra, &q.extra)
                })
            },
        )?;
        option(
            "host_segments",
            &a.host_segments,
            &b.host_segments,
            |x, y| value("", x, y),
        )?;
        option("host_traces", &a.host_traces, &b.host_traces, |x, y| {
            value("", x, y)
        })?;
        option("memsnap", &a.recorder_info, &b.recorder_info, |x, y| {
            field(".producer", &x.producer, &y.producer)?;
            field(
                ".dropped_entries",
                &x.dropped_entry_ints(),
                &y.dropped_entry_ints(),
            )?;
            extras(".extra", &x.extra, &y.extra)
        })?;
        extras("extra", &a.extra, &b.extra)
    }

    fn stack(&self, name: &str, a: Option<StackId>, b: Option<StackId>) -> Diff {
        option(name, &a, &b, |&x, &y| {
            let fa: Vec<_> = self.a.stack_frames(x).collect();
            let fb: Vec<_> = self.b.stack_frames(y).collect();
            list("", &fa, &fb, |p, q| {
                field(".name", &p.name, &q.name)?;
                field(".filename", &p.filename, &q.filename)?;
                field(".line", &p.line, &q.line)?;
                extras(".extra", &p.extra, &q.extra)
            })
        })
    }

    fn string(&self, name: &str, a: Option<StrId>, b: Option<StrId>) -> Diff {
        let a = a.map(|id| self.a.str(id));
        let b = b.map(|id| self.b.str(id));
        field(name, &a, &b)
    }

    fn segment(&self, a: &Segment, b: &Segment) -> Diff {
        let fields = [
            IntField::Device,
            IntField::Address,
            IntField::TotalSize,
            IntField::AllocatedSize,
            IntField::ActiveSize,
            IntField::RequestedSize,
            IntField::Stream,
        ];
        ints(a, b, &fields, Segment::exact_int)?;
        let type_a = a.segment_type.map(|t| t.name(&self.a.strings));
        let type_b = b.segment_type.map(|t| t.name(&self.b.strings));
        field(".segment_type", &type_a, &type_b)?;
        let pool = |s: &Segment| {
            s.segment_pool_id?;
            Some((
                s.exact_int(IntField::PoolId0)?,
                s.exact_int(IntField::PoolId1)?,
            ))
        };
        field(".segment_pool_id", &pool(a), &pool(b))?;
        field(".is_expandable", &a.is_expandable, &b.is_expandable)?;
        self.stack(".frames", a.frames, b.frames)?;
        field(
            ".frames_after_blocks",
            &a.frames_after_blocks,
            &b.frames_after_blocks,
        )?;
        list(".blocks", &a.blocks, &b.blocks, |x, y| self.block(x, y))?;
        extras(".extra", &a.extra, &b.extra)
    }

    fn block(&self, a: &Block, b: &Block) -> Diff {
        let fields = [IntField::Address, IntField::Size, IntField::RequestedSize];
        ints(a, b, &fields, Block::exact_int)?;
        field(
            ".state",
            a.state.name(&self.a.strings),
            b.state.name(&self.b.strings),
        )?;
        self.stack(".frames", a.frames, b.frames)?;
        field(".forward_frames", &a.forward_frames, &b.forward_frames)?;
        option(".history", &a.history, &b.history, |x, y| {
            list("", x, y, |p, q| {
                ints(
                    p,
                    q,
                    &[IntField::Addr, IntField::RealSize],
                    HistoryItem::exact_int,
                )?;
                self.stack(".frames", p.frames, q.frames)?;
                extras(".extra", &p.extra, &q.extra)
            })
        })?;
        extras(".extra", &a.extra, &b.extra)
    }

    fn entry(&self, a: &TraceEntry, b: &TraceEntry) -> Diff {
        field(
            ".action",
            a.action.name(&self.a.strings),
            b.action.name(&self.b.strings),
        )?;
        let fields = [
            IntField::Addr,
            IntField::DeviceFree,
            IntField::Size,
            IntField::Stream,
            IntField::TimeUs,
        ];
        ints(a, b, &fields, TraceEntry::exact_int)?;
        self.string(".compile_context", a.compile_context, b.compile_context)?;
        self.string(".user_metadata", a.user_metadata, b.user_metadata)?;
        self.stack(".frames", a.frames, b.frames)?;
        let none = EntryRare::default();
        let (ra, rb) = (
            a.rare.as_deref().unwrap_or(&none),
            b.rare.as_deref().unwrap_or(&none),
        );
        field("(has no addr key)", &ra.no_addr, &rb.no_addr)?;
        self.string(
            ".internal_metadata",
            ra.internal_metadata,
            rb.internal_metadata,
        )?;
        field(".forward_frames", &ra.forward_frames, &rb.forward_frames)?;
        field(
            "(frames key first)",
            &ra.legacy_frames_first,
            &rb.legacy_frames_first,
        )?;
        extras(".extra", &ra.extra, &rb.extra)
    }
}

fn settings(a: &AllocatorSettings, b: &AllocatorSettings) -> Diff {
    field(".PYTORCH_CUDA_ALLOC_CONF", &a.alloc_conf, &b.alloc_conf)?;
    field(".max_split_size", &a.max_split_size, &b.max_split_size)?;
    field(
        ".garbage_collection_threshold",
        &a.garbage_collection_threshold.map(f64::to_bits),
        &b.garbage_collection_threshold.map(f64::to_bits),
    )?;
    field(
        ".expandable_segments",
        &a.expandable_segments,
        &b.expandable_segments,
    )?;
    field(
        ".pinned_num_register_threads",
        &a.pinned_num_register_threads,
        &b.pinned_num_register_threads,
    )?;
    field(
        ".release_lock_on_cudamalloc",
        &a.release_lock_on_cudamalloc,
        &b.release_lock_on_cudamalloc,
    )?;
    field(
        ".pinned_use_cuda_host_register",
        &a.pinned_use_cuda_host_register,
        &b.pinned_use_cuda_host_register,
    )?;
    field(
        ".graph_capture_record_stream_reuse",
        &a.graph_capture_record_stream_reuse,
        &b.graph_capture_record_stream_reuse,
    )?;
    field(
        ".roundup_power2_divisions",
        &a.roundup_power2_divisions,
        &b.roundup_power2_divisions,
    )?;
    field(
        ".max_round_threshold",
        &a.max_round_threshold,
        &b.max_round_threshold,
    )?;
    field(".max_cached_size", &a.max_cached_size, &b.max_cached_size)?;
    extras(".extra", &a.extra, &b.extra)
}

/// Compares the exact values of int fields.
fn ints<T>(
    a: &T,
    b: &T,
    fields: &[IntField],
    get: impl Fn(&T, IntField) -> Option<crate::int::PyInt>,
) -> Diff {
    for &f in fields {
        let name = format!(".{}", f.key());
        match (get(a, f), get(b, f)) {
            (Some(x), Some(y)) => field(&name, &x, &y)?,
            (x, y) => field(&name, &x, &y)?,
        }
    }
    Ok(())
}

fn extras(name: &str, a: &Extras, b: &Extras) -> Diff {
    if a.len() != b.len() {
        let keys = |e: &Extras| e.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        return Err(format!("{name}: keys {:?} vs {:?}", keys(a), keys(b)));
    }
    for ((ka, va), (kb, vb)) in a.iter().zip(b) {
        field(&format!("{name} key"), ka, kb)?;
        at(|| format!("{name}.{ka}"), value("", va, vb))?;
    }
    Ok(())
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
        b.device_traces.as_mut().unwrap()[0][0].frames = Some(StackId(99));
        let d = diff(&a, &b).unwrap();
        assert!(
            d.contains("device_traces[0][0].frames") && d.contains("99"),
            "{d}"
        );
    }
}

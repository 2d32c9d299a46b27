//! memsnap's native format: compact msgpack with the interning tables stored once.
//!
//! A pickle or JSON snapshot repeats (or memo-references) every stack where it is used; this
//! format stores the string, frame and stack tables once and the entries refer to them by id,
//! so it is small and fast to read. Layout (rmp-serde, structs as arrays):
//!
//! ```text
//! { "memsnap_msgpack": <FORMAT_VERSION>,
//!   "snapshot": [strings, frames, stacks, shape, segments, device_traces,
//!                allocator_settings, external_annotations, host_segments, host_traces,
//!                recorder_info, extra] }
//! ```
//!
//! The body is the serde encoding of the model types, so **any change to the fields of the
//! model must bump [`FORMAT_VERSION`]**; a reader refuses versions it does not know rather than
//! misreading them. Trace entries are the exception that proves it: the in-memory
//! [`TraceEntry`] is compact (flags, sentinels, an unknown action's name in its rare part), and
//! this module writes and reads it through wire types that are the earlier entry field for
//! field, so files stayed as they were. The header (a map whose first key is `"memsnap_msgpack"`, bytes
//! `82 af 6d 65 6d ...`) is what [`looks_like`] detects; it cannot be mistaken for a pickle,
//! which starts `80 02`..`80 05`.
//!
//! Integers: typed fields are native msgpack integers (`u64` or `i64` as the field is). An
//! exact value the typed field does not hold (see [`crate::int`]) is kept in the struct's
//! trailing `exact` list as `[field, int]` pairs; frame lines and allocator settings are
//! [`crate::PyInt`]s. A `PyInt` is a native integer when it fits `i64` or `u64` (so 2^64 − 1
//! is `cf ff..ff`, −1 is `ff`), and otherwise a `bin` of its minimal little-endian
//! two's-complement bytes (as pickle's `LONG1` holds it). Generic values under unknown keys
//! keep their own encoding (`Value::BigInt` as its bytes).
//!
//! Reading untrusted bytes: a first pass walks the msgpack structure without recursion and
//! checks every length against the bytes that remain and the nesting depth, so the decoder
//! never reserves memory a small file cannot back and never recurses deeply. Then every id is
//! checked (`device_traces[0][17].frames: stack id 99 is out of range (12 stacks)`), and tables
//! with duplicate entries are refused, so no lookup can panic later.

use std::fmt;
use std::io::Cursor;

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{FormatError, Result};
use crate::int::ExactInts;
use crate::intern::{
    Frame, FrameId, StackId, StrId, StrTable, COMPILE_CONTEXT_DEFAULT, USER_METADATA_DEFAULT,
};
use crate::model::*;
use crate::value::{Extras, Value};

/// The version this code writes. Version 2 added exact integers (see the module docs); this
/// code also reads version 1, whose files are version 2 files without them.
pub const FORMAT_VERSION: u8 = 2;

/// The oldest version this code reads.
pub const OLDEST_VERSION: u8 = 1;

/// Deepest msgpack nesting accepted by the structure check (the snapshot's own structure needs
/// under ten levels; the rest is for values under unknown keys).
pub const MAX_DEPTH: usize = DECODER_DEPTH;

/// rmp-serde's own nesting limit.
const DECODER_DEPTH: usize = 1024;

const MAGIC: &[u8] = b"memsnap_msgpack";
const BODY_KEY: &[u8] = b"snapshot";
/// `fixmap(2)`, `fixstr(15)`.
const HEADER_START: [u8; 2] = [0x82, 0xa0 | 15];

/// Whether `bytes` start like a memsnap msgpack file.
pub fn looks_like(bytes: &[u8]) -> bool {
    matches!(bytes.first(), Some(0x81..=0x8f))
        && bytes.get(1) == Some(&HEADER_START[1])
        && bytes.get(2..2 + MAGIC.len()) == Some(MAGIC)
}

#[derive(Serialize)]
struct BodyRef<'a> {
    strings: Vec<&'a str>,
    frames: Vec<&'a Frame>,
    stacks: Vec<&'a [FrameId]>,
    shape: Shape,
    segments: &'a [Segment],
    device_traces: TracesOut<'a>,
    allocator_settings: &'a Option<AllocatorSettings>,
    external_annotations: &'a Option<Vec<Annotation>>,
    host_segments: &'a Option<Value>,
    host_traces: &'a Option<Value>,
    recorder_info: &'a Option<RecorderInfo>,
    extra: &'a Extras,
}

impl<'a> BodyRef<'a> {
    /// The body as written: the snapshot's fields by reference, its tables flattened.
    fn of(snapshot: &'a Snapshot) -> Self {
        let strings = &snapshot.strings;
        BodyRef {
            strings: (0..strings.len())
                .map(|i| strings.get(StrId::from_index(i)))
                .collect(),
            frames: snapshot.frames.iter().collect(),
            stacks: snapshot.stacks.iter().map(|(_, s)| s).collect(),
            shape: snapshot.shape,
            segments: &snapshot.segments,
            device_traces: TracesOut {
                traces: &snapshot.device_traces,
                strings,
            },
            allocator_settings: &snapshot.allocator_settings,
            external_annotations: &snapshot.external_annotations,
            host_segments: &snapshot.host_segments,
            host_traces: &snapshot.host_traces,
            recorder_info: &snapshot.recorder_info,
            extra: &snapshot.extra,
        }
    }
}

struct Body {
    strings: Vec<String>,
    frames: Vec<Frame>,
    stacks: Vec<Vec<FrameId>>,
    shape: Shape,
    segments: Vec<Segment>,
    device_traces: Option<Vec<Vec<TraceEntry>>>,
    allocator_settings: Option<AllocatorSettings>,
    external_annotations: Option<Vec<Annotation>>,
    host_segments: Option<Value>,
    host_traces: Option<Value>,
    recorder_info: Option<RecorderInfo>,
    extra: Extras,
}

// ------------------------------------------------------------ trace entries on the wire
//
// A `TraceEntry` keeps `time_us`, `compile_context`, `user_metadata` and an unknown action's
// name in a compact form (see `model::TraceEntry`); the file keeps the form the derived serde
// of the earlier, 80-byte entry wrote: `EntryWire` and `RareWire` are that struct, field for
// field, so files are unchanged and no version bump was needed. Turning an entry into its
// wire form needs the ids of the default strings, so traces are written and read with the
// string table at hand.

/// A known action, or the id of an unknown action's name.
#[derive(Serialize, Deserialize)]
#[serde(rename = "Action")]
enum ActionWire {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    Annotate,
    Free,
    Other(StrId),
}

#[derive(Serialize, Deserialize)]
#[serde(rename = "TraceEntry")]
struct EntryWire<R> {
    action: ActionWire,
    addr: u64,
    size: u64,
    stream: i64,
    time_us: Option<i64>,
    compile_context: Option<StrId>,
    user_metadata: Option<StrId>,
    frames: Option<StackId>,
    rare: Option<R>,
}

/// [`EntryRare`] as written: the keys other than those the entry moved into it.
#[derive(Serialize)]
#[serde(rename = "EntryRare")]
struct RareOut<'a> {
    device_free: Option<u64>,
    no_addr: bool,
    internal_metadata: Option<StrId>,
    forward_frames: &'a Option<Vec<String>>,
    legacy_frames_first: bool,
    extra: &'a Extras,
    #[serde(skip_serializing_if = "no_exact_ints")]
    exact: &'a ExactInts,
}

fn no_exact_ints(exact: &&ExactInts) -> bool {
    exact.is_empty()
}

#[derive(Deserialize)]
#[serde(rename = "EntryRare")]
struct RareIn {
    device_free: Option<u64>,
    no_addr: bool,
    internal_metadata: Option<StrId>,
    forward_frames: Option<Vec<String>>,
    legacy_frames_first: bool,
    extra: Extras,
    #[serde(default)]
    exact: ExactInts,
}

/// `None` for an [`Action::Other`] without its name (which `check_ids` refuses before writing).
fn action_wire(e: &TraceEntry) -> Option<ActionWire> {
    Some(match e.action {
        Action::Alloc => ActionWire::Alloc,
        Action::FreeRequested => ActionWire::FreeRequested,
        Action::FreeCompleted => ActionWire::FreeCompleted,
        Action::SegmentAlloc => ActionWire::SegmentAlloc,
        Action::SegmentFree => ActionWire::SegmentFree,
        Action::SegmentMap => ActionWire::SegmentMap,
        Action::SegmentUnmap => ActionWire::SegmentUnmap,
        Action::Snapshot => ActionWire::Snapshot,
        Action::Oom => ActionWire::Oom,
        Action::Annotate => ActionWire::Annotate,
        Action::Free => ActionWire::Free,
        Action::Other => ActionWire::Other(e.other_action()?),
    })
}

/// `device_traces` as written, entries in their wire form.
struct TracesOut<'a> {
    traces: &'a Option<Vec<Vec<TraceEntry>>>,
    strings: &'a StrTable,
}

impl Serialize for TracesOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        struct Trace<'a>(&'a [TraceEntry], &'a StrTable);
        impl Serialize for Trace<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                let mut seq = s.serialize_seq(Some(self.0.len()))?;
                for e in self.0 {
                    let wire = entry_out(e, self.1).ok_or_else(|| {
                        serde::ser::Error::custom("an unknown action without its name")
                    })?;
                    seq.serialize_element(&wire)?;
                }
                seq.end()
            }
        }
        struct All<'a>(&'a [Vec<TraceEntry>], &'a StrTable);
        impl Serialize for All<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().map(|t| Trace(t, self.1)))
            }
        }
        match self.traces {
            None => s.serialize_none(),
            Some(traces) => s.serialize_some(&All(traces, self.strings)),
        }
    }
}

fn entry_out<'a>(e: &'a TraceEntry, strings: &StrTable) -> Option<EntryWire<RareOut<'a>>> {
    Some(EntryWire {
        action: action_wire(e)?,
        addr: e.addr,
        size: e.size,
        stream: e.stream,
        time_us: e.time_us(),
        compile_context: e.compile_context(strings),
        user_metadata: e.user_metadata(strings),
        frames: e.frames,
        rare: e
            .rare
            .as_deref()
            .filter(|r| !r.holds_only_moved_fields())
            .map(|r| RareOut {
                device_free: r.device_free,
                no_addr: r.no_addr,
                internal_metadata: r.internal_metadata,
                forward_frames: &r.forward_frames,
                legacy_frames_first: r.legacy_frames_first,
                extra: &r.extra,
                exact: &r.exact,
            }),
    })
}

/// The field names of a trace entry and of its rare part as written (for the schema's test
/// that msgpack writes nothing the schema does not know).
#[cfg(test)]
pub(crate) fn trace_entry_wire_fields() -> Vec<String> {
    let mut strings = StrTable::default();
    let id = strings.intern("x");
    let mut entry = TraceEntry::new(Action::Alloc, 1, 2, 3);
    entry.rare_mut().device_free = Some(1);
    entry.rare_mut().internal_metadata = Some(id);
    entry.rare_mut().forward_frames = Some(vec![]);
    entry
        .rare_mut()
        .exact
        .set(crate::IntField::Size, Some(crate::PyInt::from(-1i64)));
    let wire = entry_out(&entry, &strings).unwrap();
    let keys = |v: serde_json::Value| match v {
        serde_json::Value::Object(map) => map.keys().cloned().collect::<Vec<_>>(),
        other => panic!("not a struct: {other:?}"),
    };
    let mut fields = keys(serde_json::to_value(&wire).unwrap());
    fields.extend(keys(serde_json::to_value(&wire.rare).unwrap()));
    fields
}

/// The file ids of the default strings, which entries keep as flags.
#[derive(Clone, Copy)]
struct DefaultStrs {
    compile_context: Option<StrId>,
    user_metadata: Option<StrId>,
}

impl DefaultStrs {
    /// The first occurrence of each default in the file's string table (a table with
    /// repeats is refused after decoding).
    fn of(strings: &[String]) -> Self {
        let find = |text: &str| {
            strings
                .iter()
                .position(|s| s == text)
                .map(StrId::from_index)
        };
        DefaultStrs {
            compile_context: find(COMPILE_CONTEXT_DEFAULT),
            user_metadata: find(USER_METADATA_DEFAULT),
        }
    }

    fn entry(self, wire: EntryWire<RareIn>) -> TraceEntry {
        let mut other_action = None;
        let action = match wire.action {
            ActionWire::Alloc => Action::Alloc,
            ActionWire::FreeRequested => Action::FreeRequested,
            ActionWire::FreeCompleted => Action::FreeCompleted,
            ActionWire::SegmentAlloc => Action::SegmentAlloc,
            ActionWire::SegmentFree => Action::SegmentFree,
            ActionWire::SegmentMap => Action::SegmentMap,
            ActionWire::SegmentUnmap => Action::SegmentUnmap,
            ActionWire::Snapshot => Action::Snapshot,
            ActionWire::Oom => Action::Oom,
            ActionWire::Annotate => Action::Annotate,
            ActionWire::Free => Action::Free,
            ActionWire::Other(id) => {
                other_action = Some(id);
                Action::Other
            }
        };
        let mut e = TraceEntry::new(action, wire.addr, wire.size, wire.stream);
        e.frames = wire.frames;
        e.rare = wire.rare.map(|r| {
            Box::new(EntryRare {
                device_free: r.device_free,
                no_addr: r.no_addr,
                internal_metadata: r.internal_metadata,
                forward_frames: r.forward_frames,
                legacy_frames_first: r.legacy_frames_first,
                extra: r.extra,
                exact: r.exact,
                ..EntryRare::default()
            })
        });
        if let Some(id) = other_action {
            e.set_other_action(id);
        }
        e.set_time_us(wire.time_us);
        // The defaults' ids of the file: an entry refers to its table's ids, and the table
        // is interned from the file's strings in order (ids unchanged).
        e.set_compile_context_given_default(wire.compile_context, self.compile_context);
        e.set_user_metadata_given_default(wire.user_metadata, self.user_metadata);
        e
    }
}

/// Reads `Option<Vec<Vec<TraceEntry>>>` in wire form, converting entry by entry (so the
/// decoded trace is never held twice).
struct TracesSeed(DefaultStrs);

impl<'de> DeserializeSeed<'de> for TracesSeed {
    type Value = Option<Vec<Vec<TraceEntry>>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for TracesSeed {
    type Value = Option<Vec<Vec<TraceEntry>>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("device_traces: nil or a list of traces")
    }

    fn visit_none<E: serde::de::Error>(self) -> std::result::Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_seq(ListSeed(TraceSeed(self.0))).map(Some)
    }
}

/// A list whose items `T` reads.
struct ListSeed<T>(T);

impl<'de, T: DeserializeSeed<'de> + Copy> DeserializeSeed<'de> for ListSeed<T> {
    type Value = Vec<T::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, T: DeserializeSeed<'de> + Copy> Visitor<'de> for ListSeed<T> {
    type Value = Vec<T::Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        // The length is checked against the bytes left, not against memory: reserve a
        // bounded amount, as serde's own `Vec` does.
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(item) = seq.next_element_seed(self.0)? {
            items.push(item);
        }
        Ok(items)
    }
}

/// One trace: a list of entries.
#[derive(Clone, Copy)]
struct TraceSeed(DefaultStrs);

impl<'de> DeserializeSeed<'de> for TraceSeed {
    type Value = Vec<TraceEntry>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_seq(ListSeed(EntrySeed(self.0)))
    }
}

#[derive(Clone, Copy)]
struct EntrySeed(DefaultStrs);

impl<'de> DeserializeSeed<'de> for EntrySeed {
    type Value = TraceEntry;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
        EntryWire::<RareIn>::deserialize(d).map(|wire| self.0.entry(wire))
    }
}

const BODY_FIELDS: &[&str] = &[
    "strings",
    "frames",
    "stacks",
    "shape",
    "segments",
    "device_traces",
    "allocator_settings",
    "external_annotations",
    "host_segments",
    "host_traces",
    "recorder_info",
    "extra",
];

impl<'de> Deserialize<'de> for Body {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_struct("Body", BODY_FIELDS, BodyVisitor)
    }
}

struct BodyVisitor;

fn missing_field<E: serde::de::Error>(name: &str) -> E {
    E::custom(format!("the snapshot has no `{name}` field"))
}

impl<'de> Visitor<'de> for BodyVisitor {
    type Value = Body;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "the snapshot as a list of {} fields", BODY_FIELDS.len())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Body, A::Error> {
        fn next<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(
            seq: &mut A,
            name: &str,
        ) -> std::result::Result<T, A::Error> {
            seq.next_element()?
                .ok_or_else(|| missing_field::<A::Error>(name))
        }
        let strings: Vec<String> = next(&mut seq, "strings")?;
        let defaults = DefaultStrs::of(&strings);
        Ok(Body {
            frames: next(&mut seq, "frames")?,
            stacks: next(&mut seq, "stacks")?,
            shape: next(&mut seq, "shape")?,
            segments: next(&mut seq, "segments")?,
            device_traces: seq
                .next_element_seed(TracesSeed(defaults))?
                .ok_or_else(|| missing_field::<A::Error>("device_traces"))?,
            allocator_settings: next(&mut seq, "allocator_settings")?,
            external_annotations: next(&mut seq, "external_annotations")?,
            host_segments: next(&mut seq, "host_segments")?,
            host_traces: next(&mut seq, "host_traces")?,
            recorder_info: next(&mut seq, "recorder_info")?,
            extra: next(&mut seq, "extra")?,
            strings,
        })
    }
}

fn msgpack_error(what: impl Into<String>) -> FormatError {
    FormatError::Msgpack { what: what.into() }
}

/// Encodes a snapshot. Fails only on a snapshot whose ids do not resolve, or whose values under
/// unknown keys nest deeper than [`read`] accepts.
pub fn to_vec(snapshot: &Snapshot) -> Result<Vec<u8>> {
    crate::compare::check_ids(snapshot)?;
    // Each value level takes up to three msgpack levels (variant map, list, pair); the
    // decoder allows 1024 in all.
    let deepest = crate::compare::deepest_value(snapshot);
    if 3 * deepest + 10 > DECODER_DEPTH {
        return Err(FormatError::schema(
            "(an unknown key's value)",
            format!("nested {deepest} levels deep, more than msgpack reading accepts"),
        ));
    }
    let body = BodyRef::of(snapshot);
    let mut out = Vec::with_capacity(1024 + snapshot.entry_count() * 24);
    out.extend_from_slice(&HEADER_START);
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION); // positive fixint
    out.push(0xa0 | BODY_KEY.len() as u8);
    out.extend_from_slice(BODY_KEY);
    rmp_serde::encode::write(&mut out, &body).map_err(|e| msgpack_error(e.to_string()))?;
    Ok(out)
}

/// Decodes a memsnap msgpack snapshot.
pub fn read(bytes: &[u8]) -> Result<Snapshot> {
    if !looks_like(bytes) || bytes[0] != HEADER_START[0] {
        return Err(msgpack_error(
            "not a memsnap msgpack file: it does not start with the {\"memsnap_msgpack\": version, \"snapshot\": ...} header",
        ));
    }
    let mut pos = HEADER_START.len() + MAGIC.len();
    let version = match bytes.get(pos) {
        Some(&v) if v < 0x80 => v,
        Some(_) => {
            return Err(msgpack_error(format!(
                "byte {pos}: the format version is not a small integer"
            )))
        }
        None => return Err(msgpack_error("the file ends inside its header")),
    };
    if !(OLDEST_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(msgpack_error(format!(
            "format version {version} is not supported (this build reads versions {OLDEST_VERSION} to {FORMAT_VERSION}; a newer memsnap may read it)"
        )));
    }
    pos += 1;
    let key_len = BODY_KEY.len();
    if bytes.get(pos) != Some(&(0xa0 | key_len as u8))
        || bytes.get(pos + 1..pos + 1 + key_len) != Some(BODY_KEY)
    {
        return Err(msgpack_error(format!(
            "byte {pos}: expected the key \"snapshot\""
        )));
    }
    pos += 1 + key_len;
    let body_bytes = &bytes[pos..];
    check_structure(body_bytes, pos)?;

    let mut de = rmp_serde::Deserializer::new(Cursor::new(body_bytes));
    let body = Body::deserialize(&mut de).map_err(|e| {
        msgpack_error(format!(
            "{e} (decoding stopped near byte {})",
            pos as u64 + de.position()
        ))
    })?;
    build(body)
}

/// Turns the decoded tables and lists into a snapshot, refusing duplicate table entries (the
/// tables' own dedup would shift every later id) and dangling ids.
fn build(body: Body) -> Result<Snapshot> {
    let mut snap = Snapshot::default();
    for (i, s) in body.strings.iter().enumerate() {
        if snap.strings.intern(s).index() != i {
            return Err(FormatError::Schema {
                path: format!("strings[{i}]"),
                what: "repeats an earlier string".into(),
            });
        }
    }
    for (i, frame) in body.frames.into_iter().enumerate() {
        if snap.frames.intern(frame).index() != i {
            return Err(FormatError::Schema {
                path: format!("frames[{i}]"),
                what: "repeats an earlier frame".into(),
            });
        }
    }
    let frame_count = snap.frames.len();
    for (i, stack) in body.stacks.iter().enumerate() {
        if let Some((j, f)) = stack
            .iter()
            .enumerate()
            .find(|(_, f)| f.index() >= frame_count)
        {
            return Err(FormatError::Schema {
                path: format!("stacks[{i}][{j}]"),
                what: format!(
                    "frame id {} is out of range ({frame_count} frames)",
                    f.index()
                ),
            });
        }
        if snap.stacks.intern(stack).index() != i {
            return Err(FormatError::Schema {
                path: format!("stacks[{i}]"),
                what: "repeats an earlier stack".into(),
            });
        }
    }
    snap.shape = body.shape;
    snap.segments = body.segments;
    snap.device_traces = body.device_traces;
    snap.allocator_settings = body.allocator_settings;
    snap.external_annotations = body.external_annotations;
    snap.host_segments = body.host_segments;
    snap.host_traces = body.host_traces;
    snap.recorder_info = body.recorder_info;
    snap.extra = body.extra;
    crate::compare::check_ids(&snap)?;
    Ok(snap)
}

/// Walks one msgpack value without recursion, checking that every length fits in the bytes
/// that remain, that nesting stays under [`MAX_DEPTH`] and that nothing follows the value.
/// `base` is the offset of `data` in the file, for messages.
fn check_structure(data: &[u8], base: usize) -> Result<()> {
    let at = |pos: usize| base + pos;
    let mut pos = 0usize;
    // Items still to read in each open container, innermost last.
    let mut open: Vec<u64> = vec![1];
    while let Some(left) = open.last_mut() {
        if *left == 0 {
            open.pop();
            continue;
        }
        *left -= 1;
        let start = pos;
        let Some(&marker) = data.get(pos) else {
            return Err(msgpack_error(format!(
                "the file ends at byte {} inside the snapshot",
                at(pos)
            )));
        };
        pos += 1;
        let uint = |pos: usize, width: usize| -> Result<u64> {
            let bytes = data.get(pos..pos + width).ok_or_else(|| {
                msgpack_error(format!(
                    "the file ends inside the length at byte {}",
                    at(pos)
                ))
            })?;
            Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
        };
        // (length field width, payload bytes, child items)
        let (payload, children): (u64, u64) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (0, 2 * u64::from(marker & 0x0f)),
            0x90..=0x9f => (0, u64::from(marker & 0x0f)),
            0xa0..=0xbf => (u64::from(marker & 0x1f), 0),
            0xc4 | 0xd9 => (uint(pos, 1).inspect(|_| pos += 1)?, 0),
            0xc5 | 0xda => (uint(pos, 2).inspect(|_| pos += 2)?, 0),
            0xc6 | 0xdb => (uint(pos, 4).inspect(|_| pos += 4)?, 0),
            0xc7 => (uint(pos, 1).inspect(|_| pos += 1)? + 1, 0),
            0xc8 => (uint(pos, 2).inspect(|_| pos += 2)? + 1, 0),
            0xc9 => (uint(pos, 4).inspect(|_| pos += 4)? + 1, 0),
            0xca | 0xce | 0xd2 => (4, 0),
            0xcb | 0xcf | 0xd3 => (8, 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xdc => (0, uint(pos, 2).inspect(|_| pos += 2)?),
            0xdd => (0, uint(pos, 4).inspect(|_| pos += 4)?),
            0xde => (0, 2 * uint(pos, 2).inspect(|_| pos += 2)?),
            0xdf => (0, 2 * uint(pos, 4).inspect(|_| pos += 4)?),
            0xc1 => {
                return Err(msgpack_error(format!(
                    "byte {}: 0xc1 is not a msgpack marker",
                    at(start)
                )))
            }
        };
        let remaining = (data.len() - pos) as u64;
        if payload > remaining {
            return Err(msgpack_error(format!(
                "byte {}: a value of {payload} bytes runs past the end of the file ({remaining} bytes left)",
                at(start)
            )));
        }
        pos += payload as usize;
        if children > 0 {
            // Every item takes at least one byte.
            if children > (data.len() - pos) as u64 {
                return Err(msgpack_error(format!(
                    "byte {}: a container of {children} items cannot fit in the {} bytes left",
                    at(start),
                    data.len() - pos
                )));
            }
            if open.len() > MAX_DEPTH {
                return Err(msgpack_error(format!(
                    "byte {}: nested deeper than {MAX_DEPTH} levels",
                    at(start)
                )));
            }
            open.push(children);
        }
    }
    if pos != data.len() {
        return Err(msgpack_error(format!(
            "{} unexpected bytes after the snapshot, from byte {}",
            data.len() - pos,
            at(pos)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_needs_the_header_and_is_not_pickle() {
        let bytes = to_vec(&Snapshot::new(1)).unwrap();
        assert!(looks_like(&bytes));
        assert!(!looks_like(b"\x80\x04\x95"));
        assert!(!looks_like(b"\x82\xafmemsnap_msgpaXX"));
        assert!(!looks_like(b""));
    }

    #[test]
    fn structure_check_rejects_lengths_the_file_cannot_hold() {
        // array32 claiming 4 billion items, in a 6-byte file.
        let err = check_structure(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x00], 0).unwrap_err();
        assert!(err.to_string().contains("cannot fit"), "{err}");
        let err = check_structure(&[0xdb, 0x00, 0x01, 0x00, 0x00, b'x'], 0).unwrap_err();
        assert!(err.to_string().contains("runs past the end"), "{err}");
        let deep = vec![0x91; MAX_DEPTH + 5];
        let err = check_structure(&deep, 0).unwrap_err();
        assert!(err.to_string().contains("nested deeper"), "{err}");
        assert!(check_structure(&[0x92, 0x01, 0xc0], 0).is_ok());
        let err = check_structure(&[0x91, 0x01, 0x01], 0).unwrap_err();
        assert!(err.to_string().contains("unexpected bytes"), "{err}");
    }

    /// Encodes a snapshot without the writer's id check, as a foreign writer might.
    fn encode_unchecked(snapshot: &Snapshot) -> Vec<u8> {
        let body = BodyRef::of(snapshot);
        let mut out = to_vec(&Snapshot::default()).unwrap();
        out.truncate(HEADER_START.len() + MAGIC.len() + 2 + BODY_KEY.len());
        rmp_serde::encode::write(&mut out, &body).unwrap();
        out
    }

    #[test]
    fn dangling_ids_are_reported_with_their_path() {
        let mut snap = Snapshot::new(2);
        let stack = snap.intern_stack([Frame::new("f", "a.py", 1)]);
        let mut entry = TraceEntry::new(Action::Alloc, 4096, 10, 0);
        entry.frames = Some(stack);
        let traces = snap.device_traces.as_mut().unwrap();
        traces[1] = vec![entry.clone(), entry.clone()];
        assert!(read(&encode_unchecked(&snap)).is_ok());

        snap.device_traces.as_mut().unwrap()[1][1].frames = Some(StackId::from_index(7));
        match read(&encode_unchecked(&snap)) {
            Err(FormatError::Schema { path, what }) => {
                assert_eq!(path, "device_traces[1][1].frames");
                assert_eq!(what, "stack id 7 is out of range (1 stacks)");
            }
            other => panic!("{other:?}"),
        }
        snap.device_traces.as_mut().unwrap()[1][1].frames = Some(stack);
        let dangling = StrId::from_index(3);
        snap.device_traces.as_mut().unwrap()[1][0].set_user_metadata(Some(dangling), &snap.strings);
        match read(&encode_unchecked(&snap)) {
            Err(FormatError::Schema { path, .. }) => {
                assert_eq!(path, "device_traces[1][0].user_metadata")
            }
            other => panic!("{other:?}"),
        }
    }

    /// Ids are stored as index + 1 since `Option<StackId>` became 4 bytes: the one index that
    /// does not fit, `u32::MAX`, must be refused, not panic or wrap to index 0 (a valid id).
    #[test]
    fn an_id_of_u32_max_is_refused() {
        let mut snap = Snapshot::new(1);
        let stack = snap.intern_stack([Frame::new("f", "a.py", 1)]);
        let mut entry = TraceEntry::new(Action::Alloc, 4096, 10, 0);
        entry.frames = Some(stack);
        snap.device_traces.as_mut().unwrap()[0] = vec![entry.clone()];
        assert!(read(&encode_unchecked(&snap)).is_ok(), "id 0 reads");

        snap.device_traces.as_mut().unwrap()[0][0].frames = Some(StackId::from_index(0x7fff_fffe));
        let mut bytes = encode_unchecked(&snap);
        let marker = [0xce, 0x7f, 0xff, 0xff, 0xfe];
        let at = bytes.windows(5).position(|w| w == marker).unwrap();
        bytes[at + 1..at + 5].copy_from_slice(&[0xff; 4]);
        let err = read(&bytes).unwrap_err();
        assert!(
            err.to_string()
                .contains("stack id 4294967295 is out of range"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_table_entries_are_refused() {
        let snap = Snapshot::new(1);
        let mut bytes = encode_unchecked(&snap);
        // Splice two equal strings into the (empty) string table: array of 0 -> array of 2.
        let at = HEADER_START.len() + MAGIC.len() + 2 + BODY_KEY.len() + 1;
        assert_eq!(bytes[at], 0x90);
        bytes.splice(at..at + 1, [0x92, 0xa1, b'x', 0xa1, b'x']);
        match read(&bytes) {
            Err(FormatError::Schema { path, .. }) => assert_eq!(path, "strings[1]"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn deep_values_round_trip() {
        let mut v = Value::Int(1);
        for _ in 0..300 {
            v = Value::List(vec![v]);
        }
        let mut snap = Snapshot::new(0);
        snap.extra.push(("deep".into(), v));
        let back = read(&to_vec(&snap).unwrap()).unwrap();
        assert_eq!(crate::compare::diff(&snap, &back), None);
        // Deeper than the reader accepts: refused when writing, not discovered when reading.
        for _ in 0..100 {
            snap.extra[0].1 = Value::Tuple(vec![snap.extra[0].1.clone()]);
        }
        let err = to_vec(&snap).unwrap_err();
        assert!(err.to_string().contains("nested 401 levels"), "{err}");
    }

    #[test]
    fn newer_versions_are_refused() {
        let mut bytes = to_vec(&Snapshot::new(1)).unwrap();
        bytes[HEADER_START.len() + MAGIC.len()] = FORMAT_VERSION + 1;
        let err = read(&bytes).unwrap_err();
        assert!(
            err.to_string().contains("version 3 is not supported"),
            "{err}"
        );
    }
}

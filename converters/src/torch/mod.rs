//! Imports of traces into memsnap's snapshot model: torch.profiler's Chrome traces
//! (`[memory]` events), `export_memory_timeline`'s outputs, and memsnap's own Chrome export.
//!
//! # torch.profiler (`profile(profile_memory=True)` then `export_chrome_trace`)
//! Kineto writes every caching-allocator call as an instant event named `[memory]` with args
//! `Addr`, `Bytes` (negative for frees), `Total Allocated`, `Total Reserved`, `Device Id`,
//! `Device Type` ([`profiler`]). Per device, in time order:
//!
//! - `Bytes > 0` becomes an `alloc`, `Bytes < 0` a `free_requested` and a `free_completed` at
//!   the same time, paired by address. Sizes are the allocator's **rounded** block sizes
//!   (multiples of 512), not the requested sizes: the import says so.
//! - A free of an address never allocated in the profile is a block from before it: an
//!   `alloc` is synthesized at the profile's start. The first event's `Total Allocated −
//!   Bytes` is what was live before the profile; what those frees do not explain is reported
//!   as pre-existing and unattributed.
//! - Stacks come from the `X` slices (`python_function`, `cpu_op`, `user_annotation`) that
//!   enclose the event on its thread, innermost first: `torch/nn/modules/linear.py(124):
//!   forward` becomes a frame with file, line and name; op names a frame with a name only.
//! - `[OutOfMemory]` becomes an `oom` entry. CPU allocations (`Device Type` 0) are skipped.
//! - Times: `baseTimeNanoseconds + ts` (PyTorch ≥ 2.4), else `ts` as epoch µs.
//!
//! # `export_memory_timeline` ([`timeline`])
//! The raw events (`*.raw.json.gz`: `[t_ns, action, bytes, category]`) have no addresses:
//! each created tensor becomes a block at a synthetic address, a destroy closes the oldest
//! live block of that size, and the block's one frame names its category (`ACTIVATION`,
//! `GRADIENT`, ...). The plot data (`[times, sizes]`) has totals only: each category's total
//! is rebuilt from synthetic blocks. The HTML variant holds a picture and no data: it is
//! refused with the re-export to use.
//!
//! # memsnap's own export ([`crate::chrome`])
//! Recognised by `otherData.memsnap`; every trace entry comes back exactly from the records
//! the export attached to its events ([`own`]).

pub mod own;
pub mod profiler;
pub mod timeline;

use serde::Deserialize;
use serde_json::value::RawValue;

use memsnap_format::Snapshot;

/// Why a trace cannot be imported.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The JSON is malformed or cut short.
    #[error("not valid JSON ({what}) at line {line}, column {column}")]
    Json {
        what: String,
        line: usize,
        column: usize,
    },
    /// A Chrome trace with no memory events.
    #[error(
        "no [memory] events among the trace's {events} events: record with \
         torch.profiler.profile(profile_memory=True) (and export_chrome_trace), or export \
         memory with export_memory_timeline(\"….raw.json.gz\")"
    )]
    NoMemoryEvents { events: usize },
    /// `[memory]` events of the 1.8 era: no `Addr`, so allocations and frees cannot be paired.
    #[error(
        "traceEvents[{index}]: the [memory] events have no Addr (a PyTorch 1.8-era trace): \
         allocations cannot be paired with their frees; re-record with a newer PyTorch"
    )]
    NoAddresses { index: usize },
    /// Only CPU memory events.
    #[error(
        "the {cpu} [memory] events are all CPU allocations (Device Type 0): no GPU memory to \
         import"
    )]
    OnlyCpu { cpu: usize },
    /// An event that breaks the format.
    #[error("traceEvents[{index}]: {what}")]
    BadEvent { index: usize, what: String },
    /// `export_memory_timeline`'s HTML output: a picture, no data.
    #[error(
        "this is export_memory_timeline's HTML output: it holds only a PNG picture, no data; \
         re-export with a .raw.json.gz path (export_memory_timeline(\"timeline.raw.json.gz\", \
         device=\"cuda:0\"))"
    )]
    HtmlTimeline,
    /// An `export_memory_timeline` output that breaks its format.
    #[error("memory timeline: {what}")]
    Timeline { what: String },
    /// memsnap's own export, damaged.
    #[error("memsnap export: {what}")]
    Own { what: String },
}

impl TraceError {
    fn json(e: serde_json::Error) -> TraceError {
        TraceError::Json {
            what: match e.classify() {
                serde_json::error::Category::Eof => "the file ends too early: truncated?".into(),
                _ => e
                    .to_string()
                    .split(" at line ")
                    .next()
                    .unwrap_or("")
                    .to_string(),
            },
            line: e.line(),
            column: e.column(),
        }
    }
}

/// What an import found, for the user: counts per device and warnings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImportReport {
    /// What the input was, in words (`torch.profiler trace`, ...).
    pub format: String,
    /// `distributedInfo.rank` of a profiler trace, or the rank memsnap exported.
    pub rank: Option<i64>,
    pub devices: Vec<DeviceReport>,
    /// What the user should know: rounded sizes, memory from before the window, unpaired
    /// frees, skipped events.
    pub warnings: Vec<String>,
}

/// What an import found on one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceReport {
    pub device: i64,
    /// Trace entries made.
    pub entries: usize,
    pub allocs: u64,
    pub frees: u64,
    /// Allocations that got a stack.
    pub with_stack: u64,
    pub ooms: u64,
}

/// A snapshot imported from another tool's output, with what the import found.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Imported {
    pub snapshot: Snapshot,
    pub report: ImportReport,
}

/// Imports a Chrome trace: memsnap's own export exactly, else torch.profiler's `[memory]`
/// events.
pub fn import_chrome_trace(bytes: &[u8]) -> Result<Imported, TraceError> {
    let doc = parse_trace(bytes)?;
    if let Some(meta) = own::meta(&doc)? {
        return own::import(&doc, meta);
    }
    profiler::import(&doc)
}

/// Imports `export_memory_timeline`'s raw events (`*.raw.json.gz`, inflated).
pub fn import_memory_timeline_raw(bytes: &[u8]) -> Result<Imported, TraceError> {
    timeline::import_raw(bytes)
}

/// Imports `export_memory_timeline`'s plot data (`[times, sizes]`).
pub fn import_memory_timeline_plot(bytes: &[u8]) -> Result<Imported, TraceError> {
    timeline::import_plot(bytes)
}

/// A Chrome trace document: what the importers read of it.
pub(crate) struct TraceDoc {
    pub events: Vec<Event>,
    pub base_time_ns: Option<i128>,
    pub other_data: Option<Box<RawValue>>,
    pub distributed_info: Option<Box<RawValue>>,
}

/// One trace event, only the fields the importers use (`args` parsed when needed).
#[derive(Deserialize)]
pub(crate) struct Event {
    #[serde(default)]
    pub ph: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub cat: Option<String>,
    #[serde(default)]
    pub pid: Option<serde_json::Value>,
    #[serde(default)]
    pub tid: Option<serde_json::Value>,
    #[serde(default)]
    pub ts: Option<serde_json::Value>,
    #[serde(default)]
    pub dur: Option<serde_json::Value>,
    #[serde(default)]
    pub args: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct TraceObject {
    #[serde(rename = "traceEvents", default)]
    trace_events: Vec<Event>,
    #[serde(rename = "baseTimeNanoseconds", default)]
    base_time_ns: Option<serde_json::Value>,
    #[serde(rename = "otherData", default)]
    other_data: Option<Box<RawValue>>,
    #[serde(rename = "distributedInfo", default)]
    distributed_info: Option<Box<RawValue>>,
}

/// Parses a Chrome trace: `{"traceEvents": [...], ...}` or a bare array of events.
pub(crate) fn parse_trace(bytes: &[u8]) -> Result<TraceDoc, TraceError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        let events: Vec<Event> = serde_json::from_slice(bytes).map_err(TraceError::json)?;
        return Ok(TraceDoc {
            events,
            base_time_ns: None,
            other_data: None,
            distributed_info: None,
        });
    }
    let object: TraceObject = serde_json::from_slice(bytes).map_err(TraceError::json)?;
    let base_time_ns = match &object.base_time_ns {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(integer(v).ok_or_else(|| TraceError::BadEvent {
            index: 0,
            what: format!("baseTimeNanoseconds is not an integer: {v}"),
        })?),
    };
    Ok(TraceDoc {
        events: object.trace_events,
        base_time_ns,
        other_data: object.other_data,
        distributed_info: object.distributed_info,
    })
}

/// An integer from a JSON number or numeric string.
pub(crate) fn integer(v: &serde_json::Value) -> Option<i128> {
    match v {
        serde_json::Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from)),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A `ts`/`dur` in µs (number or numeric string, fractions allowed) as integer ns.
pub(crate) fn micros_to_ns(v: &serde_json::Value) -> Option<i128> {
    match v {
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Some(i128::from(i) * 1000),
            (None, Some(u)) => Some(i128::from(u) * 1000),
            _ => n
                .as_f64()
                .filter(|f| f.is_finite() && f.abs() < 1e20)
                .map(|f| (f * 1000.0).round() as i128),
        },
        serde_json::Value::String(s) => decimal_micros_to_ns(s.trim()),
        _ => None,
    }
}

/// `"123.4567"` µs → 123456 ns (digits past the third decimal are dropped).
fn decimal_micros_to_ns(s: &str) -> Option<i128> {
    let (negative, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let whole: i128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut ns = 0i128;
    for i in 0..3 {
        ns = ns * 10 + frac.as_bytes().get(i).map_or(0, |b| i128::from(b - b'0'));
    }
    let v = whole.checked_mul(1000)?.checked_add(ns)?;
    Some(if negative { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_as_numbers_and_strings() {
        let j = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert_eq!(
            micros_to_ns(&j("1700000000000100")),
            Some(1_700_000_000_000_100_000)
        );
        assert_eq!(micros_to_ns(&j("12.345")), Some(12_345));
        assert_eq!(micros_to_ns(&j("\"12.3456\"")), Some(12_345));
        assert_eq!(micros_to_ns(&j("\"-0.5\"")), Some(-500));
        assert_eq!(micros_to_ns(&j("\"x\"")), None);
    }
}

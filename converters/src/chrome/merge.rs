//! Merging memsnap's events into a torch.profiler trace (`--merge TRACE.json[.gz]`).
//!
//! The torch file's top-level keys and events are kept as they are (byte for byte, in their
//! order); memsnap's events are appended to `traceEvents` in the torch file's time base, and
//! `otherData.memsnap` is added, so the result is still a valid torch trace (HTA reads it)
//! and memsnap reads it back exactly.
//!
//! - Kineto since May 2024 (PyTorch ≥ 2.4) writes `baseTimeNanoseconds` (epoch ns) and `ts`
//!   relative to it: memsnap's `ts = (time_us * 1000 − base) / 1000`.
//! - Older traces have no base; `ts` is epoch µs: `ts = time_us`.
//!
//! The stacks memsnap's events name go in the top-level `stackFrames` dictionary: a torch
//! trace's own (Kineto writes none) keeps its members byte for byte, memsnap's are added after
//! them with ids above its numeric ones, and the dictionary is written last.
//!
//! Both clocks are wall clocks, so the skew is small but not zero: when the torch trace has
//! `[memory]` events, allocations are matched by (device, address, size rounded to 512) and
//! the median time offset is reported ([`MergeReport::median_offset_us`]).

use std::io::Write;
use std::path::Path;

use foldhash::HashMap;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use memsnap_format::{Action, Snapshot};

use super::write::{write_atomically, write_err, write_events, write_other_data, Sink};
use super::{ChromeOptions, TimeBase};
use crate::torch::{integer, micros_to_ns, parse_trace, TraceError};
use crate::{ConvertError, Result};

/// What a merge did.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct MergeReport {
    /// The torch trace's `baseTimeNanoseconds` (`None`: epoch µs timestamps).
    pub base_time_ns: Option<i64>,
    /// Events in the torch trace.
    pub torch_events: usize,
    /// Events memsnap appended.
    pub memsnap_events: u64,
    /// GPU `[memory]` allocation events in the torch trace.
    pub torch_allocations: usize,
    /// Of those, how many matched a memsnap `alloc` (device, address, rounded size).
    pub matched: usize,
    /// Median of (torch time − memsnap time) over the matches, µs.
    pub median_offset_us: Option<f64>,
    /// The rank used for memsnap's rows (from the torch trace's `distributedInfo`).
    pub rank: Option<u32>,
}

/// The top-level members of a JSON object, in order, values untouched.
struct Members(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                    members.push((k, v));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(V)
    }
}

/// Merges `snapshot` into the torch trace at `torch_path` (gzip or not) and writes the result
/// to `out_path` (gzipped when it ends in `.gz`), atomically.
pub fn merge_path(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    torch_path: &Path,
    out_path: &Path,
) -> Result<MergeReport> {
    let io_err = |source| ConvertError::Io {
        path: torch_path.to_owned(),
        source,
    };
    let raw = std::fs::read(torch_path).map_err(io_err)?;
    let torch = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(&raw[..]), &mut out)
            .map_err(io_err)?;
        out
    } else {
        raw
    };
    write_atomically(out_path, |out| {
        merge_write(snapshot, options, &torch, torch_path, out)
    })
}

/// Merges `snapshot` into the (inflated) torch trace `torch` (`torch_path` names it in
/// errors), writing the result to `out`.
pub fn merge_write(
    snapshot: &Snapshot,
    options: &ChromeOptions,
    torch: &[u8],
    torch_path: &Path,
    out: &mut dyn Write,
) -> Result<MergeReport> {
    let trace_err = |source| ConvertError::Trace {
        path: torch_path.to_owned(),
        source,
    };
    let members: Members = serde_json::from_slice(torch).map_err(|e| {
        trace_err(if e.is_data() {
            TraceError::BadEvent {
                index: 0,
                what: "the top level is not an object with traceEvents (a Chrome trace as \
                       torch.profiler writes it)"
                    .into(),
            }
        } else {
            TraceError::Json {
                what: e.to_string().split(" at line ").next().unwrap_or("").into(),
                line: e.line(),
                column: e.column(),
            }
        })
    })?;
    let doc = parse_trace(torch).map_err(trace_err)?;
    if !members.0.iter().any(|(k, _)| k == "traceEvents") {
        return Err(trace_err(TraceError::BadEvent {
            index: 0,
            what: "no traceEvents: not a Chrome trace".into(),
        }));
    }
    let base_time_ns = doc
        .base_time_ns
        .map(|b| i64::try_from(b).map_err(|_| b))
        .transpose()
        .map_err(|b| {
            trace_err(TraceError::BadEvent {
                index: 0,
                what: format!("baseTimeNanoseconds {b} is out of range"),
            })
        })?;
    let rank = options.rank.or_else(|| distributed_rank(&doc));
    let options = ChromeOptions {
        rank,
        time_base: base_time_ns.map_or(TimeBase::EpochMicros, TimeBase::SinceNanos),
        ..options.clone()
    };
    if snapshot
        .traces()
        .iter()
        .flatten()
        .all(|e| e.time_us().is_none())
        && snapshot.traces().iter().any(|t| !t.is_empty())
    {
        return Err(ConvertError::Trace {
            path: torch_path.to_owned(),
            source: TraceError::Own {
                what: "the snapshot's trace has no times (time_us, PyTorch ≥ 2.2): it cannot \
                       be aligned with a profiler trace"
                    .into(),
            },
        });
    }

    // The torch trace's own stack frames: memsnap's ids start above its numeric ones.
    let torch_frames = match members.0.iter().find(|(k, _)| k == "stackFrames") {
        Some((_, value)) => Some(serde_json::from_str::<Members>(value.get()).map_err(|_| {
            trace_err(TraceError::BadEvent {
                index: 0,
                what: "stackFrames is not an object".into(),
            })
        })?),
        None => None,
    };
    let frames_base = match torch_frames
        .iter()
        .flat_map(|m| m.0.iter())
        .filter_map(|(k, _)| k.parse::<u64>().ok())
        .max()
    {
        None => 0,
        // Room above it for any number of memsnap's nodes (at most one per stack frame).
        Some(max) if max < 1 << 62 => max + 1,
        Some(max) => {
            return Err(trace_err(TraceError::BadEvent {
                index: 0,
                what: format!("stackFrames id {max} leaves no room to number memsnap's frames"),
            }))
        }
    };

    let mut report = MergeReport {
        base_time_ns,
        torch_events: doc.events.len(),
        rank,
        ..MergeReport::default()
    };
    offsets(snapshot, &doc, &mut report);

    out.write_all(b"{").map_err(write_err)?;
    let mut first = true;
    let mut wrote_other = false;
    let mut summary = None;
    let mut stacks = None;
    for (key, value) in members.0.iter().filter(|(k, _)| k != "stackFrames") {
        if !first {
            out.write_all(b",").map_err(write_err)?;
        }
        first = false;
        serde_json::to_writer(&mut *out, key).map_err(|e| write_err(e.into()))?;
        out.write_all(b":").map_err(write_err)?;
        match key.as_str() {
            "traceEvents" if summary.is_none() => {
                let text = value.get().trim();
                let inner = text
                    .strip_prefix('[')
                    .and_then(|t| t.strip_suffix(']'))
                    .ok_or_else(|| {
                        trace_err(TraceError::BadEvent {
                            index: 0,
                            what: "traceEvents is not an array".into(),
                        })
                    })?;
                out.write_all(b"[").map_err(write_err)?;
                out.write_all(inner.as_bytes()).map_err(write_err)?;
                let mut sink = Sink::new(out, options.time_base);
                sink.continues = !inner.trim().is_empty();
                sink.stacks.base = frames_base;
                let s = write_events(snapshot, &options, &mut sink)?;
                stacks = Some(sink.stacks);
                report.memsnap_events = s.events;
                summary = Some(s);
                out.write_all(b"\n]").map_err(write_err)?;
            }
            "otherData" => {
                // Keep torch's entries, add memsnap's (written after the events, below).
                match serde_json::from_str::<Members>(value.get()) {
                    Ok(other) => {
                        out.write_all(b"{").map_err(write_err)?;
                        for (k, v) in other.0.iter().filter(|(k, _)| k != "memsnap") {
                            serde_json::to_writer(&mut *out, k).map_err(|e| write_err(e.into()))?;
                            out.write_all(b":").map_err(write_err)?;
                            out.write_all(v.get().as_bytes()).map_err(write_err)?;
                            out.write_all(b",").map_err(write_err)?;
                        }
                        out.write_all(b"\"memsnap\":").map_err(write_err)?;
                        wrote_other = true;
                        // Placeholder: the summary exists once traceEvents is written; a
                        // trace with otherData before traceEvents gets it computed here.
                        let s = match &summary {
                            Some(s) => s.clone(),
                            None => {
                                let mut sink_out = std::io::sink();
                                let mut sink = Sink::new(&mut sink_out, options.time_base);
                                write_events(snapshot, &options, &mut sink)?
                            }
                        };
                        write_other_data(snapshot, &options, &s, out).map_err(write_err)?;
                        out.write_all(b"}").map_err(write_err)?;
                    }
                    Err(_) => out.write_all(value.get().as_bytes()).map_err(write_err)?,
                }
            }
            _ => out.write_all(value.get().as_bytes()).map_err(write_err)?,
        }
    }
    if !wrote_other {
        let s = summary.unwrap_or_default();
        out.write_all(b",\"otherData\":{\"memsnap\":")
            .map_err(write_err)?;
        write_other_data(snapshot, &options, &s, out).map_err(write_err)?;
        out.write_all(b"}").map_err(write_err)?;
    }
    let ours = stacks.filter(|s| !s.is_empty());
    let theirs = torch_frames.filter(|m| !m.0.is_empty());
    if ours.is_some() || theirs.is_some() {
        out.write_all(b",\"stackFrames\":{").map_err(write_err)?;
        let mut any = false;
        for (k, v) in theirs.iter().flat_map(|m| m.0.iter()) {
            if any {
                out.write_all(b",").map_err(write_err)?;
            }
            any = true;
            serde_json::to_writer(&mut *out, k).map_err(|e| write_err(e.into()))?;
            out.write_all(b":").map_err(write_err)?;
            out.write_all(v.get().as_bytes()).map_err(write_err)?;
        }
        if let Some(ours) = &ours {
            if any {
                out.write_all(b",").map_err(write_err)?;
            }
            ours.write_members(snapshot, out).map_err(write_err)?;
        }
        out.write_all(b"}").map_err(write_err)?;
    }
    out.write_all(b"}\n").map_err(write_err)?;
    Ok(report)
}

fn distributed_rank(doc: &crate::torch::TraceDoc) -> Option<u32> {
    let raw = doc.distributed_info.as_ref()?;
    let info: serde_json::Map<String, serde_json::Value> = serde_json::from_str(raw.get()).ok()?;
    integer(info.get("rank")?).and_then(|r| u32::try_from(r).ok())
}

/// The caching allocator's block size for a request (multiples of 512).
fn rounded(size: u64) -> u64 {
    size.max(1).div_ceil(512) * 512
}

/// Matches the torch trace's GPU allocations with the snapshot's and records the median time
/// offset.
fn offsets(snapshot: &Snapshot, doc: &crate::torch::TraceDoc, report: &mut MergeReport) {
    // memsnap allocs: (device, addr, rounded size) -> sorted times (µs).
    let mut ours: HashMap<(i64, u64, u64), Vec<i64>> = HashMap::default();
    for (device, trace) in snapshot.traces().iter().enumerate() {
        for e in trace {
            if let (Action::Alloc, Some(t)) = (e.action, e.time_us()) {
                ours.entry((device as i64, e.addr, rounded(e.size)))
                    .or_default()
                    .push(t);
            }
        }
    }
    for times in ours.values_mut() {
        times.sort_unstable();
    }
    let mut deltas = Vec::new();
    for e in &doc.events {
        if e.name.as_deref() != Some("[memory]") {
            continue;
        }
        let Some(args) = &e.args else { continue };
        let Ok(args) =
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(args.get())
        else {
            continue;
        };
        let get = |k: &str| args.get(k).and_then(integer);
        let (Some(device), Some(addr), Some(bytes)) = (get("Device Id"), get("Addr"), get("Bytes"))
        else {
            continue;
        };
        if get("Device Type") == Some(0) || bytes <= 0 {
            continue;
        }
        let Some(ts) = e.ts.as_ref().and_then(micros_to_ns) else {
            continue;
        };
        report.torch_allocations += 1;
        let abs_us = (ts + doc.base_time_ns.unwrap_or(0)) as f64 / 1000.0;
        let key = (device as i64, addr as u64, bytes as u64);
        let Some(times) = ours.get(&key) else {
            continue;
        };
        // The nearest memsnap alloc of that block.
        let i = times.partition_point(|&t| (t as f64) < abs_us);
        let nearest = [i.checked_sub(1), Some(i)]
            .into_iter()
            .flatten()
            .filter_map(|j| times.get(j))
            .map(|&t| abs_us - t as f64)
            .min_by(|a, b| a.abs().total_cmp(&b.abs()));
        if let Some(d) = nearest {
            deltas.push(d);
        }
    }
    report.matched = deltas.len();
    if !deltas.is_empty() {
        deltas.sort_by(f64::total_cmp);
        let n = deltas.len();
        report.median_offset_us = Some(if n % 2 == 1 {
            deltas[n / 2]
        } else {
            (deltas[n / 2 - 1] + deltas[n / 2]) / 2.0
        });
    }
}

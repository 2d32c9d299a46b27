//! `memsnap info`: a human summary of snapshot files.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use memsnap_format::{Action, BlockState, Shape, Snapshot};

use super::common::{self, format_size};

/// Summarise snapshots: format, PyTorch era, devices, memory, history.
///
/// For each file: the detected format and compression, the PyTorch version range its keys
/// point to, the devices, segments and trace entries per device, the time span of the
/// history, reserved/allocated/active bytes (from the segments), whether the history looks
/// truncated (frees of allocations the trace never saw, entries the ring buffer dropped), and
/// how many distinct stacks and frames it holds.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  memsnap info snapshot.pickle
  memsnap info runs/*.pickle.gz

Exit codes: 0 success; 2 a file cannot be read (the others are still summarised).")]
pub struct Args {
    /// Snapshot files (`-` reads stdin).
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let mut failed = false;
    for (i, path) in args.files.iter().enumerate() {
        if i > 0 {
            println!();
        }
        match summarise(path) {
            Ok(text) => print!("{text}"),
            Err(err) => {
                eprintln!("memsnap: error: {err:#}");
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

fn summarise(path: &Path) -> Result<String> {
    let file_bytes = if path.as_os_str() == "-" {
        None
    } else {
        std::fs::metadata(path).ok().map(|m| m.len())
    };
    let (snapshot, detected) = common::load(path)?;
    let mut out = String::new();
    let _ = writeln!(out, "{}", path.display());
    let _ = write!(
        out,
        "  format:      {}",
        common::describe_encoding(detected.format, detected.compression)
    );
    if let Some(bytes) = file_bytes {
        let _ = write!(out, ", {}", format_size(bytes));
    }
    out.push('\n');
    let shape = match snapshot.shape {
        Shape::Dict => "snapshot dict (torch.cuda.memory._snapshot())",
        Shape::SegmentList => "bare segment list (torch.cuda.memory.memory_snapshot()): no history",
    };
    let _ = writeln!(out, "  shape:       {shape}");
    let _ = writeln!(out, "  era:         {}", Era::infer(&snapshot).describe());
    if let Some(info) = &snapshot.recorder_info {
        let _ = writeln!(out, "  producer:    {}", info.producer);
    }

    let devices = snapshot.devices();
    let _ = writeln!(out, "  devices:     {}", devices.len());
    let per_device = memory_by_device(&snapshot);
    let expandable = snapshot
        .segments
        .iter()
        .filter(|s| s.is_expandable == Some(true))
        .count();
    let _ = write!(out, "  segments:    {}", snapshot.segments.len());
    if expandable > 0 {
        let _ = write!(out, " ({expandable} expandable)");
    }
    out.push('\n');
    let total = per_device
        .values()
        .fold(Memory::default(), |acc, m| acc.plus(m));
    let _ = writeln!(out, "  memory:      {}", total.describe());
    let trace_lengths: Vec<usize> = snapshot.traces().iter().map(Vec::len).collect();
    for device in &devices {
        let mem = per_device.get(device).copied().unwrap_or_default();
        let entries = usize::try_from(*device)
            .ok()
            .and_then(|d| trace_lengths.get(d))
            .copied()
            .unwrap_or(0);
        let _ = writeln!(
            out,
            "    device {device}: {}, {}; {}",
            count(mem.segments, "segment"),
            mem.describe(),
            count(entries, "trace entry")
        );
    }

    match &snapshot.device_traces {
        None => {
            let _ = writeln!(out, "  history:     none (no device_traces)");
        }
        Some(_) => {
            let _ = writeln!(out, "  entries:     {}", snapshot.entry_count());
            if let Some(span) = time_span(&snapshot) {
                let _ = writeln!(out, "  time span:   {span}");
            } else if snapshot.entry_count() > 0 {
                let _ = writeln!(
                    out,
                    "  time span:   unknown (entries have no time_us, PyTorch ≤2.1)"
                );
            }
            let _ = writeln!(out, "  history:     {}", truncation(&snapshot));
        }
    }
    if let Some(annotations) = &snapshot.external_annotations {
        let _ = writeln!(out, "  annotations: {}", annotations.len());
    }
    if let Some(conf) = snapshot
        .allocator_settings
        .as_ref()
        .and_then(|s| s.alloc_conf.as_deref())
        .filter(|c| !c.is_empty())
    {
        let _ = writeln!(out, "  alloc conf:  {conf}");
    }
    let _ = writeln!(
        out,
        "  stacks:      {} distinct stacks of {} distinct frames",
        snapshot.stacks.len(),
        snapshot.frames.len()
    );
    Ok(out)
}

/// `1 segment`, `3 segments`, `2 trace entries`.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else if let Some(stem) = noun.strip_suffix('y') {
        format!("{n} {stem}ies")
    } else {
        format!("{n} {noun}s")
    }
}

/// Bytes held per device, from the segments.
#[derive(Clone, Copy, Default)]
struct Memory {
    segments: usize,
    reserved: u64,
    allocated: u64,
    active: u64,
}

impl Memory {
    fn plus(self, o: &Memory) -> Memory {
        Memory {
            segments: self.segments + o.segments,
            reserved: self.reserved.saturating_add(o.reserved),
            allocated: self.allocated.saturating_add(o.allocated),
            active: self.active.saturating_add(o.active),
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} reserved, {} allocated, {} active",
            format_size(self.reserved),
            format_size(self.allocated),
            format_size(self.active)
        )
    }
}

fn memory_by_device(snapshot: &Snapshot) -> BTreeMap<i64, Memory> {
    let mut by_device: BTreeMap<i64, Memory> = BTreeMap::new();
    for seg in &snapshot.segments {
        // Legacy segments may lack the sums; the blocks give them.
        let from_blocks = |keep: fn(BlockState) -> bool| -> u64 {
            seg.blocks
                .iter()
                .filter(|b| keep(b.state))
                .fold(0u64, |acc, b| acc.saturating_add(b.size))
        };
        let m = Memory {
            segments: 1,
            reserved: seg.total_size,
            allocated: seg
                .allocated_size
                .unwrap_or_else(|| from_blocks(|s| s == BlockState::ActiveAllocated)),
            active: seg
                .active_size
                .unwrap_or_else(|| from_blocks(|s| s.is_active())),
        };
        let entry = by_device.entry(seg.device).or_default();
        *entry = entry.plus(&m);
    }
    by_device
}

/// `2025-09-07 12:34:56.789 UTC – 2025-09-07 12:35:01.002 UTC (4.213 s)`.
fn time_span(snapshot: &Snapshot) -> Option<String> {
    let times = snapshot.traces().iter().flatten().filter_map(|e| e.time_us);
    let (first, last) = times.fold(None, |acc: Option<(i64, i64)>, t| match acc {
        None => Some((t, t)),
        Some((lo, hi)) => Some((lo.min(t), hi.max(t))),
    })?;
    let seconds = (i128::from(last) - i128::from(first)) as f64 / 1e6;
    Some(format!(
        "{} – {} ({seconds:.3} s)",
        format_utc(first),
        format_utc(last)
    ))
}

/// Formats microseconds since the Unix epoch as a UTC date and time.
fn format_utc(time_us: i64) -> String {
    let secs = time_us.div_euclid(1_000_000);
    let millis = time_us.rem_euclid(1_000_000) / 1000;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{millis:03} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Whether the history misses its oldest events: frees of blocks the trace never saw
/// allocated, and what memsnap's recorder says its ring buffer dropped.
fn truncation(snapshot: &Snapshot) -> String {
    let mut orphan_frees = 0usize;
    for trace in snapshot.traces() {
        let mut known: HashSet<u64> = HashSet::new();
        for e in trace {
            // The guards record the address as they test it.
            match e.action {
                Action::Alloc => {
                    known.insert(e.addr);
                }
                Action::FreeRequested if known.insert(e.addr) => orphan_frees += 1,
                Action::FreeCompleted | Action::Free if !known.remove(&e.addr) => orphan_frees += 1,
                _ => {}
            }
        }
    }
    let dropped: u64 = snapshot
        .recorder_info
        .as_ref()
        .map(|r| {
            r.dropped_entries
                .iter()
                .fold(0u64, |a, &d| a.saturating_add(d))
        })
        .unwrap_or(0);
    let mut reasons = Vec::new();
    if orphan_frees > 0 {
        reasons.push(format!(
            "{} of allocations not in the trace",
            count(orphan_frees, "free")
        ));
    }
    if dropped > 0 {
        reasons.push(format!("the ring buffer dropped {dropped} entries"));
    }
    if reasons.is_empty() {
        "complete (every free has its allocation in the trace)".to_string()
    } else {
        format!(
            "looks truncated: {} (the oldest events are missing)",
            reasons.join("; ")
        )
    }
}

/// The PyTorch versions (minor numbers of 2.x) whose snapshots have the keys this one has.
struct Era {
    /// Lowest version with every key present, and the key that says so.
    low: (u32, &'static str),
    /// Highest version that writes none of the keys absent here, and the missing key.
    high: (u32, &'static str),
    shape: Shape,
}

/// The newest format memsnap knows.
const NEWEST_MINOR: u32 = 15;

impl Era {
    fn infer(s: &Snapshot) -> Era {
        let mut low = (0u32, "");
        let mut high = (NEWEST_MINOR, "");
        let mut at_least = |v: u32, why: &'static str| {
            if v > low.0 {
                low = (v, why);
            }
        };
        let entries: Vec<_> = s.traces().iter().flatten().collect();
        let blocks = s.segments.iter().flat_map(|seg| seg.blocks.iter());
        let legacy_blocks = blocks
            .clone()
            .any(|b| b.history.is_some() || b.address.is_none());
        if s.segments.iter().any(|seg| seg.is_expandable.is_some())
            || blocks.clone().any(|b| b.address.is_some())
        {
            at_least(1, "block addresses");
        }
        if entries.iter().any(|e| e.time_us.is_some()) {
            at_least(2, "time_us");
        }
        if s.allocator_settings.is_some() {
            at_least(3, "allocator_settings");
        }
        if s.external_annotations.is_some() {
            at_least(5, "external_annotations");
        }
        if entries.iter().any(|e| e.compile_context.is_some()) {
            at_least(8, "compile_context");
        }
        let settings = s.allocator_settings.as_ref();
        if settings.is_some_and(|a| a.graph_capture_record_stream_reuse.is_some()) {
            at_least(9, "graph_capture_record_stream_reuse");
        }
        if entries.iter().any(|e| e.user_metadata.is_some()) {
            at_least(10, "user_metadata");
        }
        let rare = || entries.iter().filter_map(|e| e.rare.as_deref());
        if rare().any(|r| r.forward_frames.is_some()) {
            at_least(11, "forward_frames");
        }
        if settings.is_some_and(|a| a.max_round_threshold.is_some() || a.max_cached_size.is_some())
        {
            at_least(13, "max_round_threshold");
        }
        if s.host_segments.is_some() || s.host_traces.is_some() {
            at_least(14, "host_segments");
        }
        if entries.iter().any(|e| e.action == Action::Annotate) {
            at_least(14, "annotate entries");
        }
        if rare().any(|r| r.internal_metadata.is_some()) {
            at_least(15, "internal_metadata");
        }

        let mut at_most = |v: u32, why: &'static str| {
            if v < high.0 {
                high = (v, why);
            }
        };
        if legacy_blocks {
            at_most(0, "legacy blocks without address");
        }
        // Absent top-level keys say nothing about a bare list, which never has them.
        if s.shape == Shape::Dict {
            if s.allocator_settings.is_none() {
                at_most(2, "allocator_settings");
            }
            if s.external_annotations.is_none() {
                at_most(4, "external_annotations");
            }
            if s.host_segments.is_none() {
                at_most(13, "host_segments");
            }
            if let Some(a) = settings {
                if a.graph_capture_record_stream_reuse.is_none() {
                    at_most(8, "graph_capture_record_stream_reuse");
                }
                if a.max_round_threshold.is_none() {
                    at_most(12, "max_round_threshold");
                }
            }
            if !entries.is_empty() {
                if entries.iter().all(|e| e.time_us.is_none()) {
                    at_most(1, "time_us");
                }
                if entries.iter().all(|e| e.compile_context.is_none()) {
                    at_most(7, "compile_context");
                }
                if entries.iter().all(|e| e.user_metadata.is_none()) {
                    at_most(9, "user_metadata");
                }
            }
        }
        Era {
            low,
            high,
            shape: s.shape,
        }
    }

    fn describe(&self) -> String {
        let version = |v: u32| {
            if v == 0 {
                "2.0".to_string()
            } else {
                format!("2.{v}")
            }
        };
        let (low, why_low) = self.low;
        let (high, why_high) = self.high;
        let has = if why_low.is_empty() {
            String::new()
        } else {
            format!("has {why_low}")
        };
        let lacks = if why_high.is_empty() {
            String::new()
        } else {
            format!("no {why_high}")
        };
        let because = [has.as_str(), lacks.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(", ");
        let because = if because.is_empty() {
            String::new()
        } else {
            format!(" ({because})")
        };
        if low > high {
            return format!(
                "mixed: keys of PyTorch {}+ but {}; not written by one PyTorch release",
                version(low),
                lacks
            );
        }
        let range = if low == high {
            format!(
                "PyTorch {}",
                if low == 0 {
                    "≤2.0".to_string()
                } else {
                    version(low)
                }
            )
        } else if low == 0 {
            format!("PyTorch ≤{}", version(high))
        } else if high == NEWEST_MINOR && why_high.is_empty() {
            format!("PyTorch {}+", version(low))
        } else {
            format!("PyTorch {}–{}", version(low), version(high))
        };
        match self.shape {
            Shape::SegmentList => format!("{range}{because}, judged from the segments only"),
            Shape::Dict => format!("{range}{because}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_format::{AllocatorSettings, TraceEntry};

    #[test]
    fn utc_dates_are_civil_dates() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(
            format_utc(1_757_253_255_215_904),
            "2025-09-07 13:54:15.215 UTC"
        );
        assert_eq!(
            format_utc(951_782_400_000_000),
            "2000-02-29 00:00:00.000 UTC"
        );
    }

    #[test]
    fn era_comes_from_the_keys_present_and_absent() {
        let mut s = Snapshot::new(1);
        s.allocator_settings = Some(AllocatorSettings::default());
        s.external_annotations = Some(Vec::new());
        // allocator_settings without graph_capture_record_stream_reuse: at most 2.8.
        assert_eq!(
            Era::infer(&s).describe(),
            "PyTorch 2.5–2.8 (has external_annotations, no graph_capture_record_stream_reuse)"
        );

        let mut e = TraceEntry::new(Action::Alloc, 0x1000, 512, 0);
        e.time_us = Some(1);
        e.compile_context = Some(s.strings.intern("N/A"));
        s.device_traces = Some(vec![vec![e]]);
        assert!(Era::infer(&s).describe().starts_with("PyTorch 2.8 "));

        let mut old = Snapshot::new(1);
        old.device_traces = Some(vec![vec![TraceEntry::new(Action::Alloc, 0, 512, 0)]]);
        assert_eq!(Era::infer(&old).describe(), "PyTorch ≤2.1 (no time_us)");
    }

    #[test]
    fn frees_without_allocation_mark_the_history_truncated() {
        let mut s = Snapshot::new(1);
        s.device_traces = Some(vec![vec![
            TraceEntry::new(Action::Alloc, 0x1000, 512, 0),
            TraceEntry::new(Action::FreeRequested, 0x1000, 512, 0),
            TraceEntry::new(Action::FreeCompleted, 0x1000, 512, 0),
        ]]);
        assert!(truncation(&s).starts_with("complete"));
        s.device_traces = Some(vec![vec![
            TraceEntry::new(Action::FreeRequested, 0x2000, 512, 0),
            TraceEntry::new(Action::FreeCompleted, 0x2000, 512, 0),
        ]]);
        assert_eq!(
            truncation(&s),
            "looks truncated: 1 free of allocations not in the trace (the oldest events are missing)"
        );
    }
}

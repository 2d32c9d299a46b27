//! `memsnap info`: a human summary of snapshot files.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use memsnap_format::{BlockState, Shape, Snapshot};

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
            outln!();
        }
        match summarise(path) {
            Ok(text) => out!("{text}"),
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
    let (snapshot, source) = common::load(path)?;
    let mut out = String::new();
    let _ = writeln!(out, "{}", path.display());
    let _ = write!(out, "  format:      {}", source.describe());
    if let Some(bytes) = file_bytes {
        let _ = write!(out, ", {}", format_size(bytes));
    }
    out.push('\n');
    let shape = match snapshot.shape {
        Shape::Dict => "snapshot dict (torch.cuda.memory._snapshot())",
        Shape::SegmentList => "bare segment list (torch.cuda.memory.memory_snapshot()): no history",
    };
    let _ = writeln!(out, "  shape:       {shape}");
    let _ = writeln!(
        out,
        "  era:         {}",
        memsnap_format::era::Era::infer(&snapshot).describe()
    );
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
    let times = snapshot
        .traces()
        .iter()
        .flatten()
        .filter_map(|e| e.time_us());
    let (first, last) = times.fold(None, |acc: Option<(i64, i64)>, t| match acc {
        None => Some((t, t)),
        Some((lo, hi)) => Some((lo.min(t), hi.max(t))),
    })?;
    let seconds = (i128::from(last) - i128::from(first)) as f64 / 1e6;
    // Nothing was recorded before 2000: such times count from another origin (ROCm's
    // CLOCK_BOOTTIME, since boot), not dates.
    const YEAR_2000_US: i64 = 946_684_800_000_000;
    if last < YEAR_2000_US {
        return Some(format!(
            "{:.3} s – {:.3} s from the clock's origin (not dates; {seconds:.3} s)",
            first as f64 / 1e6,
            last as f64 / 1e6
        ));
    }
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
/// allocated, and what memsnap's recorder says its ring buffer dropped (the replay knows both).
fn truncation(snapshot: &Snapshot) -> String {
    let (mut orphan_frees, mut dropped) = (0u64, 0u64);
    for device in 0..snapshot.traces().len() as i64 {
        if let Ok(replay) = memsnap_analysis::Replay::build(snapshot, device) {
            orphan_frees += replay.frees_without_alloc();
            dropped = dropped.saturating_add(replay.dropped_entries.unwrap_or(0));
        }
    }
    let mut reasons = Vec::new();
    if orphan_frees > 0 {
        reasons.push(format!(
            "{} of allocations not in the trace",
            count(orphan_frees as usize, "free")
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

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_format::{Action, TraceEntry};

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

//! `memsnap simulate`: replays a snapshot's trace through memsnap's caching allocator —
//! fidelity against PyTorch's recorded decisions, and what-if runs under other settings or a
//! smaller GPU.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use memsnap_recorder::AllocatorConfig;
use memsnap_simulate::{simulate, suggest, DeviceReport, Options, Simulation};
use serde::Serialize;

use crate::cmd::common::{format_size, load, parse_size};

/// Replay a snapshot's trace through memsnap's allocator: does it make PyTorch's decisions,
/// and would other settings (or a smaller GPU) have avoided the OOM?
///
/// The allocator's state at the start of the recorded window is rebuilt from the file, then
/// every alloc, free and empty_cache of the window is replayed with the file's settings
/// (its allocator_settings, else the PyTorch defaults of its era). The report compares the
/// replay's segment decisions (cudaMalloc/cudaFree, map/unmap) with the recorded ones, and
/// puts peaks, fragmentation, device calls and out-of-memory side by side with the file's.
///
/// With --alloc-conf and/or --memory-limit it also replays under those settings (the whole
/// PYTORCH_CUDA_ALLOC_CONF of the what-if run) or on a smaller device. --suggest tries the
/// settings people actually use, on top of the file's, and ranks them by reserved peak.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  memsnap simulate run.pickle
      how closely the replay follows the recording; peaks and OOM side by side
  memsnap simulate run.pickle --alloc-conf expandable_segments:True
      would expandable segments have lowered the reserved peak?
  memsnap simulate run.pickle --memory-limit 24GiB
      would the run fit on a 24 GiB GPU, and where would it run out of memory?
  memsnap simulate run.pickle --alloc-conf \"max_split_size_mb:128,roundup_power2_divisions:4\" --memory-limit 24GiB
  memsnap simulate oom.pickle --suggest
      rank expandable_segments, max_split_size_mb, garbage_collection_threshold and
      roundup_power2_divisions by reserved peak, and say which avoid the OOM
  memsnap simulate run.pickle --json
      {\"devices\": [{\"device\": 0, \"segment_events\": [[\"segment_alloc\", 20971520], ...],
        \"reserved_peak_bytes\": N, \"oom\": null, \"fidelity\": {...}, ...}]}

The device's memory is what the file implies (an oom entry's device_free plus the reserved
bytes then), else 80 GiB (or twice the recorded reserved peak), unless --memory-limit is given.
garbage_collection_threshold acts only with a memory fraction: add
per_process_memory_fraction:0.99 to try it.")]
pub struct Args {
    /// Snapshot file (pickle, JSON or msgpack; `-` for stdin).
    pub file: PathBuf,
    /// Replay under these settings instead of the file's (a PYTORCH_CUDA_ALLOC_CONF string,
    /// e.g. "expandable_segments:True,max_split_size_mb:128").
    #[arg(long, value_name = "CONF")]
    pub alloc_conf: Option<String>,
    /// Device memory for the replay (e.g. 24GiB, 80GB).
    #[arg(long, value_parser = parse_size, value_name = "BYTES")]
    pub memory_limit: Option<u64>,
    /// Try common settings and rank them by reserved peak.
    #[arg(long, conflicts_with = "alloc_conf")]
    pub suggest: bool,
    /// Only this device (default: every device with a trace).
    #[arg(long)]
    pub device: Option<i64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Output<'a> {
    file: String,
    #[serde(flatten)]
    run: &'a Simulation,
    /// The replay with the file's own settings, when a what-if was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    baseline: Option<&'a Simulation>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (snapshot, _) = load(&args.file)?;
    let file = args.file.display().to_string();
    if args.suggest {
        let s = suggest(&snapshot, args.memory_limit, args.device)?;
        if args.json {
            crate::write_json_stdout(&s);
            return Ok(ExitCode::SUCCESS);
        }
        outln!("{file}: settings tried on top of the file's, best first");
        outln!(
            "  {:>12} {:>14}  {:<30} settings",
            "reserved",
            "fragmentation",
            "out of memory"
        );
        let rows = std::iter::once((&s.baseline, "(the file's own)"))
            .chain(s.candidates.iter().map(|c| (c, c.change.as_str())));
        for (c, label) in rows {
            outln!(
                "  {:>12} {:>14}  {:<30} {label}",
                format_size(c.reserved_peak_bytes),
                format_size(c.fragmentation_bytes),
                oom_text(c.oom)
            );
        }
        if let Some(best) = s.candidates.first() {
            outln!("\n{}.", best.verdict);
        }
        return Ok(ExitCode::SUCCESS);
    }

    let what_if = args.alloc_conf.is_some() || args.memory_limit.is_some();
    let config = args
        .alloc_conf
        .as_deref()
        .map(AllocatorConfig::parse)
        .transpose()
        .context("--alloc-conf")?;
    let own = simulate(
        &snapshot,
        &Options {
            device: args.device,
            ..Default::default()
        },
    )?;
    let other = if what_if {
        Some(simulate(
            &snapshot,
            &Options {
                config,
                memory_limit: args.memory_limit,
                device: args.device,
            },
        )?)
    } else {
        None
    };
    if args.json {
        let out = match &other {
            Some(o) => Output {
                file,
                run: o,
                baseline: Some(&own),
            },
            None => Output {
                file,
                run: &own,
                baseline: None,
            },
        };
        crate::write_json_stdout(&out);
        return Ok(ExitCode::SUCCESS);
    }
    print_report(&file, &own, other.as_ref());
    Ok(ExitCode::SUCCESS)
}

fn oom_text(oom: Option<(i64, usize)>) -> String {
    match oom {
        Some((d, e)) => format!("OOM at event {e} (device {d})"),
        None => "no OOM".to_string(),
    }
}

fn conf_label(conf: &str) -> String {
    if conf.is_empty() {
        "PyTorch defaults".to_string()
    } else {
        conf.to_string()
    }
}

fn print_report(file: &str, own: &Simulation, other: Option<&Simulation>) {
    outln!(
        "{file}: replayed with {} ({})",
        conf_label(&own.alloc_conf),
        own.settings_source
    );
    if let Some(o) = other {
        outln!("what-if: {}", conf_label(&o.alloc_conf));
    }
    for d in &own.devices {
        let w = other.and_then(|o| o.devices.iter().find(|x| x.device == d.device));
        print_device(d, w);
    }
}

fn print_device(d: &DeviceReport, w: Option<&DeviceReport>) {
    let cap_from = match d.capacity_source {
        memsnap_simulate::CapacitySource::Limit => "--memory-limit",
        memsnap_simulate::CapacitySource::OomEntry => "the oom entry",
        memsnap_simulate::CapacitySource::Default => "default",
    };
    outln!(
        "\ndevice {}: {} events; device memory {} ({cap_from}); start of the window: {} segments, {} reserved, {} blocks allocated ({} sizes estimated)",
        d.device,
        d.events,
        format_size(d.capacity_bytes),
        d.start_segments,
        format_size(d.start_reserved_bytes),
        d.start_allocated_blocks,
        d.start_estimated_blocks
    );
    let r = &d.recorded;
    let mut header = format!("  {:<22}{:>18}{:>18}", "", "recorded", "replayed");
    if let Some(w) = w {
        header.push_str(&format!("{:>18}", "what-if"));
        if w.capacity_source == memsnap_simulate::CapacitySource::Limit {
            header.push_str(&format!(" ({} GPU)", format_size(w.capacity_bytes)));
        }
    }
    outln!("{header}");
    let row = |name: &str, rec: String, f: &dyn Fn(&DeviceReport) -> String| {
        let mut line = format!("  {name:<22}{rec:>18}{:>18}", f(d));
        if let Some(w) = w {
            line.push_str(&format!("{:>18}", f(w)));
        }
        outln!("{line}");
    };
    row("reserved peak", format_size(r.reserved_peak_bytes), &|x| {
        format_size(x.reserved_peak_bytes)
    });
    row("allocated peak", "-".into(), &|x| {
        format_size(x.allocated_peak_bytes)
    });
    row("fragmentation @peak", "-".into(), &|x| {
        format_size(x.fragmentation_bytes)
    });
    row("cudaMalloc/map", r.device_mallocs.to_string(), &|x| {
        x.device_mallocs.to_string()
    });
    row("cudaFree/unmap", r.device_frees.to_string(), &|x| {
        x.device_frees.to_string()
    });
    row(
        "out of memory",
        r.oom_event.map_or("no".into(), |e| format!("event {e}")),
        &|x| match &x.oom {
            Some(o) if x.events_replayed < x.events => format!("event {} (end)", o.event),
            Some(o) => format!("event {}", o.event),
            None => "no".into(),
        },
    );
    if let Some(w) = w {
        if w.start_reserved_bytes > w.capacity_bytes {
            outln!(
                "  note: the state at the start of the window ({} reserved) already exceeds the what-if device memory",
                format_size(w.start_reserved_bytes)
            );
        }
    }
    let f = &d.fidelity;
    outln!(
        "  fidelity: {}/{} segment decisions reproduced ({} extra), {}/{} allocations at the recorded address",
        f.reproduced, f.segment_decisions, f.extra, f.placed_at_recorded_address, f.allocations
    );
    if let Some(first) = f.differences.first() {
        outln!(
            "  first difference at event {} ({}): PyTorch {}, replay {} ({} steps differ)",
            first.event,
            first.step,
            decisions(&first.pytorch),
            decisions(&first.replay),
            f.difference_count
        );
    }
    if d.anomaly_count > 0 {
        outln!(
            "  {} inconsistencies in the file were absorbed, first: {}",
            d.anomaly_count,
            d.anomalies.first().map_or("", String::as_str)
        );
    }
}

fn decisions(list: &[(memsnap_simulate::SegmentAction, u64)]) -> String {
    if list.is_empty() {
        return "nothing".into();
    }
    let parts: Vec<String> = list
        .iter()
        .take(4)
        .map(|(a, s)| format!("{} {}", a.name(), format_size(*s)))
        .collect();
    let more = if list.len() > 4 {
        format!(" and {} more", list.len() - 4)
    } else {
        String::new()
    };
    format!("{}{more}", parts.join(", "))
}

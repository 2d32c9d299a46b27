//! `memsnap export --to flamegraph|pprof`: the live set at an instant as a flame graph SVG or
//! a gzipped pprof heap profile (`memsnap_converters::{flamegraph, pprof}`).

use std::process::ExitCode;
use std::time::Instant as WallClock;

use anyhow::{bail, Context, Result};
use memsnap_converters::profile::{LiveProfile, LiveSource, ProfileOptions};
use memsnap_converters::{flamegraph, pprof};

use super::{Args, By, Target};
use crate::cmd::common::{self, format_size};

pub fn run(args: &Args) -> Result<ExitCode> {
    let [input] = args.inputs.as_slice() else {
        bail!(
            "--to {} exports one snapshot; got {} files",
            target_name(args.to),
            args.inputs.len()
        );
    };
    let started = WallClock::now();
    let (snapshot, _) = common::load(input)?;
    let mut options = ProfileOptions::default();
    options.at = args.at;
    options.by = match args.by {
        By::Stack => memsnap_converters::profile::By::Stack,
        By::Site => memsnap_converters::profile::By::Site,
    };
    options.min_size = args.min_size;
    options.device = args.device;
    options.label = input.file_name().map(|n| n.to_string_lossy().into_owned());
    let live = LiveProfile::select(&snapshot, &options)
        .with_context(|| format!("{}: cannot take the live set", input.display()))?;
    let bytes = match args.to {
        Target::Flamegraph => {
            let mut svg = Vec::new();
            flamegraph::render(&live, &mut svg)?;
            svg
        }
        Target::Pprof => pprof::encode(&live)?,
        other => bail!("--to {} is not a profile format", target_name(other)),
    };
    memsnap_format::io::write_atomic(&args.output, &bytes)
        .with_context(|| format!("cannot write {}", args.output.display()))?;

    let what = match live.source {
        LiveSource::Empty => {
            "no device has trace entries or segments: the export is empty".to_string()
        }
        LiveSource::SegmentsOnly => format!(
            "device {}: no trace, so the live set is the snapshot's active blocks: {} in {} blocks",
            live.device.unwrap_or_default(),
            format_size(live.bytes),
            live.allocations.len()
        ),
        LiveSource::Trace => format!(
            "device {}, live memory {}: {} in {} blocks",
            live.device.unwrap_or_default(),
            live.describe_instant(),
            format_size(live.bytes),
            live.allocations.len()
        ),
        _ => String::new(),
    };
    outln!(
        "{} -> {} ({}, {}, {:.2} s)",
        input.display(),
        args.output.display(),
        target_name(args.to),
        format_size(bytes.len() as u64),
        started.elapsed().as_secs_f64()
    );
    outln!("  {what}");
    if live.smaller_count > 0 {
        outln!(
            "  left out: {} in {} blocks smaller than {}",
            format_size(live.smaller_bytes),
            live.smaller_count,
            format_size(args.min_size)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn target_name(target: Target) -> &'static str {
    match target {
        Target::Chrome => "chrome",
        Target::Perfetto => "perfetto",
        Target::Flamegraph => "flamegraph",
        Target::Pprof => "pprof",
        Target::Parquet => "parquet",
    }
}

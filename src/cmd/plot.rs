//! `memsnap plot`: the active-memory timeline as a PNG or SVG picture, without a display.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use memsnap_plot::{render_png, render_svg, ColourBy, PlotOptions};

use super::common::{load, parse_size};

/// Draw the active-memory timeline to a PNG or SVG file (headless).
///
/// The picture is the viewer's main chart: one band per allocation coloured by its call site
/// (or by category, or by phase: --colour-by), memory from before the recorded window in
/// a muted grey, allocations below --min-size folded into one band (the total stays exact),
/// reserved memory as an outline, and each training step's phases shaded behind the
/// bands (set-up violet, forward red, backward blue, optimizer green) with each phase's slope
/// and rate drawn over them.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    memsnap plot snapshot.pickle -o timeline.png\n  \
    memsnap plot snapshot.pickle -o timeline.svg --min-size 1MiB --range 1000..5000\n  \
    memsnap plot rank3.pickle -o r3.png --device 3 --width 2400 --height 1200 --dark\n  \
    memsnap plot snapshot.pickle -o categories.png --colour-by category")]
pub struct Args {
    /// Snapshot file (pickle, msgpack or JSON; gzip/zstd allowed).
    pub file: PathBuf,
    /// Output picture; the extension picks the format (.png or .svg).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Device to draw (default: the one with the longest trace).
    #[arg(long)]
    pub device: Option<i64>,
    /// Fold allocations smaller than this into one band (e.g. 1MiB, 4096).
    #[arg(long, value_parser = parse_size, default_value = "0")]
    pub min_size: u64,
    /// Event range START..END to draw (default: the whole trace).
    #[arg(long, value_parser = parse_range)]
    pub range: Option<(f64, f64)>,
    /// Picture width in pixels.
    #[arg(long, default_value_t = 1600)]
    pub width: u32,
    /// Picture height in pixels.
    #[arg(long, default_value_t = 900)]
    pub height: u32,
    /// Don't shade the steps' phases or draw their slopes.
    #[arg(long)]
    pub no_steps: bool,
    /// Band colours: `site` (the user's code that allocated it), `category` (parameter,
    /// optimizer state, gradient, activation, temporary), `phase` (that allocated it) or
    /// `module` (the module path that made it).
    #[arg(long, value_enum, default_value_t = Colouring::Site, alias = "color-by")]
    pub colour_by: Colouring,
    /// Dark background.
    #[arg(long)]
    pub dark: bool,
}

/// `--colour-by`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Colouring {
    Site,
    Category,
    Phase,
    Module,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let ext = args
        .output
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let png = match ext.as_deref() {
        Some("png") => true,
        Some("svg") => false,
        _ => bail!(
            "cannot tell the picture format of {}: use a .png or .svg file name",
            args.output.display()
        ),
    };
    let (snapshot, _) = load(&args.file)?;
    let options = PlotOptions {
        device: args.device,
        width: args.width,
        height: args.height,
        range: args.range,
        min_size: args.min_size,
        show_steps: !args.no_steps,
        colour_by: match args.colour_by {
            Colouring::Site => ColourBy::Site,
            Colouring::Category => ColourBy::Category,
            Colouring::Phase => ColourBy::Phase,
            Colouring::Module => ColourBy::Module,
        },
        dark: args.dark,
        ..PlotOptions::default()
    };
    let bytes = if png {
        render_png(&snapshot, &options)?
    } else {
        render_svg(&snapshot, &options)?.into_bytes()
    };
    memsnap_format::io::write_atomic(&args.output, &bytes)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    eprintln!("wrote {}", args.output.display());
    Ok(ExitCode::SUCCESS)
}

fn parse_range(text: &str) -> Result<(f64, f64), String> {
    let (a, b) = text
        .split_once("..")
        .ok_or_else(|| format!("`{text}` is not a range: use START..END, e.g. 1000..5000"))?;
    let parse = |s: &str| {
        s.trim()
            .parse::<f64>()
            .map_err(|_| format!("`{s}` in `{text}` is not a number"))
    };
    let (a, b) = (parse(a)?, parse(b)?);
    if a >= b || a.is_nan() || b.is_nan() {
        return Err(format!("range `{text}` is empty: START must be below END"));
    }
    Ok((a, b))
}

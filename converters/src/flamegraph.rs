//! Flame graph SVG of the bytes live at an instant ([`crate::profile`] picks them).
//!
//! Each live block becomes a folded line, root first, `outer;…;inner <bytes>`, its frames as
//! `file:line:function`; lines with the same stack add up. [`By::Site`](crate::profile::By)
//! keeps one level, the site. [`render`] draws them with
//! [inferno](https://github.com/jonhoo/inferno) (the Rust port of Brendan Gregg's
//! `flamegraph.pl`): a frame's width is the bytes live under it, and hovering shows
//! `name (1,234,567 bytes, 12.34%)`; the root reads `all (<total> bytes, 100%)`. Frames
//! narrower than 0.1% of the width are not drawn but stay in their parents' totals.
//!
//! ```
//! use memsnap_converters::flamegraph;
//! use memsnap_converters::profile::{LiveProfile, ProfileOptions};
//! use memsnap_format::{Action, Frame, Snapshot, TraceEntry};
//!
//! let mut snapshot = Snapshot::new(1);
//! let stack = snapshot.intern_stack(vec![
//!     Frame::new("forward", "model.py", 42),
//!     Frame::new("train_step", "train.py", 10),
//! ]);
//! let mut entry = TraceEntry::new(Action::Alloc, 0x1000, 2 << 20, 0);
//! entry.frames = Some(stack);
//! snapshot.device_traces.as_mut().unwrap()[0].push(entry);
//!
//! let live = LiveProfile::select(&snapshot, &ProfileOptions::default())?;
//! assert_eq!(flamegraph::folded_lines(&live), ["train.py:10:train_step;model.py:42:forward 2097152"]);
//! let mut svg = Vec::new();
//! flamegraph::render(&live, &mut svg)?;
//! assert!(String::from_utf8(svg)?.contains("all (2,097,152 bytes, 100%)"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::io::Write;

use inferno::flamegraph::color::{BasicPalette, Palette};
use inferno::flamegraph::{from_lines, Options};
use memsnap_format::FrameId;

use crate::profile::{frame_label, LiveProfile, ProfileError};

/// The most live bytes a flame graph draws (an exabyte; no device is near).
pub const MAX_DRAWN_BYTES: u64 = 1 << 60;

/// The live set as folded lines, root first (`f0;f1;…;leaf <bytes>`), one per distinct
/// stack, sorted. Frame text has `;` replaced by `,` and line breaks by spaces (they would
/// split the line); a block without frames is `<no frames>`.
pub fn folded_lines(profile: &LiveProfile<'_>) -> Vec<String> {
    let mut labels: BTreeMap<FrameId, String> = BTreeMap::new();
    let mut bytes_by_path: BTreeMap<String, u64> = BTreeMap::new();
    let mut path = String::new();
    for &id in &profile.allocations {
        let Some(allocation) = profile.allocation(id) else {
            continue;
        };
        path.clear();
        for frame in profile.frames_of(allocation) {
            if !path.is_empty() {
                path.push(';');
            }
            let label = labels
                .entry(frame)
                .or_insert_with(|| folded_frame(&frame_label(profile.snapshot, frame)));
            path.push_str(label);
        }
        if path.is_empty() {
            path.push_str(profile.no_frames_label(allocation));
        }
        let total = bytes_by_path.entry(path.clone()).or_default();
        *total = total.saturating_add(allocation.size);
    }
    bytes_by_path
        .into_iter()
        .map(|(path, bytes)| format!("{path} {bytes}"))
        .collect()
}

/// A frame's text made safe for a folded line.
fn folded_frame(label: &str) -> String {
    let text: String = label
        .chars()
        .map(|c| match c {
            ';' => ',',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect();
    let text = text.trim();
    if text.is_empty() {
        "<unnamed frame>".to_string()
    } else {
        text.to_string()
    }
}

/// The title: what is live, how much and when.
pub fn title(profile: &LiveProfile<'_>) -> String {
    format!(
        "Live memory {}: {} in {} blocks",
        profile.describe_instant(),
        memsnap_units::format_size(profile.bytes),
        profile.allocations.len()
    )
}

/// Writes the flame graph SVG of the live set (see the module docs). An empty live set gives
/// a small SVG that says so.
pub fn render(profile: &LiveProfile<'_>, out: &mut impl Write) -> Result<(), ProfileError> {
    let fail = |e: std::io::Error| ProfileError::Flamegraph {
        what: e.to_string(),
    };
    // inferno adds the counts in a usize; the live total saturates, so this bounds every sum.
    if profile.bytes >= MAX_DRAWN_BYTES {
        return Err(ProfileError::Implausible {
            bytes: profile.bytes,
        });
    }
    let lines = folded_lines(profile);
    if profile.bytes == 0 {
        return write_empty(profile, out).map_err(fail);
    }
    let mut options = Options::default();
    options.title = title(profile);
    options.subtitle = Some(profile.describe());
    options.count_name = "bytes".to_string();
    options.name_type = "Frame:".to_string();
    options.colors = Palette::Basic(BasicPalette::Mem);
    // Colours from the frame name, the same in every export.
    options.hash = true;
    options.deterministic = true;
    from_lines(&mut options, lines.iter().map(String::as_str), out).map_err(fail)
}

/// What inferno cannot draw (it refuses an empty input): a title and a line saying why.
fn write_empty(profile: &LiveProfile<'_>, out: &mut impl Write) -> std::io::Result<()> {
    let title = escape(&title(profile));
    let subtitle = escape(&profile.describe());
    let why = match profile.device {
        None => "nothing to show: the snapshot has no trace entries and no segments",
        Some(_) if profile.smaller_count > 0 => "every live block is smaller than --min-size",
        Some(_) => "no memory is live at this instant",
    };
    write!(
        out,
        r##"<?xml version="1.0" standalone="no"?>
<svg version="1.1" width="1200" height="90" xmlns="http://www.w3.org/2000/svg">
<rect x="0" y="0" width="100%" height="100%" fill="#eeeeee"/>
<text x="600" y="24" font-family="Verdana" font-size="17" text-anchor="middle">{title}</text>
<text x="600" y="48" font-family="Verdana" font-size="12" text-anchor="middle" fill="#a0a0a0">{subtitle}</text>
<text x="600" y="72" font-family="Verdana" font-size="12" text-anchor="middle">{why}</text>
<g><title>all (0 bytes, 100%)</title></g>
</svg>
"##
    )
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

//! # memsnap-plot
//!
//! Headless pictures of a snapshot's **active memory timeline**, for reports and CI artefacts
//! (`memsnap plot FILE -o out.png|svg`), and for the viewer's SVG export.
//!
//! The picture is the same stacked chart the viewer draws: each allocation is a band coloured
//! by its call site (the user's code that allocated it), by its category (parameter,
//! optimizer state, gradient, activation, temporary) or by the phase that allocated it
//! ([`ColourBy`]), stacked in allocation order and sliding down when something below it is
//! freed; memory from before the recorded window is grey-blue; allocations smaller than the
//! size threshold fold into one "smaller than X" band on top, so the stack's height is always
//! the exact total. Reserved memory is a dashed outline. The phases of each training step
//! (set-up, forward, backward, optimizer) are shaded behind the bands, and each phase's slope is
//! drawn over them with its rate.
//!
//! All geometry comes from [`memsnap_analysis::Layout`]; this crate only turns it into SVG
//! text, and rasterises that SVG with `resvg` for PNG. Text uses a font compiled into the
//! binary, so output does not depend on the machine's fonts.

use std::fmt::Write as _;

use memsnap_analysis::sites::top_frame;
use memsnap_analysis::{
    format_size, AllocId, Axis, Category, CurveKind, DeviceTimeline, LayoutRequest, Lifetime,
    PhaseKind, StepOptions,
};
use memsnap_format::Snapshot;

/// What can go wrong making a picture.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    #[error("device {device} is not in the snapshot (devices: {available:?})")]
    NoSuchDevice { device: i64, available: Vec<i64> },
    #[error("the snapshot has no trace entries or segments to plot")]
    Empty,
    #[error("analysis failed: {0}")]
    Analysis(#[from] memsnap_analysis::AnalysisError),
    #[error("invalid plot options: {what}")]
    InvalidOptions { what: String },
    #[error("rendering the PNG failed: {what}")]
    Render { what: String },
}

/// What to draw.
#[derive(Clone, Debug, PartialEq)]
pub struct PlotOptions {
    /// Device to draw; `None` picks the device with the longest trace.
    pub device: Option<i64>,
    /// Picture size in pixels.
    pub width: u32,
    pub height: u32,
    /// Event range `[start, end)` to draw; `None` is the whole trace.
    pub range: Option<(f64, f64)>,
    /// Allocations smaller than this fold into the residual band.
    pub min_size: u64,
    /// At most this many allocations get their own band.
    pub max_bands: usize,
    /// Shade the phases of the training steps and draw each phase's slope with its rate.
    pub show_steps: bool,
    /// What a band's colour says.
    pub colour_by: ColourBy,
    /// A title; `None` writes a default one.
    pub title: Option<String>,
    pub dark: bool,
}

impl Default for PlotOptions {
    fn default() -> Self {
        PlotOptions {
            device: None,
            width: 1600,
            height: 900,
            range: None,
            min_size: 0,
            max_bands: 5000,
            show_steps: true,
            colour_by: ColourBy::Site,
            title: None,
            dark: false,
        }
    }
}

/// What a band's colour says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ColourBy {
    /// The allocation's call site (the innermost frame of the user's code): one site, one colour.
    #[default]
    Site,
    /// Its category: parameter, optimizer state, gradient, activation, temporary, unknown.
    Category,
    /// The phase that allocated it: set-up, forward, backward, optimizer.
    Phase,
}

/// The colour of a category's bands.
pub fn category_colour(category: Category) -> &'static str {
    match category {
        Category::Parameter => "#4e79a7",
        Category::OptimizerState => "#b07aa1",
        Category::Gradient => "#f28e2b",
        Category::Activation => "#59a14f",
        Category::Temporary => "#edc948",
        Category::Unknown => "#9c9c9c",
    }
}

/// The colour of a phase's bands (and, lighter, of its shading).
pub fn phase_colour(kind: PhaseKind) -> &'static str {
    match kind {
        PhaseKind::Setup => "#7f7f7f",
        PhaseKind::Forward => "#1a9850",
        PhaseKind::Backward => "#d73027",
        PhaseKind::Optimizer => "#7b3294",
    }
}

/// The device PyTorch's viewer opens by default: the one with the longest trace (the lowest
/// device with segments when no trace has entries).
pub fn default_device(snapshot: &Snapshot) -> Option<i64> {
    let traces = snapshot.traces();
    let longest = traces
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .max_by_key(|(i, t)| (t.len(), std::cmp::Reverse(*i)))
        .map(|(i, _)| i as i64);
    longest.or_else(|| snapshot.segments.iter().map(|s| s.device).min())
}

const MARGIN_LEFT: f64 = 90.0;
const MARGIN_RIGHT: f64 = 24.0;
const MARGIN_TOP: f64 = 48.0;
const MARGIN_BOTTOM: f64 = 56.0;

struct Theme {
    background: &'static str,
    text: &'static str,
    grid: &'static str,
    residual: &'static str,
    before_window: &'static str,
    reserved: &'static str,
    forward: &'static str,
    backward: &'static str,
    step_line: &'static str,
}

const LIGHT: Theme = Theme {
    background: "#ffffff",
    text: "#202020",
    grid: "#e0e0e0",
    residual: "#b8b8b8",
    before_window: "#8da4bf",
    reserved: "#505050",
    forward: "#1a9850",
    backward: "#d73027",
    step_line: "#9a9a9a",
};

const DARK: Theme = Theme {
    background: "#1b1b1b",
    text: "#e8e8e8",
    grid: "#333333",
    residual: "#6a6a6a",
    before_window: "#5a7390",
    reserved: "#c8c8c8",
    forward: "#66bd63",
    backward: "#f46d43",
    step_line: "#777777",
};

/// Draws the timeline as an SVG document.
pub fn render_svg(snapshot: &Snapshot, options: &PlotOptions) -> Result<String, PlotError> {
    if options.width < 200
        || options.height < 150
        || options.width > 16384
        || options.height > 16384
    {
        return Err(PlotError::InvalidOptions {
            what: format!(
                "size {}x{} must be between 200x150 and 16384x16384",
                options.width, options.height
            ),
        });
    }
    let device = match options.device {
        Some(d) => d,
        None => default_device(snapshot).ok_or(PlotError::Empty)?,
    };
    let available = snapshot.devices();
    if !available.contains(&device) {
        return Err(PlotError::NoSuchDevice { device, available });
    }
    let timeline = DeviceTimeline::build(snapshot, device)?;
    let theme = if options.dark { &DARK } else { &LIGHT };

    let plot_w = f64::from(options.width) - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_h = f64::from(options.height) - MARGIN_TOP - MARGIN_BOTTOM;
    let mut request = LayoutRequest::whole(&timeline, plot_w.round().max(1.0) as u32);
    if let Some((start, end)) = options.range {
        if !start.is_finite() || !end.is_finite() || start >= end {
            return Err(PlotError::InvalidOptions {
                what: format!("range {start}..{end} is empty"),
            });
        }
        request.start = start.max(0.0);
        request.end = end.min(request.end).max(request.start + 1.0);
    }
    request.axis = Axis::Event;
    request.min_size = options.min_size;
    request.max_bands = options.max_bands;
    request.lifetime = Lifetime::Active;
    let layout = timeline.layout(&request)?;

    let reserved = timeline.curves().get(CurveKind::Reserved);
    let reserved_max = layout
        .columns
        .iter()
        .map(|c| reserved.at(c.event))
        .max()
        .unwrap_or(0);
    let y_max = nice_ceiling(layout.y_max.max(reserved_max).max(1));
    let x_of = |x: f64| MARGIN_LEFT + (x - request.start) / (request.end - request.start) * plot_w;
    let y_of = |bytes: u64| MARGIN_TOP + plot_h - (bytes as f64 / y_max as f64) * plot_h;

    let mut svg = String::with_capacity(64 * 1024);
    let (w, h) = (options.width, options.height);
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="Ubuntu, sans-serif">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{w}" height="{h}" fill="{}"/>"#,
        theme.background
    );

    // Title.
    let peak = timeline.peak(CurveKind::Active);
    let title = options.title.clone().unwrap_or_else(|| {
        format!(
            "Active memory, device {device}: peak {} at event {}",
            format_size(peak.bytes),
            peak.event
        )
    });
    let _ = writeln!(
        svg,
        r#"<text x="{MARGIN_LEFT}" y="30" font-size="18" fill="{}">{}</text>"#,
        theme.text,
        escape(&title)
    );

    // Grid and axes.
    for i in 0..=5u64 {
        let bytes = y_max / 5 * i;
        let y = y_of(bytes);
        let _ = writeln!(
            svg,
            r#"<line x1="{MARGIN_LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="1"/>"#,
            MARGIN_LEFT + plot_w,
            theme.grid
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="end" fill="{}">{}</text>"#,
            MARGIN_LEFT - 8.0,
            y + 4.0,
            theme.text,
            escape(&format_size(bytes))
        );
    }
    for i in 0..=6u32 {
        let x_axis = request.start + (request.end - request.start) * f64::from(i) / 6.0;
        let x = x_of(x_axis);
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" font-size="12" text-anchor="middle" fill="{}">{}</text>"#,
            MARGIN_TOP + plot_h + 18.0,
            theme.text,
            x_axis.round()
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle" fill="{}">trace event</text>"#,
        MARGIN_LEFT + plot_w / 2.0,
        MARGIN_TOP + plot_h + 40.0,
        theme.text
    );

    // Everything data-driven is clipped to the plot area, so a step that starts before the
    // visible range is cut at the edge instead of being bent.
    let _ = writeln!(
        svg,
        r#"<clipPath id="plot-area"><rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{plot_w:.1}" height="{plot_h:.1}"/></clipPath><g clip-path="url(#plot-area)">"#
    );

    let analysis = timeline.steps(&StepOptions::default());
    let visible = |s: u32, e: u32| f64::from(e + 1) > request.start && f64::from(s) < request.end;

    // Phases: shaded behind the bands.
    if options.show_steps {
        for (_, phase) in analysis.phases() {
            if !visible(phase.start_event, phase.end_event) {
                continue;
            }
            let x0 = x_of(f64::from(phase.start_event));
            let x1 = x_of(f64::from(phase.end_event) + 1.0);
            let _ = writeln!(
                svg,
                r#"<rect x="{x0:.1}" y="{MARGIN_TOP}" width="{:.1}" height="{plot_h:.1}" fill="{}" fill-opacity="{}"/>"#,
                (x1 - x0).max(0.0),
                phase_colour(phase.kind),
                if options.dark { 0.16 } else { 0.09 }
            );
        }
    }

    // Bands.
    let replay = timeline.replay();
    let mut sites = std::collections::HashMap::new();
    let _ = writeln!(svg, r#"<g stroke="none">"#);
    for band in &layout.bands {
        let Some(alloc) = replay.get(band.alloc) else {
            continue;
        };
        let colour = match options.colour_by {
            _ if alloc.before_window() && options.colour_by != ColourBy::Category => {
                theme.before_window.to_string()
            }
            ColourBy::Site => {
                let site = alloc.stack.and_then(|stack| {
                    *sites
                        .entry(stack)
                        .or_insert_with(|| top_frame(snapshot, stack).map(|f| f.0))
                });
                site_colour(site, band.alloc)
            }
            ColourBy::Category => analysis
                .categories
                .get(band.alloc.0 as usize)
                .map_or(theme.residual, |c| category_colour(*c))
                .to_string(),
            ColourBy::Phase => alloc
                .alloc_event
                .and_then(|e| analysis.phase_at(e))
                .map_or(theme.residual, |(_, p)| phase_colour(p.kind))
                .to_string(),
        };
        let mut top = String::new();
        let mut bottom = Vec::with_capacity(band.steps.len() * 2);
        for (i, step) in band.steps.iter().enumerate() {
            let x0 = x_of(step.x);
            let x1 = x_of(band.steps.get(i + 1).map_or(band.x_end, |s| s.x));
            let y_bottom = y_of(step.bottom);
            let y_top = y_of(step.bottom.saturating_add(band.size));
            let _ = write!(
                top,
                "{}{x0:.1},{y_top:.1} {x1:.1},{y_top:.1} ",
                if i == 0 { "M" } else { "L" }
            );
            bottom.push((x0, x1, y_bottom));
        }
        for (x0, x1, y) in bottom.iter().rev() {
            let _ = write!(top, "L{x1:.1},{y:.1} {x0:.1},{y:.1} ");
        }
        let _ = writeln!(svg, r#"<path d="{}Z" fill="{colour}"/>"#, top.trim_end());
    }
    let _ = writeln!(svg, "</g>");

    // Residual band: between the drawn bands and the total, per column.
    let mut residual = String::new();
    for (i, c) in layout.columns.iter().enumerate() {
        let _ = write!(
            residual,
            "{}{:.1},{:.1} {:.1},{:.1} ",
            if i == 0 { "M" } else { "L" },
            x_of(c.x0),
            y_of(c.total_bytes),
            x_of(c.x1),
            y_of(c.total_bytes)
        );
    }
    for c in layout.columns.iter().rev() {
        let _ = write!(
            residual,
            "L{:.1},{:.1} {:.1},{:.1} ",
            x_of(c.x1),
            y_of(c.drawn_bytes),
            x_of(c.x0),
            y_of(c.drawn_bytes)
        );
    }
    if !layout.columns.is_empty() {
        let _ = writeln!(
            svg,
            r#"<path d="{}Z" fill="{}" fill-opacity="0.85"/>"#,
            residual.trim_end(),
            theme.residual
        );
    }

    // Reserved memory outline.
    let mut outline = String::new();
    for (i, c) in layout.columns.iter().enumerate() {
        let y = y_of(reserved.at(c.event));
        let _ = write!(
            outline,
            "{}{:.1},{y:.1} {:.1},{y:.1} ",
            if i == 0 { "M" } else { "L" },
            x_of(c.x0),
            x_of(c.x1)
        );
    }
    if reserved_max > 0 {
        let _ = writeln!(
            svg,
            r#"<path d="{}" fill="none" stroke="{}" stroke-width="1.5" stroke-dasharray="6 4"/>"#,
            outline.trim_end(),
            theme.reserved
        );
    }

    // Steps: boundaries, and each phase's slope with its rate.
    let mut kinds_shown: Vec<PhaseKind> = Vec::new();
    if options.show_steps {
        for (step, phase) in analysis.phases() {
            if !visible(phase.start_event, phase.end_event) {
                continue;
            }
            if !kinds_shown.contains(&phase.kind) {
                kinds_shown.push(phase.kind);
            }
            let (x0, x1) = (
                x_of(f64::from(phase.start_event)),
                x_of(f64::from(phase.end_event) + 1.0),
            );
            let first_of_step =
                step.is_some_and(|i| analysis.steps[i].start_event == phase.start_event);
            if first_of_step {
                let _ = writeln!(
                    svg,
                    r#"<line x1="{x0:.1}" y1="{MARGIN_TOP}" x2="{x0:.1}" y2="{:.1}" stroke="{}" stroke-dasharray="2 3"/>"#,
                    MARGIN_TOP + plot_h,
                    theme.step_line
                );
            }
            let (y0, y1) = (y_of(phase.start_bytes), y_of(phase.end_bytes));
            let colour = match phase.kind {
                PhaseKind::Forward => theme.forward,
                PhaseKind::Backward => theme.backward,
                other => phase_colour(other),
            };
            let _ = writeln!(
                svg,
                r#"<line x1="{x0:.1}" y1="{y0:.1}" x2="{x1:.1}" y2="{y1:.1}" stroke="{colour}" stroke-width="2.5"/>"#
            );
            // The rate, where there is room for it.
            if x1 - x0 >= 90.0 {
                let rate = match phase.slope.bytes_per_s {
                    Some(r) => format!(
                        "{}{}/s",
                        sign(phase.slope.bytes),
                        format_size(r.abs() as u64)
                    ),
                    None => format!(
                        "{}{}/event",
                        sign(phase.slope.bytes),
                        format_size(phase.slope.bytes_per_event.abs() as u64)
                    ),
                };
                let _ = writeln!(
                    svg,
                    r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle" fill="{colour}">{}</text>"#,
                    (x0 + x1) / 2.0,
                    (y0 + y1) / 2.0 - 6.0,
                    escape(&rate)
                );
            }
        }
    }
    let _ = writeln!(svg, "</g>");

    // Legend: only what the picture shows.
    let threshold = layout.drawn_min_size.max(options.min_size);
    let has_residual = layout.columns.iter().any(|c| c.total_bytes > c.drawn_bytes);
    let has_before_window = options.colour_by != ColourBy::Category
        && layout
            .bands
            .iter()
            .any(|b| replay.get(b.alloc).is_some_and(|a| a.before_window()));
    let mut legend: Vec<(&str, String)> = Vec::new();
    if has_before_window {
        legend.push((
            theme.before_window,
            "allocated before the recorded window".into(),
        ));
    }
    if has_residual {
        legend.push((
            theme.residual,
            format!("allocations smaller than {}", format_size(threshold)),
        ));
    }
    let kind_colour = |k: PhaseKind| match k {
        PhaseKind::Forward => theme.forward,
        PhaseKind::Backward => theme.backward,
        other => phase_colour(other),
    };
    kinds_shown.sort();
    for kind in kinds_shown {
        legend.push((kind_colour(kind), kind.name().to_string()));
    }
    if options.colour_by == ColourBy::Category {
        let mut shown: Vec<Category> = layout
            .bands
            .iter()
            .filter_map(|b| analysis.categories.get(b.alloc.0 as usize).copied())
            .collect();
        shown.sort();
        shown.dedup();
        for c in shown {
            legend.push((category_colour(c), c.label().to_string()));
        }
    }
    let mut lx = MARGIN_LEFT + plot_w;
    for (colour, label) in legend.iter().rev() {
        lx -= 24.0 + 7.0 * label.len() as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{lx:.1}" y="20" width="12" height="12" fill="{colour}"/><text x="{:.1}" y="31" font-size="12" fill="{}">{}</text>"#,
            lx + 16.0,
            theme.text,
            escape(label)
        );
    }
    let _ = writeln!(svg, "</svg>");
    Ok(svg)
}

/// Rasterises an SVG made by [`render_svg`] to PNG bytes.
pub fn svg_to_png(svg: &str) -> Result<Vec<u8>, PlotError> {
    use resvg::{tiny_skia, usvg};
    let render_err = |what: String| PlotError::Render { what };
    let mut options = usvg::Options::default();
    {
        let db = options.fontdb_mut();
        db.load_font_data(epaint_default_fonts::UBUNTU_LIGHT.to_vec());
        let family = db
            .faces()
            .next()
            .and_then(|f| f.families.first().map(|(name, _)| name.clone()));
        if let Some(family) = family {
            db.set_sans_serif_family(family);
        }
    }
    let tree = usvg::Tree::from_str(svg, &options).map_err(|e| render_err(e.to_string()))?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| render_err(format!("cannot allocate {size:?} pixels")))?;
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap.encode_png().map_err(|e| render_err(e.to_string()))
}

/// Draws the timeline as PNG bytes.
pub fn render_png(snapshot: &Snapshot, options: &PlotOptions) -> Result<Vec<u8>, PlotError> {
    svg_to_png(&render_svg(snapshot, options)?)
}

fn sign(bytes: i64) -> &'static str {
    if bytes < 0 {
        "-"
    } else {
        "+"
    }
}

/// A stable, well-spread colour per call site (so one site keeps its colour across views).
fn site_colour(site: Option<u32>, alloc: AllocId) -> String {
    let key = site.map_or(u64::from(alloc.0) ^ 0x5bd1_e995, u64::from);
    let mut h = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^= h >> 29;
    let hue = (h % 360) as f64;
    let light = 48.0 + ((h >> 16) % 16) as f64;
    format!("hsl({hue:.0},62%,{light:.0}%)")
}

/// The next "round" number of bytes above `bytes` (1, 2 or 5 times a power of 1024 or 10),
/// so axis labels read well.
fn nice_ceiling(bytes: u64) -> u64 {
    let mut unit = 1u64;
    while unit.saturating_mul(1024) <= bytes {
        unit = unit.saturating_mul(1024);
    }
    for m in [1u64, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 1024] {
        let candidate = unit.saturating_mul(m);
        if candidate >= bytes {
            return candidate;
        }
    }
    bytes
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ceiling_rounds_up_to_readable_values() {
        assert_eq!(nice_ceiling(1), 1);
        assert_eq!(nice_ceiling(3 << 30), 5 << 30);
        assert_eq!(nice_ceiling(700 << 20), 1000 << 20);
        assert!(nice_ceiling(u64::MAX / 2) >= u64::MAX / 2);
    }

    #[test]
    fn escape_makes_text_safe_for_svg() {
        assert_eq!(escape("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
    }
}

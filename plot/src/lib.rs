//! # memsnap-plot
//!
//! The timeline picture of a snapshot's **active memory**, once, for everything that draws it:
//! `memsnap plot FILE -o out.png|svg` for reports and CI artefacts, and the viewer, which paints
//! the same [`scene`] with egui and exports it through the same [`svg`] writer.
//!
//! * [`scene`]: the picture as data, UI-free: each allocation is a band coloured by its call
//!   site (the user's code that allocated it), by its category or by the phase that allocated
//!   it ([`ColourBy`]), stacked in allocation order and sliding down when something below it is
//!   freed; memory from before the recorded window in a muted grey; allocations smaller than
//!   the size threshold folded into one "smaller than X" band on top, so the stack's height is
//!   always the exact total; reserved memory as an outline; the phases of each training step
//!   (set-up, forward, backward, optimizer) shaded behind the bands, with each phase's slope
//!   and rate drawn over them; step marks, axis ticks and the legend.
//! * [`palette`]: every colour, so one site has one colour everywhere.
//! * [`svg`]: a scene as SVG; `svg_to_png` rasterises it with `resvg` (feature `png`, on by
//!   default; the viewer, which paints scenes with egui, leaves it off).
//! * [`sites`]: per-stack lookups (user-code site, search matches) computed once.
//! * [`text`]: durations, rates and phase names as written in pictures and tables.
//!
//! All geometry comes from [`memsnap_analysis::Layout`]. This crate has no UI dependency.
//! Text in PNGs uses a font compiled into the binary, so output does not depend on the
//! machine's fonts.

pub mod palette;
pub mod scene;
pub mod sites;
pub mod svg;
pub mod text;

use memsnap_analysis::{
    format_size, Axis, CurveKind, DeviceTimeline, LayoutRequest, Lifetime, StepOptions,
};
use memsnap_format::Snapshot;

use scene::{Align, BandStyle, LegendStyle, Mapping, Pos, Rect, Scene, SceneModel, Text, Theme};
use sites::StackSites;

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

pub use palette::{category_colour, phase_colour, Colour, ColourBy};

const MARGIN_LEFT: f32 = 90.0;
const MARGIN_RIGHT: f32 = 24.0;
/// Room for the title and, below it, the legend.
const MARGIN_TOP: f32 = 72.0;
const MARGIN_BOTTOM: f32 = 56.0;

/// Builds the picture `options` ask for as a [`Scene`].
pub fn render_scene(snapshot: &Snapshot, options: &PlotOptions) -> Result<Scene, PlotError> {
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
        None => DeviceTimeline::default_device(snapshot).ok_or(PlotError::Empty)?,
    };
    let available = snapshot.devices();
    if !available.contains(&device) {
        return Err(PlotError::NoSuchDevice { device, available });
    }
    let timeline = DeviceTimeline::build(snapshot, device)?;
    let steps = timeline.steps(&StepOptions::default());
    let sites = StackSites::new(snapshot);
    if options.colour_by == ColourBy::Module {
        sites.find_modules(snapshot);
    }
    let model = SceneModel {
        timeline: &timeline,
        steps: &steps,
        sites: &sites,
    };
    let theme = if options.dark {
        Theme::DARK
    } else {
        Theme::LIGHT
    };

    let (width, height) = (options.width as f32, options.height as f32);
    let plot = Rect::from_x_y(
        MARGIN_LEFT,
        width - MARGIN_RIGHT,
        MARGIN_TOP,
        height - MARGIN_BOTTOM,
    );
    let mut request = LayoutRequest::whole(&timeline, plot.width().round().max(1.0) as u32);
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

    // An import whose source records no reserved memory has none to outline (not 0 B).
    let reserved_known = timeline.replay().reserved_known();
    let reserved = if reserved_known {
        scene::reserved_max(&timeline, &layout)
    } else {
        0
    };
    let map = Mapping {
        plot,
        start: request.start,
        end: request.end,
        y_max: nice_ceiling(layout.y_max.max(reserved).max(1)) as f64,
        axis: Axis::Event,
    };
    let style = BandStyle {
        colour_by: options.colour_by,
        dark: options.dark,
        search: None,
        show_reserved: reserved_known,
    };
    let bands = scene::band_layer(&model, &layout, &style, &map);
    // Every step and phase, blended into its column, while they fit; more steps than
    // half-pixel columns (68,000 steps of a 10M-entry run across 1,500 pixels) are thinned as
    // the viewer thins them: the first and last step of each column. Rasterising every sliver
    // of such a run cost most of `memsnap plot`'s time and could show nothing more.
    let dense = steps.steps.len() as f32 > 2.0 * plot.width();
    let steps = if options.show_steps && dense {
        scene::StepDetail::Thinned
    } else if options.show_steps {
        scene::StepDetail::All
    } else {
        scene::StepDetail::Hidden
    };
    let mut overlay = scene::overlay(&model, &map, 0.0, &theme, steps);
    scene::place_labels(&mut overlay, plot, &mut scene::estimate_text_size);
    let legend = scene::legend(
        &model,
        &LegendStyle {
            colour_by: options.colour_by,
            dark: options.dark,
            show_steps: options.show_steps,
            show_reserved: reserved_known,
            min_size: options.min_size,
        },
    );
    let peak = timeline.peak(CurveKind::Active);
    let title = options.title.clone().unwrap_or_else(|| {
        format!(
            "Active memory, device {device}: peak {} at event {}",
            format_size(peak.bytes),
            peak.event
        )
    });
    Ok(Scene {
        origin: Pos::new(0.0, 0.0),
        size: Pos::new(width, height),
        theme,
        plot,
        title: Some(Text {
            pos: Pos::new(MARGIN_LEFT, 30.0),
            align: (Align::Min, Align::Max),
            text: title,
            colour: theme.text,
            size: 18.0,
        }),
        bands,
        overlay,
        legend,
    })
}

/// Draws the timeline as an SVG document.
pub fn render_svg(snapshot: &Snapshot, options: &PlotOptions) -> Result<String, PlotError> {
    Ok(svg::write_svg(&render_scene(snapshot, options)?))
}

/// Rasterises an SVG made by [`render_svg`] to PNG bytes (feature `png`, on by default).
#[cfg(feature = "png")]
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

/// Draws the timeline as PNG bytes (feature `png`, on by default).
#[cfg(feature = "png")]
pub fn render_png(snapshot: &Snapshot, options: &PlotOptions) -> Result<Vec<u8>, PlotError> {
    svg_to_png(&render_svg(snapshot, options)?)
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
}

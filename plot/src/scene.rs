//! The timeline picture as data: what `memsnap plot` writes and what the viewer paints.
//!
//! A scene is built from a [`DeviceTimeline`], its [`StepAnalysis`] and a [`Layout`] of the
//! visible range, mapped onto a plot rectangle by a [`Mapping`]. It holds only shapes, colours
//! and words (no UI types), in three parts that change at different rates:
//!
//! * [`BandLayer`] ([`band_layer`]): one rect per band step in its colour (site, category or
//!   phase, [`ColourBy`]), the residual "smaller than" band, the spike envelope and the
//!   reserved outline. The viewer caches it (and its mesh) while the view rests.
//! * [`Overlay`] ([`overlay`]): phase shading, grid lines with their tick labels, step marks,
//!   each phase's slope, and the labels placed by [`place_labels`] around a text measurer.
//! * the legend ([`legend`]): what each colour means.
//!
//! [`crate::svg::write_svg`] turns a [`Scene`] into SVG; the viewer paints the same parts with
//! egui and keeps its interaction (hover, pin, zoom, pan, the overview strip) to itself.

use memsnap_analysis::{
    AllocId, Allocation, Axis, Category, CurveKind, DeviceTimeline, Layout, Phase, PhaseKind, Step,
    StepAnalysis,
};

use crate::palette::{self, Colour, ColourBy};
use crate::sites::{StackMatch, StackSites};
use crate::text::{format_duration_us, phase_label, slope_rate_text};

/// A point in scene units (SVG pixels, or egui points in the viewer).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pos {
    pub x: f32,
    pub y: f32,
}

impl Pos {
    pub const fn new(x: f32, y: f32) -> Pos {
        Pos { x, y }
    }
}

/// An axis-aligned rectangle, `min` top-left.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rect {
    pub min: Pos,
    pub max: Pos,
}

impl Rect {
    /// The rectangle between two x and two y values, in any order.
    pub fn from_x_y(x0: f32, x1: f32, y0: f32, y1: f32) -> Rect {
        Rect {
            min: Pos::new(x0.min(x1), y0.min(y1)),
            max: Pos::new(x0.max(x1), y0.max(y1)),
        }
    }

    pub fn from_min_size(min: Pos, w: f32, h: f32) -> Rect {
        Rect {
            min,
            max: Pos::new(min.x + w, min.y + h),
        }
    }

    pub fn width(&self) -> f32 {
        self.max.x - self.min.x
    }

    pub fn height(&self) -> f32 {
        self.max.y - self.min.y
    }

    pub fn contains_x(&self, x: f32) -> bool {
        self.min.x <= x && x <= self.max.x
    }

    pub fn contains_rect(&self, other: Rect) -> bool {
        self.min.x <= other.min.x
            && self.min.y <= other.min.y
            && other.max.x <= self.max.x
            && other.max.y <= self.max.y
    }

    pub fn intersects(&self, other: Rect) -> bool {
        self.min.x <= other.max.x
            && other.min.x <= self.max.x
            && self.min.y <= other.max.y
            && other.min.y <= self.max.y
    }

    /// Grown by `dx` left and right and `dy` up and down.
    pub fn expand2(&self, dx: f32, dy: f32) -> Rect {
        Rect {
            min: Pos::new(self.min.x - dx, self.min.y - dy),
            max: Pos::new(self.max.x + dx, self.max.y + dy),
        }
    }
}

/// A polyline.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub points: Vec<Pos>,
    pub colour: Colour,
    pub width: f32,
}

/// Horizontal and vertical anchoring of a text at its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Min,
    Center,
    Max,
}

/// A text, anchored at `pos` by `(horizontal, vertical)` alignment.
#[derive(Clone, Debug, PartialEq)]
pub struct Text {
    pub pos: Pos,
    pub align: (Align, Align),
    pub text: String,
    pub colour: Colour,
    pub size: f32,
}

/// The size of text in the plot: ticks, step marks, rates.
pub const FONT_SIZE: f32 = 11.0;
/// Phases narrower than this get no slope line: it would be a vertical tick.
pub const MIN_SLOPE_WIDTH: f32 = 4.0;
/// No glyph of the label font is narrower than this (a fifth of the font size), so a text
/// of `n` characters needs at least `n` times it: a bound that saves measuring.
const MIN_GLYPH_WIDTH: f32 = FONT_SIZE * 0.2;

/// The colours a scene takes from its surroundings (the viewer passes egui's visuals).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Theme {
    pub dark: bool,
    /// Around the plot.
    pub background: Colour,
    /// Inside the plot.
    pub plot_background: Colour,
    pub text: Colour,
    /// The axis name.
    pub weak_text: Colour,
    pub grid: Colour,
    /// Behind slope lines and rate labels, so they read over the bands.
    pub label_halo: Colour,
}

impl Theme {
    pub const LIGHT: Theme = Theme {
        dark: false,
        background: Colour::rgb(255, 255, 255),
        plot_background: Colour::rgb(255, 255, 255),
        text: Colour::rgb(32, 32, 32),
        weak_text: Colour::rgb(110, 110, 110),
        grid: Colour::rgb(224, 224, 224),
        label_halo: Colour::rgba(255, 255, 255, 204),
    };

    pub const DARK: Theme = Theme {
        dark: true,
        background: Colour::rgb(27, 27, 27),
        plot_background: Colour::rgb(27, 27, 27),
        text: Colour::rgb(232, 232, 232),
        weak_text: Colour::rgb(140, 140, 140),
        grid: Colour::rgb(51, 51, 51),
        label_halo: Colour::rgba(27, 27, 27, 204),
    };
}

/// What a scene is drawn from.
#[derive(Clone, Copy)]
pub struct SceneModel<'a> {
    pub timeline: &'a DeviceTimeline,
    pub steps: &'a StepAnalysis,
    /// The user-code site of each stack (band colours by site).
    pub sites: &'a StackSites,
}

/// Axis values (event index or microseconds) and bytes to scene positions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mapping {
    pub plot: Rect,
    /// The visible axis range.
    pub start: f64,
    pub end: f64,
    /// Bytes at the top of the plot.
    pub y_max: f64,
    pub axis: Axis,
}

impl Mapping {
    pub fn x(&self, x: f64) -> f32 {
        let span = self.end - self.start;
        self.plot.min.x + ((x - self.start) / span * f64::from(self.plot.width())) as f32
    }

    pub fn y(&self, bytes: u64) -> f32 {
        let f = (bytes as f64 / self.y_max.max(1.0)).min(1.2) as f32;
        self.plot.max.y - f * self.plot.height()
    }

    /// The axis value at a scene x.
    pub fn axis_at(&self, x: f32) -> f64 {
        self.start
            + f64::from(x - self.plot.min.x) / f64::from(self.plot.width().max(1.0))
                * (self.end - self.start)
    }

    /// The bytes at a scene y.
    pub fn bytes_at(&self, y: f32) -> u64 {
        let f = f64::from((self.plot.max.y - y) / self.plot.height());
        (f * self.y_max).max(0.0) as u64
    }

    /// The x of an event position on this axis.
    pub fn event_x(&self, timeline: &DeviceTimeline, event: f64) -> f32 {
        self.x(event_to_axis(timeline, self.axis, event))
    }
}

/// Whether the trace has a usable wall-time axis (times that advance).
pub fn has_time_axis(timeline: &DeviceTimeline) -> bool {
    let time = timeline.time();
    time.len() > 1 && time.span().is_some_and(|(first, last)| last > first)
}

/// Event position → axis position.
pub fn event_to_axis(timeline: &DeviceTimeline, axis: Axis, event: f64) -> f64 {
    match axis {
        Axis::Event => event,
        Axis::Time => timeline.time().time_at(event).unwrap_or(event),
    }
}

/// Axis position → event position.
pub fn axis_to_event(timeline: &DeviceTimeline, axis: Axis, x: f64) -> f64 {
    match axis {
        Axis::Event => x,
        Axis::Time => timeline.time().event_at(x).unwrap_or(x),
    }
}

// ---- bands -------------------------------------------------------------------------------

/// How the bands are coloured besides their geometry.
#[derive(Clone, Copy)]
pub struct BandStyle<'a> {
    pub colour_by: ColourBy,
    pub dark: bool,
    /// Bands whose stack does not match are faded.
    pub search: Option<&'a StackMatch>,
    pub show_reserved: bool,
}

/// The bands of a layout, the residual band, the spike envelope and the reserved outline.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BandLayer {
    /// Every filled rectangle in drawing order: the bands' steps, then the residual band,
    /// then the envelope.
    pub rects: Vec<(Rect, Colour)>,
    /// For each band, its allocation and its rects (`rects[start..end]`).
    pub bands: Vec<(AllocId, usize, usize)>,
    /// `rects[bands_end..residual_end]` is the residual band, the rest the envelope.
    pub bands_end: usize,
    pub residual_end: usize,
    /// The reserved-memory outline.
    pub reserved: Option<Line>,
}

/// The colour of an allocation's band. Memory from before the recorded window keeps its own
/// muted colour in every mode.
pub fn band_colour(
    model: &SceneModel<'_>,
    id: AllocId,
    allocation: &Allocation,
    colour_by: ColourBy,
    dark: bool,
) -> Colour {
    if allocation.before_window() || allocation.origin == memsnap_analysis::Origin::Unattributed {
        return palette::before_window(dark);
    }
    match colour_by {
        ColourBy::Site => palette::site_colour(model.sites.site(allocation.stack)),
        ColourBy::Category => model
            .steps
            .categories
            .get(id.0 as usize)
            .map_or(palette::NO_SITE, |&c| palette::category_colour(c)),
        ColourBy::Phase => allocation
            .alloc_event()
            .and_then(|e| model.steps.phase_at(e))
            .map_or(palette::NO_SITE, |(_, phase)| {
                palette::phase_colour(phase.kind)
            }),
        ColourBy::Module => {
            // A run recorded with `memsnap.torch.enable(modules=True)` names its module
            // calls: those paths colour the bands; else the stack's chain of forwards.
            let paths = model.timeline.module_paths();
            let key = if paths.is_empty() {
                model.sites.module(allocation.stack)
            } else {
                paths.of(id.0 as usize).map(crate::sites::module_path_key)
            };
            palette::module_colour(key)
        }
    }
}

/// Builds the band layer of a layout.
pub fn band_layer(
    model: &SceneModel<'_>,
    layout: &Layout,
    style: &BandStyle<'_>,
    map: &Mapping,
) -> BandLayer {
    let replay = model.timeline.replay();
    let columns = &layout.columns;
    let mut out = BandLayer::default();
    out.rects.reserve(layout.bands.len() * 2 + columns.len());
    out.bands.reserve(layout.bands.len());
    for band in &layout.bands {
        let Some(a) = replay.get(band.alloc) else {
            continue;
        };
        let mut colour = band_colour(model, band.alloc, a, style.colour_by, style.dark);
        if style.search.is_some_and(|m| !m.matches(a.stack)) {
            colour = palette::unmatched(style.dark);
        }
        let start = out.rects.len();
        for (i, step) in band.steps.iter().enumerate() {
            let x1 = band.steps.get(i + 1).map_or(band.x_end, |next| next.x);
            let rect = Rect::from_x_y(
                map.x(step.x),
                map.x(x1),
                map.y(step.bottom.saturating_add(band.size)),
                map.y(step.bottom),
            );
            out.rects.push((rect, colour));
        }
        out.bands.push((band.alloc, start, out.rects.len()));
    }
    out.bands_end = out.rects.len();
    // The residual band, merged over runs of equal columns.
    let residual = palette::residual(style.dark);
    let push_residual = |rects: &mut Vec<(Rect, Colour)>, x0: f64, x1: f64, lo, hi| {
        if hi > lo {
            let rect = Rect::from_x_y(map.x(x0), map.x(x1), map.y(hi), map.y(lo));
            rects.push((rect, residual));
        }
    };
    let mut run: Option<(usize, u64, u64)> = None;
    for (c, col) in columns.iter().enumerate() {
        let key = (col.drawn_bytes, col.total_bytes);
        match run {
            Some((_, lo, hi)) if (lo, hi) == key => {}
            _ => {
                if let Some((start, lo, hi)) = run {
                    push_residual(&mut out.rects, columns[start].x0, col.x0, lo, hi);
                }
                run = Some((c, key.0, key.1));
            }
        }
    }
    if let (Some((start, lo, hi)), Some(last)) = (run, columns.last()) {
        push_residual(&mut out.rects, columns[start].x0, last.x1, lo, hi);
    }
    out.residual_end = out.rects.len();
    // Spikes shorter than a column: a thin envelope line.
    let envelope = palette::envelope(style.dark);
    for col in columns {
        if col.total_max > col.total_bytes || col.total_min < col.total_bytes {
            let x = map.x(col.x0);
            let rect = Rect::from_x_y(x, x + 1.0, map.y(col.total_max), map.y(col.total_min));
            out.rects.push((rect, envelope));
        }
    }
    if style.show_reserved {
        let points = reserved_outline(model.timeline, layout, map);
        if points.len() >= 2 {
            out.reserved = Some(Line {
                points,
                colour: palette::reserved(style.dark),
                width: 1.5,
            });
        }
    }
    out
}

/// A step line along the highest reserved value of each column.
fn reserved_outline(timeline: &DeviceTimeline, layout: &Layout, map: &Mapping) -> Vec<Pos> {
    let reserved = &timeline.curves().reserved;
    let mut points = Vec::with_capacity(layout.columns.len() * 2);
    let mut last: Option<u64> = None;
    for (c, col) in layout.columns.iter().enumerate() {
        let next_event = layout
            .columns
            .get(c + 1)
            .map_or(col.event + 1, |n| n.event.max(col.event + 1));
        let value = timeline
            .curve_envelope(CurveKind::Reserved, col.event, next_event, 1)
            .ok()
            .and_then(|v| v.first().map(|(_, hi)| *hi))
            .unwrap_or_else(|| reserved.at(col.event));
        let x = map.x(col.x0);
        if last != Some(value) {
            if let Some(prev) = last {
                points.push(Pos::new(x, map.y(prev)));
            }
            points.push(Pos::new(x, map.y(value)));
            last = Some(value);
        }
    }
    if let (Some(col), Some(value)) = (layout.columns.last(), last) {
        points.push(Pos::new(map.x(col.x1), map.y(value)));
    }
    points
}

/// The highest reserved value in a layout's columns (for the y scale).
pub fn reserved_max(timeline: &DeviceTimeline, layout: &Layout) -> u64 {
    let (Some(first), Some(last)) = (layout.columns.first(), layout.columns.last()) else {
        return 0;
    };
    timeline
        .curve_envelope(CurveKind::Reserved, first.event, last.event + 1, 1)
        .ok()
        .and_then(|v| v.first().map(|(_, hi)| *hi))
        .unwrap_or(0)
}

// ---- overlay -----------------------------------------------------------------------------

/// A training step's mark: a line at its start, and what its label says.
#[derive(Clone, Debug, PartialEq)]
pub struct StepMark {
    pub line: Line,
    /// The step's number.
    pub index: usize,
    pub warmup: bool,
    pub partial: bool,
    /// Width available to the label (up to the next mark or the plot's edge).
    pub room: f32,
    /// Closer than `MIN_MARK_GAP` (4 points) to the last mark drawn: its line is not drawn.
    pub crowded: bool,
}

impl StepMark {
    /// The labels the mark could carry, longest first: `step 3 · warm-up`, `step 3`, `3`.
    ///
    /// Made on demand: zoomed out on a long run, tens of thousands of marks are visible and
    /// almost none has room for a label.
    pub fn labels(&self) -> [String; 3] {
        let short = format!("step {}", self.index);
        let long = if self.warmup {
            format!("{short} · warm-up")
        } else if self.partial {
            format!("{short} · partial")
        } else {
            short.clone()
        };
        [long, short, self.index.to_string()]
    }

    /// Characters of the shortest label (the step's number).
    fn shortest_label_chars(&self) -> usize {
        self.index.checked_ilog10().map_or(1, |d| d as usize + 1)
    }
}

/// A phase's slope: from its start bytes to its end bytes, clipped to the plot.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseSlope {
    pub kind: PhaseKind,
    pub from: Pos,
    pub to: Pos,
    pub colour: Colour,
    /// `+1.2 GiB/s`, or per event without times.
    pub rate: String,
}

/// A placed label, with the rectangle filled behind it.
#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    pub text: Text,
    pub halo: Option<(Rect, Colour)>,
}

/// Everything drawn around and over the bands.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overlay {
    /// Each phase's tint, behind the bands.
    pub shading: Vec<(Rect, Colour)>,
    /// Grid lines (horizontal at byte ticks, vertical at axis ticks).
    pub grid: Vec<Line>,
    /// Tick labels and the axis name.
    pub ticks: Vec<Text>,
    pub step_marks: Vec<StepMark>,
    pub slopes: Vec<PhaseSlope>,
    /// The halo drawn under slope lines.
    pub halo: Colour,
    /// Step and rate labels, once [`place_labels`] has placed them.
    pub labels: Vec<Label>,
}

/// Which steps an [`overlay`] shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepDetail {
    /// None.
    Hidden,
    /// Every step and phase (pictures: sub-pixel phases blend into their column).
    All,
    /// Of the steps starting in one half-point column, the first and the last (the ones
    /// between are slivers in that column): what an interactive view can draw every frame.
    Thinned,
}

/// Shading, axes, step marks and slopes for `map` (labels are placed by [`place_labels`]).
pub fn overlay(
    model: &SceneModel<'_>,
    map: &Mapping,
    full_start: f64,
    theme: &Theme,
    steps: StepDetail,
) -> Overlay {
    let mut out = Overlay {
        halo: theme.label_halo,
        ..Overlay::default()
    };
    let show_steps = steps != StepDetail::Hidden;
    let drawn = match steps {
        StepDetail::Hidden => Vec::new(),
        StepDetail::All => (0..model.steps.steps.len()).collect(),
        StepDetail::Thinned => drawn_steps(model, map),
    };
    if show_steps {
        out.shading = phase_shading(model, &drawn, map, theme.dark);
    }
    axes(map, full_start, theme, &mut out);
    if show_steps {
        step_marks(model, &drawn, map, &mut out);
        out.slopes = phase_slopes(model, &drawn, map);
    }
    out
}

/// Width of the columns [`drawn_steps`] thins the steps to: half a point (one pixel on a
/// display of two pixels a point).
const STEP_COLUMN: f32 = 0.5;

/// The indexes of the steps to draw, in order: those in view and, of the steps that start
/// in the same [`STEP_COLUMN`], only the first and the last. The ones between start and end
/// in that column, with all their phases: slivers no slope, label or shade could show
/// (zoomed out on a long run, tens of thousands of steps; walking each one's phases took
/// most of a frame). Steps are in event order, so each bound is a search.
fn drawn_steps(model: &SceneModel<'_>, map: &Mapping) -> Vec<usize> {
    let steps = &model.steps.steps;
    let plot = map.plot;
    let x_of = |event: u32| map.event_x(model.timeline, f64::from(event));
    let first = steps.partition_point(|s| x_of(s.end_event) < plot.min.x);
    let end = steps
        .partition_point(|s| x_of(s.start_event) <= plot.max.x)
        .max(first);
    let mut drawn = Vec::new();
    let mut i = first;
    while i < end {
        drawn.push(i);
        let column_end =
            (x_of(steps[i].start_event) / STEP_COLUMN).floor() * STEP_COLUMN + STEP_COLUMN;
        let starts_later = |s: &Step| x_of(s.start_event) >= column_end;
        // Galloping: one probe when the next step is a column away, a few when many share it.
        let mut span = 1;
        while i + span < end && !starts_later(&steps[i + span]) {
            span *= 2;
        }
        let low = i + span / 2 + 1;
        let high = (i + span).min(end);
        let next = low.min(high) + steps[low.min(high)..high].partition_point(|s| !starts_later(s));
        if next - 1 > i {
            drawn.push(next - 1);
        }
        i = next;
    }
    drawn
}

/// The light tint of each phase behind the bands (the set-up and every step's phases).
fn phase_shading(
    model: &SceneModel<'_>,
    drawn: &[usize],
    map: &Mapping,
    dark: bool,
) -> Vec<(Rect, Colour)> {
    let plot = map.plot;
    let mut shading = Vec::new();
    for phase in drawn_phases(model, drawn) {
        let x0 = map
            .event_x(model.timeline, f64::from(phase.start_event))
            .max(plot.min.x);
        let x1 = map
            .event_x(model.timeline, f64::from(phase.end_event) + 1.0)
            .min(plot.max.x);
        if x1 <= x0 {
            continue;
        }
        let rect = Rect::from_x_y(x0, x1, plot.min.y, plot.max.y);
        shading.push((rect, palette::phase_shade(phase.kind, dark)));
    }
    shading
}

/// Grid lines with tick labels on both axes, and the axis name.
fn axes(map: &Mapping, full_start: f64, theme: &Theme, out: &mut Overlay) {
    let plot = map.plot;
    let grid = |points| Line {
        points,
        colour: theme.grid,
        width: 0.5,
    };
    let text = |pos, align, text: String, colour| Text {
        pos,
        align,
        text,
        colour,
        size: FONT_SIZE,
    };
    for tick in byte_ticks(map.y_max as u64) {
        let y = map.y(tick);
        out.grid
            .push(grid(vec![Pos::new(plot.min.x, y), Pos::new(plot.max.x, y)]));
        out.ticks.push(text(
            Pos::new(plot.min.x - 4.0, y),
            (Align::Max, Align::Center),
            memsnap_analysis::format_size(tick),
            theme.text,
        ));
    }
    let name = match map.axis {
        Axis::Event => "event",
        Axis::Time => "time since start",
    };
    // Tick labels stop short of the axis name at the right end (about 7 px a character).
    let name_left = plot.max.x - 7.0 * name.len() as f32 - 6.0;
    let count = (plot.width() / 110.0).max(2.0) as usize;
    for tick in nice_ticks(map.start, map.end, count) {
        let x = map.x(tick);
        out.grid
            .push(grid(vec![Pos::new(x, plot.min.y), Pos::new(x, plot.max.y)]));
        let label = match map.axis {
            Axis::Event => format!("{}", tick.round() as i64),
            Axis::Time => format_duration_us((tick - full_start).round() as i64),
        };
        if x + 3.5 * label.len() as f32 > name_left {
            continue;
        }
        out.ticks.push(text(
            Pos::new(x, plot.max.y + 2.0),
            (Align::Center, Align::Min),
            label,
            theme.text,
        ));
    }
    out.ticks.push(text(
        Pos::new(plot.max.x, plot.max.y + 2.0),
        (Align::Max, Align::Min),
        name.to_owned(),
        theme.weak_text,
    ));
}

/// A mark at the start of each visible step.
fn step_marks(model: &SceneModel<'_>, drawn: &[usize], map: &Mapping, out: &mut Overlay) {
    let plot = map.plot;
    let x_of = |event: u32| map.event_x(model.timeline, f64::from(event));
    let mark = palette::STEP_MARK.with_alpha(179);
    let mut last_x = f32::NEG_INFINITY;
    for step in drawn.iter().map(|&i| &model.steps.steps[i]) {
        let (x0, x1) = (x_of(step.start_event), x_of(step.end_event));
        if x1 < plot.min.x || x0 > plot.max.x || !plot.contains_x(x0) {
            continue;
        }
        // Lines closer than a few points to the one before are not drawn: 68,000 steps
        // across 1,500 pixels drew a line in every column, and the chart was one yellow sheet.
        let crowded = x0 - last_x < MIN_MARK_GAP;
        if !crowded {
            last_x = x0;
        }
        let room = model
            .steps
            .steps
            .get(step.index + 1)
            .map_or(plot.max.x, |next| x_of(next.start_event))
            .min(plot.max.x)
            - x0
            - 6.0;
        out.step_marks.push(StepMark {
            line: Line {
                points: vec![Pos::new(x0, plot.min.y), Pos::new(x0, plot.max.y)],
                colour: mark,
                width: 1.0,
            },
            index: step.index,
            warmup: step.warmup,
            partial: step.partial,
            room,
            crowded,
        });
    }
}

/// Least distance, in points, between two step marks.
const MIN_MARK_GAP: f32 = 4.0;

/// The set-up's phase and the phases of the drawn steps.
fn drawn_phases<'a>(model: &SceneModel<'a>, drawn: &'a [usize]) -> impl Iterator<Item = &'a Phase> {
    let steps = &model.steps.steps;
    model
        .steps
        .setup
        .iter()
        .chain(drawn.iter().flat_map(move |&i| steps[i].phases.iter()))
}

/// The part of the segment `a`–`b` (with `a.x <= b.x`) between `left` and `right`.
pub fn clip_segment(a: Pos, b: Pos, left: f32, right: f32) -> Option<(Pos, Pos)> {
    if b.x < left || a.x > right || b.x <= a.x {
        return None;
    }
    let y_at = |x: f32| a.y + (b.y - a.y) * (x - a.x) / (b.x - a.x);
    let (x0, x1) = (a.x.max(left), b.x.min(right));
    Some((Pos::new(x0, y_at(x0)), Pos::new(x1, y_at(x1))))
}

/// Every phase's slope wide enough to read as one.
fn phase_slopes(model: &SceneModel<'_>, drawn: &[usize], map: &Mapping) -> Vec<PhaseSlope> {
    let mut slopes = Vec::new();
    for phase in drawn_phases(model, drawn) {
        let a = Pos::new(
            map.event_x(model.timeline, f64::from(phase.start_event)),
            map.y(phase.start_bytes),
        );
        let b = Pos::new(
            map.event_x(model.timeline, f64::from(phase.end_event) + 1.0),
            map.y(phase.end_bytes),
        );
        // Too narrow to read as a slope (also skips phases out of view).
        if b.x - a.x < MIN_SLOPE_WIDTH {
            continue;
        }
        let Some((from, to)) = clip_segment(a, b, map.plot.min.x, map.plot.max.x) else {
            continue;
        };
        slopes.push(PhaseSlope {
            kind: phase.kind,
            from,
            to,
            colour: palette::phase_colour(phase.kind),
            rate: slope_rate_text(&phase.slope()),
        });
    }
    slopes
}

/// Places the step labels (the longest that fits before the next mark) and each slope's rate
/// (beside the middle of its line, where it overlaps no other label and stays in the plot).
/// `measure` gives a text's width and height at [`FONT_SIZE`].
pub fn place_labels(overlay: &mut Overlay, plot: Rect, measure: &mut dyn FnMut(&str) -> Pos) {
    let mut labels = Vec::new();
    for mark in &overlay.step_marks {
        let x0 = mark.line.points[0].x;
        // Thousands of marks a few pixels apart (a long run zoomed out) cannot hold even the
        // shortest label: skip measuring them (it dominated the frame at 10M entries).
        if mark.shortest_label_chars() as f32 * MIN_GLYPH_WIDTH > mark.room {
            continue;
        }
        let Some(label) = mark
            .labels()
            .into_iter()
            .find(|l| measure(l).x <= mark.room)
        else {
            continue;
        };
        labels.push(Label {
            text: Text {
                pos: Pos::new(x0 + 3.0, plot.min.y + 2.0),
                align: (Align::Min, Align::Min),
                text: label,
                colour: palette::STEP_MARK,
                size: FONT_SIZE,
            },
            halo: None,
        });
    }
    let mut placed: Vec<Rect> = Vec::new();
    for slope in &overlay.slopes {
        let size = measure(&slope.rate);
        let (a, b) = (slope.from, slope.to);
        let mid = Pos::new((a.x + b.x) / 2.0, (a.y + b.y) / 2.0);
        let candidates = [
            Pos::new(mid.x - size.x / 2.0, mid.y - 6.0 - size.y),
            Pos::new(mid.x + 6.0, mid.y - size.y / 2.0),
            Pos::new(mid.x - 6.0 - size.x, mid.y - size.y / 2.0),
            Pos::new(mid.x - size.x / 2.0, mid.y + 6.0),
        ];
        let free = |min: Pos| {
            let rect = Rect::from_min_size(min, size.x, size.y);
            let background = rect.expand2(2.0, 0.0);
            // Clear of the step labels along the top.
            let inside = plot.contains_rect(background) && background.min.y > plot.min.y + 14.0;
            let clear = !placed
                .iter()
                .any(|r| r.intersects(background.expand2(2.0, 2.0)));
            (inside && clear).then_some((rect, background))
        };
        let Some((rect, background)) = candidates.into_iter().find_map(free) else {
            continue;
        };
        placed.push(background);
        labels.push(Label {
            text: Text {
                pos: rect.min,
                align: (Align::Min, Align::Min),
                text: slope.rate.clone(),
                colour: slope.colour,
                size: FONT_SIZE,
            },
            halo: Some((background, overlay.halo)),
        });
    }
    overlay.labels = labels;
}

/// A text measurer for pictures without a font engine: an average glyph width.
pub fn estimate_text_size(text: &str) -> Pos {
    Pos::new(
        text.chars().count() as f32 * FONT_SIZE * 0.55,
        FONT_SIZE * 1.3,
    )
}

/// Round tick positions between `lo` and `hi`, about `count` of them.
pub fn nice_ticks(lo: f64, hi: f64, count: usize) -> Vec<f64> {
    if hi.is_nan() || lo.is_nan() || hi <= lo || count == 0 {
        return Vec::new();
    }
    let raw = (hi - lo) / count as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude)
        .max(1.0);
    let mut ticks = Vec::new();
    let mut v = (lo / step).ceil() * step;
    while v <= hi && ticks.len() < 1000 {
        ticks.push(v);
        v += step;
    }
    ticks
}

/// Round byte ticks from 0 to `max`: 1, 2 or 5 times a power of 1024 times a power of 10.
pub fn byte_ticks(max: u64) -> Vec<u64> {
    if max == 0 {
        return Vec::new();
    }
    let raw = max as f64 / 5.0;
    let unit = [1u64 << 40, 1 << 30, 1 << 20, 1 << 10, 1]
        .into_iter()
        .find(|u| *u as f64 <= raw)
        .unwrap_or(1);
    let mantissa = raw / unit as f64;
    let m = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        .into_iter()
        .find(|m| *m >= mantissa)
        .unwrap_or(1000.0);
    let step = (m * unit as f64) as u64;
    (1..)
        .map(|i| i * step)
        .take_while(|v| *v <= max)
        .take(20)
        .collect()
}

// ---- legend ------------------------------------------------------------------------------

/// One entry of the key to the colours.
#[derive(Clone, Debug, PartialEq)]
pub struct LegendEntry {
    pub swatch: Colour,
    /// A smaller swatch drawn inside (a phase's line colour over its tint).
    pub inner: Option<Colour>,
    pub label: String,
    pub tooltip: &'static str,
}

/// What the legend shows besides the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LegendStyle {
    pub colour_by: ColourBy,
    pub dark: bool,
    pub show_steps: bool,
    pub show_reserved: bool,
    /// The size filter (the residual band's label).
    pub min_size: u64,
}

/// The key to the colours: what band colours mean in the mode, the special bands, the phases.
pub fn legend(model: &SceneModel<'_>, style: &LegendStyle) -> Vec<LegendEntry> {
    let entry = |swatch, label: String, tooltip| LegendEntry {
        swatch,
        inner: None,
        label,
        tooltip,
    };
    let kinds = phase_kinds_present(model.steps);
    let mut out = Vec::new();
    match style.colour_by {
        ColourBy::Site => out.push(entry(
            palette::SITE_SWATCH,
            "allocations (colour = user-code site)".into(),
            "Each band is one allocation, stacked in allocation order; one colour per user-code site (the innermost frame of your code in its stack)",
        )),
        ColourBy::Category => {
            // Input and autograd detail come only from PyTorch's profiler.
            let from_source = model.timeline.replay().categories_source.is_some();
            for category in Category::ALL
                .into_iter()
                .filter(|c| from_source || !matches!(c, Category::Input | Category::AutogradDetail))
            {
                out.push(entry(
                    palette::category_colour(category),
                    category.label().to_owned(),
                    category_tooltip(category),
                ));
            }
        }
        ColourBy::Module => out.push(entry(
            palette::SITE_SWATCH,
            "allocations (colour = module path)".into(),
            "Each band is one allocation; one colour per module path (the named path, such as blocks.0.attn, of a run recorded with memsnap.torch.enable(modules=True); else the forwards nn.Module calls entered, outermost first, by file:line), grey outside every module",
        )),
        ColourBy::Phase => {
            if kinds.is_empty() {
                out.push(entry(
                    palette::NO_SITE,
                    "no phase found".into(),
                    "This trace has no steps or phases, so no allocation has a phase",
                ));
            }
        }
    }
    let replay = model.timeline.replay();
    if replay.before_window_allocations > replay.unattributed_allocations {
        out.push(entry(
            palette::before_window(style.dark),
            format!(
                "before the recording ({})",
                memsnap_analysis::format_size(
                    replay.before_window_bytes - replay.unattributed_bytes
                )
            ),
            "Memory allocated before the trace starts (ring buffer dropped it, or recording started late)",
        ));
    }
    if replay.unattributed_allocations > 0 {
        out.push(entry(
            palette::before_window(style.dark),
            format!(
                "before the profile, unattributed ({})",
                memsnap_analysis::format_size(replay.unattributed_bytes)
            ),
            "Memory the profiler counted as allocated (Total Allocated) that no block of the profile accounts for: allocated before it started and not freed in it",
        ));
    }
    let residual = if style.min_size > 0 {
        format!(
            "smaller than {}",
            memsnap_analysis::format_size(style.min_size)
        )
    } else {
        "not drawn (beyond the largest bands)".to_owned()
    };
    out.push(entry(
        palette::residual(style.dark),
        residual,
        "Allocations folded into one band by the size filter or the band limit; the total stays exact",
    ));
    if style.show_reserved {
        out.push(entry(
            palette::reserved(style.dark),
            "reserved".into(),
            "Memory reserved from CUDA (segments)",
        ));
    }
    // One entry per phase kind: its tint behind the bands, its slope line, and (colouring by
    // phase) its bands.
    if style.show_steps || style.colour_by == ColourBy::Phase {
        for kind in kinds {
            out.push(LegendEntry {
                swatch: palette::phase_shade(kind, style.dark),
                inner: Some(palette::phase_colour(kind)),
                label: phase_label(kind).to_owned(),
                tooltip: phase_tooltip(kind),
            });
        }
    }
    out
}

/// The phase kinds the analysis found, in the order they run.
pub fn phase_kinds_present(steps: &StepAnalysis) -> Vec<PhaseKind> {
    let mut kinds: Vec<PhaseKind> = steps.phases().map(|(_, p)| p.kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds
}

fn phase_tooltip(kind: PhaseKind) -> &'static str {
    match kind {
        PhaseKind::Setup => "Set-up before the first step: the model and its weights are built or loaded. Shaded behind the bands; the line is its slope with its rate",
        PhaseKind::Forward => "Forward pass: activations pile up. Shaded behind the bands; the line is its slope with its rate",
        PhaseKind::Backward => "Backward pass: autograd frees the activations and creates gradients. Shaded behind the bands; the line is its slope with its rate",
        PhaseKind::Optimizer => "Optimizer step: state and temporaries, then the gradients are zeroed. Shaded behind the bands; the line is its slope with its rate",
    }
}

fn category_tooltip(category: Category) -> &'static str {
    match category {
        Category::Parameter => "Live before the window or allocated in the set-up, never freed: weights and buffers",
        Category::OptimizerState => "Allocated in an optimizer phase and outliving the step (e.g. Adam's moments)",
        Category::Gradient => "Allocated in backward and outliving the backward phase",
        Category::Activation => "Allocated in forward and freed in the backward phase of the same step",
        Category::Temporary => "Freed in the phase that allocated it",
        Category::Input => "Model inputs (PyTorch's memory profiler's category)",
        Category::AutogradDetail => "Autograd's own bookkeeping (PyTorch's memory profiler's category)",
        Category::Unknown => "Anything else: forward tensors that outlive their step (a leak?), memory from before the window freed in it, files without phases",
    }
}

// ---- the whole picture ---------------------------------------------------------------------

/// A whole picture: what [`crate::svg::write_svg`] writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Scene {
    /// The picture's top-left corner and size, in scene units.
    pub origin: Pos,
    pub size: Pos,
    pub theme: Theme,
    pub plot: Rect,
    pub title: Option<Text>,
    pub bands: BandLayer,
    pub overlay: Overlay,
    /// Drawn in the margin above the plot when there is one.
    pub legend: Vec<LegendEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_slopes_clip_to_the_plot() {
        let a = Pos::new(-10.0, 100.0);
        let b = Pos::new(10.0, 0.0);
        let (p, q) = clip_segment(a, b, 0.0, 5.0).expect("visible");
        assert_eq!((p.x, q.x), (0.0, 5.0));
        assert!((p.y - 50.0).abs() < 1e-4 && (q.y - 25.0).abs() < 1e-4);
        assert!(clip_segment(a, b, 20.0, 30.0).is_none());
        assert!(clip_segment(b, b, 0.0, 30.0).is_none());
    }

    #[test]
    fn byte_ticks_are_round_and_cover_the_range() {
        let ticks = byte_ticks(10 << 30);
        assert_eq!(ticks.first(), Some(&(2 << 30)));
        assert!(ticks.len() >= 4 && ticks.len() <= 6, "{ticks:?}");
        assert!(byte_ticks(0).is_empty());
        assert_eq!(byte_ticks(3), vec![1, 2, 3]);
    }

    #[test]
    fn nice_ticks_are_round_numbers() {
        assert_eq!(
            nice_ticks(0.0, 100.0, 5),
            vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
        );
        assert!(nice_ticks(5.0, 5.0, 3).is_empty());
    }
}

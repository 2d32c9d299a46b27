//! The active memory timeline: stacked allocation bands over time (coloured by site, category
//! or phase), the residual band of the size filter, the reserved-memory outline, step markers,
//! each phase shaded behind the bands with its slope and rate, and an overview strip. The
//! bands come from [`DeviceTimeline::layout`] and the phases from [`StepAnalysis`]; this
//! module only maps them to pixels and handles zoom, pan, hover and click.

use egui::epaint::Mesh;
use egui::{Color32, Pos2, Rect, Sense, Shape, Stroke, Vec2};
use memsnap_analysis::{
    AllocId, Allocation, Axis, Category, DeviceTimeline, Hit, Layout, LayoutRequest, Lifetime,
    PhaseKind, Step, StepAnalysis,
};
use memsnap_format::Snapshot;

use crate::analysis_ext::{StackMatch, StackSites};
use crate::export::Svg;
use crate::palette::{self, ColorMode};
use crate::shortcuts::Command;
use crate::steps_ui::{phase_label, slope_rate_text};
use crate::units::{
    bytes_to_slider, format_bytes, format_duration_us, slider_to_bytes, LOG_SLIDER_MAX,
};
use crate::view::TimeWindow;

/// What the timeline reads.
pub struct TimelineModel<'a> {
    pub snapshot: &'a Snapshot,
    pub timeline: &'a DeviceTimeline,
    pub steps: &'a StepAnalysis,
    /// The user-code site of each stack (band colours in [`ColorMode::Site`], labels).
    pub sites: &'a StackSites,
}

/// Most bands drawn at once; the rest join the residual band (PyTorch's viewer uses 15 000).
pub const DEFAULT_MAX_BANDS: usize = 5_000;

/// While the view moves, at most this many bands are laid out (the biggest), so zooming and
/// panning stay smooth on huge traces; full detail returns when the view rests.
pub const MOVING_MAX_BANDS: usize = 1_000;

/// How long after the last zoom or pan the view counts as moving, in seconds.
const SETTLE_SECONDS: f64 = 0.15;

/// Height of the overview strip under the plot.
const OVERVIEW_HEIGHT: f32 = 44.0;
/// Space for the y-axis labels.
const Y_LABEL_WIDTH: f32 = 72.0;
/// Space for the x-axis labels.
const X_LABEL_HEIGHT: f32 = 18.0;
/// Phases narrower than this (in points) get no slope line: it would be a vertical tick.
const MIN_SLOPE_WIDTH: f32 = 4.0;

/// The timeline's view state.
pub struct TimelineState {
    pub axis: Axis,
    pub window: TimeWindow,
    pub lifetime: Lifetime,
    /// Size filter: allocations below this fold into the "smaller than" band.
    pub min_size: u64,
    pub max_bands: usize,
    /// Search text; bands whose stack does not mention it are faded.
    pub search: String,
    search_match: Option<StackMatch>,
    /// What a band's colour says: its site, its category or its phase.
    pub color_mode: ColorMode,
    /// Step markers, phase shading and phase slopes.
    pub show_steps: bool,
    pub show_reserved: bool,
    /// Scale y to what is visible (else to the whole run's peak).
    pub fit_y: bool,
    /// What the pointer is over (this frame).
    pub hovered: Option<Hit>,
    /// The allocation clicked on (its full stack is shown).
    pub pinned: Option<AllocId>,
    /// The instant cursor (an event), for the "At an instant" view.
    pub cursor: Option<u32>,
    /// The last layout, reused while the request is unchanged.
    layout: Option<Layout>,
    overview: Option<Layout>,
    /// Screen position where a box-zoom drag started.
    box_start: Option<Pos2>,
    /// The band geometry, reused while nothing that shapes it changes.
    band_cache: Option<BandCache>,
    /// Axes, step marks and labels of the last frame (for SVG export).
    last_overlay: Option<Drawing>,
    /// The phase shading of the last frame, drawn under the bands (for SVG export).
    last_shading: Option<Drawing>,
    /// Milliseconds of the last layout computation (shown in the debug line and the bench).
    pub last_layout_ms: f64,
    /// Input time of the last zoom or pan, for the lighter layout while moving.
    last_move_time: Option<f64>,
    drawn_window: Option<TimeWindow>,
    pub search_focus_requested: bool,
}

impl TimelineState {
    pub fn new(timeline: &DeviceTimeline) -> Self {
        TimelineState {
            axis: Axis::Event,
            window: full_window(timeline, Axis::Event),
            lifetime: Lifetime::Active,
            min_size: 0,
            max_bands: DEFAULT_MAX_BANDS,
            search: String::new(),
            search_match: None,
            color_mode: ColorMode::default(),
            show_steps: true,
            show_reserved: true,
            fit_y: true,
            hovered: None,
            pinned: None,
            cursor: None,
            layout: None,
            overview: None,
            box_start: None,
            band_cache: None,
            last_overlay: None,
            last_shading: None,
            last_layout_ms: 0.0,
            last_move_time: None,
            drawn_window: None,
            search_focus_requested: false,
        }
    }

    /// Switches between the event and the wall-time axis, keeping the visible range.
    pub fn set_axis(&mut self, timeline: &DeviceTimeline, axis: Axis) {
        if axis == self.axis || (axis == Axis::Time && !has_time_axis(timeline)) {
            return;
        }
        let start = axis_to_event(timeline, self.axis, self.window.start);
        let end = axis_to_event(timeline, self.axis, self.window.end);
        self.axis = axis;
        self.window = full_window(timeline, axis);
        let (a, b) = (
            event_to_axis(timeline, axis, start),
            event_to_axis(timeline, axis, end),
        );
        self.window.show_range(a, b);
        self.layout = None;
        self.overview = None;
    }

    /// Shows a training step with a little margin.
    pub fn zoom_to_step(&mut self, timeline: &DeviceTimeline, step: &Step) {
        self.zoom_to_events(timeline, step.start_event, step.end_event);
    }

    /// Shows the events `first..=last` (a step or a phase) with a little margin.
    pub fn zoom_to_events(&mut self, timeline: &DeviceTimeline, first: u32, last: u32) {
        let a = event_to_axis(timeline, self.axis, f64::from(first));
        let b = event_to_axis(timeline, self.axis, f64::from(last) + 1.0);
        let margin = (b - a) * 0.05;
        self.window.show_range(a - margin, b + margin);
    }

    /// Keyboard zoom and pan.
    pub fn run_command(&mut self, command: Command) {
        let center = (self.window.start + self.window.end) / 2.0;
        match command {
            Command::ZoomIn => self.window.zoom_at(center, 0.7),
            Command::ZoomOut => self.window.zoom_at(center, 1.0 / 0.7),
            Command::PanLeft => self.window.pan_by_fraction(-0.2),
            Command::PanRight => self.window.pan_by_fraction(0.2),
            Command::ResetZoom => self.window.reset(),
            Command::FocusSearch => self.search_focus_requested = true,
            Command::CycleColorMode => self.color_mode = self.color_mode.next(),
            _ => {}
        }
    }

    /// The search, recomputed when the text changes.
    fn update_search(&mut self, snapshot: &Snapshot) {
        let query = self.search.trim();
        if query.is_empty() {
            self.search_match = None;
        } else if self.search_match.as_ref().is_none_or(|m| m.query != query) {
            self.search_match = Some(StackMatch::new(snapshot, query));
        }
    }

    pub fn search_match(&self) -> Option<&StackMatch> {
        self.search_match.as_ref()
    }

    /// The layout for `width_px` columns of the visible window, cached while unchanged. While
    /// `moving`, at most [`MOVING_MAX_BANDS`] bands.
    pub fn layout_for(
        &mut self,
        timeline: &DeviceTimeline,
        width_px: u32,
        moving: bool,
    ) -> Option<&Layout> {
        let max_bands = if moving {
            self.max_bands.min(MOVING_MAX_BANDS)
        } else {
            self.max_bands
        };
        let request = LayoutRequest {
            axis: self.axis,
            start: self.window.start,
            end: self.window.end,
            width_px: width_px.max(1),
            min_size: self.min_size,
            max_bands,
            lifetime: self.lifetime,
        };
        if self.layout.as_ref().is_none_or(|l| l.request != request) {
            let started = std::time::Instant::now();
            self.layout = timeline.layout(&request).ok();
            self.last_layout_ms = started.elapsed().as_secs_f64() * 1e3;
        }
        self.layout.as_ref()
    }

    /// The layout the last frame drew.
    pub fn cached_layout(&self) -> Option<&Layout> {
        self.layout.as_ref()
    }

    fn overview_for(&mut self, timeline: &DeviceTimeline, width_px: u32) -> Option<&Layout> {
        let request = LayoutRequest {
            axis: self.axis,
            start: self.window.full_start,
            end: self.window.full_end,
            width_px: width_px.max(1),
            min_size: u64::MAX,
            max_bands: 0,
            lifetime: self.lifetime,
        };
        if self.overview.as_ref().is_none_or(|l| l.request != request) {
            self.overview = timeline.layout(&request).ok();
        }
        self.overview.as_ref()
    }

    /// The last drawn timeline as SVG: phase shading, bands, then axes, marks and slopes.
    pub fn last_svg(&self) -> Option<String> {
        let overlay = self.last_overlay.as_ref()?;
        let bands = &self.band_cache.as_ref()?.drawing;
        let empty = Drawing::default();
        let shading = self.last_shading.as_ref().unwrap_or(&empty);
        Some(overlay.to_svg(&[shading, bands, overlay]))
    }

    /// The band geometry last drawn (tests compare its colours with the model).
    pub fn last_band_drawing(&self) -> Option<&Drawing> {
        self.band_cache.as_ref().map(|c| &c.drawing)
    }

    /// The phase shading last drawn.
    pub fn last_phase_shading(&self) -> Option<&Drawing> {
        self.last_shading.as_ref()
    }
}

/// Whether the trace has a usable wall-time axis (times that advance).
pub fn has_time_axis(timeline: &DeviceTimeline) -> bool {
    timeline
        .time()
        .times()
        .is_some_and(|t| t.len() > 1 && t.last() > t.first())
}

/// The whole recorded range on an axis.
pub fn full_window(timeline: &DeviceTimeline, axis: Axis) -> TimeWindow {
    let events = f64::from(timeline.replay().axis_len());
    match axis {
        Axis::Time => {
            let start = event_to_axis(timeline, Axis::Time, 0.0);
            let end = event_to_axis(timeline, Axis::Time, events - 1.0) + 1.0;
            TimeWindow::new(start, end, 1.0)
        }
        Axis::Event => TimeWindow::new(0.0, events, 1.0),
    }
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

/// The size slider, the search box and the view toggles above the plot.
pub fn filter_bar_ui(ui: &mut egui::Ui, model: &TimelineModel<'_>, state: &mut TimelineState) {
    ui.horizontal_wrapped(|ui| {
        ui.label("Hide below");
        let mut position = bytes_to_slider(state.min_size);
        let slider = egui::Slider::new(&mut position, 0.0..=LOG_SLIDER_MAX)
            .step_by(0.25)
            .show_value(false)
            .text(if state.min_size == 0 {
                "everything shown".to_owned()
            } else {
                format!("smaller than {}", format_bytes(state.min_size))
            });
        let response = ui
            .add(slider)
            .on_hover_text("Size filter (log scale): allocations smaller than this fold into one grey band, so the total stays exact");
        if response.changed() {
            state.min_size = slider_to_bytes(position);
        }
        let search = egui::TextEdit::singleline(&mut state.search)
            .hint_text("search function or file")
            .desired_width(180.0);
        let response = ui
            .add(search)
            .on_hover_text("Keep only allocations whose stack mentions this function or file name; the others fade out but stay counted");
        if std::mem::take(&mut state.search_focus_requested) {
            response.request_focus();
        }
        state.update_search(model.snapshot);
        if let Some(m) = &state.search_match {
            ui.label(format!("{} matching stacks", m.matching_stacks));
        }
        ui.separator();
        let mut time = state.axis == Axis::Time;
        let has_time = has_time_axis(model.timeline);
        if ui
            .add_enabled(has_time, egui::Checkbox::new(&mut time, "wall time"))
            .on_hover_text("Plot against recorded time instead of the event index")
            .on_disabled_hover_text("This trace has no times (PyTorch before 2.2)")
            .changed()
        {
            state.set_axis(model.timeline, if time { Axis::Time } else { Axis::Event });
        }
        let mut allocated_only = state.lifetime == Lifetime::Allocated;
        if ui
            .checkbox(&mut allocated_only, "end at free request")
            .on_hover_text("End each allocation at free_requested instead of free_completed (hides frees pending on other streams)")
            .changed()
        {
            state.lifetime = if allocated_only {
                Lifetime::Allocated
            } else {
                Lifetime::Active
            };
        }
        ui.checkbox(&mut state.show_steps, "steps")
            .on_hover_text("Mark training steps, shade their phases (set-up, forward, backward, optimizer) and draw each phase's slope with its rate");
        ui.checkbox(&mut state.show_reserved, "reserved")
            .on_hover_text("Outline the memory reserved from CUDA (segments)");
        ui.checkbox(&mut state.fit_y, "fit y")
            .on_hover_text("Scale the memory axis to what is visible (else to the whole run)");
        ui.separator();
        ui.label("colour by")
            .on_hover_text("What a band's colour says (C cycles)");
        for mode in ColorMode::ALL {
            ui.selectable_value(&mut state.color_mode, mode, mode.label())
                .on_hover_text(mode.tooltip());
        }
        if ui
            .add_enabled(state.window.is_zoomed(), egui::Button::new("Reset zoom"))
            .on_hover_text("Show the whole run (0 or Home)")
            .clicked()
        {
            state.window.reset();
        }
    });
}

/// A one-line key to the colours of the plot: what band colours mean in the current mode,
/// the special bands, and the phases.
pub fn legend_ui(ui: &mut egui::Ui, model: &TimelineModel<'_>, state: &TimelineState) {
    let dark = ui.visuals().dark_mode;
    let kinds = phase_kinds_present(model.steps);
    ui.horizontal_wrapped(|ui| {
        ui.spacing_mut().item_spacing.x = 4.0;
        let swatch = |ui: &mut egui::Ui, color: Color32, text: String, tip: &str| {
            let (rect, _) = ui.allocate_exact_size(egui::vec2(12.0, 12.0), Sense::hover());
            ui.painter().rect_filled(rect, 2.0, color);
            ui.label(text).on_hover_text(tip);
            ui.add_space(8.0);
        };
        match state.color_mode {
            ColorMode::Site => swatch(
                ui,
                Color32::from_rgb(31, 119, 180),
                "allocations (colour = user-code site)".into(),
                "Each band is one allocation, stacked in allocation order; one colour per user-code site (the innermost frame of your code in its stack)",
            ),
            ColorMode::Category => {
                for category in Category::ALL {
                    swatch(
                        ui,
                        palette::category_color(category),
                        category.label().to_owned(),
                        category_tooltip(category),
                    );
                }
            }
            ColorMode::Phase => {
                if kinds.is_empty() {
                    swatch(
                        ui,
                        palette::NO_SITE,
                        "no phase found".into(),
                        "This trace has no steps or phases, so no allocation has a phase",
                    );
                }
            }
        }
        let replay = model.timeline.replay();
        if replay.before_window_allocations > 0 {
            swatch(
                ui,
                palette::before_window(dark),
                format!("before the recording ({})", format_bytes(replay.before_window_bytes)),
                "Memory allocated before the trace starts (ring buffer dropped it, or recording started late)",
            );
        }
        let residual = if state.min_size > 0 {
            format!("smaller than {}", format_bytes(state.min_size))
        } else {
            "not drawn (beyond the largest bands)".to_owned()
        };
        swatch(
            ui,
            palette::residual(dark),
            residual,
            "Allocations folded into one band by the size filter or the band limit; the total stays exact",
        );
        if state.show_reserved {
            swatch(ui, palette::reserved(dark), "reserved".into(), "Memory reserved from CUDA (segments)");
        }
        // One entry per phase kind: its tint behind the bands, its slope line, and (colouring
        // by phase) its bands.
        if state.show_steps || state.color_mode == ColorMode::Phase {
            for kind in kinds {
                let (rect, _) = ui.allocate_exact_size(egui::vec2(12.0, 12.0), Sense::hover());
                ui.painter().rect_filled(rect, 2.0, palette::phase_shade(kind, dark));
                ui.painter().rect_filled(rect.shrink(3.0), 1.0, palette::phase_color(kind));
                ui.label(phase_label(kind)).on_hover_text(phase_tooltip(kind));
                ui.add_space(8.0);
            }
        }
    });
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
        Category::Unknown => "Anything else: forward tensors that outlive their step (a leak?), memory from before the window freed in it, files without phases",
    }
}

/// The colour of an allocation's band in `mode`. Memory from before the recorded window keeps
/// its own muted colour in every mode.
pub fn band_color(
    model: &TimelineModel<'_>,
    id: AllocId,
    allocation: &Allocation,
    mode: ColorMode,
    dark: bool,
) -> Color32 {
    if allocation.before_window() {
        return palette::before_window(dark);
    }
    match mode {
        ColorMode::Site => palette::site_color(model.sites.site(allocation.stack)),
        ColorMode::Category => model
            .steps
            .categories
            .get(id.0 as usize)
            .map_or(palette::NO_SITE, |&c| palette::category_color(c)),
        ColorMode::Phase => allocation
            .alloc_event
            .and_then(|e| model.steps.phase_at(e))
            .map_or(palette::NO_SITE, |(_, phase)| {
                palette::phase_color(phase.kind)
            }),
    }
}

/// Geometry of one drawn frame, in screen points: painted as one mesh and exported as SVG.
#[derive(Clone, Debug, Default)]
pub struct Drawing {
    pub size: Vec2,
    pub origin: Pos2,
    pub background: Color32,
    pub rects: Vec<(Rect, Color32)>,
    pub lines: Vec<(Vec<Pos2>, Color32, f32)>,
    pub texts: Vec<(Pos2, String, Color32)>,
}

impl Drawing {
    /// SVG of `layers` drawn in order, framed by this drawing's size, origin and background.
    fn to_svg(&self, layers: &[&Drawing]) -> String {
        let mut svg = Svg::new(self.size, self.background);
        let offset = self.origin.to_vec2();
        for layer in layers {
            for (rect, color) in &layer.rects {
                svg.rect(rect.translate(-offset), *color);
            }
            for (points, color, width) in &layer.lines {
                let points: Vec<Pos2> = points.iter().map(|p| *p - offset).collect();
                svg.polyline(&points, *color, *width);
            }
            for (pos, text, color) in &layer.texts {
                svg.text(*pos - offset, text, *color, 11.0);
            }
        }
        svg.finish()
    }

    /// The rectangles as one mesh (one draw call however many bands there are).
    pub fn mesh(&self) -> Mesh {
        let mut mesh = Mesh::default();
        mesh.reserve_triangles(self.rects.len() * 2);
        mesh.reserve_vertices(self.rects.len() * 4);
        for (rect, color) in &self.rects {
            mesh.add_colored_rect(*rect, *color);
        }
        mesh
    }
}

/// What the band geometry depends on.
#[derive(Clone, Debug, PartialEq)]
struct BandKey {
    request: LayoutRequest,
    plot: Rect,
    y_max_bits: u64,
    dark: bool,
    show_reserved: bool,
    search: Option<String>,
    color_mode: ColorMode,
}

/// Band geometry and its mesh, kept while the [`BandKey`] is unchanged.
struct BandCache {
    key: BandKey,
    drawing: Drawing,
    mesh: std::sync::Arc<Mesh>,
}

/// Maps layout values to the plot rectangle.
#[derive(Clone, Copy)]
struct Transform {
    plot: Rect,
    window: TimeWindow,
    y_max: f64,
}

impl Transform {
    fn x(&self, x: f64) -> f32 {
        self.window
            .to_screen(x, self.plot.left(), self.plot.width())
    }

    fn y(&self, bytes: u64) -> f32 {
        let f = (bytes as f64 / self.y_max).min(1.2) as f32;
        self.plot.bottom() - f * self.plot.height()
    }

    fn bytes_at(&self, y: f32) -> u64 {
        let f = f64::from((self.plot.bottom() - y) / self.plot.height());
        (f * self.y_max).max(0.0) as u64
    }
}

/// How a layout is drawn besides its geometry.
#[derive(Clone, Copy)]
pub struct DrawStyle<'a> {
    /// Bands whose stack does not match are faded.
    pub search: Option<&'a StackMatch>,
    pub show_reserved: bool,
    pub dark: bool,
    pub color_mode: ColorMode,
}

/// Builds the drawing of a layout: bands, residual band, spike envelope and reserved outline.
pub fn layout_drawing(
    layout: &Layout,
    model: &TimelineModel<'_>,
    style: DrawStyle<'_>,
    plot: Rect,
    window: TimeWindow,
    y_max: f64,
) -> Drawing {
    let DrawStyle {
        search,
        show_reserved,
        dark,
        color_mode,
    } = style;
    let t = Transform {
        plot,
        window,
        y_max: y_max.max(1.0),
    };
    let replay = model.timeline.replay();
    let mut drawing = Drawing::default();
    let columns = &layout.columns;
    drawing
        .rects
        .reserve(layout.bands.len() * 2 + columns.len());
    for band in &layout.bands {
        let Some(a) = replay.get(band.alloc) else {
            continue;
        };
        let mut color = band_color(model, band.alloc, a, color_mode, dark);
        if search.is_some_and(|m| !m.matches(a.stack)) {
            color = palette::unmatched(dark);
        }
        for (i, step) in band.steps.iter().enumerate() {
            let x1 = band.steps.get(i + 1).map_or(band.x_end, |next| next.x);
            let rect = Rect::from_x_y_ranges(
                t.x(step.x)..=t.x(x1),
                t.y(step.bottom.saturating_add(band.size))..=t.y(step.bottom),
            );
            drawing.rects.push((rect, color));
        }
    }
    // The residual band, merged over runs of equal columns.
    let residual = palette::residual(dark);
    let mut run: Option<(usize, u64, u64)> = None;
    for (c, col) in columns.iter().enumerate() {
        let key = (col.drawn_bytes, col.total_bytes);
        match run {
            Some((_, lo, hi)) if (lo, hi) == key => {}
            _ => {
                if let Some((start, lo, hi)) = run {
                    push_residual(
                        &mut drawing,
                        &t,
                        columns[start].x0,
                        col.x0,
                        lo,
                        hi,
                        residual,
                    );
                }
                run = Some((c, key.0, key.1));
            }
        }
    }
    if let (Some((start, lo, hi)), Some(last)) = (run, columns.last()) {
        push_residual(
            &mut drawing,
            &t,
            columns[start].x0,
            last.x1,
            lo,
            hi,
            residual,
        );
    }
    // Spikes shorter than a column: a thin envelope line.
    let envelope = palette::envelope(dark);
    for col in columns {
        if col.total_max > col.total_bytes || col.total_min < col.total_bytes {
            let x = t.x(col.x0);
            let rect = Rect::from_x_y_ranges(x..=x + 1.0, t.y(col.total_max)..=t.y(col.total_min));
            drawing.rects.push((rect, envelope));
        }
    }
    if show_reserved {
        let line = reserved_outline(model.timeline, layout, &t);
        if line.len() >= 2 {
            drawing.lines.push((line, palette::reserved(dark), 1.5));
        }
    }
    drawing
}

fn push_residual(
    drawing: &mut Drawing,
    t: &Transform,
    x0: f64,
    x1: f64,
    lo: u64,
    hi: u64,
    color: Color32,
) {
    if hi > lo {
        let rect = Rect::from_x_y_ranges(t.x(x0)..=t.x(x1), t.y(hi)..=t.y(lo));
        drawing.rects.push((rect, color));
    }
}

/// A step line along the highest reserved value of each column.
fn reserved_outline(timeline: &DeviceTimeline, layout: &Layout, t: &Transform) -> Vec<Pos2> {
    let reserved = &timeline.curves().reserved;
    let mut points = Vec::with_capacity(layout.columns.len() * 2);
    let mut last: Option<u64> = None;
    for (c, col) in layout.columns.iter().enumerate() {
        let next_event = layout
            .columns
            .get(c + 1)
            .map_or(col.event + 1, |n| n.event.max(col.event + 1));
        let value = timeline
            .curve_envelope(
                memsnap_analysis::CurveKind::Reserved,
                col.event,
                next_event,
                1,
            )
            .ok()
            .and_then(|v| v.first().map(|(_, hi)| *hi))
            .unwrap_or_else(|| reserved.at(col.event));
        let x = t.x(col.x0);
        if last != Some(value) {
            if let Some(prev) = last {
                points.push(Pos2::new(x, t.y(prev)));
            }
            points.push(Pos2::new(x, t.y(value)));
            last = Some(value);
        }
    }
    if let (Some(col), Some(value)) = (layout.columns.last(), last) {
        points.push(Pos2::new(t.x(col.x1), t.y(value)));
    }
    points
}

/// The highest reserved value in a layout's columns (for the y scale).
fn reserved_max(timeline: &DeviceTimeline, layout: &Layout) -> u64 {
    let (Some(first), Some(last)) = (layout.columns.first(), layout.columns.last()) else {
        return 0;
    };
    timeline
        .curve_envelope(
            memsnap_analysis::CurveKind::Reserved,
            first.event,
            last.event + 1,
            1,
        )
        .ok()
        .and_then(|v| v.first().map(|(_, hi)| *hi))
        .unwrap_or(0)
}

/// What the timeline reports to its caller after a frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelineOutput {
    pub clicked: Option<Hit>,
}

/// The timeline plot with its axes and the overview strip.
pub fn timeline_ui(
    ui: &mut egui::Ui,
    model: &TimelineModel<'_>,
    state: &mut TimelineState,
) -> TimelineOutput {
    let dark = ui.visuals().dark_mode;
    let available = ui.available_rect_before_wrap();
    let overview_rect = Rect::from_min_max(
        Pos2::new(
            available.left() + Y_LABEL_WIDTH,
            available.bottom() - OVERVIEW_HEIGHT,
        ),
        available.right_bottom(),
    );
    let outer = Rect::from_min_max(
        available.left_top(),
        Pos2::new(available.right(), overview_rect.top() - 6.0),
    );
    let plot = Rect::from_min_max(
        Pos2::new(outer.left() + Y_LABEL_WIDTH, outer.top() + 4.0),
        Pos2::new(outer.right() - 4.0, outer.bottom() - X_LABEL_HEIGHT),
    );
    ui.allocate_rect(available, Sense::hover());
    if plot.width() < 10.0 || plot.height() < 10.0 {
        return TimelineOutput::default();
    }
    let response = ui.interact(
        plot,
        ui.make_persistent_id("timeline_plot"),
        Sense::click_and_drag(),
    );
    let mut output = TimelineOutput::default();

    handle_zoom_and_pan(ui, &response, plot, state);
    let now = ui.input(|i| i.time);
    if state.drawn_window != Some(state.window) {
        if state.drawn_window.is_some() {
            state.last_move_time = Some(now);
        }
        state.drawn_window = Some(state.window);
    }
    let moving = state
        .last_move_time
        .is_some_and(|t| now - t < SETTLE_SECONDS);
    if moving {
        // Come back for the full-detail layout once the view rests.
        ui.ctx()
            .request_repaint_after(std::time::Duration::from_secs_f64(SETTLE_SECONDS));
    }

    let width_px = plot.width().round() as u32;
    let search = state.search_match.clone();
    let show_reserved = state.show_reserved;
    let fit_y = state.fit_y;
    let window = state.window;
    state.layout_for(model.timeline, width_px, moving);
    // Taken out while drawing (state changes below), put back at the end.
    let Some(layout) = state.layout.take() else {
        ui.painter().text(
            plot.center(),
            egui::Align2::CENTER_CENTER,
            "nothing to draw",
            egui::FontId::proportional(14.0),
            ui.visuals().weak_text_color(),
        );
        return output;
    };
    let y_top = if fit_y {
        let reserved = if show_reserved {
            reserved_max(model.timeline, &layout)
        } else {
            0
        };
        layout.y_max.max(reserved)
    } else {
        let curves = model.timeline.curves();
        curves.active.max().0.max(if show_reserved {
            curves.reserved.max().0
        } else {
            0
        })
    };
    let y_max = (y_top as f64 * 1.05).max(1.0);
    let t = Transform {
        plot,
        window,
        y_max,
    };

    let painter = ui.painter_at(outer.union(overview_rect));
    painter.rect_filled(plot, 0.0, ui.visuals().extreme_bg_color);
    let key = BandKey {
        request: layout.request,
        plot,
        y_max_bits: y_max.to_bits(),
        dark,
        show_reserved,
        search: search.as_ref().map(|m| m.query.clone()),
        color_mode: state.color_mode,
    };
    if state.band_cache.as_ref().is_none_or(|c| c.key != key) {
        let style = DrawStyle {
            search: search.as_ref(),
            show_reserved,
            dark,
            color_mode: state.color_mode,
        };
        let drawing = layout_drawing(&layout, model, style, plot, window, y_max);
        let mesh = std::sync::Arc::new(drawing.mesh());
        state.band_cache = Some(BandCache { key, drawing, mesh });
    }
    let mut overlay = Drawing {
        origin: available.min,
        size: available.size(),
        background: ui.visuals().panel_fill,
        ..Drawing::default()
    };
    let mut shading = Drawing::default();
    if state.show_steps {
        phase_shading(&painter, model, state.axis, &t, dark, &mut shading);
    }
    axes_ui(&painter, ui, state.axis, &t, &mut overlay);
    if let Some(cache) = &state.band_cache {
        painter.add(Shape::mesh(cache.mesh.clone()));
        for (points, color, width) in &cache.drawing.lines {
            painter.add(Shape::line(points.clone(), Stroke::new(*width, *color)));
        }
    }
    if state.show_steps {
        let halo = ui.visuals().extreme_bg_color;
        steps_overlay(&painter, model, state.axis, &t, halo, &mut overlay);
    }

    // Highlight the pinned allocation.
    if let Some(pinned) = state.pinned {
        if let Some(band) = layout.bands.iter().find(|b| b.alloc == pinned) {
            for (i, step) in band.steps.iter().enumerate() {
                let x1 = band.steps.get(i + 1).map_or(band.x_end, |next| next.x);
                let rect = Rect::from_x_y_ranges(
                    t.x(step.x)..=t.x(x1),
                    t.y(step.bottom.saturating_add(band.size))..=t.y(step.bottom),
                );
                painter.rect_stroke(
                    rect,
                    0.0,
                    Stroke::new(2.0, palette::HIGHLIGHT),
                    egui::StrokeKind::Outside,
                );
            }
        }
    }
    if let Some(cursor) = state.cursor {
        let x = t.x(event_to_axis(model.timeline, state.axis, f64::from(cursor)));
        if plot.x_range().contains(x) {
            painter.vline(
                x,
                plot.y_range(),
                Stroke::new(1.0, ui.visuals().strong_text_color()),
            );
        }
    }

    // Hover and click.
    state.hovered = None;
    if let Some(pos) = response.hover_pos() {
        let x = window.from_screen(pos.x, plot.left(), plot.width());
        let hit = layout.hit_test(x, t.bytes_at(pos.y));
        state.hovered = hit;
        if let Some(start) = state.box_start {
            let rect = Rect::from_two_pos(
                Pos2::new(start.x, plot.top()),
                Pos2::new(pos.x, plot.bottom()),
            );
            painter.rect_filled(
                rect,
                0.0,
                Color32::from_rgba_unmultiplied(120, 160, 255, 40),
            );
        } else if let Some(Hit::Band(id)) = hit {
            if let Some(band) = layout.bands.iter().find(|b| b.alloc == id) {
                if let Some(column) = layout.column_at(x) {
                    if let Some(bottom) = band.bottom_at(column) {
                        let rect = Rect::from_x_y_ranges(
                            t.x(band.x_start)..=t.x(band.x_end),
                            t.y(bottom.saturating_add(band.size))..=t.y(bottom),
                        );
                        painter.rect_stroke(
                            rect,
                            0.0,
                            Stroke::new(1.0, palette::HIGHLIGHT),
                            egui::StrokeKind::Outside,
                        );
                    }
                }
            }
        }
    }
    if response.clicked() {
        if let Some(pos) = response.interact_pointer_pos() {
            let x = window.from_screen(pos.x, plot.left(), plot.width());
            let hit = layout.hit_test(x, t.bytes_at(pos.y));
            state.pinned = match hit {
                Some(Hit::Band(id)) => Some(id),
                _ => None,
            };
            state.cursor = layout
                .column_at(x)
                .map(|c| layout.columns[c as usize].event);
            output.clicked = hit;
        }
    }

    overview_ui(ui, model, state, overview_rect);

    let description = format!(
        "Active memory timeline: {} bands drawn, peak in view {}, allocations below {} folded",
        layout.bands.len(),
        format_bytes(layout.y_max),
        format_bytes(layout.drawn_min_size)
    );
    response.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Image, true, &description));
    let response = if state.box_start.is_none() {
        match state.hovered {
            Some(Hit::Band(id)) => response.on_hover_ui_at_pointer(|ui| {
                crate::details_ui::hover_card_ui(ui, model, id);
            }),
            Some(Hit::Residual { column }) => response.on_hover_ui_at_pointer(|ui| {
                let col = &layout.columns[column as usize];
                ui.label(format!(
                    "{} in allocations smaller than {} (or beyond the {} largest)",
                    format_bytes(col.total_bytes.saturating_sub(col.drawn_bytes)),
                    format_bytes(layout.drawn_min_size.max(1)),
                    state.max_bands
                ));
            }),
            None => response,
        }
    } else {
        response
    };
    let _ = response;
    state.last_overlay = Some(overlay);
    state.last_shading = Some(shading);
    state.layout = Some(layout);
    output
}

fn handle_zoom_and_pan(
    ui: &egui::Ui,
    response: &egui::Response,
    plot: Rect,
    state: &mut TimelineState,
) {
    let window = state.window;
    if response.hovered() {
        let (scroll, zoom, pointer) =
            ui.input(|i| (i.smooth_scroll_delta, i.zoom_delta(), i.pointer.hover_pos()));
        let anchor = pointer
            .map(|p| window.from_screen(p.x, plot.left(), plot.width()))
            .unwrap_or((window.start + window.end) / 2.0);
        if zoom != 1.0 {
            state.window.zoom_at(anchor, 1.0 / f64::from(zoom));
        } else if scroll.y != 0.0 {
            state
                .window
                .zoom_at(anchor, (-f64::from(scroll.y) * 0.003).exp());
        }
        if scroll.x != 0.0 {
            state
                .window
                .pan_by(-f64::from(scroll.x) / f64::from(plot.width()) * window.span());
        }
    }
    let boxing = ui.input(|i| i.modifiers.shift);
    if response.drag_started_by(egui::PointerButton::Secondary)
        || (response.drag_started_by(egui::PointerButton::Primary) && boxing)
    {
        state.box_start = response.interact_pointer_pos();
    }
    if state.box_start.is_some() {
        if response.drag_stopped() {
            if let (Some(start), Some(end)) =
                (state.box_start.take(), response.interact_pointer_pos())
            {
                if (end.x - start.x).abs() > 3.0 {
                    let a = window.from_screen(start.x, plot.left(), plot.width());
                    let b = window.from_screen(end.x, plot.left(), plot.width());
                    state.window.show_range(a, b);
                }
            }
        }
    } else if response.dragged_by(egui::PointerButton::Primary) {
        let dx = response.drag_delta().x;
        state
            .window
            .pan_by(-f64::from(dx) / f64::from(plot.width()) * window.span());
    }
    if response.double_clicked() {
        state.window.reset();
    }
}

/// Axis ticks and labels.
fn axes_ui(
    painter: &egui::Painter,
    ui: &egui::Ui,
    axis: Axis,
    t: &Transform,
    drawing: &mut Drawing,
) {
    let text_color = ui.visuals().text_color();
    let grid = ui.visuals().widgets.noninteractive.bg_stroke.color;
    let font = egui::FontId::proportional(11.0);
    for tick in byte_ticks(t.y_max as u64) {
        let y = t.y(tick);
        painter.hline(t.plot.x_range(), y, Stroke::new(0.5, grid));
        let label = format_bytes(tick);
        painter.text(
            Pos2::new(t.plot.left() - 4.0, y),
            egui::Align2::RIGHT_CENTER,
            &label,
            font.clone(),
            text_color,
        );
        drawing.texts.push((
            Pos2::new(t.plot.left() - Y_LABEL_WIDTH + 2.0, y + 4.0),
            label,
            text_color,
        ));
    }
    let origin = t.window.full_start;
    for tick in nice_ticks(
        t.window.start,
        t.window.end,
        (t.plot.width() / 110.0).max(2.0) as usize,
    ) {
        let x = t.x(tick);
        painter.vline(x, t.plot.y_range(), Stroke::new(0.5, grid));
        let label = match axis {
            Axis::Event => format!("{}", tick.round() as i64),
            Axis::Time => format_duration_us((tick - origin).round() as i64),
        };
        painter.text(
            Pos2::new(x, t.plot.bottom() + 2.0),
            egui::Align2::CENTER_TOP,
            &label,
            font.clone(),
            text_color,
        );
        drawing
            .texts
            .push((Pos2::new(x, t.plot.bottom() + 13.0), label, text_color));
    }
    let axis_name = match axis {
        Axis::Event => "event",
        Axis::Time => "time since start",
    };
    painter.text(
        Pos2::new(t.plot.right(), t.plot.bottom() + 2.0),
        egui::Align2::RIGHT_TOP,
        axis_name,
        font,
        ui.visuals().weak_text_color(),
    );
}

/// Screen x of an event position on the plot's axis.
fn event_x(model: &TimelineModel<'_>, axis: Axis, t: &Transform, event: f64) -> f32 {
    t.x(event_to_axis(model.timeline, axis, event))
}

/// The light tint of each phase behind the bands (the set-up and every step's phases).
fn phase_shading(
    painter: &egui::Painter,
    model: &TimelineModel<'_>,
    axis: Axis,
    t: &Transform,
    dark: bool,
    shading: &mut Drawing,
) {
    for (_, phase) in model.steps.phases() {
        let x0 = event_x(model, axis, t, f64::from(phase.start_event)).max(t.plot.left());
        let x1 = event_x(model, axis, t, f64::from(phase.end_event) + 1.0).min(t.plot.right());
        if x1 <= x0 {
            continue;
        }
        let rect = Rect::from_x_y_ranges(x0..=x1, t.plot.y_range());
        let color = palette::phase_shade(phase.kind, dark);
        painter.rect_filled(rect, 0.0, color);
        shading.rects.push((rect, color));
    }
}

/// The part of the segment `a`–`b` (with `a.x <= b.x`) between `left` and `right`.
fn clip_segment(a: Pos2, b: Pos2, left: f32, right: f32) -> Option<(Pos2, Pos2)> {
    if b.x < left || a.x > right || b.x <= a.x {
        return None;
    }
    let y_at = |x: f32| a.y + (b.y - a.y) * (x - a.x) / (b.x - a.x);
    let (x0, x1) = (a.x.max(left), b.x.min(right));
    Some((Pos2::new(x0, y_at(x0)), Pos2::new(x1, y_at(x1))))
}

/// Step boundaries and labels, and every phase's slope (start bytes to end bytes) with its
/// rate where there is room. `halo` outlines lines and labels so they read over the bands.
fn steps_overlay(
    painter: &egui::Painter,
    model: &TimelineModel<'_>,
    axis: Axis,
    t: &Transform,
    halo: Color32,
    drawing: &mut Drawing,
) {
    let font = egui::FontId::proportional(11.0);
    let x_of = |event: u32| event_x(model, axis, t, f64::from(event));
    let label_halo = halo.gamma_multiply(0.8);
    for step in &model.steps.steps {
        let (x0, x1) = (x_of(step.start_event), x_of(step.end_event));
        if x1 < t.plot.left() || x0 > t.plot.right() {
            continue;
        }
        let mark = Stroke::new(1.0, palette::STEP_MARK.gamma_multiply(0.7));
        if t.plot.x_range().contains(x0) {
            painter.vline(x0, t.plot.y_range(), mark);
            drawing.lines.push((
                vec![Pos2::new(x0, t.plot.top()), Pos2::new(x0, t.plot.bottom())],
                mark.color,
                1.0,
            ));
            // The longest label that ends before the next step's mark.
            let room = model
                .steps
                .steps
                .get(step.index + 1)
                .map_or(t.plot.right(), |next| x_of(next.start_event))
                .min(t.plot.right())
                - x0
                - 6.0;
            let short = format!("step {}", step.index);
            let long = if step.warmup {
                format!("{short} · warm-up")
            } else if step.partial {
                format!("{short} · partial")
            } else {
                short.clone()
            };
            let width = |text: &str| {
                painter
                    .layout_no_wrap(text.to_owned(), font.clone(), palette::STEP_MARK)
                    .size()
                    .x
            };
            let Some(label) = [long, short, step.index.to_string()]
                .into_iter()
                .find(|l| width(l) <= room)
            else {
                continue;
            };
            painter.text(
                Pos2::new(x0 + 3.0, t.plot.top() + 2.0),
                egui::Align2::LEFT_TOP,
                &label,
                font.clone(),
                palette::STEP_MARK,
            );
            drawing.texts.push((
                Pos2::new(x0 + 3.0, t.plot.top() + 12.0),
                label,
                palette::STEP_MARK,
            ));
        }
    }
    let mut placed_labels: Vec<Rect> = Vec::new();
    for (_, phase) in model.steps.phases() {
        let a = Pos2::new(x_of(phase.start_event), t.y(phase.start_bytes));
        let b = Pos2::new(
            event_x(model, axis, t, f64::from(phase.end_event) + 1.0),
            t.y(phase.end_bytes),
        );
        // Too narrow to read as a slope (also skips phases out of view).
        if b.x - a.x < MIN_SLOPE_WIDTH {
            continue;
        }
        let Some((a, b)) = clip_segment(a, b, t.plot.left(), t.plot.right()) else {
            continue;
        };
        let color = palette::phase_color(phase.kind);
        painter.line_segment([a, b], Stroke::new(4.0, label_halo));
        painter.line_segment([a, b], Stroke::new(2.0, color));
        drawing.lines.push((vec![a, b], label_halo, 4.0));
        drawing.lines.push((vec![a, b], color, 2.0));
        let rate = slope_rate_text(&phase.slope);
        let galley = painter.layout_no_wrap(rate.clone(), font.clone(), color);
        let size = galley.size();
        // Beside the middle of its line (above, right, left or below), only where it overlaps
        // no other label and stays in the plot; it may reach past a narrow phase.
        let mid = Pos2::new((a.x + b.x) / 2.0, (a.y + b.y) / 2.0);
        let candidates = [
            Pos2::new(mid.x - size.x / 2.0, mid.y - 6.0 - size.y),
            Pos2::new(mid.x + 6.0, mid.y - size.y / 2.0),
            Pos2::new(mid.x - 6.0 - size.x, mid.y - size.y / 2.0),
            Pos2::new(mid.x - size.x / 2.0, mid.y + 6.0),
        ];
        let free = |min: Pos2| {
            let rect = Rect::from_min_size(min, size);
            let background = rect.expand2(egui::vec2(2.0, 0.0));
            // Clear of the step labels along the top.
            let inside = t.plot.contains_rect(background) && background.top() > t.plot.top() + 14.0;
            let clear = !placed_labels
                .iter()
                .any(|r| r.intersects(background.expand(2.0)));
            (inside && clear).then_some((rect, background))
        };
        let Some((rect, background)) = candidates.into_iter().find_map(free) else {
            continue;
        };
        placed_labels.push(background);
        painter.rect_filled(background, 2.0, label_halo);
        painter.galley(rect.min, galley, color);
        drawing.rects.push((background, label_halo));
        drawing
            .texts
            .push((Pos2::new(rect.left(), rect.bottom() - 2.0), rate, color));
    }
}

/// The overview strip: the whole run's total, with the visible window marked. Click or drag
/// to move the window.
fn overview_ui(
    ui: &mut egui::Ui,
    model: &TimelineModel<'_>,
    state: &mut TimelineState,
    rect: Rect,
) {
    let response = ui
        .interact(
            rect,
            ui.make_persistent_id("timeline_overview"),
            Sense::click_and_drag(),
        )
        .on_hover_text(
            "The whole run; the light box is what the plot shows. Click or drag to move there.",
        );
    let painter = ui.painter_at(rect);
    painter.rect_filled(rect, 2.0, ui.visuals().faint_bg_color);
    let width = rect.width().round() as u32;
    let full = state.window;
    let dark = ui.visuals().dark_mode;
    if let Some(overview) = state.overview_for(model.timeline, width) {
        let y_max = overview.y_max.max(1) as f32;
        let mut mesh = Mesh::default();
        let fill = if dark {
            Color32::from_rgb(110, 140, 190)
        } else {
            Color32::from_rgb(90, 120, 170)
        };
        for (c, col) in overview.columns.iter().enumerate() {
            let x = rect.left() + c as f32;
            let h = col.total_max as f32 / y_max * (rect.height() - 2.0);
            mesh.add_colored_rect(
                Rect::from_min_max(
                    Pos2::new(x, rect.bottom() - h),
                    Pos2::new(x + 1.0, rect.bottom()),
                ),
                fill,
            );
        }
        painter.add(Shape::mesh(mesh));
    }
    let overview_window = TimeWindow {
        start: full.full_start,
        end: full.full_end,
        ..full
    };
    let x0 = overview_window.to_screen(full.start, rect.left(), rect.width());
    let x1 = overview_window
        .to_screen(full.end, rect.left(), rect.width())
        .max(x0 + 2.0);
    let visible = Rect::from_x_y_ranges(x0..=x1, rect.y_range());
    painter.rect_filled(
        visible,
        0.0,
        Color32::from_rgba_unmultiplied(255, 255, 255, 40),
    );
    painter.rect_stroke(
        visible,
        0.0,
        Stroke::new(1.0, ui.visuals().strong_text_color()),
        egui::StrokeKind::Inside,
    );
    if response.clicked() || response.dragged() {
        if let Some(pos) = response.interact_pointer_pos() {
            let center = overview_window.from_screen(pos.x, rect.left(), rect.width());
            let half = state.window.span() / 2.0;
            state.window.show_range(center - half, center + half);
        }
    }
    if response.double_clicked() {
        state.window.reset();
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_format::synth::{generate, TrainingRun};

    #[test]
    fn a_search_that_matches_nothing_fades_every_band() {
        let (snapshot, _) = generate(&TrainingRun::default());
        let timeline = DeviceTimeline::build(&snapshot, 0).expect("timeline");
        let steps = timeline.steps(&Default::default());
        let sites = StackSites::new(&snapshot);
        let model = TimelineModel {
            snapshot: &snapshot,
            timeline: &timeline,
            steps: &steps,
            sites: &sites,
        };
        let layout = timeline
            .layout(&LayoutRequest::whole(&timeline, 400))
            .expect("layout");
        assert!(!layout.bands.is_empty());
        let plot = Rect::from_min_size(Pos2::ZERO, egui::vec2(400.0, 300.0));
        let window = full_window(&timeline, Axis::Event);
        let y_max = layout.y_max as f64 * 1.05;
        let nothing = StackMatch::new(&snapshot, "no_such_function_anywhere");
        let style = DrawStyle {
            search: Some(&nothing),
            show_reserved: false,
            dark: true,
            color_mode: ColorMode::Site,
        };
        let drawing = layout_drawing(&layout, &model, style, plot, window, y_max);
        let faded = palette::unmatched(true);
        let special = [
            faded,
            palette::residual(true),
            palette::envelope(true),
            palette::before_window(true),
        ];
        assert!(drawing.rects.iter().all(|(_, c)| special.contains(c)));
        assert!(drawing.rects.iter().any(|(_, c)| *c == faded));

        // Without a search, bands keep their stack colours, and every rect lies in the plot.
        let style = DrawStyle {
            search: None,
            show_reserved: true,
            dark: true,
            color_mode: ColorMode::Site,
        };
        let drawing = layout_drawing(&layout, &model, style, plot, window, y_max);
        assert!(drawing.rects.iter().any(|(_, c)| !special.contains(c)));
        let inside = plot.expand(1.0);
        assert!(drawing.rects.iter().all(|(r, _)| inside.contains_rect(*r)));
        assert_eq!(drawing.lines.len(), 1, "the reserved outline");
    }

    /// The generated default run: its snapshot, timeline, steps and sites.
    fn generated_run() -> (Snapshot, DeviceTimeline, StepAnalysis, StackSites) {
        let (snapshot, _) = generate(&TrainingRun::default());
        let timeline = DeviceTimeline::build(&snapshot, 0).expect("timeline");
        let steps = timeline.steps(&Default::default());
        let sites = StackSites::new(&snapshot);
        (snapshot, timeline, steps, sites)
    }

    fn drawing_in(model: &TimelineModel<'_>, layout: &Layout, mode: ColorMode) -> Drawing {
        let plot = Rect::from_min_size(Pos2::ZERO, egui::vec2(800.0, 300.0));
        let window = full_window(model.timeline, Axis::Event);
        let style = DrawStyle {
            search: None,
            show_reserved: false,
            dark: false,
            color_mode: mode,
        };
        layout_drawing(layout, model, style, plot, window, layout.y_max as f64)
    }

    #[test]
    fn colour_modes_colour_bands_by_category_phase_or_site() {
        let (snapshot, timeline, steps, sites) = generated_run();
        let model = TimelineModel {
            snapshot: &snapshot,
            timeline: &timeline,
            steps: &steps,
            sites: &sites,
        };
        let replay = timeline.replay();
        assert_eq!(steps.categories.len(), replay.allocations.len());
        // Every traced allocation: its category's colour, its phase's colour, its site's.
        for (i, a) in replay.allocations.iter().enumerate() {
            let id = AllocId(i as u32);
            if a.before_window() {
                for mode in ColorMode::ALL {
                    assert_eq!(
                        band_color(&model, id, a, mode, true),
                        palette::before_window(true)
                    );
                }
                continue;
            }
            assert_eq!(
                band_color(&model, id, a, ColorMode::Category, true),
                palette::category_color(steps.categories[i])
            );
            let event = a.alloc_event.expect("traced");
            let (_, phase) = steps.phase_at(event).expect("phases tile the run");
            assert_eq!(
                band_color(&model, id, a, ColorMode::Phase, true),
                palette::phase_color(phase.kind)
            );
            assert_eq!(
                band_color(&model, id, a, ColorMode::Site, true),
                palette::site_color(
                    a.stack
                        .and_then(|s| memsnap_analysis::sites::top_frame(&snapshot, s))
                )
            );
        }

        // The drawn bands: only the mode's colours (plus the residual and envelope greys), and
        // the run's main categories and phases all show.
        let layout = timeline
            .layout(&LayoutRequest::whole(&timeline, 800))
            .expect("layout");
        let special = [palette::residual(false), palette::envelope(false)];
        let colours = |mode| -> std::collections::HashSet<Color32> {
            drawing_in(&model, &layout, mode)
                .rects
                .iter()
                .map(|(_, c)| *c)
                .filter(|c| !special.contains(c))
                .collect()
        };
        let by_category = colours(ColorMode::Category);
        for category in [
            Category::Parameter,
            Category::OptimizerState,
            Category::Gradient,
            Category::Activation,
        ] {
            assert!(
                by_category.contains(&palette::category_color(category)),
                "{category} is drawn"
            );
        }
        assert!(by_category.iter().all(|c| Category::ALL
            .iter()
            .any(|&k| palette::category_color(k) == *c)));
        let by_phase = colours(ColorMode::Phase);
        let kinds = [
            PhaseKind::Forward,
            PhaseKind::Backward,
            PhaseKind::Optimizer,
        ];
        for kind in kinds {
            assert!(
                by_phase.contains(&palette::phase_color(kind)),
                "{kind} is drawn"
            );
        }
        assert!(by_phase.len() <= 4, "{by_phase:?}");
        assert_ne!(colours(ColorMode::Site), by_category);
    }

    #[test]
    fn stacks_with_the_same_user_code_site_share_a_colour() {
        use memsnap_format::{Action, Frame, TraceEntry};
        let mut snapshot = Snapshot::new(1);
        let user = Frame::new("train_step", "train.py", 12);
        let other_user = Frame::new("evaluate", "train.py", 40);
        let torch_a = Frame::new("forward", "torch/nn/modules/linear.py", 116);
        let torch_b = Frame::new("forward", "torch/nn/modules/conv.py", 450);
        let stacks = [
            snapshot.intern_stack([torch_a.clone(), user.clone()]),
            snapshot.intern_stack([torch_b, user]),
            snapshot.intern_stack([torch_a, other_user]),
        ];
        let trace = &mut snapshot.device_traces.as_mut().expect("traces")[0];
        for (i, stack) in stacks.iter().enumerate() {
            let mut entry = TraceEntry::new(Action::Alloc, 0x1000 * (i as u64 + 1), 512, 0);
            entry.frames = Some(*stack);
            trace.push(entry);
        }
        let timeline = DeviceTimeline::build(&snapshot, 0).expect("timeline");
        let steps = timeline.steps(&Default::default());
        let sites = StackSites::new(&snapshot);
        let model = TimelineModel {
            snapshot: &snapshot,
            timeline: &timeline,
            steps: &steps,
            sites: &sites,
        };
        let colour = |i: usize| {
            let a = &timeline.replay().allocations[i];
            band_color(&model, AllocId(i as u32), a, ColorMode::Site, true)
        };
        assert_ne!(stacks[0], stacks[1]);
        assert_eq!(colour(0), colour(1), "same site, different stacks");
        assert_eq!(
            sites.label(&snapshot, Some(stacks[1])),
            "train.py:12:train_step"
        );
        assert_eq!(sites.site(Some(stacks[0])), sites.site(Some(stacks[1])));
        assert_ne!(sites.site(Some(stacks[0])), sites.site(Some(stacks[2])));
    }

    #[test]
    fn phase_slopes_clip_to_the_plot() {
        let a = Pos2::new(-10.0, 100.0);
        let b = Pos2::new(10.0, 0.0);
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

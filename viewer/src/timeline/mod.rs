//! The active memory timeline: stacked allocation bands over time (coloured by site, category
//! or phase), the residual band of the size filter, the reserved-memory outline, step marks,
//! each phase shaded behind the bands with its slope and rate, and an overview strip.
//!
//! The picture is a [`memsnap_plot::scene`], the same one `memsnap plot` writes: this module
//! keeps the view state and lays out the frame; `paint` paints the scene with egui (the plot's
//! background, shading, grid and bands as one picture made by `backdrop`), `interaction`
//! handles zoom, pan, hover and click, `overview` the strip under the plot, `legend` the key to
//! the colours and `controls` the filter bar.

mod backdrop;
mod controls;
mod interaction;
mod legend;
mod overview;
mod paint;
mod tail;

use std::sync::Arc;

use egui::{Pos2, Rect, Sense};
use memsnap_analysis::{Axis, DeviceTimeline, Hit, Layout, LayoutRequest, Lifetime, Step};
use memsnap_format::Snapshot;
use memsnap_plot::scene::{BandLayer, Pos, Rect as SceneRect, Scene};
use memsnap_plot::sites::StackMatch;
use memsnap_plot::{Colour, ColourBy};

pub use controls::filter_bar_ui;
pub use legend::legend_ui;
pub use memsnap_plot::scene::{axis_to_event, event_to_axis, has_time_axis};

use crate::advise::PredictedOverlay;
use crate::document::TimelineModel;
use crate::live_tail::LiveTail;
use crate::shortcuts::Command;
use crate::view::{Selection, TimeWindow};

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
    pub color_mode: ColourBy,
    /// Step markers, phase shading and phase slopes.
    pub show_steps: bool,
    pub show_reserved: bool,
    /// Scale y to what is visible (else to the whole run's peak).
    pub fit_y: bool,
    /// The last layout, reused while the request is unchanged.
    layout: Option<Layout>,
    overview: Option<Layout>,
    /// Screen position where a box-zoom drag started.
    box_start: Option<Pos2>,
    /// The band geometry, reused while nothing that shapes it changes.
    band_cache: Option<paint::BandCache>,
    /// The plot's background, shading, grid and bands as one picture, reused while they are
    /// unchanged.
    backdrop: Option<backdrop::Backdrop>,
    /// The shading, axes, step marks, slopes and labels of the last frame, and the frame's
    /// picture area and background (for SVG export).
    last_frame: Option<paint::LastFrame>,
    /// Milliseconds of the last layout computation (shown in the debug line and the bench).
    pub last_layout_ms: f64,
    /// Input time of the last zoom or pan, for the lighter layout while moving.
    last_move_time: Option<f64>,
    drawn_window: Option<TimeWindow>,
    pub search_focus_requested: bool,
    /// The fix selected in the Advise view: its predicted curves, drawn over the recorded
    /// run, and the allocations it checkpoints, tinted.
    pub predicted: Option<Arc<PredictedOverlay>>,
    /// What a live recording received after this document, drawn past its end until the
    /// next document replaces it (set each frame by the page, like `predicted`).
    pub live_tail: Option<Arc<LiveTail>>,
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
            color_mode: ColourBy::default(),
            show_steps: true,
            show_reserved: true,
            fit_y: true,
            layout: None,
            overview: None,
            box_start: None,
            band_cache: None,
            backdrop: None,
            last_frame: None,
            last_layout_ms: 0.0,
            last_move_time: None,
            drawn_window: None,
            search_focus_requested: false,
            predicted: None,
            live_tail: None,
        }
    }

    /// Widens the range to the end of the live tail (back to the document's when there is
    /// none): a view showing everything goes on showing everything, a zoomed one stays
    /// where it is. Not a move of the user's: the layout keeps its full detail. O(tail
    /// points).
    fn reach_live_tail(&mut self, timeline: &DeviceTimeline) {
        let document = full_window(timeline, self.axis);
        let tail_end = self
            .live_tail
            .as_ref()
            .filter(|_| self.lifetime == Lifetime::Active)
            .and_then(|t| tail::tail_end(timeline, self.axis, t));
        let end = tail_end.map_or(document.full_end, |e| e.max(document.full_end));
        if end == self.window.full_end {
            return;
        }
        let before = self.window;
        let showing_all = !self.window.is_zoomed();
        self.window.full_end = end;
        if showing_all {
            self.window.reset();
        } else {
            self.window.show_range(before.start, before.end.min(end));
        }
        if self.drawn_window == Some(before) {
            self.drawn_window = Some(self.window);
        }
    }

    /// Follows a timeline that grew (a live document rebuilt with more entries): the
    /// recorded range becomes the new one; a view showing everything keeps showing
    /// everything, a zoomed view keeps its range; the cached layouts, bands and search are
    /// made again. The size filter, colours and other choices stay. O(1).
    pub fn follow(&mut self, timeline: &DeviceTimeline) {
        if self.axis == Axis::Time && !has_time_axis(timeline) {
            self.axis = Axis::Event;
        }
        let zoomed = self.window.is_zoomed();
        let (start, end) = (self.window.start, self.window.end);
        self.window = full_window(timeline, self.axis);
        if zoomed {
            self.window.show_range(start, end);
        }
        self.layout = None;
        self.overview = None;
        self.band_cache = None;
        self.backdrop = None;
        self.search_match = None;
        self.drawn_window = None;
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

    /// The last drawn timeline as SVG, written from the same scene the frame painted.
    pub fn last_svg(&self) -> Option<String> {
        let last = self.last_frame.as_ref()?;
        let bands = &self.band_cache.as_ref()?.bands;
        let scene = Scene {
            origin: last.area.min,
            size: Pos::new(last.area.width(), last.area.height()),
            theme: last.theme,
            plot: last.plot,
            title: None,
            bands: bands.clone(),
            overlay: last.overlay.clone(),
            legend: Vec::new(),
        };
        Some(memsnap_plot::svg::write_svg(&scene))
    }

    /// The band layer last drawn (tests compare its colours with the model).
    pub fn last_band_drawing(&self) -> Option<&BandLayer> {
        self.band_cache.as_ref().map(|c| &c.bands)
    }

    /// The phase shading last drawn.
    pub fn last_phase_shading(&self) -> Option<&[(SceneRect, Colour)]> {
        self.last_frame
            .as_ref()
            .map(|f| f.overlay.shading.as_slice())
    }
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

/// What the timeline reports to its caller after a frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelineOutput {
    pub clicked: Option<Hit>,
}

/// The timeline plot with its axes and the overview strip. Hover, pin and the instant cursor
/// go to `selection`, which the other panels read.
pub fn timeline_ui(
    ui: &mut egui::Ui,
    model: &TimelineModel<'_>,
    state: &mut TimelineState,
    selection: &mut Selection,
) -> TimelineOutput {
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
    interaction::handle_zoom_and_pan(ui, &response, plot, state);
    state.reach_live_tail(model.timeline);
    let moving = state.note_motion(ui);
    state.layout_for(model.timeline, plot.width().round() as u32, moving);
    // Taken out while drawing (state changes below), put back at the end.
    let Some(layout) = state.layout.take() else {
        ui.painter().text(
            plot.center(),
            egui::Align2::CENTER_CENTER,
            "nothing to draw",
            egui::FontId::proportional(14.0),
            ui.visuals().weak_text_color(),
        );
        return TimelineOutput::default();
    };
    let painter = ui.painter_at(outer.union(overview_rect));
    let map = paint::timeline_scene_ui(ui, &painter, model, state, &layout, plot, available);
    interaction::highlight_ui(ui, &painter, model, state, selection, &layout, &map);
    let output = interaction::hover_and_click(&painter, &response, state, selection, &layout, &map);
    overview::overview_ui(ui, model, state, overview_rect);
    interaction::hover_card_ui(response, model, state, selection, &layout);
    state.layout = Some(layout);
    output
}

impl TimelineState {
    /// Notes whether the view moved this frame; while it moves (and shortly after) the layout
    /// is lighter, and a repaint comes back for full detail once it rests.
    fn note_motion(&mut self, ui: &egui::Ui) -> bool {
        let now = ui.input(|i| i.time);
        if self.drawn_window != Some(self.window) {
            if self.drawn_window.is_some() {
                self.last_move_time = Some(now);
            }
            self.drawn_window = Some(self.window);
        }
        let moving = self
            .last_move_time
            .is_some_and(|t| now - t < SETTLE_SECONDS);
        if moving {
            ui.ctx()
                .request_repaint_after(std::time::Duration::from_secs_f64(SETTLE_SECONDS));
        }
        moving
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_analysis::{AllocId, Category, PhaseKind, StepAnalysis};
    use memsnap_plot::palette;
    use memsnap_plot::scene::{band_colour, band_layer, BandLayer, BandStyle, Mapping};
    use memsnap_plot::sites::StackSites;
    use memsnap_workload::{generate, TrainingRun};

    fn mapping(width: f32, height: f32, timeline: &DeviceTimeline, y_max: f64) -> Mapping {
        let window = full_window(timeline, Axis::Event);
        Mapping {
            plot: SceneRect::from_x_y(0.0, width, 0.0, height),
            start: window.start,
            end: window.end,
            y_max,
            axis: Axis::Event,
        }
    }

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
        let map = mapping(400.0, 300.0, &timeline, layout.y_max as f64 * 1.05);
        let nothing = StackMatch::new(&snapshot, "no_such_function_anywhere");
        let style = BandStyle {
            search: Some(&nothing),
            show_reserved: false,
            dark: true,
            colour_by: ColourBy::Site,
        };
        let drawing = band_layer(&model.scene(), &layout, &style, &map);
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
        let style = BandStyle {
            search: None,
            show_reserved: true,
            dark: true,
            colour_by: ColourBy::Site,
        };
        let drawing = band_layer(&model.scene(), &layout, &style, &map);
        assert!(drawing.rects.iter().any(|(_, c)| !special.contains(c)));
        let inside = map.plot.expand2(1.0, 1.0);
        assert!(drawing.rects.iter().all(|(r, _)| inside.contains_rect(*r)));
        assert!(drawing.reserved.is_some(), "the reserved outline");
    }

    /// The generated default run: its snapshot, timeline, steps and sites.
    fn generated_run() -> (Snapshot, DeviceTimeline, StepAnalysis, StackSites) {
        let (snapshot, _) = generate(&TrainingRun::default());
        let timeline = DeviceTimeline::build(&snapshot, 0).expect("timeline");
        let steps = timeline.steps(&Default::default());
        let sites = StackSites::new(&snapshot);
        (snapshot, timeline, steps, sites)
    }

    fn drawing_in(model: &TimelineModel<'_>, layout: &Layout, mode: ColourBy) -> BandLayer {
        let map = mapping(800.0, 300.0, model.timeline, layout.y_max as f64);
        let style = BandStyle {
            search: None,
            show_reserved: false,
            dark: false,
            colour_by: mode,
        };
        band_layer(&model.scene(), layout, &style, &map)
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
                for mode in ColourBy::ALL {
                    assert_eq!(
                        band_colour(&model.scene(), id, a, mode, true),
                        palette::before_window(true)
                    );
                }
                continue;
            }
            assert_eq!(
                band_colour(&model.scene(), id, a, ColourBy::Category, true),
                palette::category_colour(steps.categories[i])
            );
            let event = a.alloc_event().expect("traced");
            let (_, phase) = steps.phase_at(event).expect("phases tile the run");
            assert_eq!(
                band_colour(&model.scene(), id, a, ColourBy::Phase, true),
                palette::phase_colour(phase.kind)
            );
            assert_eq!(
                band_colour(&model.scene(), id, a, ColourBy::Site, true),
                palette::site_colour(
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
        let colours = |mode| -> std::collections::HashSet<Colour> {
            drawing_in(&model, &layout, mode)
                .rects
                .iter()
                .map(|(_, c)| *c)
                .filter(|c| !special.contains(c))
                .collect()
        };
        let by_category = colours(ColourBy::Category);
        for category in [
            Category::Parameter,
            Category::OptimizerState,
            Category::Gradient,
            Category::Activation,
        ] {
            assert!(
                by_category.contains(&palette::category_colour(category)),
                "{category} is drawn"
            );
        }
        assert!(by_category.iter().all(|c| Category::ALL
            .iter()
            .any(|&k| palette::category_colour(k) == *c)));
        let by_phase = colours(ColourBy::Phase);
        let kinds = [
            PhaseKind::Forward,
            PhaseKind::Backward,
            PhaseKind::Optimizer,
        ];
        for kind in kinds {
            assert!(
                by_phase.contains(&palette::phase_colour(kind)),
                "{kind} is drawn"
            );
        }
        assert!(by_phase.len() <= 4, "{by_phase:?}");
        assert_ne!(colours(ColourBy::Site), by_category);
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
            band_colour(&model.scene(), AllocId(i as u32), a, ColourBy::Site, true)
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
}

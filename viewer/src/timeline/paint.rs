//! Paints the timeline's [`memsnap_plot::scene`] with egui: the plot's background, phase
//! shading, grid and bands as one cached picture ([`super::backdrop`]), the rest of the overlay
//! (ticks, step marks, slopes and their labels) every frame.

use std::sync::Arc;

use egui::epaint::Mesh;
use egui::{Painter, Pos2, Rect, Shape, Stroke};
use memsnap_analysis::{Layout, LayoutRequest};
use memsnap_plot::scene::{
    self, Align, BandLayer, BandStyle, Mapping, Overlay, Pos, Rect as SceneRect, Text, Theme,
};
use memsnap_plot::ColourBy;

use super::backdrop::{Backdrop, BackdropKey};
use super::{TimelineModel, TimelineState};
use crate::advise::PredictedOverlay;
use crate::palette::{color32, colour};

/// What the band geometry depends on.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct BandKey {
    request: LayoutRequest,
    plot: Rect,
    y_max_bits: u64,
    dark: bool,
    show_reserved: bool,
    search: Option<String>,
    colour_by: ColourBy,
    /// Whether the steps (categories, phases) had arrived: they colour the bands in the
    /// category and phase modes, and come after the first picture.
    steps_ready: bool,
}

/// Band geometry, kept while the [`BandKey`] is unchanged.
pub(super) struct BandCache {
    key: BandKey,
    pub(super) bands: BandLayer,
    /// Which layout this is (each gets a new number): the backdrop is composited again when
    /// it changes.
    generation: u64,
}

/// What the last frame drew besides the bands, for the SVG export.
pub(super) struct LastFrame {
    pub(super) overlay: Overlay,
    pub(super) plot: SceneRect,
    pub(super) area: SceneRect,
    pub(super) theme: Theme,
}

pub(super) fn pos(p: Pos) -> Pos2 {
    Pos2::new(p.x, p.y)
}

pub(super) fn rect(r: SceneRect) -> Rect {
    Rect::from_min_max(pos(r.min), pos(r.max))
}

pub(super) fn scene_rect(r: Rect) -> SceneRect {
    SceneRect::from_x_y(r.left(), r.right(), r.top(), r.bottom())
}

/// The scene's colours from egui's visuals.
fn theme(ui: &egui::Ui) -> Theme {
    let v = ui.visuals();
    Theme {
        dark: v.dark_mode,
        background: colour(v.panel_fill),
        plot_background: colour(v.extreme_bg_color),
        text: colour(v.text_color()),
        weak_text: colour(v.weak_text_color()),
        grid: colour(v.widgets.noninteractive.bg_stroke.color),
        label_halo: colour(v.extreme_bg_color.gamma_multiply(0.8)),
    }
}

/// Whether the reserved outline is drawn: asked for, and known (an import whose source records
/// no reserved memory has none, not 0 B).
pub(super) fn reserved_shown(model: &TimelineModel<'_>, state: &TimelineState) -> bool {
    state.show_reserved && model.timeline.replay().reserved_known()
}

/// The y scale: what is visible (fit y) or the whole run's peak, with a little headroom; a
/// selected fix's predicted run included, so its line is never cut off at the top.
fn y_max(model: &TimelineModel<'_>, state: &TimelineState, layout: &Layout) -> f64 {
    let show_reserved = reserved_shown(model, state);
    let predicted =
        |(allocated, reserved): (u64, u64)| allocated.max(if show_reserved { reserved } else { 0 });
    // The live tail, past the document's end, when the view reaches past that end.
    let tail = state
        .live_tail
        .as_ref()
        .filter(|_| state.lifetime == memsnap_analysis::Lifetime::Active)
        .filter(|_| state.window.end > super::full_window(model.timeline, state.axis).full_end)
        .map_or(0, |t| super::tail::tail_top(model.timeline, t));
    let y_top = if state.fit_y {
        let reserved = if show_reserved {
            scene::reserved_max(model.timeline, layout)
        } else {
            0
        };
        let in_view = state.predicted.as_ref().and_then(|p| {
            let event = |x: f64| scene::axis_to_event(model.timeline, state.axis, x).max(0.0);
            let lo = event(state.window.start).floor() as usize;
            let hi = (event(state.window.end).ceil() as usize).max(lo + 1);
            p.max_in(lo.min(p.len().saturating_sub(1)), hi.min(p.len()))
        });
        layout
            .y_max
            .max(reserved)
            .max(in_view.map_or(0, predicted))
            .max(tail)
    } else {
        let curves = model.timeline.curves();
        let whole = state.predicted.as_ref().map_or(0, |p| {
            predicted((p.allocated_peak_bytes, p.reserved_peak_bytes))
        });
        curves
            .active
            .max()
            .0
            .max(if show_reserved {
                curves.reserved.max().0
            } else {
                0
            })
            .max(whole)
            .max(tail)
    };
    (y_top as f64 * 1.05).max(1.0)
}

/// Builds this frame's scene (the bands only when something that shapes them changed) and
/// paints it; returns the mapping from values to screen points.
pub(super) fn timeline_scene_ui(
    ui: &egui::Ui,
    painter: &Painter,
    model: &TimelineModel<'_>,
    state: &mut TimelineState,
    layout: &Layout,
    plot: Rect,
    area: Rect,
) -> Mapping {
    let theme = theme(ui);
    let map = Mapping {
        plot: scene_rect(plot),
        start: state.window.start,
        end: state.window.end,
        y_max: y_max(model, state, layout),
        axis: state.axis,
    };
    let key = BandKey {
        request: layout.request,
        plot,
        y_max_bits: map.y_max.to_bits(),
        dark: theme.dark,
        show_reserved: reserved_shown(model, state),
        search: state.search_match.as_ref().map(|m| m.query.clone()),
        colour_by: state.color_mode,
        steps_ready: !model.steps.categories.is_empty(),
    };
    if state.band_cache.as_ref().is_none_or(|c| c.key != key) {
        if state.color_mode == ColourBy::Module {
            // Once per file, the first time bands are coloured by module.
            model.sites.find_modules(model.snapshot);
        }
        let style = BandStyle {
            colour_by: state.color_mode,
            dark: theme.dark,
            search: state.search_match.as_ref(),
            show_reserved: reserved_shown(model, state),
        };
        let bands = scene::band_layer(&model.scene(), layout, &style, &map);
        // Unique in the process: a backdrop never outlives a layout it was not made from.
        static LAYOUTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let generation = LAYOUTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        state.band_cache = Some(BandCache {
            key,
            bands,
            generation,
        });
    }
    let mut overlay = scene::overlay(
        &model.scene(),
        &map,
        state.window.full_start,
        &theme,
        if state.show_steps {
            scene::StepDetail::Thinned
        } else {
            scene::StepDetail::Hidden
        },
    );
    let font = egui::FontId::proportional(scene::FONT_SIZE);
    scene::place_labels(&mut overlay, map.plot, &mut |text: &str| {
        let size = painter
            .layout_no_wrap(text.to_owned(), font.clone(), egui::Color32::WHITE)
            .size();
        Pos::new(size.x, size.y)
    });

    let pixels_per_point = ui.ctx().pixels_per_point();
    let backdrop = BackdropKey {
        bands: state.band_cache.as_ref().map_or(u64::MAX, |c| c.generation),
        plot,
        background: ui.visuals().extreme_bg_color,
        // Zoomed out on a long run, most of thousands of phases are slivers between pixel
        // centres: compositing them costs time and adds (almost) nothing.
        shading: overlay
            .shading
            .iter()
            .map(|&(r, c)| (rect(r), color32(c)))
            .filter(|(r, _)| {
                r.width() * pixels_per_point >= 1.0 || covers_a_pixel_centre(*r, pixels_per_point)
            })
            .collect(),
        grid: overlay.grid.clone(),
        pixels_per_point,
        max_texture_side: ui.ctx().input(|i| i.max_texture_side),
    };
    let no_bands = BandLayer::default();
    let bands = state.band_cache.as_ref().map_or(&no_bands, |c| &c.bands);
    let bands = bands.rects.iter().map(|&(r, c)| (rect(r), color32(c)));
    let backdrop = Backdrop::update(ui.ctx(), state.backdrop.take(), backdrop, bands);
    backdrop.paint(painter);
    state.backdrop = Some(backdrop);
    for text in &overlay.ticks {
        text_ui(painter, text);
    }
    if let Some(cache) = &state.band_cache {
        if let Some(predicted) = &state.predicted {
            if predicted.touched_count > 0 {
                painter.add(Shape::mesh(Arc::new(touched_mesh(
                    &cache.bands,
                    predicted,
                    pixels_per_point,
                    theme.dark,
                ))));
            }
        }
        if let Some(line) = &cache.bands.reserved {
            let points = line.points.iter().copied().map(pos).collect();
            painter.add(Shape::line(
                points,
                Stroke::new(line.width, color32(line.colour)),
            ));
        }
    }
    if let Some(predicted) = &state.predicted {
        predicted_ui(
            painter,
            model,
            layout,
            &map,
            predicted,
            reserved_shown(model, state),
        );
    }
    if let Some(tail) = state
        .live_tail
        .as_ref()
        .filter(|_| state.lifetime == memsnap_analysis::Lifetime::Active)
    {
        let points = super::tail::tail_points(model.timeline, state.axis, tail);
        super::tail::live_tail_ui(painter, &map, &points);
    }
    // Thousands of step marks land on the same pixels of a long run seen whole: one line per
    // pixel column looks the same and costs a thousandth of the triangles.
    let mut last_mark_x = f32::NEG_INFINITY;
    for mark in overlay.step_marks.iter().filter(|m| !m.crowded) {
        let x = mark.line.points.first().map_or(0.0, |p| p.x) * pixels_per_point;
        if (x - last_mark_x).abs() < 1.0 {
            continue;
        }
        last_mark_x = x;
        line_ui(
            painter,
            &mark.line.points,
            mark.line.width,
            mark.line.colour,
        );
    }
    for slope in &overlay.slopes {
        let points = [pos(slope.from), pos(slope.to)];
        painter.line_segment(points, Stroke::new(4.0, color32(overlay.halo)));
        painter.line_segment(points, Stroke::new(2.0, color32(slope.colour)));
    }
    for label in &overlay.labels {
        if let Some((r, c)) = label.halo {
            painter.rect_filled(rect(r), 2.0, color32(c));
        }
        text_ui(painter, &label.text);
    }
    state.last_frame = Some(LastFrame {
        overlay,
        plot: map.plot,
        area: scene_rect(area),
        theme,
    });
    map
}

/// The colour of a predicted run's curves (allocated solid, reserved dashed): a magenta no
/// category, phase or site band has.
pub(super) const PREDICTED: egui::Color32 = egui::Color32::from_rgb(236, 0, 140);

/// The tint over the allocations a selected fix checkpoints: the predicted run's magenta,
/// half transparent, so the bands' own colours still show through.
pub(super) fn touched_tint(dark: bool) -> egui::Color32 {
    egui::Color32::from_rgba_unmultiplied(236, 0, 140, if dark { 150 } else { 120 })
}

/// The drawn rectangles of the bands whose allocations the fix checkpoints, as one mesh in
/// the tint. O(drawn bands + their rectangles): only what the layout put in view.
pub(super) fn touched_mesh(
    bands: &BandLayer,
    predicted: &PredictedOverlay,
    pixels_per_point: f32,
    dark: bool,
) -> Mesh {
    let tint = touched_tint(dark);
    let mut mesh = Mesh::default();
    for &(id, start, end) in &bands.bands {
        if !predicted.touches(id) {
            continue;
        }
        for (r, _) in bands.rects.get(start..end).unwrap_or_default() {
            let r = rect(*r);
            if covers_a_pixel_centre(r, pixels_per_point) {
                mesh.add_colored_rect(r, tint);
            }
        }
    }
    mesh
}

/// The points of a predicted run's curves, one per layout column: the highest predicted
/// allocated and reserved bytes over the recorded events the column covers (so no peak is
/// lost between columns). O(columns), each an O(1) range query plus two partial blocks.
pub(super) fn predicted_points(
    model: &TimelineModel<'_>,
    layout: &Layout,
    map: &Mapping,
    predicted: &PredictedOverlay,
) -> (Vec<Pos2>, Vec<Pos2>) {
    let mut allocated = Vec::with_capacity(layout.columns.len());
    let mut reserved = Vec::with_capacity(layout.columns.len());
    let last = predicted.len();
    for c in &layout.columns {
        let lo = scene::axis_to_event(model.timeline, map.axis, c.x0)
            .floor()
            .max(0.0) as usize;
        let hi = (scene::axis_to_event(model.timeline, map.axis, c.x1).ceil() as usize)
            .max(lo + 1)
            .min(last);
        let Some((a, r)) = predicted.max_in(lo.min(last.saturating_sub(1)), hi) else {
            continue;
        };
        let x = map.x((c.x0 + c.x1) / 2.0);
        allocated.push(Pos2::new(x, map.y(a)));
        reserved.push(Pos2::new(x, map.y(r)));
    }
    (allocated, reserved)
}

/// The selected fix's predicted run over the recorded one: allocated as a solid line,
/// reserved (when the recorded outline is shown) dashed, both in [`PREDICTED`].
fn predicted_ui(
    painter: &Painter,
    model: &TimelineModel<'_>,
    layout: &Layout,
    map: &Mapping,
    predicted: &PredictedOverlay,
    show_reserved: bool,
) {
    let (allocated, reserved) = predicted_points(model, layout, map, predicted);
    if show_reserved && reserved.len() > 1 {
        painter.extend(Shape::dashed_line(
            &reserved,
            Stroke::new(1.5, PREDICTED),
            6.0,
            4.0,
        ));
    }
    if allocated.len() > 1 {
        painter.add(Shape::line(allocated, Stroke::new(2.0, PREDICTED)));
    }
}

/// Whether `r` (in points) contains the centre of some physical pixel in both directions.
pub(super) fn covers_a_pixel_centre(r: Rect, pixels_per_point: f32) -> bool {
    let covers = |a: f32, b: f32| {
        let (lo, hi) = (a.min(b) * pixels_per_point, a.max(b) * pixels_per_point);
        // The first pixel centre (k + 0.5) at or after `lo`.
        (lo - 0.5).ceil() + 0.5 <= hi
    };
    covers(r.left(), r.right()) && covers(r.top(), r.bottom())
}

/// A grid line or a step mark (straight across the plot), or a polyline.
fn line_ui(painter: &Painter, points: &[Pos], width: f32, c: memsnap_plot::Colour) {
    let stroke = Stroke::new(width, color32(c));
    match points {
        [a, b] if a.y == b.y => {
            painter.hline(a.x..=b.x, a.y, stroke);
        }
        [a, b] if a.x == b.x => {
            painter.vline(a.x, a.y..=b.y, stroke);
        }
        _ => {
            painter.add(Shape::line(
                points.iter().copied().map(pos).collect(),
                stroke,
            ));
        }
    }
}

fn text_ui(painter: &Painter, text: &Text) {
    let align = |a: Align| match a {
        Align::Min => egui::Align::Min,
        Align::Center => egui::Align::Center,
        Align::Max => egui::Align::Max,
    };
    painter.text(
        pos(text.pos),
        egui::Align2([align(text.align.0), align(text.align.1)]),
        &text.text,
        egui::FontId::proportional(text.size),
        color32(text.colour),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_predicted_run_above_the_recorded_one_raises_the_y_scale() {
        use memsnap_analysis::DeviceTimeline;
        let (snapshot, _) = memsnap_workload::generate(&memsnap_workload::TrainingRun {
            steps: 2,
            ..Default::default()
        });
        let timeline = DeviceTimeline::build(&snapshot, 0).expect("timeline");
        let steps = timeline.steps(&Default::default());
        let sites = memsnap_plot::sites::StackSites::new(&snapshot);
        let model = TimelineModel {
            snapshot: &snapshot,
            timeline: &timeline,
            steps: &steps,
            sites: &sites,
        };
        let mut state = TimelineState::new(&timeline);
        let layout = timeline
            .layout(&LayoutRequest::whole(&timeline, 400))
            .expect("layout");
        let recorded = y_max(&model, &state, &layout);
        let n = timeline.replay().trace_len as usize;
        let high = recorded as u64 * 3;
        let curve = memsnap_advise::PredictedCurve {
            events: vec![n as u32 / 2],
            allocated: vec![high],
            reserved: vec![high],
            allocated_peak_bytes: high,
            reserved_peak_bytes: high,
            checkpointed_events: Vec::new(),
        };
        state.predicted = Some(Arc::new(PredictedOverlay::new(&curve, "x", n, &[])));
        assert!(y_max(&model, &state, &layout) >= high as f64);
        state.fit_y = false;
        assert!(y_max(&model, &state, &layout) >= high as f64);
        state.predicted = None;
        assert!(y_max(&model, &state, &layout) < high as f64);
    }

    #[test]
    fn a_rect_between_pixel_centres_covers_none_and_is_left_out() {
        let r = |x0: f32, x1: f32, y0: f32, y1: f32| Rect::from_x_y_ranges(x0..=x1, y0..=y1);
        // Pixel centres at 0.5, 1.5, …
        assert!(covers_a_pixel_centre(r(0.0, 1.0, 0.0, 1.0), 1.0));
        assert!(
            !covers_a_pixel_centre(r(0.0, 1.0, 0.6, 1.4), 1.0),
            "thin band"
        );
        assert!(
            !covers_a_pixel_centre(r(0.6, 1.4, 0.0, 10.0), 1.0),
            "narrow column"
        );
        assert!(covers_a_pixel_centre(r(0.0, 1.0, 1.4, 1.6), 1.0));
        // At 2 pixels per point the centres are at 0.25, 0.75, … points.
        assert!(covers_a_pixel_centre(r(0.0, 1.0, 0.6, 0.8), 2.0));
        assert!(!covers_a_pixel_centre(r(0.0, 1.0, 0.3, 0.7), 2.0));
    }
}

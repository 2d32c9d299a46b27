//! Several files (ranks): a table with peak, steps and drift per rank, one small timeline per
//! rank on a shared axis, and an overlay of their totals.

use egui::{Color32, Pos2, Rect, Sense, Shape, Stroke};
use memsnap_analysis::compare::{RankRow, Skew};
use memsnap_analysis::{Axis, CurveKind, LayoutRequest, Lifetime};

use crate::document::Shown;
use crate::palette;
use crate::timeline::{event_to_axis, has_time_axis};
use crate::units::{format_delta, format_duration_us, format_size};

/// Height of each small multiple.
const SMALL_HEIGHT: f32 = 70.0;

/// The shared axis: wall time when every rank has times (ranks of one job share a clock)
/// and `by_event` is off, else the event index.
pub fn shared_range(documents: &[Shown<'_>], by_event: bool) -> (Axis, f64, f64) {
    let all_timed = documents.iter().all(|d| has_time_axis(&d.device.timeline));
    if all_timed && !by_event {
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        for d in documents {
            let t = &d.device.timeline;
            let last = f64::from(t.replay().axis_len() - 1);
            lo = lo.min(event_to_axis(t, Axis::Time, 0.0));
            hi = hi.max(event_to_axis(t, Axis::Time, last) + 1.0);
        }
        (Axis::Time, lo, hi)
    } else {
        let hi = documents
            .iter()
            .map(|d| f64::from(d.device.timeline.replay().axis_len()))
            .fold(1.0, f64::max);
        (Axis::Event, 0.0, hi)
    }
}

/// One colour per rank for the overlay.
fn rank_color(i: usize) -> Color32 {
    palette::color32(palette::series_colour(i))
}

/// The ranks page's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RanksState {
    /// Line the ranks up by event index instead of wall time (for runs whose clocks differ).
    pub by_event: bool,
}

/// Per-column (x, max bytes) of a rank's total over the shared range, only where it recorded.
fn rank_curve(doc: &Shown<'_>, axis: Axis, start: f64, end: f64, width: u32) -> Vec<(f64, u64)> {
    let timeline = &doc.device.timeline;
    let request = LayoutRequest {
        axis,
        start,
        end,
        width_px: width.max(1),
        min_size: u64::MAX,
        max_bands: 0,
        lifetime: Lifetime::Active,
    };
    let Ok(layout) = timeline.layout(&request) else {
        return Vec::new();
    };
    let own_start = event_to_axis(timeline, axis, 0.0);
    let own_end = event_to_axis(timeline, axis, f64::from(timeline.replay().axis_len()));
    layout
        .columns
        .iter()
        .filter(|c| c.x1 > own_start && c.x0 < own_end)
        .map(|c| (c.x0, c.total_max))
        .collect()
}

/// The ranks page. Clicking a rank's row or plot makes it the active file.
pub fn ranks_ui(
    ui: &mut egui::Ui,
    documents: &[Shown<'_>],
    active: &mut usize,
    state: &mut RanksState,
) {
    if documents.is_empty() {
        return;
    }
    ui.horizontal(|ui| {
        ui.label("Shared axis:");
        ui.selectable_value(&mut state.by_event, false, "wall time")
            .on_hover_text(
                "Ranks of one job share a clock: line them up by time (when every file has times)",
            );
        ui.selectable_value(&mut state.by_event, true, "event index")
            .on_hover_text(
                "Line the ranks up by trace entry, e.g. for runs recorded at different times",
            );
    });
    if documents.iter().any(|d| !d.document.profiles_ready()) {
        // The profiles are computed after the files open; a repaint picks them up.
        ui.horizontal(|ui| {
            ui.spinner();
            ui.label("Summarising the ranks…");
        });
        ui.ctx()
            .request_repaint_after(std::time::Duration::from_millis(100));
    }
    let rows: Vec<RankRow> = documents
        .iter()
        .filter_map(|d| {
            let profile = d.device.profile()?;
            RankRow::from_summary(
                d.document.name.clone(),
                std::slice::from_ref(&profile.summary),
            )
        })
        .collect();
    if let Some(skew) = Skew::of(&rows) {
        ui.label(format!(
            "{} ranks; peak from {} to {} (spread {}, {:.1}%), highest: {}{}",
            skew.ranks,
            format_size(skew.min_peak_bytes),
            format_size(skew.max_peak_bytes),
            format_size(skew.peak_spread_bytes),
            skew.peak_spread_percent,
            skew.max_peak_file,
            skew.step_duration_spread_us
                .map(|s| format!("; step time spread {}", format_duration_us(s)))
                .unwrap_or_default()
        ));
    }
    egui::Grid::new("ranks_table")
        .striped(true)
        .num_columns(6)
        .show(ui, |ui| {
            for (title, tip) in [
                ("rank", "The file (click to show it in the timeline)"),
                ("peak", "Highest allocated memory"),
                ("steps", "Training steps found"),
                ("step time", "Median step duration"),
                ("drift/step", "Growth of the step minimum per step"),
                ("", ""),
            ] {
                ui.strong(title).on_hover_text(tip);
            }
            ui.end_row();
            for (i, row) in rows.iter().enumerate() {
                let label = egui::RichText::new(&row.file).color(rank_color(i));
                if ui
                    .selectable_label(*active == i, label)
                    .on_hover_text("Make this the active file")
                    .clicked()
                {
                    *active = i;
                }
                ui.label(format_size(row.peak_bytes));
                ui.label(row.steps.to_string());
                ui.label(row.step_duration_us.map_or("–".into(), format_duration_us));
                ui.label(format_delta(row.drift_bytes_per_step.round() as i64));
                if row.leak_suspected {
                    ui.colored_label(palette::color32(palette::WARNING), "leak suspected");
                } else {
                    ui.label("");
                }
                ui.end_row();
            }
        });
    ui.separator();

    let (axis, start, end) = shared_range(documents, state.by_event);
    let width = ui.available_width().max(100.0);
    let curves: Vec<Vec<(f64, u64)>> = documents
        .iter()
        .map(|d| rank_curve(d, axis, start, end, width.round() as u32))
        .collect();
    let y_max = curves
        .iter()
        .flat_map(|c| c.iter().map(|(_, v)| *v))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.05;
    let to_x =
        |rect: Rect, x: f64| rect.left() + ((x - start) / (end - start)) as f32 * rect.width();

    ui.strong("Totals overlaid");
    let (rect, response) = ui.allocate_exact_size(egui::vec2(width, 160.0), Sense::hover());
    let painter = ui.painter_at(rect);
    painter.rect_filled(rect, 0.0, ui.visuals().extreme_bg_color);
    for (i, curve) in curves.iter().enumerate() {
        let points: Vec<Pos2> = curve
            .iter()
            .map(|(x, v)| {
                Pos2::new(
                    to_x(rect, *x),
                    rect.bottom() - (*v as f64 / y_max) as f32 * rect.height(),
                )
            })
            .collect();
        if points.len() >= 2 {
            painter.add(Shape::line(points, Stroke::new(1.5, rank_color(i))));
        }
    }
    response.widget_info(|| {
        egui::WidgetInfo::labeled(
            egui::Role::Image,
            true,
            format!("Totals of {} ranks overlaid", documents.len()),
        )
    });
    ui.add_space(6.0);
    ui.strong("Each rank (same time and memory axes)");
    egui::ScrollArea::vertical().show(ui, |ui| {
        for (i, (doc, curve)) in documents.iter().zip(&curves).enumerate() {
            let (rect, response) =
                ui.allocate_exact_size(egui::vec2(width, SMALL_HEIGHT), Sense::click());
            let painter = ui.painter_at(rect);
            painter.rect_filled(rect, 0.0, ui.visuals().extreme_bg_color);
            let color = rank_color(i);
            let mut mesh = egui::epaint::Mesh::default();
            for (k, (x, v)) in curve.iter().enumerate() {
                let x0 = to_x(rect, *x);
                let x1 = curve.get(k + 1).map_or(x0 + 1.0, |(nx, _)| to_x(rect, *nx));
                let top = rect.bottom() - (*v as f64 / y_max) as f32 * rect.height();
                mesh.add_colored_rect(
                    Rect::from_x_y_ranges(x0..=x1, top..=rect.bottom()),
                    color.gamma_multiply(0.8),
                );
            }
            painter.add(Shape::mesh(mesh));
            painter.text(
                rect.left_top() + egui::vec2(4.0, 2.0),
                egui::Align2::LEFT_TOP,
                format!(
                    "{}  peak {}",
                    doc.document.name,
                    format_size(doc.device.timeline.peak(CurveKind::Active).bytes)
                ),
                egui::FontId::proportional(11.0),
                ui.visuals().strong_text_color(),
            );
            if i == *active {
                painter.rect_stroke(
                    rect,
                    0.0,
                    Stroke::new(1.5, palette::color32(palette::HIGHLIGHT)),
                    egui::StrokeKind::Inside,
                );
            }
            let response = response.on_hover_text("Click to make this the active file");
            if response.clicked() {
                *active = i;
            }
        }
    });
}

//! What the pointer and the keyboard do to the plot: zoom, pan and box zoom; hover and click
//! (pin an allocation, move the instant cursor); the highlights and the hover card.

use egui::{Color32, Painter, Pos2, Rect, Stroke};
use memsnap_analysis::{Hit, Layout};
use memsnap_plot::scene::Mapping;

use super::{event_to_axis, TimelineModel, TimelineOutput, TimelineState};
use crate::palette::{self, color32};
use crate::units::format_size;
use crate::view::Selection;

pub(super) fn handle_zoom_and_pan(
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

/// The pinned allocation's outline and the instant cursor.
pub(super) fn highlight_ui(
    ui: &egui::Ui,
    painter: &Painter,
    model: &TimelineModel<'_>,
    state: &TimelineState,
    selection: &Selection,
    layout: &Layout,
    map: &Mapping,
) {
    let plot = super::paint::rect(map.plot);
    if let Some(pinned) = selection.pinned {
        if let Some(band) = layout.band(pinned) {
            for (i, step) in band.steps.iter().enumerate() {
                let x1 = band.steps.get(i + 1).map_or(band.x_end, |next| next.x);
                let rect = Rect::from_x_y_ranges(
                    map.x(step.x)..=map.x(x1),
                    map.y(step.bottom.saturating_add(band.size))..=map.y(step.bottom),
                );
                painter.rect_stroke(
                    rect,
                    0.0,
                    Stroke::new(2.0, color32(palette::HIGHLIGHT)),
                    egui::StrokeKind::Outside,
                );
            }
        }
    }
    if let Some(cursor) = selection.cursor {
        let x = map.x(event_to_axis(model.timeline, state.axis, f64::from(cursor)));
        if plot.x_range().contains(x) {
            painter.vline(
                x,
                plot.y_range(),
                Stroke::new(1.0, ui.visuals().strong_text_color()),
            );
        }
    }
}

/// What the pointer is over (outlined, or the zoom box being dragged), and what a click pins.
pub(super) fn hover_and_click(
    painter: &Painter,
    response: &egui::Response,
    state: &TimelineState,
    selection: &mut Selection,
    layout: &Layout,
    map: &Mapping,
) -> TimelineOutput {
    let plot = super::paint::rect(map.plot);
    let mut output = TimelineOutput::default();
    selection.hovered = None;
    if let Some(pos) = response.hover_pos() {
        let x = map.axis_at(pos.x);
        let hit = layout.hit_test(x, map.bytes_at(pos.y));
        selection.hovered = hit;
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
            let band = layout.band(id);
            let bottom = band
                .zip(layout.column_at(x))
                .and_then(|(b, c)| b.bottom_at(c));
            if let (Some(band), Some(bottom)) = (band, bottom) {
                let rect = Rect::from_x_y_ranges(
                    map.x(band.x_start)..=map.x(band.x_end),
                    map.y(bottom.saturating_add(band.size))..=map.y(bottom),
                );
                painter.rect_stroke(
                    rect,
                    0.0,
                    Stroke::new(1.0, color32(palette::HIGHLIGHT)),
                    egui::StrokeKind::Outside,
                );
            }
        }
    }
    if response.clicked() {
        if let Some(pos) = response.interact_pointer_pos() {
            let x = map.axis_at(pos.x);
            let hit = layout.hit_test(x, map.bytes_at(pos.y));
            selection.pinned = match hit {
                Some(Hit::Band(id)) => Some(id),
                _ => None,
            };
            selection.cursor = layout
                .column_at(x)
                .map(|c| layout.columns[c as usize].event);
            output.clicked = hit;
        }
    }
    output
}

/// The plot's accessible description, and the card under the pointer.
pub(super) fn hover_card_ui(
    response: egui::Response,
    model: &TimelineModel<'_>,
    state: &TimelineState,
    selection: &Selection,
    layout: &Layout,
) {
    let description = format!(
        "Active memory timeline: {} bands drawn, peak in view {}, allocations below {} folded",
        layout.bands.len(),
        format_size(layout.y_max),
        format_size(layout.drawn_min_size)
    );
    response.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Image, true, &description));
    if state.box_start.is_some() {
        return;
    }
    match selection.hovered {
        Some(Hit::Band(id)) => {
            response.on_hover_ui_at_pointer(|ui| {
                crate::details_ui::hover_card_ui(ui, model, id);
            });
        }
        Some(Hit::Residual { column }) => {
            response.on_hover_ui_at_pointer(|ui| {
                let col = &layout.columns[column as usize];
                ui.label(format!(
                    "{} in allocations smaller than {} (or beyond the {} largest)",
                    format_size(col.total_bytes.saturating_sub(col.drawn_bytes)),
                    format_size(layout.drawn_min_size.max(1)),
                    state.max_bands
                ));
            });
        }
        None => {}
    }
}

//! The overview strip under the plot: the whole run's total, with the visible window marked.

use egui::epaint::Mesh;
use egui::{Color32, Pos2, Rect, Sense, Shape, Stroke};

use super::{TimelineModel, TimelineState};
use crate::palette::{self, color32};
use crate::view::TimeWindow;

/// The overview strip: the whole run's total, with the visible window marked. Click or drag
/// to move the window.
pub(super) fn overview_ui(
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
        let fill = color32(palette::overview(dark));
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

//! A one-line key to the colours of the plot, from the scene's legend.

use egui::Sense;
use memsnap_plot::scene::{self, LegendStyle};

use super::{TimelineModel, TimelineState};
use crate::palette::color32;

/// What band colours mean in the current mode, the special bands, and the phases.
pub fn legend_ui(ui: &mut egui::Ui, model: &TimelineModel<'_>, state: &TimelineState) {
    let style = LegendStyle {
        colour_by: state.color_mode,
        dark: ui.visuals().dark_mode,
        show_steps: state.show_steps,
        show_reserved: super::paint::reserved_shown(model, state),
        min_size: state.min_size,
    };
    let entries = scene::legend(&model.scene(), &style);
    ui.horizontal_wrapped(|ui| {
        ui.spacing_mut().item_spacing.x = 4.0;
        for entry in entries {
            let (rect, _) = ui.allocate_exact_size(egui::vec2(12.0, 12.0), Sense::hover());
            ui.painter().rect_filled(rect, 2.0, color32(entry.swatch));
            if let Some(inner) = entry.inner {
                ui.painter()
                    .rect_filled(rect.shrink(3.0), 1.0, color32(inner));
            }
            ui.label(entry.label).on_hover_text(entry.tooltip);
            ui.add_space(8.0);
        }
        if let Some(predicted) = &state.predicted {
            // The swatch and its words on one line.
            ui.horizontal(|ui| {
            let (rect, _) = ui.allocate_exact_size(egui::vec2(16.0, 12.0), Sense::hover());
            ui.painter().hline(
                rect.x_range(),
                rect.center().y,
                egui::Stroke::new(2.0, super::paint::PREDICTED),
            );
            ui.label(&predicted.label).on_hover_text(format!(
                "The fix selected in the Advise view, replayed: the edited trace's entries drawn at the recorded entries they stand for, the highest value per pixel column (allocated solid, reserved dashed; blocks as the allocator rounds them). Predicted peaks: allocated {}, reserved {}",
                crate::units::format_size(predicted.allocated_peak_bytes),
                crate::units::format_size(predicted.reserved_peak_bytes)
            ));
            });
            ui.add_space(8.0);
            if predicted.touched_count > 0 {
                ui.horizontal(|ui| {
                let (rect, _) = ui.allocate_exact_size(egui::vec2(12.0, 12.0), Sense::hover());
                ui.painter()
                    .rect_filled(rect, 2.0, super::paint::touched_tint(ui.visuals().dark_mode));
                ui.label("checkpointed by the fix").on_hover_text(format!(
                    "{} allocations made in the module calls the fix checkpoints: freed after each call's forward and made again at the start of its backward",
                    predicted.touched_count
                ));
                });
            }
        }
    });
}

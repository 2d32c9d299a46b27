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
    });
}

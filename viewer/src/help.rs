//! The help overlay: every keyboard shortcut and mouse gesture, from the same table the key
//! handling reads.

use crate::shortcuts::{COMMANDS, GESTURES};

/// Shows the shortcut list in a window while `open` is true.
pub fn help_overlay_ui(ui: &mut egui::Ui, open: &mut bool) {
    let ctx = ui.ctx().clone();
    egui::Window::new("Keyboard shortcuts")
        .open(open)
        .collapsible(false)
        .resizable(false)
        .anchor(egui::Align2::CENTER_CENTER, egui::Vec2::ZERO)
        .show(&ctx, |ui| {
            egui::Grid::new("shortcut_grid")
                .num_columns(2)
                .striped(true)
                .spacing([16.0, 4.0])
                .show(ui, |ui| {
                    for (_, keys, what) in COMMANDS {
                        let keys: Vec<String> =
                            keys.iter().map(|k| ctx.format_shortcut(k)).collect();
                        ui.monospace(keys.join("  "));
                        ui.label(*what);
                        ui.end_row();
                    }
                    for (gesture, what) in GESTURES {
                        ui.monospace(*gesture);
                        ui.label(*what);
                        ui.end_row();
                    }
                });
            ui.add_space(6.0);
            ui.label("Press F1 or Esc to close.");
        });
}

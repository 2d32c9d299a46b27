//! The filter bar above the plot: size filter, search, axis, lifetime, toggles, colour mode.

use memsnap_analysis::{Axis, Lifetime};
use memsnap_plot::ColourBy;

use super::{has_time_axis, TimelineModel, TimelineState};
use crate::units::{bytes_to_slider, format_size, slider_to_bytes, LOG_SLIDER_MAX};

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
                format!("smaller than {}", format_size(state.min_size))
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
        for mode in ColourBy::ALL {
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

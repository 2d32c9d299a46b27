//! The training steps table (peak, growth, release, drift) and the leak banner. Clicking a row
//! zooms the timeline to that step.

use egui_extras::{Column, TableBuilder};
use memsnap_analysis::{Slope, StepAnalysis, StepMethod};

use crate::palette;
use crate::units::{format_bytes, format_bytes_signed, format_duration_us, format_rate};

/// The table's state: the selected row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepsState {
    pub selected: Option<usize>,
}

impl StepsState {
    /// The step after (or before) the selected one, for `]` and `[`.
    pub fn step_after(&self, steps: &StepAnalysis, forward: bool) -> Option<usize> {
        let n = steps.steps.len();
        if n == 0 {
            return None;
        }
        Some(match (self.selected, forward) {
            (None, true) => 0,
            (None, false) => n - 1,
            (Some(i), true) => (i + 1).min(n - 1),
            (Some(i), false) => i.saturating_sub(1),
        })
    }
}

/// A banner when memory drifts from step to step (a leak) or the peak grows.
pub fn drift_banner_ui(ui: &mut egui::Ui, steps: &StepAnalysis) {
    let drift = &steps.drift;
    if drift.leak_suspected {
        ui.label(
            egui::RichText::new(format!(
                "Leak suspected: the memory left after each step grows by {} per step ({:.1}% over the run)",
                format_bytes_signed(drift.min_bytes_per_step.round() as i64),
                drift.min_growth_percent
            ))
            .color(palette::WARNING),
        )
        .on_hover_text("The minimum of each step, fitted with a robust (Theil–Sen) line; see the 'outliving' column for the steps that keep memory");
    }
    if drift.peak_growth_suspected {
        ui.label(
            egui::RichText::new(format!(
                "Peak grows by {} per step ({:.1}% over the run)",
                format_bytes_signed(drift.peak_bytes_per_step.round() as i64),
                drift.peak_growth_percent
            ))
            .color(palette::WARNING),
        );
    }
}

fn slope_text(slope: &Slope) -> String {
    match slope.bytes_per_s {
        Some(rate) => format!(
            "{} ({})",
            format_bytes(slope.bytes.unsigned_abs()),
            format_rate(rate)
        ),
        None => format!(
            "{} ({}/event)",
            format_bytes(slope.bytes.unsigned_abs()),
            format_bytes(slope.bytes_per_event.abs().round() as u64)
        ),
    }
}

/// The steps table. Returns the step whose row was clicked.
pub fn steps_ui(ui: &mut egui::Ui, steps: &StepAnalysis, state: &mut StepsState) -> Option<usize> {
    let method = match &steps.method {
        StepMethod::Stacks => "phases from the allocation stacks".to_owned(),
        StepMethod::Annotations { name } => format!("from record_function annotations \"{name}\""),
        StepMethod::CurveShape => "from the rise and fall of memory".to_owned(),
        StepMethod::None => "none found".to_owned(),
    };
    ui.horizontal(|ui| {
        ui.strong(format!("Training steps: {}", steps.steps.len()));
        ui.weak(method);
        let drift = &steps.drift;
        if steps.steps.len() >= 2 {
            ui.separator();
            ui.label(format!(
                "drift {} per step (minimum), {} per step (peak)",
                format_bytes_signed(drift.min_bytes_per_step.round() as i64),
                format_bytes_signed(drift.peak_bytes_per_step.round() as i64)
            ))
            .on_hover_text(format!(
                "Growth over the run: minimum {:.2}%, peak {:.2}% of the highest step peak (flagged above {:.1}%)",
                drift.min_growth_percent, drift.peak_growth_percent, drift.tolerance_percent
            ));
        }
    });
    if steps.steps.is_empty() {
        ui.weak("No repeating step shape and no step annotations in this trace.");
        return None;
    }
    let mut clicked = None;
    let row_height = ui.text_style_height(&egui::TextStyle::Body) + 4.0;
    TableBuilder::new(ui)
        .id_salt("steps_table")
        .striped(true)
        .sense(egui::Sense::click())
        .cell_layout(egui::Layout::left_to_right(egui::Align::Center))
        .column(Column::exact(64.0))
        .column(Column::auto().at_least(80.0))
        .column(Column::auto().at_least(80.0))
        .column(Column::auto().at_least(150.0))
        .column(Column::auto().at_least(150.0))
        .column(Column::auto().at_least(80.0))
        .column(Column::auto().at_least(90.0))
        .column(Column::remainder())
        .header(row_height, |mut header| {
            for (title, tip) in [
                ("step", "Step number (click a row to zoom to it)"),
                ("start", "Memory at the start of the step"),
                ("peak", "Highest memory in the step"),
                ("growth", "Forward: start to peak, and its rate"),
                ("release", "Backward: peak to end, and its rate"),
                ("drift", "End minus start: memory the step kept"),
                (
                    "outliving",
                    "Allocations made in the step and still live after it",
                ),
                ("duration", "Wall time of the step"),
            ] {
                header.col(|ui| {
                    ui.strong(title).on_hover_text(tip);
                });
            }
        })
        .body(|body| {
            body.rows(row_height, steps.steps.len(), |mut row| {
                let i = row.index();
                let step = &steps.steps[i];
                row.set_selected(state.selected == Some(i));
                let drift = step.end_bytes as i64 - step.start_bytes as i64;
                let leaky = step.outliving_bytes > 0 && drift > 0;
                let duration = step
                    .start_time_us
                    .zip(step.end_time_us)
                    .map_or("–".to_owned(), |(a, b)| format_duration_us(b - a));
                row.col(|ui| {
                    if ui
                        .add(egui::Button::new(format!("step {}", step.index)).frame(false))
                        .on_hover_text("Zoom the timeline to this step")
                        .clicked()
                    {
                        clicked = Some(i);
                    }
                });
                let cells = [
                    format_bytes(step.start_bytes),
                    format_bytes(step.peak_bytes),
                    slope_text(&step.forward),
                    slope_text(&step.backward),
                    format_bytes_signed(drift),
                    if step.outliving_count == 0 {
                        "–".to_owned()
                    } else {
                        format!(
                            "{} in {}",
                            format_bytes(step.outliving_bytes),
                            step.outliving_count
                        )
                    },
                    duration,
                ];
                for (c, text) in cells.into_iter().enumerate() {
                    row.col(|ui| {
                        let rich = egui::RichText::new(text);
                        let rich = if leaky && (c == 4 || c == 5) {
                            rich.color(palette::WARNING)
                        } else {
                            rich
                        };
                        ui.add(egui::Label::new(rich).selectable(false));
                    });
                }
                if row.response().clicked() {
                    clicked = Some(i);
                }
            });
        });
    if let Some(i) = clicked {
        state.selected = Some(i);
    }
    clicked
}

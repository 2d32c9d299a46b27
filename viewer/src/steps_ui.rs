//! The training steps table and the leak banner: the set-up phase, then each step (start and
//! end, peak, what it keeps, warm-up or partial) with its phases under it (forward, backward,
//! optimizer: events, bytes, change and rate). Clicking a row zooms the timeline to that step
//! or phase.

use std::collections::BTreeSet;

use egui_extras::{Column, TableBuilder};
use memsnap_analysis::{Phase, Step, StepAnalysis, StepMethod};

use crate::palette;
use crate::units::{format_delta, format_duration_us, format_size};

/// The table's state: the selected step or phase, and the steps whose phases are listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepsState {
    pub selected: Option<usize>,
    pub selected_phase: Option<PhaseRef>,
    /// Steps listed with their phases under them (a step opens when it is selected).
    pub expanded: BTreeSet<usize>,
    /// Bring the selected step into view on the next frame (it was picked with `[` or `]`).
    pub scroll_to_selected: bool,
}

impl StepsState {
    /// Selects a step and lists its phases.
    pub fn select_step(&mut self, step: usize) {
        self.selected = Some(step);
        self.selected_phase = None;
        self.expanded.insert(step);
    }

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

/// A banner when memory drifts from step to step (a leak) or the peak grows, naming the code
/// that keeps memory every step (`leaks`, [`memsnap_analysis::leaks`]; the most first).
pub fn drift_banner_ui(
    ui: &mut egui::Ui,
    steps: &StepAnalysis,
    leaks: &[memsnap_analysis::LeakingSite],
) {
    let drift = &steps.drift;
    if drift.leak_suspected {
        ui.label(
            egui::RichText::new(format!(
                "Leak suspected: the memory left after each step grows by {} per step ({:.1}% over the run)",
                format_delta(drift.min_bytes_per_step.round() as i64),
                drift.min_growth_percent
            ))
            .color(palette::color32(palette::WARNING)),
        )
        .on_hover_text("The minimum of each step, fitted with a robust (Theil–Sen) line; see the 'outliving' column for the steps that keep memory");
    }
    if let Some(top) = leaks.first() {
        let others = match leaks.len() {
            1 => String::new(),
            2 => " (and 1 more site)".to_string(),
            n => format!(" (and {} more sites)", n - 1),
        };
        ui.label(
            egui::RichText::new(format!(
                "Kept every step: {} keeps {} per step, {} held at the end{others}",
                top.site,
                memsnap_analysis::format_size(top.bytes_per_step),
                memsnap_analysis::format_size(top.live_bytes()),
            ))
            .color(palette::color32(palette::WARNING)),
        )
        .on_hover_text(format!(
            "{} allocations made in {} steps (#{} to #{}) are still held when the recording ends{}. Advise predicts the run without them.",
            top.allocations,
            top.steps,
            top.first_step,
            top.last_step,
            if top.before_window_allocations > 0 {
                format!(
                    ", and {} from before the recording's window",
                    top.before_window_allocations
                )
            } else {
                String::new()
            }
        ));
    }
    if drift.peak_growth_suspected {
        ui.label(
            egui::RichText::new(format!(
                "Peak grows by {} per step ({:.1}% over the run)",
                format_delta(drift.peak_bytes_per_step.round() as i64),
                drift.peak_growth_percent
            ))
            .color(palette::color32(palette::WARNING)),
        );
    }
}

pub use memsnap_plot::text::{phase_label, slope_rate_text};

/// Where a phase is: the set-up, or phase `index` of step `step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PhaseRef {
    Setup,
    Step { step: usize, index: usize },
}

/// One row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    Step(usize),
    Phase(PhaseRef),
}

impl StepsState {
    /// The rows shown: the set-up, then each step, followed by its phases when expanded.
    fn rows(&self, steps: &StepAnalysis) -> Vec<Row> {
        let mut rows = Vec::new();
        if steps.setup.is_some() {
            rows.push(Row::Phase(PhaseRef::Setup));
        }
        for (i, step) in steps.steps.iter().enumerate() {
            rows.push(Row::Step(i));
            if self.expanded.contains(&i) {
                rows.extend(
                    (0..step.phases.len())
                        .map(|index| Row::Phase(PhaseRef::Step { step: i, index })),
                );
            }
        }
        rows
    }
}

fn phase_of(steps: &StepAnalysis, at: PhaseRef) -> Option<&Phase> {
    match at {
        PhaseRef::Setup => steps.setup.as_ref(),
        PhaseRef::Step { step, index } => steps.steps.get(step)?.phases.get(index),
    }
}

fn duration_text(start: Option<i64>, end: Option<i64>) -> String {
    start
        .zip(end)
        .map_or("–".to_owned(), |(a, b)| format_duration_us(b - a))
}

/// What the notes column says about a step: warm-up, partial, memory it keeps.
fn step_notes(step: &Step) -> String {
    let mut notes = Vec::new();
    if step.partial {
        notes.push("partial: the recording starts inside this step".to_owned());
    }
    if step.warmup {
        notes.push(format!(
            "warm-up: creates {} optimizer state",
            format_size(step.optimizer_state_bytes)
        ));
    }
    if step.outliving_count > 0 {
        notes.push(format!(
            "{} in {} outlive the step",
            format_size(step.outliving_bytes),
            step.outliving_count
        ));
    }
    if notes.is_empty() {
        "–".to_owned()
    } else {
        notes.join("; ")
    }
}

/// The steps table: the set-up phase, then a row per step with its phases under it. Returns
/// the events (first, last) of the step or phase whose row was clicked, to zoom to.
pub fn steps_ui(
    ui: &mut egui::Ui,
    steps: &StepAnalysis,
    state: &mut StepsState,
) -> Option<(u32, u32)> {
    let method = match &steps.method {
        StepMethod::Stacks => "from the allocation stacks".to_owned(),
        StepMethod::Annotations { name } => format!("from record_function annotations \"{name}\""),
        StepMethod::CurveShape => "from the rise and fall of memory".to_owned(),
        StepMethod::None => "none found".to_owned(),
    };
    let method = match &steps.fallback_reason {
        Some(reason) => format!("{method} ({reason})"),
        None => method,
    };
    ui.horizontal(|ui| {
        ui.strong(format!("Training steps: {}", steps.steps.len()));
        ui.weak(method);
        let drift = &steps.drift;
        if steps.steps.len() >= 2 {
            ui.separator();
            ui.label(format!(
                "drift {} per step (minimum), {} per step (peak)",
                format_delta(drift.min_bytes_per_step.round() as i64),
                format_delta(drift.peak_bytes_per_step.round() as i64)
            ))
            .on_hover_text(format!(
                "Growth over the run: minimum {:.2}%, peak {:.2}% of the highest step peak (flagged above {:.1}%); partial steps do not count",
                drift.min_growth_percent, drift.peak_growth_percent, drift.tolerance_percent
            ));
        }
        if steps.steps.iter().any(|s| !s.phases.is_empty()) {
            ui.separator();
            let all_expanded = state.expanded.len() >= steps.steps.len();
            let (text, tip) = if all_expanded {
                ("hide phases", "List the steps only")
            } else {
                ("show all phases", "List every step's phases under it")
            };
            if ui.small_button(text).on_hover_text(tip).clicked() {
                if all_expanded {
                    state.expanded.clear();
                } else {
                    state.expanded = (0..steps.steps.len()).collect();
                }
            }
        }
    });
    if steps.steps.is_empty() && steps.setup.is_none() {
        ui.weak("No repeating step shape and no step annotations in this trace.");
        return None;
    }
    let rows = state.rows(steps);
    let mut clicked: Option<Row> = None;
    let mut toggled: Option<usize> = None;
    let row_height = ui.text_style_height(&egui::TextStyle::Body) + 4.0;
    let mut table = TableBuilder::new(ui);
    if std::mem::take(&mut state.scroll_to_selected) {
        if let Some(row) = rows
            .iter()
            .position(|r| Some(*r) == state.selected.map(Row::Step))
        {
            table = table.scroll_to_row(row, Some(egui::Align::Center));
        }
    }
    table
        .id_salt("steps_table")
        .striped(true)
        .sense(egui::Sense::click())
        .cell_layout(egui::Layout::left_to_right(egui::Align::Center))
        .column(Column::exact(112.0))
        .column(Column::auto().at_least(64.0))
        .column(Column::auto().at_least(120.0))
        .column(Column::auto().at_least(64.0))
        .column(Column::auto().at_least(72.0))
        .column(Column::auto().at_least(96.0))
        .column(Column::auto().at_least(56.0))
        .column(Column::remainder())
        .header(row_height, |mut header| {
            for (title, tip) in [
                ("step / phase", "Click a row to zoom to that step or phase; + / - shows or hides a step's phases"),
                ("events", "First and last trace event"),
                ("start to end", "Memory before the first event and after the last"),
                ("peak", "Highest memory inside"),
                ("change", "End minus start: memory a step keeps, or a phase adds (+) or frees (-)"),
                ("rate", "The phase's slope: its change per second (per event without times)"),
                ("duration", "Wall time"),
                ("notes", "Warm-up and partial steps, memory that outlives a step, allocations of a phase"),
            ] {
                header.col(|ui| {
                    ui.strong(title).on_hover_text(tip);
                });
            }
        })
        .body(|body| {
            body.rows(row_height, rows.len(), |mut row| {
                let Some(&kind) = rows.get(row.index()) else {
                    return;
                };
                match kind {
                    Row::Step(i) => {
                        let Some(step) = steps.steps.get(i) else {
                            return;
                        };
                        row.set_selected(state.selected == Some(i) && state.selected_phase.is_none());
                        let change = step.kept_bytes();
                        // A warm-up step keeps its optimizer state on purpose: not a leak.
                        let leaky = step.outliving_bytes > 0 && change > 0 && !step.warmup;
                        row.col(|ui| {
                            let open = state.expanded.contains(&i);
                            if !step.phases.is_empty()
                                && ui
                                    .add(egui::Button::new(if open { "-" } else { "+" }).small())
                                    .on_hover_text(if open { "Hide this step's phases" } else { "Show this step's phases" })
                                    .clicked()
                            {
                                toggled = Some(i);
                            }
                            if ui
                                .add(egui::Button::new(format!("step {}", step.index)).frame(false))
                                .on_hover_text("Zoom the timeline to this step")
                                .clicked()
                            {
                                clicked = Some(Row::Step(i));
                            }
                        });
                        let cells = [
                            format!("{}–{}", step.start_event, step.end_event),
                            format!("{} to {}", format_size(step.before_bytes), format_size(step.end_bytes)),
                            format_size(step.peak_bytes),
                            format_delta(change),
                            "–".to_owned(),
                            duration_text(step.start_time_us, step.end_time_us),
                            step_notes(step),
                        ];
                        for (c, text) in cells.into_iter().enumerate() {
                            row.col(|ui| {
                                let rich = egui::RichText::new(text);
                                let rich = if leaky && (c == 3 || c == 6) {
                                    rich.color(palette::color32(palette::WARNING))
                                } else if step.partial && c == 6 {
                                    rich.italics()
                                } else {
                                    rich
                                };
                                ui.add(egui::Label::new(rich).selectable(false));
                            });
                        }
                        if row.response().clicked() {
                            clicked = Some(Row::Step(i));
                        }
                    }
                    Row::Phase(at) => {
                        let Some(phase) = phase_of(steps, at) else {
                            return;
                        };
                        row.set_selected(state.selected_phase == Some(at));
                        let color = palette::color32(palette::phase_colour(phase.kind));
                        row.col(|ui| {
                            if at != PhaseRef::Setup {
                                ui.add_space(18.0);
                            }
                            let (rect, _) = ui.allocate_exact_size(egui::vec2(10.0, 10.0), egui::Sense::hover());
                            ui.painter().rect_filled(rect, 2.0, color);
                            if ui
                                .add(egui::Button::new(phase_label(phase.kind)).frame(false))
                                .on_hover_text("Zoom the timeline to this phase")
                                .clicked()
                            {
                                clicked = Some(Row::Phase(at));
                            }
                        });
                        let cells = [
                            format!("{}–{}", phase.start_event, phase.end_event),
                            format!("{} to {}", format_size(phase.start_bytes), format_size(phase.end_bytes)),
                            format_size(phase.peak_bytes),
                            format_delta(phase.slope().bytes),
                            slope_rate_text(&phase.slope()),
                            duration_text(phase.start_time_us, phase.end_time_us),
                            format!(
                                "{} allocations, {} allocated",
                                phase.allocations,
                                format_size(phase.allocated_bytes)
                            ),
                        ];
                        for (c, text) in cells.into_iter().enumerate() {
                            row.col(|ui| {
                                let rich = egui::RichText::new(text);
                                let rich = if c == 4 { rich.color(color) } else { rich };
                                ui.add(egui::Label::new(rich).selectable(false));
                            });
                        }
                        if row.response().clicked() {
                            clicked = Some(Row::Phase(at));
                        }
                    }
                }
            });
        });
    if let Some(i) = toggled {
        if !state.expanded.remove(&i) {
            state.expanded.insert(i);
        }
    }
    match clicked? {
        Row::Step(i) => {
            state.select_step(i);
            let step = steps.steps.get(i)?;
            Some((step.start_event, step.end_event))
        }
        Row::Phase(at) => {
            state.selected_phase = Some(at);
            if let PhaseRef::Step { step, .. } = at {
                state.selected = Some(step);
            }
            let phase = phase_of(steps, at)?;
            Some((phase.start_event, phase.end_event))
        }
    }
}

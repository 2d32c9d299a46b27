//! The Advise view: what would make the run fit a memory budget. A budget field, a Run button
//! that ranks the fixes of `memsnap_advise` (activation checkpointing of a module,
//! micro-batches, 8-bit or offloaded optimizer state, allocator settings, and their
//! combinations, each predicted by editing the trace and replaying it) in a background job, the
//! ranked list as `memsnap advise` prints it, and the details of the fix selected: its
//! predicted peaks against the recorded ones and the modules it touches.
//!
//! Selecting a fix replays it once more in a background job for the timeline: its predicted
//! curves on the recorded axis and the allocations it checkpoints
//! ([`advise::PredictedOverlay`]), which the timeline draws over the recorded bands while the
//! fix stays selected.

use std::sync::Arc;

use egui::RichText;
use memsnap_advise::{Advice, Fix, Prediction};
use memsnap_format::Snapshot;

use crate::advise::{self, AdviseError, PredictedOverlay};
use crate::job::{Job, JobError};
use crate::palette;
use crate::units::format_size;

/// What the panel reads: the file and the device shown.
pub struct AdviseModel<'a> {
    pub snapshot: &'a Arc<Snapshot>,
    pub device: i64,
    /// The recorded timeline of the device (the overlay's axis and allocations).
    pub timeline: &'a memsnap_analysis::DeviceTimeline,
}

/// The view's state for one device.
#[derive(Default)]
pub struct AdviseState {
    /// The budget field; `None` until first shown (then the device's memory when the file
    /// states it, else empty).
    pub budget: Option<String>,
    /// The last advice, with the budget it was given for.
    pub advice: Option<Advice>,
    /// Index into the advice's predictions of the fix selected.
    pub selected: Option<usize>,
    /// Why the last run gave no advice.
    pub error: Option<JobError<AdviseError>>,
    job: Option<Job<Advice, AdviseError>>,
    /// The selected fix's predicted run over the recorded timeline, once replayed.
    overlay: Option<Arc<PredictedOverlay>>,
    /// Why the selected fix's overlay could not be made.
    pub overlay_error: Option<JobError<AdviseError>>,
    overlay_job: Option<Job<PredictedOverlay, AdviseError>>,
}

impl AdviseState {
    /// Whether the advisor is running.
    pub fn is_running(&self) -> bool {
        self.job.is_some()
    }

    /// Whether the selected fix's overlay is being replayed.
    pub fn overlay_is_running(&self) -> bool {
        self.overlay_job.is_some()
    }

    /// The selected fix's predicted run, for the timeline (`None` without a selection, or
    /// while it is replayed).
    pub fn overlay(&self) -> Option<&Arc<PredictedOverlay>> {
        self.overlay.as_ref()
    }

    /// Blocks until the running work is done (tests).
    pub fn finish(&mut self) {
        if let Some(job) = self.job.take() {
            self.accept(job.wait());
        }
        if let Some(job) = self.overlay_job.take() {
            self.accept_overlay(job.wait());
        }
    }

    fn accept(&mut self, result: Result<Advice, JobError<AdviseError>>) {
        match result {
            Ok(advice) => {
                self.advice = Some(advice);
                self.selected = None;
                self.overlay = None;
                self.overlay_job = None;
                self.overlay_error = None;
                self.error = None;
            }
            Err(e) => self.error = Some(e),
        }
    }

    fn accept_overlay(&mut self, result: Result<PredictedOverlay, JobError<AdviseError>>) {
        match result {
            Ok(overlay) => {
                self.overlay = Some(Arc::new(overlay));
                self.overlay_error = None;
            }
            Err(e) => self.overlay_error = Some(e),
        }
    }

    fn poll(&mut self) {
        if let Some(result) = self.job.as_ref().and_then(Job::poll) {
            self.job = None;
            self.accept(result);
        }
        self.poll_overlay();
    }

    /// Picks up the selected fix's overlay when its replay is done (the timeline page calls
    /// it too: the fix stays selected while the Advise view is not shown).
    pub fn poll_overlay(&mut self) {
        if let Some(result) = self.overlay_job.as_ref().and_then(Job::poll) {
            self.overlay_job = None;
            self.accept_overlay(result);
        }
    }

    /// Selects the advice's fix `i` (`None`: none) and replays it for the timeline's overlay
    /// in the background; a deselection removes the overlay. A replay still going for an
    /// earlier selection is left to finish and its result dropped.
    pub fn select(&mut self, i: Option<usize>, model: &AdviseModel<'_>, ctx: &egui::Context) {
        self.selected = i;
        self.overlay = None;
        self.overlay_job = None;
        self.overlay_error = None;
        let Some(advice) = &self.advice else {
            return;
        };
        let Some(prediction) = i.and_then(|i| advice.predictions.get(i)).cloned() else {
            return;
        };
        let snapshot = model.snapshot.clone();
        let device = model.device;
        let budget = advice.budget_bytes;
        let replay = model.timeline.replay();
        let events = replay.trace_len as usize;
        let alloc_events: Vec<Option<u32>> =
            replay.allocations.iter().map(|a| a.alloc_event()).collect();
        self.overlay_job = Some(Job::spawn(
            "the predicted run",
            Some(ctx.clone()),
            move |progress| {
                progress.set("replaying the fix for the timeline", 0, 0);
                advise::predict_overlay(
                    &snapshot,
                    device,
                    &prediction,
                    budget,
                    events,
                    &alloc_events,
                )
            },
        ));
    }

    /// Starts ranking the fixes under the field's budget (a run still going is left to finish
    /// and its result dropped: the advisor has no cancel points).
    pub fn start(&mut self, model: &AdviseModel<'_>, ctx: &egui::Context) {
        let budget = match advise::parse_budget(self.budget.as_deref().unwrap_or_default()) {
            Ok(budget) => budget,
            Err(e) => {
                self.error = Some(JobError::Failed(e));
                return;
            }
        };
        let snapshot = model.snapshot.clone();
        let device = model.device;
        self.error = None;
        self.job = Some(Job::spawn(
            "the advice",
            Some(ctx.clone()),
            move |progress| {
                progress.set("replaying the fixes", 0, 0);
                advise::run(&snapshot, device, budget)
            },
        ));
    }
}

/// A budget as the field shows it: whole GiB or MiB when it is one, else bytes, so that it
/// parses back to the same number.
fn budget_text(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 30) {
        format!("{}GiB", bytes >> 30)
    } else if bytes.is_multiple_of(1 << 20) {
        format!("{}MiB", bytes >> 20)
    } else {
        bytes.to_string()
    }
}

/// The view: the budget and Run, then the advice with the selected fix's details.
pub fn advise_ui(ui: &mut egui::Ui, model: &AdviseModel<'_>, state: &mut AdviseState) {
    state.poll();
    if state.budget.is_none() {
        state.budget = Some(
            memsnap_simulate::device_memory(model.snapshot, model.device)
                .filter(|&bytes| bytes > 0)
                .map(budget_text)
                .unwrap_or_default(),
        );
    }
    controls_ui(ui, model, state);
    if let Some(e) = &state.error {
        ui.label(RichText::new(format!("Error: {e}")).color(ui.visuals().error_fg_color));
    }
    if state.is_running() || state.overlay_is_running() {
        ui.ctx()
            .request_repaint_after(std::time::Duration::from_millis(100));
    }
    let Some(advice) = &state.advice else {
        if !state.is_running() {
            ui.label("No advice yet: enter a budget (or none) and press Run.");
        }
        return;
    };
    if let Some(i) = state.selected.filter(|&i| i < advice.predictions.len()) {
        let overlay = OverlayStatus {
            ready: state.overlay.is_some(),
            running: state.overlay_job.is_some(),
            error: state.overlay_error.as_ref(),
        };
        egui::Panel::right("advise_details")
            .resizable(true)
            .default_size(380.0)
            .show(ui, |ui| {
                egui::ScrollArea::vertical().show(ui, |ui| details_ui(ui, advice, i, &overlay));
            });
    }
    let mut clicked = None;
    egui::CentralPanel::default().show(ui, |ui| {
        egui::ScrollArea::vertical().show(ui, |ui| {
            clicked = advice_ui(ui, advice, state.selected);
        });
    });
    if let Some(click) = clicked {
        let selection = (state.selected != Some(click)).then_some(click);
        state.select(selection, model, ui.ctx());
    }
}

/// Where the selected fix's overlay of the timeline is.
struct OverlayStatus<'a> {
    ready: bool,
    running: bool,
    error: Option<&'a JobError<AdviseError>>,
}

fn controls_ui(ui: &mut egui::Ui, model: &AdviseModel<'_>, state: &mut AdviseState) {
    let mut go = false;
    ui.horizontal_wrapped(|ui| {
        let label = ui.label("budget");
        let budget = state.budget.get_or_insert_with(String::new);
        let response = ui
            .add(
                egui::TextEdit::singleline(budget)
                    .desired_width(110.0)
                    .hint_text("e.g. 40GB"),
            )
            .labelled_by(label.id)
            .on_hover_text(
                "Memory the run must fit in, reserved bytes (40GB, 24GiB); empty: no budget, the fixes ranked by reserved peak. The default is the device's memory when the file states it (an OOM entry). Enter runs",
            );
        go |= response.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
        go |= ui
            .add_enabled(!state.is_running(), egui::Button::new("Run"))
            .on_hover_text(
                "Edit the trace for each fix and replay it through memsnap's allocator (in the background)",
            )
            .clicked();
        if let Some(job) = &state.job {
            ui.spinner()
                .on_hover_text("Ranking the fixes in the background");
            ui.label(format!("{}…", job.progress().stage()));
        }
    });
    if go && !state.is_running() {
        state.start(model, ui.ctx());
    }
}

fn fits_text(p: &Prediction) -> &'static str {
    match (p.fits, p.out_of_memory) {
        (_, true) => ", runs out of memory",
        (Some(true), _) => ", fits",
        (Some(false), _) => ", does not fit",
        (None, _) => "",
    }
}

/// The advice: the baseline, the modules, the ranked fixes and those with no effect. Returns
/// the fix clicked.
fn advice_ui(ui: &mut egui::Ui, advice: &Advice, selected: Option<usize>) -> Option<usize> {
    if let Some(note) = advise::completion_note(advice) {
        ui.label(RichText::new(note).color(palette::color32(palette::WARNING)));
    }
    ui.label(format!(
        "device {}{}",
        advice.device,
        advice
            .budget_bytes
            .map_or(String::new(), |b| format!(", budget {}", format_size(b)))
    ));
    let b = &advice.baseline;
    ui.strong(format!(
        "{}: allocated peak {}, reserved peak {}{}",
        if advice.completion.is_some() {
            "Completed run (replayed)"
        } else {
            "As recorded (replayed)"
        },
        format_size(b.allocated_peak_bytes),
        format_size(b.reserved_peak_bytes),
        fits_text(b)
    ));
    if advice.passes == 0 {
        ui.label("No step with a forward and a backward phase was found: checkpointing and micro-batches have nothing to edit.");
    }
    ui.separator();
    let mut clicked = None;
    if advice.predictions.is_empty() {
        ui.label("No fix changes a peak.");
    } else {
        ui.label("Fixes, best first (click one for its details):");
        egui::Grid::new("advise_table")
            .striped(true)
            .num_columns(6)
            .show(ui, |ui| {
                ui.strong("#");
                ui.strong("fits").on_hover_text(
                    "yes/no: the replay on a device of the budget's size ran to the end; OOM: it ran out of memory even without the limit",
                );
                ui.strong("allocated")
                    .on_hover_text("Predicted peak of allocated bytes");
                ui.strong("reserved")
                    .on_hover_text("Predicted peak of reserved bytes (what the budget bounds)");
                ui.strong("recompute")
                    .on_hover_text("Checkpointing's extra forward work, by bytes allocated");
                ui.strong("fix");
                ui.end_row();
                for (i, p) in advice.predictions.iter().enumerate() {
                    ui.label(format!("{}", i + 1));
                    let verdict = p.verdict();
                    let text = RichText::new(verdict);
                    let cell = ui.label(if verdict == "yes" {
                        text.color(palette::color32(palette::series_colour(2)))
                    } else if verdict == "-" {
                        text
                    } else if verdict == "yes*" {
                        text.color(palette::color32(palette::WARNING))
                    } else {
                        text.color(ui.visuals().error_fg_color)
                    });
                    if let Some(note) = p.leak_note() {
                        cell.on_hover_text(note);
                    }
                    ui.label(format_size(p.allocated_peak_bytes));
                    ui.label(format_size(p.reserved_peak_bytes));
                    ui.label(advise::recompute_text(p));
                    if ui
                        .selectable_label(selected == Some(i), &p.description)
                        .on_hover_text("Show this fix's details")
                        .clicked()
                    {
                        clicked = Some(i);
                    }
                    ui.end_row();
                }
            });
    }
    if !advice.unchanged.is_empty() {
        ui.add_space(6.0);
        ui.label(format!("No change: {}", advice.unchanged.join("; ")))
            .on_hover_text(
                "Fixes tried whose replay has the recorded peaks (nothing to edit, or no effect)",
            );
    }
    if !advice.modules.is_empty() {
        ui.add_space(6.0);
        ui.label("Activations live at the peak, by module:");
        let fixes = selected
            .and_then(|i| advice.predictions.get(i))
            .map_or(&[][..], |p| &p.fixes[..]);
        modules_ui(ui, advice, fixes, "advise_modules");
    }
    clicked
}

/// The module nodes with their activations at the peak, those the `fixes` touch marked.
fn modules_ui(ui: &mut egui::Ui, advice: &Advice, fixes: &[Fix], id: &str) {
    let shown = &advice.modules[..advice.modules.len().min(8)];
    egui::Grid::new(id).num_columns(2).show(ui, |ui| {
        for m in shown {
            ui.label(format_size(m.activation_bytes_at_peak));
            if fixes.iter().any(|f| f.covers(m)) {
                ui.strong(format!("{}  (checkpointed by the fix)", m.module));
            } else {
                ui.label(&m.module);
            }
            ui.end_row();
        }
    });
    if let Some(pattern) = shown.iter().find(|m| m.module.contains('*')) {
        ui.weak(format!(
            "* stands for a number: {} is every {}",
            pattern.module,
            pattern.module.replacen('*', "N", 1)
        ));
    }
}

fn change(predicted: u64, recorded: u64) -> String {
    if recorded == 0 {
        return String::new();
    }
    format!(
        " ({:+.1}%)",
        (predicted as f64 - recorded as f64) / recorded as f64 * 100.0
    )
}

/// The selected fix: what it changes, its peaks against the baseline, the modules it touches.
fn details_ui(ui: &mut egui::Ui, advice: &Advice, i: usize, overlay: &OverlayStatus<'_>) {
    let p = &advice.predictions[i];
    let b = &advice.baseline;
    ui.heading(format!("Fix {}", i + 1));
    ui.label(RichText::new(&p.description).strong());
    let against = if advice.completion.is_some() {
        "the completed run"
    } else {
        "recorded"
    };
    ui.label(format!(
        "Predicted allocated peak {} vs {} {against}{}",
        format_size(p.allocated_peak_bytes),
        format_size(b.allocated_peak_bytes),
        change(p.allocated_peak_bytes, b.allocated_peak_bytes)
    ));
    ui.label(format!(
        "Predicted reserved peak {} vs {} {against}{}",
        format_size(p.reserved_peak_bytes),
        format_size(b.reserved_peak_bytes),
        change(p.reserved_peak_bytes, b.reserved_peak_bytes)
    ));
    match (advice.budget_bytes, p.fits, p.out_of_memory) {
        (_, _, true) => {
            ui.label("Runs out of memory even without the budget's limit.");
        }
        (Some(budget), Some(fits), _) => {
            ui.label(format!(
                "{} the budget of {}",
                if fits { "Fits" } else { "Does not fit" },
                format_size(budget)
            ));
        }
        _ => {}
    }
    if p.extra_forward_compute > 0.0 {
        ui.label(format!(
            "Recomputes {:.0}% of the forward (by bytes allocated)",
            p.extra_forward_compute * 100.0
        ));
    }
    let touched = advise::modules_touched(p);
    if touched.is_empty() {
        ui.label("Touches no module (it changes the whole step or the allocator).");
    } else {
        ui.label(format!("Modules touched: {}", touched.join(", ")));
        if !advice.modules.is_empty() {
            modules_ui(ui, advice, &p.fixes, "advise_details_modules");
        }
    }
    ui.add_space(6.0);
    if let Some(e) = overlay.error {
        ui.label(
            RichText::new(format!("No timeline overlay: {e}")).color(ui.visuals().error_fg_color),
        );
    } else if overlay.running {
        ui.horizontal(|ui| {
            ui.spinner();
            ui.label("Replaying the fix for the timeline…");
        });
    } else if overlay.ready {
        ui.label(
            RichText::new(
                "The Timeline draws the predicted run over the recorded one (each edited entry at the recorded entry it stands for) and tints the allocations the fix checkpoints, while this fix is selected.",
            )
            .weak(),
        );
    }
}

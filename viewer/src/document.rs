//! One open file: the decoded snapshot, the analysis model of each device (built on the
//! loader thread), and each device's view state. The page functions lay out the panels; the
//! panels themselves live in their own modules.

use std::path::PathBuf;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::{Duration, Instant as WallInstant};

use memsnap_analysis::{DeviceTimeline, StepAnalysis, StepOptions};
use memsnap_format::io::Detected;
use memsnap_format::Snapshot;

use crate::loader::{LoadProgress, LoadedSnapshot};
use crate::shortcuts::Command;
use crate::units::format_size;
use crate::view::Selection;

/// The analysis model of one device: built once, read by every panel.
pub struct DeviceModel {
    pub device: i64,
    pub timeline: Arc<DeviceTimeline>,
    /// Steps, phases and categories: computed after the picture is up (the bands do not need
    /// them; the step marks, phase shading and the steps table appear when they are ready).
    steps: Arc<OnceLock<StepAnalysis>>,
    /// Summary and per-site bytes, for the ranks table and the diff: computed after the
    /// picture is up (it costs as much as the rest of the analysis), see [`Document::prepare`].
    profile: Arc<OnceLock<Result<memsnap_analysis::compare::DeviceProfile, String>>>,
}

impl DeviceModel {
    /// The timeline with its drawing indexes: what the first picture needs. The steps follow
    /// ([`DeviceModel::compute_steps`]).
    pub fn build(snapshot: &Snapshot, device: i64) -> Result<DeviceModel, String> {
        let timeline =
            DeviceTimeline::build_for_drawing(snapshot, device).map_err(|e| e.to_string())?;
        Ok(DeviceModel {
            device,
            timeline: Arc::new(timeline),
            steps: Arc::default(),
            profile: Arc::default(),
        })
    }

    /// The steps, phases and categories; no steps and no categories while they are being
    /// computed (see [`DeviceModel::steps_ready`]).
    pub fn steps(&self) -> &StepAnalysis {
        static PENDING: LazyLock<StepAnalysis> = LazyLock::new(pending_steps);
        self.steps.get().unwrap_or(&PENDING)
    }

    /// Whether the steps are computed.
    pub fn steps_ready(&self) -> bool {
        self.steps.get().is_some()
    }

    /// Computes the steps now (when they are not yet).
    pub fn compute_steps(&self) {
        compute_steps(&self.timeline, &self.steps);
    }

    /// The summary and per-site bytes, once computed (`None` before, or when computing it
    /// failed: see [`DeviceModel::profile_error`]).
    pub fn profile(&self) -> Option<&memsnap_analysis::compare::DeviceProfile> {
        self.profile.get().and_then(|p| p.as_ref().ok())
    }

    /// Why the profile could not be computed.
    pub fn profile_error(&self) -> Option<&str> {
        self.profile
            .get()
            .and_then(|p| p.as_ref().err().map(String::as_str))
    }

    /// Whether the steps and the profile are computed (or the profile failed).
    pub fn profile_done(&self) -> bool {
        self.steps_ready() && self.profile.get().is_some()
    }

    /// Computes the profile now (when it is not yet).
    fn compute_profile(&self, snapshot: &Snapshot) {
        compute_profile(snapshot, &self.timeline, &self.steps, &self.profile);
    }
}

/// No steps, no phases, no categories.
fn pending_steps() -> StepAnalysis {
    StepAnalysis {
        method: memsnap_analysis::StepMethod::None,
        fallback_reason: None,
        setup: None,
        steps: Vec::new(),
        drift: Default::default(),
        categories: Vec::new(),
    }
}

fn compute_steps(timeline: &DeviceTimeline, cell: &OnceLock<StepAnalysis>) {
    cell.get_or_init(|| {
        // Off the loader thread, a panic must cost only the steps (none are shown).
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            timeline.steps(&StepOptions::default())
        }))
        .unwrap_or_else(|_| pending_steps())
    });
}

fn compute_profile(
    snapshot: &Snapshot,
    timeline: &DeviceTimeline,
    steps: &OnceLock<StepAnalysis>,
    cell: &OnceLock<Result<memsnap_analysis::compare::DeviceProfile, String>>,
) {
    cell.get_or_init(|| {
        // Off the loader thread, a panic must still cost only this summary.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // The summary's steps are the model's (both `StepOptions::default()`): found
            // once, not again for the summary.
            let options = memsnap_analysis::SummaryOptions::default();
            match steps.get() {
                Some(steps) => memsnap_analysis::compare::device_profile_with_steps(
                    snapshot, timeline, &options, steps,
                ),
                None => memsnap_analysis::compare::device_profile(snapshot, timeline, &options),
            }
        }))
        .map_err(|panic| crate::loader::panic_message(&*panic))
    });
}

/// Everything the user changed about how one device is shown.
pub struct DeviceState {
    pub timeline: crate::timeline::TimelineState,
    pub steps: crate::steps_ui::StepsState,
    pub instant: crate::instant_ui::InstantState,
    /// The hovered and pinned allocation and the instant cursor, shared by the panels.
    pub selection: Selection,
    pub allocator: crate::allocator_ui::AllocatorState,
}

impl DeviceState {
    pub fn new(model: &DeviceModel) -> Self {
        DeviceState {
            timeline: crate::timeline::TimelineState::new(&model.timeline),
            steps: crate::steps_ui::StepsState::default(),
            instant: crate::instant_ui::InstantState::default(),
            selection: Selection::default(),
            allocator: Default::default(),
        }
    }
}

/// An open snapshot file.
pub struct Document {
    pub id: u64,
    pub name: String,
    pub path: Option<PathBuf>,
    pub detected: Detected,
    pub file_bytes: u64,
    pub decode_time: Duration,
    pub analysis_time: Duration,
    pub snapshot: Arc<Snapshot>,
    /// The user-code site of every stack (band colours and labels).
    pub sites: memsnap_plot::sites::StackSites,
    /// Devices with a trace or segments, ascending.
    pub devices: Vec<DeviceModel>,
    pub states: Vec<DeviceState>,
    /// Index into `devices` of the device shown.
    pub device_index: usize,
    /// Devices that could not be analysed (the others still show).
    pub device_errors: Vec<String>,
    /// The thread computing the devices' profiles after the document is shown.
    profiles: Option<std::thread::JoinHandle<()>>,
}

impl Document {
    /// Builds the analysis of every device; runs on the loader thread.
    pub fn prepare(
        id: u64,
        loaded: LoadedSnapshot,
        _progress: &LoadProgress,
    ) -> Result<Document, String> {
        let started = WallInstant::now();
        let snapshot = loaded.snapshot;
        let mut devices = Vec::new();
        let mut device_errors = Vec::new();
        let sites = std::thread::scope(|scope| {
            let sites = scope.spawn(|| memsnap_plot::sites::StackSites::new(&snapshot));
            for device in DeviceTimeline::devices(&snapshot) {
                match DeviceModel::build(&snapshot, device) {
                    Ok(model) => devices.push(model),
                    Err(e) => device_errors.push(format!("device {device}: {e}")),
                }
            }
            sites
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        if devices.is_empty() {
            return Err(match device_errors.first() {
                Some(e) => format!("no device could be analysed ({e})"),
                None => "the snapshot has no trace entries and no segments".into(),
            });
        }
        // PyTorch's viewer starts on the device with the longest trace; so do we.
        let default_device = DeviceTimeline::default_device(&snapshot);
        let device_index = devices
            .iter()
            .position(|d| Some(d.timeline.device()) == default_device)
            .unwrap_or(0);
        let states = devices.iter().map(DeviceState::new).collect();
        let snapshot = Arc::new(snapshot);
        // The steps (marks, phases, the steps table), the ranks table and the diff need each
        // device's steps and profile; the picture does not, so they are computed on their own
        // thread while the timeline is already on screen: the steps of every device first.
        let work: Vec<_> = devices
            .iter()
            .map(|d| (d.timeline.clone(), d.steps.clone(), d.profile.clone()))
            .collect();
        let for_profiles = snapshot.clone();
        let profiles = std::thread::Builder::new()
            .name(format!("profile {}", loaded.name))
            .spawn(move || {
                for (timeline, steps, _) in &work {
                    compute_steps(timeline, steps);
                }
                for (timeline, steps, profile) in &work {
                    compute_profile(&for_profiles, timeline, steps, profile);
                }
            })
            .ok();
        Ok(Document {
            id,
            name: loaded.name,
            path: loaded.path,
            detected: loaded.detected,
            file_bytes: loaded.file_bytes,
            decode_time: loaded.decode_time,
            analysis_time: started.elapsed(),
            snapshot,
            sites,
            devices,
            states,
            device_index,
            device_errors,
            profiles,
        })
    }

    /// Whether every device's steps are computed (they follow the first picture).
    pub fn steps_ready(&self) -> bool {
        self.devices.iter().all(DeviceModel::steps_ready)
    }

    /// Whether every device's profile is computed.
    pub fn profiles_ready(&self) -> bool {
        self.devices.iter().all(DeviceModel::profile_done)
    }

    /// Waits for the profiles (tests, benchmarks, screenshots); computes them here if their
    /// thread could not start or died.
    pub fn wait_for_profiles(&mut self) {
        if let Some(handle) = self.profiles.take() {
            let _ = handle.join();
        }
        for d in &self.devices {
            d.compute_steps();
            d.compute_profile(&self.snapshot);
        }
    }

    pub fn device(&self) -> &DeviceModel {
        &self.devices[self.device_index]
    }

    pub fn state(&self) -> &DeviceState {
        &self.states[self.device_index]
    }

    pub fn state_mut(&mut self) -> &mut DeviceState {
        &mut self.states[self.device_index]
    }

    /// A tooltip line about the file.
    pub fn summary(&self) -> String {
        let entries = self.snapshot.entry_count();
        format!(
            "{}\n{} {}{} on disk, {} trace entries, {} device(s)\ndecoded in {:.2} s, analysed in {:.2} s",
            self.path
                .as_ref()
                .map_or(self.name.clone(), |p| p.display().to_string()),
            self.detected.format.name(),
            format_size(self.file_bytes),
            match self.detected.compression {
                memsnap_format::Compression::None => "",
                memsnap_format::Compression::Gzip => " (gzip)",
                memsnap_format::Compression::Zstd => " (zstd)",
            },
            entries,
            self.devices.len(),
            self.decode_time.as_secs_f64(),
            self.analysis_time.as_secs_f64(),
        )
    }

    /// Applies a keyboard command meant for the document shown; zoom and pan commands only
    /// when its timeline is on screen.
    pub fn run_command(&mut self, command: Command, timeline_shown: bool) {
        let i = self.device_index;
        let model = &self.devices[i];
        let state = &mut self.states[i];
        match command {
            Command::PreviousStep | Command::NextStep => {
                let forward = command == Command::NextStep;
                if let Some(step) = state.steps.step_after(model.steps(), forward) {
                    state.steps.select_step(step);
                    state.steps.scroll_to_selected = true;
                    state
                        .timeline
                        .zoom_to_step(&model.timeline, &model.steps().steps[step]);
                }
            }
            Command::JumpToPeak => {
                state.selection.cursor =
                    Some(model.timeline.resolve(memsnap_analysis::Instant::Peak));
            }
            Command::Unpin => state.selection.pinned = None,
            other if timeline_shown => state.timeline.run_command(other),
            _ => {}
        }
    }

    /// The timeline last drawn, as SVG.
    pub fn timeline_svg(&self) -> Option<String> {
        self.state().timeline.last_svg()
    }

    /// The timeline page: controls, the plot with its overview, the steps table and details.
    pub fn timeline_page_ui(&mut self, ui: &mut egui::Ui) {
        self.device_bar_ui(ui);
        let i = self.device_index;
        let model = &self.devices[i];
        let state = &mut self.states[i];
        let snapshot = &self.snapshot;
        let timeline_model = crate::timeline::TimelineModel {
            snapshot,
            timeline: &model.timeline,
            steps: model.steps(),
            sites: &self.sites,
        };
        crate::timeline::filter_bar_ui(ui, &timeline_model, &mut state.timeline);
        if model.steps_ready() {
            crate::steps_ui::drift_banner_ui(ui, model.steps());
        }

        egui::Panel::right("details_panel")
            .resizable(true)
            .default_size(340.0)
            .show(ui, |ui| {
                crate::details_ui::details_ui(ui, &timeline_model, &mut state.selection);
            });
        egui::Panel::bottom("steps_panel")
            .resizable(true)
            .default_size(220.0)
            .show(ui, |ui| {
                if !model.steps_ready() {
                    ui.add(egui::Spinner::new());
                    ui.label("Finding the training steps…");
                } else if let Some((start, end)) =
                    crate::steps_ui::steps_ui(ui, model.steps(), &mut state.steps)
                {
                    state.timeline.zoom_to_events(&model.timeline, start, end);
                }
            });
        egui::CentralPanel::default().show(ui, |ui| {
            crate::timeline::legend_ui(ui, &timeline_model, &state.timeline);
            crate::timeline::timeline_ui(
                ui,
                &timeline_model,
                &mut state.timeline,
                &mut state.selection,
            );
        });
    }

    /// The "at an instant" page: the live set and the segments at the cursor (or the peak).
    pub fn instant_page_ui(&mut self, ui: &mut egui::Ui) {
        self.device_bar_ui(ui);
        let i = self.device_index;
        let model = &self.devices[i];
        let state = &mut self.states[i];
        let at = match state.selection.cursor {
            Some(event) => memsnap_analysis::Instant::Event(event),
            None => memsnap_analysis::Instant::Peak,
        };
        let instant_model = crate::instant_ui::InstantModel {
            snapshot: &self.snapshot,
            sites: &self.sites,
            timeline: &model.timeline,
            at,
            min_size: state.timeline.min_size,
        };
        crate::instant_ui::instant_ui(ui, &instant_model, &mut state.instant);
    }

    /// Device selector plus what the file says about truncation and errors.
    pub(crate) fn device_bar_ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            if self.devices.len() > 1 {
                let current = self.devices[self.device_index].device;
                egui::ComboBox::from_id_salt(("device", self.id))
                    .selected_text(format!("cuda:{current}"))
                    .show_ui(ui, |ui| {
                        for (i, d) in self.devices.iter().enumerate() {
                            ui.selectable_value(
                                &mut self.device_index,
                                i,
                                format!(
                                    "cuda:{} ({} entries)",
                                    d.device,
                                    d.timeline.replay().trace_len
                                ),
                            );
                        }
                    })
                    .response
                    .on_hover_text("Which GPU of this file to show");
            } else {
                ui.label(format!("cuda:{}", self.device().device))
                    .on_hover_text("The only device in this file");
            }
            let replay = self.device().timeline.replay();
            if replay.truncated {
                let mut text = format!(
                    "History starts mid-run: {} in {} allocations from before the recorded window",
                    format_size(replay.before_window_bytes),
                    replay.before_window_allocations
                );
                if let Some(dropped) = replay.dropped_entries {
                    text.push_str(&format!(", {dropped} entries dropped by the ring buffer"));
                }
                if replay.unattributed_bytes > 0 {
                    text.push_str(&format!(
                        ", of which {} before the profile, unattributed (counted by {}, in no block)",
                        format_size(replay.unattributed_bytes),
                        replay.source.as_deref().unwrap_or("the source")
                    ));
                }
                ui.label(
                    egui::RichText::new("history truncated")
                        .color(crate::palette::color32(crate::palette::WARNING)),
                )
                .on_hover_text(text);
            }
            if replay.anomaly_count > 0 {
                let mut text = format!(
                    "{} inconsistent events were accounted for:",
                    replay.anomaly_count
                );
                for a in replay.anomalies.iter().take(10) {
                    text.push_str(&format!("\nevent {}: {}", a.event, a.what));
                }
                ui.label(format!("{} anomalies", replay.anomaly_count))
                    .on_hover_text(text);
            }
            for e in &self.device_errors {
                ui.label(egui::RichText::new(e).color(ui.visuals().error_fg_color));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_workload::{generate, TrainingRun};

    #[test]
    fn the_picture_is_built_without_the_steps_and_they_arrive_complete() {
        let (snapshot, _) = generate(&TrainingRun::default());
        let model = DeviceModel::build(&snapshot, 0).expect("model");
        // What the first picture needs is there; the steps are not yet.
        assert!(!model.timeline.by_size_desc().is_empty());
        assert!(!model.steps_ready());
        assert!(!model.profile_done());
        assert!(model.steps().steps.is_empty() && model.steps().categories.is_empty());
        model.compute_steps();
        assert!(model.steps_ready());
        let expected = model.timeline.steps(&StepOptions::default());
        assert_eq!(model.steps(), &expected);
        assert!(expected.steps.len() >= 3);
        assert_eq!(
            expected.categories.len(),
            model.timeline.replay().allocations.len()
        );
    }
}

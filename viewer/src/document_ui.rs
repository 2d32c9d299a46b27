//! How an open file is shown: which device, what the user changed about each panel
//! ([`DeviceState`]), and the pages that lay the panels out over the file's model
//! ([`Document`], which knows nothing of them).

use egui::RichText;

use crate::advise_ui::{self, AdviseModel, AdviseState};
use crate::allocator_ui::{self, AllocatorModel, AllocatorState};
use crate::document::{DeviceModel, Document, Shown, TimelineModel};
use crate::instant_ui::{self, InstantState};
use crate::live::LiveSession;
use crate::live_ui::{self, LiveAction, LiveBarModel, LiveBarState};
use crate::shortcuts::Command;
use crate::steps_ui::{self, StepsState};
use crate::timeline::{self, TimelineState};
use crate::units::format_size;
use crate::view::Selection;
use crate::{details_ui, palette};

/// Everything the user changed about how one device is shown.
pub struct DeviceState {
    pub timeline: TimelineState,
    pub steps: StepsState,
    pub instant: InstantState,
    /// The hovered and pinned allocation and the instant cursor, shared by the panels.
    pub selection: Selection,
    pub allocator: AllocatorState,
    pub advise: AdviseState,
}

impl DeviceState {
    pub fn new(model: &DeviceModel) -> Self {
        DeviceState {
            timeline: TimelineState::new(&model.timeline),
            steps: StepsState::default(),
            instant: InstantState::default(),
            selection: Selection::default(),
            allocator: AllocatorState::default(),
            advise: AdviseState::default(),
        }
    }
}

/// An open file as the window shows it: its model, the device shown and each device's state.
pub struct OpenDocument {
    pub doc: Document,
    /// Index into the model's `devices` of the device shown.
    pub device_index: usize,
    /// One per device, in the model's order.
    pub states: Vec<DeviceState>,
    /// The recording this document follows, when it was attached to rather than opened.
    pub live: Option<LiveSession>,
    pub live_bar: LiveBarState,
}

impl OpenDocument {
    /// Shows `doc` on its default device, every panel in its initial state.
    pub fn new(doc: Document) -> Self {
        OpenDocument {
            device_index: doc.default_device,
            states: doc.devices.iter().map(DeviceState::new).collect(),
            doc,
            live: None,
            live_bar: LiveBarState::default(),
        }
    }

    /// Shows the first document of a live session, which then keeps it up to date.
    pub fn live(doc: Document, session: LiveSession) -> Self {
        let mut open = OpenDocument::new(doc);
        open.live = Some(session);
        open
    }

    /// Shows `doc`, a rebuild of the same recording with more entries: each device keeps its
    /// panels' state (size filter, zoom, pin, colours, selected step) when the devices are
    /// the same, and the timeline follows the new range.
    pub fn replace_document(&mut self, doc: Document) {
        let same_devices = doc.devices.len() == self.doc.devices.len()
            && doc
                .devices
                .iter()
                .zip(&self.doc.devices)
                .all(|(a, b)| a.device == b.device);
        if same_devices {
            for (state, model) in self.states.iter_mut().zip(&doc.devices) {
                state.timeline.follow(&model.timeline);
                let allocations = model.timeline.replay().allocations.len();
                if state
                    .selection
                    .pinned
                    .is_some_and(|id| id.0 as usize >= allocations)
                {
                    state.selection.pinned = None;
                }
                state.selection.hovered = None;
            }
        } else {
            self.states = doc.devices.iter().map(DeviceState::new).collect();
            self.device_index = doc.default_device;
        }
        crate::live::retire(std::mem::replace(&mut self.doc, doc));
    }

    /// Takes what the live session has: a newer document (unless paused), a finished save.
    /// Returns a message for the status area (is it an error, its text).
    pub fn poll_live(&mut self) -> Option<(bool, String)> {
        let session = self.live.as_mut()?;
        session.poll();
        session.set_paused(self.live_bar.paused);
        let document = session.take_document();
        let saved = session.poll_save();
        if let Some(document) = document {
            self.replace_document(document);
        }
        saved.map(|result| match result {
            Ok((path, entries)) => (
                false,
                format!("Saved {entries} entries to {}", path.display()),
            ),
            Err(e) => (true, e),
        })
    }

    /// The live bar (when the document is live), acting on what the user asked.
    pub fn live_bar_ui(&mut self, ui: &mut egui::Ui) {
        let Some(session) = &mut self.live else {
            return;
        };
        let status_line = session.status_line();
        let dropped_line = session.dropped_line();
        let model = LiveBarModel {
            status_line: &status_line,
            dropped_line: dropped_line.as_deref(),
            receiving: session.is_receiving(),
            can_save: session.latest_snapshot().is_some(),
            saving: session.is_saving(),
        };
        live_ui::live_bar_ui(ui, &model, &mut self.live_bar);
        session.set_paused(self.live_bar.paused);
        match self.live_bar.action.take() {
            Some(LiveAction::Save) => {
                session.save(live_ui::default_save_path(&self.doc.name));
            }
            Some(LiveAction::Detach) => session.detach(),
            Some(LiveAction::Reattach) => {
                self.live_bar.paused = false;
                session.set_paused(false);
                session.reattach();
            }
            None => {}
        }
    }

    /// The model of the device shown.
    pub fn device(&self) -> &DeviceModel {
        &self.doc.devices[self.device_index]
    }

    /// The file with the device shown: what the ranks and diff pages read.
    pub fn shown(&self) -> Shown<'_> {
        Shown {
            document: &self.doc,
            device: self.device(),
        }
    }

    pub fn state(&self) -> &DeviceState {
        &self.states[self.device_index]
    }

    pub fn state_mut(&mut self) -> &mut DeviceState {
        &mut self.states[self.device_index]
    }

    /// Applies a keyboard command meant for the document shown; zoom and pan commands only
    /// when its timeline is on screen.
    pub fn run_command(&mut self, command: Command, timeline_shown: bool) {
        let i = self.device_index;
        let model = &self.doc.devices[i];
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
        let model = &self.doc.devices[i];
        let state = &mut self.states[i];
        let snapshot = &self.doc.snapshot;
        let timeline_model = TimelineModel {
            snapshot,
            timeline: &model.timeline,
            steps: model.steps(),
            sites: &self.doc.sites,
        };
        // The fix selected in the Advise view, drawn over the recorded run.
        state.advise.poll_overlay();
        state.timeline.predicted = state.advise.overlay().cloned();
        // What a live recording received after this document, drawn past its end.
        state.timeline.live_tail = self
            .live
            .as_ref()
            .and_then(LiveSession::tail)
            .filter(|t| t.continues(snapshot, model.device));
        if state.advise.overlay_is_running() {
            ui.ctx()
                .request_repaint_after(std::time::Duration::from_millis(100));
        }
        timeline::filter_bar_ui(ui, &timeline_model, &mut state.timeline);
        if model.steps_ready() {
            let leaks = model
                .profile()
                .map_or(&[][..], |p| p.summary.leaking_sites.as_slice());
            steps_ui::drift_banner_ui(ui, model.steps(), leaks);
        }

        egui::Panel::right("details_panel")
            .resizable(true)
            .default_size(340.0)
            .show(ui, |ui| {
                details_ui::details_ui(ui, &timeline_model, &mut state.selection);
            });
        egui::Panel::bottom("steps_panel")
            .resizable(true)
            .default_size(220.0)
            .show(ui, |ui| {
                if !model.steps_ready() {
                    ui.add(egui::Spinner::new());
                    ui.label("Finding the training steps…");
                } else if let Some(e) = model.steps_error() {
                    // A failure in the background costs the steps, shown here, not the window.
                    ui.label(RichText::new(e.to_string()).color(ui.visuals().error_fg_color));
                } else if let Some((start, end)) =
                    steps_ui::steps_ui(ui, model.steps(), &mut state.steps)
                {
                    state.timeline.zoom_to_events(&model.timeline, start, end);
                }
            });
        egui::CentralPanel::default().show(ui, |ui| {
            timeline::legend_ui(ui, &timeline_model, &state.timeline);
            timeline::timeline_ui(
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
        let model = &self.doc.devices[i];
        let state = &mut self.states[i];
        let at = match state.selection.cursor {
            Some(event) => memsnap_analysis::Instant::Event(event),
            None => memsnap_analysis::Instant::Peak,
        };
        let instant_model = instant_ui::InstantModel {
            snapshot: &self.doc.snapshot,
            sites: &self.doc.sites,
            timeline: &model.timeline,
            at,
            min_size: state.timeline.min_size,
        };
        instant_ui::instant_ui(ui, &instant_model, &mut state.instant);
    }

    /// Device selector plus what the file says about truncation and errors.
    fn device_bar_ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            if self.doc.devices.len() > 1 {
                let current = self.doc.devices[self.device_index].device;
                egui::ComboBox::from_id_salt(("device", self.doc.id))
                    .selected_text(format!("cuda:{current}"))
                    .show_ui(ui, |ui| {
                        for (i, d) in self.doc.devices.iter().enumerate() {
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
                    RichText::new("history truncated")
                        .color(palette::color32(palette::WARNING)),
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
            for e in &self.doc.device_errors {
                ui.label(RichText::new(e).color(ui.visuals().error_fg_color));
            }
        });
    }

    /// The Allocator page: the device bar, then the view for the device shown.
    pub fn allocator_page_ui(&mut self, ui: &mut egui::Ui) {
        self.device_bar_ui(ui);
        let i = self.device_index;
        let model = AllocatorModel {
            snapshot: &self.doc.snapshot,
            device: self.doc.devices[i].device,
        };
        allocator_ui::allocator_ui(ui, &model, &mut self.states[i].allocator);
    }

    /// The Advise page: the device bar, then the view for the device shown.
    pub fn advise_page_ui(&mut self, ui: &mut egui::Ui) {
        self.device_bar_ui(ui);
        let i = self.device_index;
        let device = &self.doc.devices[i];
        let model = AdviseModel {
            snapshot: &self.doc.snapshot,
            device: device.device,
            timeline: &device.timeline,
        };
        advise_ui::advise_ui(ui, &model, &mut self.states[i].advise);
    }
}

//! The live panels: the bar above a live document (its status line, the dropped marker, Pause,
//! Save snapshot, Detach and Reattach) and the File → Attach… dialog. Both read what
//! [`crate::live`] reports and only say what the user asked for; the app acts on it.

use std::path::PathBuf;

use egui::RichText;

use crate::live::{self, Address, FoundSocket};
use crate::palette;

/// What the live bar shows, read from a [`live::LiveSession`].
pub struct LiveBarModel<'a> {
    /// "live: N entries received from …", "disconnected: REASON; N entries received".
    pub status_line: &'a str,
    /// "N entries dropped by the recorder", when some were.
    pub dropped_line: Option<&'a str>,
    /// Connecting or connected.
    pub receiving: bool,
    /// Whether anything was received that a save would write.
    pub can_save: bool,
    /// A save is being written.
    pub saving: bool,
}

/// What the user changed in the live bar: the pause, and one action asked this frame.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveBarState {
    pub paused: bool,
    pub action: Option<LiveAction>,
}

/// An action asked of the live session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiveAction {
    Save,
    Detach,
    Reattach,
}

/// The bar above a live document.
pub fn live_bar_ui(ui: &mut egui::Ui, model: &LiveBarModel<'_>, state: &mut LiveBarState) {
    ui.horizontal_wrapped(|ui| {
        if model.receiving {
            ui.label(
                RichText::new("LIVE")
                    .strong()
                    .color(palette::color32(palette::WARNING)),
            )
            .on_hover_text("Receiving the recording as it runs");
        }
        ui.label(model.status_line);
        if let Some(dropped) = model.dropped_line {
            ui.label(RichText::new(dropped).color(palette::color32(palette::WARNING)))
                .on_hover_text(
                    "This viewer fell behind and the recorder's ring overwrote entries before \
                     they were sent (or while it was detached): the timeline has a gap there",
                );
        }
        ui.separator();
        // Shown after a disconnect too: a view paused then shows the last document on resume.
        ui.toggle_value(&mut state.paused, "Pause").on_hover_text(
            "Freeze the view; the stream is still received, and resuming shows the newest",
        );
        if model.receiving {
            if ui
                .button("Detach")
                .on_hover_text("Stop receiving; everything received stays")
                .clicked()
            {
                state.action = Some(LiveAction::Detach);
            }
        } else if ui
            .button("Reattach")
            .on_hover_text("Connect again; new entries are appended to what was received")
            .clicked()
        {
            state.action = Some(LiveAction::Reattach);
        }
        if ui
            .add_enabled(
                model.can_save && !model.saving,
                egui::Button::new("Save snapshot…"),
            )
            .on_hover_text("Write what was received as a snapshot (msgpack) in the current folder")
            .clicked()
        {
            state.action = Some(LiveAction::Save);
        }
    });
}

/// The File → Attach… dialog's state: the sockets found when it opened and the typed address.
#[derive(Debug, Default)]
pub struct AttachState {
    pub open: bool,
    pub address: String,
    /// Sent to every recording attached to (`--token`, `MEMSNAP_LIVE_TOKEN`, or typed here).
    pub token: String,
    pub found: Vec<FoundSocket>,
    pub error: Option<String>,
}

impl AttachState {
    /// Opens the dialog, scanning the default socket directories.
    pub fn open(&mut self) {
        self.open = true;
        self.error = None;
        self.refresh();
    }

    fn refresh(&mut self) {
        self.found = live::find_sockets(&live::default_socket_dirs());
    }
}

/// The dialog: the sockets found, and a field for any `unix:`/`tcp:` address. Returns the
/// address to attach to when the user picked one.
pub fn attach_dialog_ui(ui: &mut egui::Ui, state: &mut AttachState) -> Option<Address> {
    if !state.open {
        return None;
    }
    let ctx = ui.ctx().clone();
    let mut chosen = None;
    let mut open = true;
    egui::Window::new("Attach to a live recording")
        .open(&mut open)
        .collapsible(false)
        .resizable(false)
        .anchor(egui::Align2::CENTER_CENTER, egui::Vec2::ZERO)
        .show(&ctx, |ui| {
            ui.label(
                "Recordings serving their history at the default address (serve_live(\"1\")):",
            );
            if state.found.is_empty() {
                ui.label(RichText::new("none found").weak());
            }
            for found in &state.found {
                ui.horizontal(|ui| {
                    let text = format!(
                        "pid {}{}  {}",
                        found.pid,
                        if found.running { "" } else { " (not running)" },
                        found.path.display()
                    );
                    if ui
                        .add_enabled(found.running, egui::Button::new("Attach"))
                        .on_hover_text("Attach to this recording")
                        .clicked()
                    {
                        chosen = Some(Address::Unix(found.path.clone()));
                    }
                    ui.label(text);
                });
            }
            if ui
                .button("Refresh")
                .on_hover_text("Look for recordings again")
                .clicked()
            {
                state.refresh();
            }
            ui.separator();
            ui.label("Or an address (unix:/path.sock, tcp:127.0.0.1:PORT):");
            ui.horizontal(|ui| {
                let field = ui.add(
                    egui::TextEdit::singleline(&mut state.address)
                        .hint_text("unix:/path.sock")
                        .desired_width(280.0),
                );
                let entered = field.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
                if ui
                    .button("Attach to address")
                    .on_hover_text("Attach to the address typed")
                    .clicked()
                    || entered
                {
                    match Address::parse(&state.address) {
                        Ok(address) => chosen = Some(address),
                        Err(e) => state.error = Some(e),
                    }
                }
            });
            ui.horizontal(|ui| {
                ui.label("Token:");
                ui.add(
                    egui::TextEdit::singleline(&mut state.token)
                        .password(true)
                        .hint_text("the recorder's MEMSNAP_LIVE_TOKEN, if it has one")
                        .desired_width(280.0),
                );
            });
            if let Some(e) = &state.error {
                ui.label(RichText::new(e).color(ui.visuals().error_fg_color));
            }
        });
    if chosen.is_some() || !open {
        state.open = false;
    }
    chosen
}

/// The default name of a saved live snapshot: `memsnap-<name>.msgpack` in the current folder,
/// not overwriting (as the PNG and SVG exports name theirs).
pub fn default_save_path(name: &str) -> PathBuf {
    crate::export::default_export_path(name, "msgpack")
}

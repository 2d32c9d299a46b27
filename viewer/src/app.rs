//! The application: open files, loading jobs, messages, and the frame layout that calls each
//! panel's `*_ui` function. Everything here is reachable without a window, so kittest drives
//! the real app.

use std::path::PathBuf;
use std::sync::{mpsc, Arc};

use egui::{Color32, ColorImage, RichText};

use crate::document::Document;
use crate::document_ui::OpenDocument;
use crate::export;
use crate::job::JobError;
use crate::live::{Address, LiveSession};
use crate::live_ui::{self, AttachState};
use crate::loader::{LoadError, LoadJob, Source};
use crate::settings::{Settings, STORAGE_KEY};
use crate::shortcuts::{self, Command};

/// The main area's view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MainView {
    /// Active memory over time, with steps, size filter and details.
    #[default]
    Timeline,
    /// The live set and the segments at one instant.
    Instant,
    /// Every open file (rank) on a shared time axis.
    Ranks,
    /// Two snapshots side by side.
    Diff,
    /// Recorded vs simulated reserved memory under other allocator settings.
    Allocator,
    /// What would make the run fit a memory budget: ranked fixes, each replayed.
    Advise,
}

impl MainView {
    pub const ALL: [MainView; 6] = [
        MainView::Timeline,
        MainView::Instant,
        MainView::Ranks,
        MainView::Diff,
        MainView::Allocator,
        MainView::Advise,
    ];

    pub fn label(self) -> &'static str {
        match self {
            MainView::Timeline => "Timeline",
            MainView::Instant => "At an instant",
            MainView::Ranks => "Ranks",
            MainView::Diff => "Diff",
            MainView::Allocator => "Allocator",
            MainView::Advise => "Advise",
        }
    }

    pub fn tooltip(self) -> &'static str {
        match self {
            MainView::Timeline => {
                "Active memory over time, stacked by allocation, with training steps"
            }
            MainView::Instant => {
                "What is live at the cursor (or the peak) and how the segments are filled"
            }
            MainView::Ranks => {
                "All open files as small multiples on one time axis, plus their totals overlaid"
            }
            MainView::Diff => "Two snapshots side by side, with the change per call site",
            MainView::Allocator => {
                "Reserved memory as recorded vs simulated under other PYTORCH_CUDA_ALLOC_CONF settings or a memory limit, with suggestions"
            }
            MainView::Advise => {
                "What would make the run fit a memory budget: checkpointing, micro-batches, optimizer state, allocator settings, each predicted by replaying the edited trace"
            }
        }
    }
}

/// A message shown in the status area until dismissed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub is_error: bool,
    pub text: String,
}

/// The whole viewer state.
pub struct ViewerApp {
    pub settings: Settings,
    pub documents: Vec<OpenDocument>,
    /// Index into `documents` of the file shown.
    pub active: usize,
    pub jobs: Vec<LoadJob<Document>>,
    pub notices: Vec<Notice>,
    pub view: MainView,
    pub show_help: bool,
    /// The two documents the diff view compares (indices into `documents`).
    pub diff_pair: (usize, usize),
    pub ranks: crate::ranks_ui::RanksState,
    /// Live recordings attached to whose first document is not built yet.
    pub attaching: Vec<LiveSession>,
    /// The File → Attach… dialog.
    pub attach_dialog: AttachState,
    /// Sources waiting for the first frame (they need the egui context to wake the UI).
    pending: Vec<Source>,
    /// Addresses to attach to, waiting for the first frame likewise.
    pending_attach: Vec<Address>,
    next_id: u64,
    screenshot: Option<(PathBuf, mpsc::Receiver<Arc<ColorImage>>)>,
    /// Applied theme, to notice when the setting changes.
    applied_theme: Option<crate::settings::ThemeChoice>,
}

impl Default for ViewerApp {
    fn default() -> Self {
        ViewerApp::new(Settings::default())
    }
}

impl ViewerApp {
    pub fn new(settings: Settings) -> Self {
        ViewerApp {
            settings,
            documents: Vec::new(),
            active: 0,
            jobs: Vec::new(),
            notices: Vec::new(),
            view: MainView::Timeline,
            show_help: false,
            diff_pair: (0, 1),
            ranks: Default::default(),
            attaching: Vec::new(),
            attach_dialog: AttachState::default(),
            pending: Vec::new(),
            pending_attach: Vec::new(),
            next_id: 1,
            screenshot: None,
            applied_theme: None,
        }
    }

    /// The app eframe starts: settings from storage, `files` queued for loading.
    pub fn from_creation_context(cc: &eframe::CreationContext<'_>, files: Vec<PathBuf>) -> Self {
        let settings = cc
            .storage
            .and_then(|s| eframe::get_value::<Settings>(s, STORAGE_KEY))
            .unwrap_or_default();
        let mut app = ViewerApp::new(settings);
        for file in files {
            app.open(Source::Path(file));
        }
        app
    }

    /// Queues a file; loading starts on the next frame, in the background.
    pub fn open(&mut self, source: Source) {
        self.pending.push(source);
    }

    /// Attaches to a live recording; the receiver starts on the next frame, in the
    /// background, and its document opens when the recorder's state has arrived.
    pub fn attach(&mut self, address: Address) {
        self.pending_attach.push(address);
    }

    /// The document shown, if any file is open.
    pub fn active_document(&self) -> Option<&OpenDocument> {
        self.documents.get(self.active)
    }

    pub fn active_document_mut(&mut self) -> Option<&mut OpenDocument> {
        self.documents.get_mut(self.active)
    }

    /// Whether files are queued or loading.
    pub fn is_loading(&self) -> bool {
        !self.pending.is_empty()
            || !self.jobs.is_empty()
            || !self.pending_attach.is_empty()
            || !self.attaching.is_empty()
            || self.documents.iter().any(|d| !d.doc.profiles_ready())
    }

    /// Blocks until every queued and running load is done (tests, benchmarks, screenshots).
    pub fn finish_loading(&mut self) {
        self.start_pending(None);
        for job in std::mem::take(&mut self.jobs) {
            let result = job.wait();
            self.accept(result);
        }
        for document in &mut self.documents {
            document.doc.wait_for_profiles();
        }
    }

    fn start_pending(&mut self, ctx: Option<&egui::Context>) {
        for address in std::mem::take(&mut self.pending_attach) {
            let id = self.next_id;
            self.next_id += 1;
            let token = Some(self.attach_dialog.token.clone()).filter(|t| !t.is_empty());
            self.attaching
                .push(LiveSession::start(id, address, token, ctx.cloned()));
        }
        for source in std::mem::take(&mut self.pending) {
            let id = self.next_id;
            self.next_id += 1;
            let repaint = ctx.cloned();
            self.jobs
                .push(LoadJob::spawn(id, source, ctx.cloned(), move |loaded| {
                    Document::prepare(id, loaded, repaint)
                }));
        }
    }

    fn poll_jobs(&mut self) {
        let mut i = 0;
        while i < self.jobs.len() {
            if let Some(result) = self.jobs[i].poll() {
                self.jobs.remove(i);
                self.accept(result);
            } else {
                i += 1;
            }
        }
    }

    /// Opens the first document of each live session that has one, drops the sessions that
    /// ended before any (with a notice), and updates the live documents.
    fn poll_live(&mut self) {
        let mut i = 0;
        while i < self.attaching.len() {
            let session = &mut self.attaching[i];
            session.poll();
            if let Some(document) = session.take_document() {
                let session = self.attaching.remove(i);
                self.documents.push(OpenDocument::live(document, session));
                self.active = self.documents.len() - 1;
                if self.documents.len() >= 2 {
                    self.diff_pair = (self.documents.len() - 2, self.documents.len() - 1);
                }
            } else if !session.is_receiving() {
                let session = self.attaching.remove(i);
                let reason = session
                    .ended()
                    .map_or_else(String::new, ToString::to_string);
                self.notices.push(Notice {
                    is_error: true,
                    text: format!("cannot attach to {}: {reason}", session.address.url()),
                });
            } else {
                i += 1;
            }
        }
        for document in &mut self.documents {
            if let Some((is_error, text)) = document.poll_live() {
                self.notices.push(Notice { is_error, text });
            }
        }
    }

    /// Whether a live recording is being received.
    pub fn is_receiving(&self) -> bool {
        !self.attaching.is_empty()
            || self
                .documents
                .iter()
                .any(|d| d.live.as_ref().is_some_and(LiveSession::is_receiving))
    }

    fn accept(&mut self, result: Result<Document, JobError<LoadError>>) {
        match result {
            Ok(document) => {
                if let Some(path) = &document.path {
                    self.settings.remember(path);
                }
                // In the order the files were opened, not the order their loads finished:
                // two files dropped together came up in either order (a flaky ranks picture).
                let at = self
                    .documents
                    .iter()
                    .position(|d| d.doc.id > document.id)
                    .unwrap_or(self.documents.len());
                // The newest file opened is shown, whichever finished last: an older one
                // finishing after it keeps the shown file in place (the ranks picture once
                // framed rank0 or rank1 by which load finished last).
                let newest = at == self.documents.len();
                self.documents.insert(at, OpenDocument::new(document));
                if newest {
                    self.active = at;
                } else if at <= self.active {
                    self.active += 1;
                }
                if self.documents.len() >= 2 {
                    self.diff_pair = (self.documents.len() - 2, self.documents.len() - 1);
                }
            }
            Err(JobError::Cancelled { what }) => self.notices.push(Notice {
                is_error: false,
                text: format!("{} was cancelled.", capitalised(&what)),
            }),
            Err(err) => self.notices.push(Notice {
                is_error: true,
                text: err.to_string(),
            }),
        }
    }

    /// Closes the document at `index`.
    pub fn close(&mut self, index: usize) {
        if index < self.documents.len() {
            self.documents.remove(index);
            self.active = self.active.min(self.documents.len().saturating_sub(1));
            let last = self.documents.len().saturating_sub(1);
            self.diff_pair = (self.diff_pair.0.min(last), self.diff_pair.1.min(last));
        }
    }

    /// Shows the whole UI for one frame.
    pub fn ui(&mut self, ui: &mut egui::Ui) {
        let ctx = ui.ctx().clone();
        self.apply_theme(&ctx);
        self.start_pending(Some(&ctx));
        self.poll_jobs();
        self.poll_live();
        for document in &mut self.documents {
            document.doc.poll();
        }
        self.take_dropped_files(&ctx);
        self.poll_screenshot();
        for command in shortcuts::pressed(&ctx) {
            self.run_command(&ctx, command);
        }

        egui::Panel::top("menu_bar").show(ui, |ui| self.menu_bar_ui(ui));
        egui::Panel::top("file_bar").show(ui, |ui| self.file_bar_ui(ui));
        if let Some(document) = self
            .documents
            .get_mut(self.active)
            .filter(|d| d.live.is_some())
        {
            egui::Panel::top("live_bar").show(ui, |ui| document.live_bar_ui(ui));
        }
        if !self.jobs.is_empty() || !self.notices.is_empty() || !self.attaching.is_empty() {
            egui::Panel::bottom("status").show(ui, |ui| self.status_ui(ui));
        }
        egui::CentralPanel::default().show(ui, |ui| self.main_ui(ui));

        crate::help::help_overlay_ui(ui, &mut self.show_help);
        if let Some(address) = live_ui::attach_dialog_ui(ui, &mut self.attach_dialog) {
            self.attach(address);
        }
        file_drop_overlay_ui(&ctx);
        if !self.jobs.is_empty()
            || self.is_receiving()
            || self.documents.iter().any(|d| !d.doc.steps_ready())
        {
            // Progress bars move, and the steps arrive after the first picture, without input
            // events.
            ctx.request_repaint_after(std::time::Duration::from_millis(100));
        }
    }

    fn apply_theme(&mut self, ctx: &egui::Context) {
        if self.applied_theme != Some(self.settings.theme) {
            ctx.set_theme(self.settings.theme.egui_theme());
            self.applied_theme = Some(self.settings.theme);
        }
    }

    fn take_dropped_files(&mut self, ctx: &egui::Context) {
        let dropped = ctx.input(|i| i.raw.dropped_files.clone());
        for file in dropped {
            self.open(Source::Dropped(file));
        }
        // Start them now, not a frame later.
        self.start_pending(Some(ctx));
    }

    fn run_command(&mut self, ctx: &egui::Context, command: Command) {
        match command {
            Command::Open => self.open_dialog(),
            Command::CloseFile => self.close(self.active),
            Command::NextFile => {
                if !self.documents.is_empty() {
                    self.active = (self.active + 1) % self.documents.len();
                }
            }
            Command::ToggleTheme => self.settings.theme = self.settings.theme.toggled(),
            Command::ToggleHelp => self.show_help = !self.show_help,
            Command::ExportPng => self.export_png(ctx),
            Command::ExportSvg => self.export_svg(),
            Command::Unpin if self.show_help => self.show_help = false,
            other => {
                let timeline_shown = self.view == MainView::Timeline;
                if let Some(doc) = self.active_document_mut() {
                    doc.run_command(other, timeline_shown);
                }
            }
        }
    }

    fn open_dialog(&mut self) {
        // Without an xdg-desktop-portal this returns None at once; drag and drop and the
        // command line still work, and the notice says so.
        let picked = rfd::FileDialog::new()
            .set_title("Open memory snapshots")
            .add_filter(
                "Memory snapshots",
                &[
                    "pickle", "pkl", "pck", "msgpack", "mpk", "memsnap", "json", "gz", "zst",
                ],
            )
            .add_filter("All files", &["*"])
            .pick_files();
        match picked {
            Some(files) => {
                for file in files {
                    self.open(Source::Path(file));
                }
            }
            None => self.notices.push(Notice {
                is_error: false,
                text: "No file chosen. (Without a desktop file chooser, drop files on the window or pass them on the command line.)".into(),
            }),
        }
    }

    fn export_png(&mut self, ctx: &egui::Context) {
        let name = self
            .active_document()
            .map_or("viewer".to_owned(), |d| d.doc.name.clone());
        let path = export::default_export_path(&name, "png");
        let (sender, receiver) = mpsc::channel();
        let wake = ctx.clone();
        ctx.request_screenshot(move |image| {
            let _ = sender.send(image);
            wake.request_repaint();
        });
        self.screenshot = Some((path, receiver));
    }

    fn poll_screenshot(&mut self) {
        let Some((path, receiver)) = &self.screenshot else {
            return;
        };
        match receiver.try_recv() {
            Ok(image) => {
                let notice = match export::write_png(&image, path) {
                    Ok(()) => Notice {
                        is_error: false,
                        text: format!("Saved {}", path.display()),
                    },
                    Err(e) => Notice {
                        is_error: true,
                        text: e.to_string(),
                    },
                };
                self.notices.push(notice);
                self.screenshot = None;
            }
            Err(mpsc::TryRecvError::Empty) => {}
            Err(mpsc::TryRecvError::Disconnected) => {
                self.notices.push(Notice {
                    is_error: true,
                    text: "The renderer did not deliver a screenshot.".into(),
                });
                self.screenshot = None;
            }
        }
    }

    fn export_svg(&mut self) {
        let Some(doc) = self.active_document() else {
            return;
        };
        let path = export::default_export_path(&doc.doc.name, "svg");
        let notice = match doc.timeline_svg() {
            Some(svg) => match std::fs::write(&path, svg) {
                Ok(()) => Notice {
                    is_error: false,
                    text: format!("Saved {}", path.display()),
                },
                Err(e) => Notice {
                    is_error: true,
                    text: format!("cannot write {}: {e}", path.display()),
                },
            },
            None => Notice {
                is_error: true,
                text: "Nothing to export yet: show the timeline first.".into(),
            },
        };
        self.notices.push(notice);
    }

    fn menu_bar_ui(&mut self, ui: &mut egui::Ui) {
        egui::MenuBar::new().ui(ui, |ui| {
            ui.menu_button("File", |ui| {
                let ctx = ui.ctx().clone();
                if ui
                    .add(
                        egui::Button::new("Open…")
                            .shortcut_text(shortcuts::shortcut_text(&ctx, Command::Open)),
                    )
                    .on_hover_text("Open one or more snapshot files (pickle, msgpack, JSON; gzip or zstd)")
                    .clicked()
                {
                    self.open_dialog();
                }
                ui.menu_button("Open recent", |ui| {
                    if self.settings.recent_files.is_empty() {
                        ui.label("No recent files");
                    }
                    for path in self.settings.recent_files.clone() {
                        if ui
                            .button(path.display().to_string())
                            .on_hover_text("Open this file again")
                            .clicked()
                        {
                            self.open(Source::Path(path));
                        }
                    }
                });
                if ui
                    .button("Attach…")
                    .on_hover_text("Follow a recording while it runs (a program serving its history with CachingAllocator::serve_live)")
                    .clicked()
                {
                    self.attach_dialog.open();
                }
                ui.separator();
                if ui
                    .add_enabled(
                        !self.documents.is_empty(),
                        egui::Button::new("Export PNG")
                            .shortcut_text(shortcuts::shortcut_text(&ctx, Command::ExportPng)),
                    )
                    .on_hover_text("Save a picture of the window in the current folder")
                    .clicked()
                {
                    self.export_png(&ctx);
                }
                if ui
                    .add_enabled(
                        !self.documents.is_empty(),
                        egui::Button::new("Export SVG")
                            .shortcut_text(shortcuts::shortcut_text(&ctx, Command::ExportSvg)),
                    )
                    .on_hover_text("Save the timeline as a vector drawing in the current folder")
                    .clicked()
                {
                    self.export_svg();
                }
                ui.separator();
                if ui
                    .add_enabled(
                        !self.documents.is_empty(),
                        egui::Button::new("Close file")
                            .shortcut_text(shortcuts::shortcut_text(&ctx, Command::CloseFile)),
                    )
                    .on_hover_text("Close the file shown")
                    .clicked()
                {
                    self.close(self.active);
                }
                if ui.button("Quit").on_hover_text("Quit the viewer").clicked() {
                    ui.send_viewport_cmd(egui::ViewportCommand::Close);
                }
            });
            ui.menu_button("View", |ui| {
                for view in MainView::ALL {
                    if ui
                        .selectable_label(self.view == view, view.label())
                        .on_hover_text(view.tooltip())
                        .clicked()
                    {
                        self.view = view;
                    }
                }
                ui.separator();
                ui.checkbox(&mut self.settings.wall_time_axis, "Wall-time axis")
                    .on_hover_text("Plot against recorded time instead of the event index (when the trace has times)");
                let dark = self.settings.theme == crate::settings::ThemeChoice::Dark;
                if ui
                    .button(if dark { "Light theme" } else { "Dark theme" })
                    .on_hover_text("Switch the colour theme")
                    .clicked()
                {
                    self.settings.theme = self.settings.theme.toggled();
                }
            });
            ui.menu_button("Help", |ui| {
                if ui
                    .button("Keyboard shortcuts")
                    .on_hover_text("List every key and mouse gesture")
                    .clicked()
                {
                    self.show_help = true;
                }
            });
        });
    }

    fn file_bar_ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal_wrapped(|ui| {
            for view in MainView::ALL {
                // Advise is reached from the View menu; its button shows while it is the view.
                if view == MainView::Advise && self.view != view {
                    continue;
                }
                let enabled = match view {
                    MainView::Timeline | MainView::Instant => !self.documents.is_empty(),
                    MainView::Ranks | MainView::Allocator | MainView::Advise => {
                        !self.documents.is_empty()
                    }
                    MainView::Diff => self.documents.len() >= 2,
                };
                let response = ui
                    .add_enabled(
                        enabled,
                        egui::Button::selectable(self.view == view, view.label()),
                    )
                    .on_hover_text(view.tooltip())
                    .on_disabled_hover_text("Open two files to compare them");
                if response.clicked() {
                    self.view = view;
                }
            }
            ui.separator();
            let mut close = None;
            for (i, doc) in self.documents.iter().enumerate() {
                let response = ui
                    .add(egui::Button::selectable(i == self.active, &doc.doc.name))
                    .on_hover_text(doc.doc.summary());
                if response.clicked() {
                    self.active = i;
                }
                if response.middle_clicked() {
                    close = Some(i);
                }
            }
            if let Some(i) = close {
                self.close(i);
            }
            if self.documents.is_empty() && self.jobs.is_empty() && self.attaching.is_empty() {
                ui.label("No file open");
            }
        });
    }

    fn status_ui(&mut self, ui: &mut egui::Ui) {
        let mut cancel = None;
        for job in &self.jobs {
            ui.horizontal(|ui| {
                let progress = job.progress();
                let text = format!("{} – {}", job.name, progress.stage());
                let bar = match progress.fraction() {
                    Some(f) => egui::ProgressBar::new(f).show_percentage(),
                    None => egui::ProgressBar::new(0.0).animate(true),
                };
                ui.add_sized([260.0, 18.0], bar.text(text))
                    .on_hover_text("Loading in the background; the window stays usable");
                if ui
                    .add_enabled(!job.is_cancelled(), egui::Button::new("Cancel"))
                    .on_hover_text("Stop loading this file")
                    .clicked()
                {
                    cancel = Some(job.id);
                }
            });
        }
        if let Some(id) = cancel {
            if let Some(job) = self.jobs.iter().find(|j| j.id == id) {
                job.cancel();
            }
        }
        for session in &self.attaching {
            ui.horizontal(|ui| {
                ui.add(egui::Spinner::new());
                ui.label(session.status_line());
                if ui
                    .button("Cancel")
                    .on_hover_text("Stop attaching to this recording")
                    .clicked()
                {
                    session.detach();
                }
            });
        }
        let mut dismiss = None;
        for (i, notice) in self.notices.iter().enumerate() {
            ui.horizontal(|ui| {
                if ui
                    .small_button("×")
                    .on_hover_text("Dismiss this message")
                    .clicked()
                {
                    dismiss = Some(i);
                }
                let color = if notice.is_error {
                    ui.visuals().error_fg_color
                } else {
                    ui.visuals().text_color()
                };
                let prefix = if notice.is_error { "Error: " } else { "" };
                ui.label(RichText::new(format!("{prefix}{}", notice.text)).color(color));
            });
        }
        if let Some(i) = dismiss {
            self.notices.remove(i);
        }
    }

    fn main_ui(&mut self, ui: &mut egui::Ui) {
        if self.documents.is_empty() {
            let loading = self.jobs.first().and_then(|job| {
                Some((job.name.as_str(), job.preview()?, job.progress().fraction()))
            });
            match loading {
                Some((name, preview, fraction)) => {
                    loading_preview_ui(ui, name, &preview, fraction);
                }
                None => welcome_ui(ui, self.jobs.is_empty() && self.attaching.is_empty()),
            }
            return;
        }
        match self.view {
            MainView::Timeline => {
                let active = self.active;
                self.documents[active].timeline_page_ui(ui);
            }
            MainView::Instant => {
                let active = self.active;
                self.documents[active].instant_page_ui(ui);
            }
            MainView::Ranks => {
                let shown: Vec<_> = self.documents.iter().map(OpenDocument::shown).collect();
                crate::ranks_ui::ranks_ui(ui, &shown, &mut self.active, &mut self.ranks)
            }
            MainView::Diff => {
                let shown: Vec<_> = self.documents.iter().map(OpenDocument::shown).collect();
                crate::diff_ui::diff_ui(ui, &shown, &mut self.diff_pair);
            }
            MainView::Allocator => {
                let active = self.active;
                self.documents[active].allocator_page_ui(ui);
            }
            MainView::Advise => {
                let active = self.active;
                self.documents[active].advise_page_ui(ui);
            }
        }
    }
}

/// "Loading x" from "loading x", for the start of a sentence.
fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

fn welcome_ui(ui: &mut egui::Ui, idle: bool) {
    ui.vertical_centered(|ui| {
        ui.add_space(ui.available_height() / 3.0);
        ui.heading("memsnap viewer");
        ui.add_space(8.0);
        if idle {
            ui.label("Drop PyTorch memory snapshots here (pickle, msgpack or JSON, optionally gzip/zstd),");
            ui.label("or use File > Open. Several files open as ranks. Press F1 for shortcuts.");
        } else {
            ui.label("Loading…");
        }
    });
}

/// While a pickle loads: the memory in use over the entries read so far, growing to the
/// right as the file is read (the x axis is the whole file, estimated from the bytes read).
fn loading_preview_ui(
    ui: &mut egui::Ui,
    name: &str,
    preview: &crate::loader::LoadPreview,
    fraction: Option<f32>,
) {
    ui.add_space(8.0);
    ui.label(format!(
        "Loading {name}: {} entries read so far. The picture grows as the file is read; the \
         full timeline follows.",
        preview.entries
    ));
    let (rect, _) = ui.allocate_exact_size(
        egui::vec2(ui.available_width(), ui.available_height().min(400.0)),
        egui::Sense::hover(),
    );
    let painter = ui.painter_at(rect);
    painter.rect_filled(rect, 0.0, ui.visuals().extreme_bg_color);
    let lowest = preview
        .buckets
        .iter()
        .map(|b| b.0)
        .min()
        .unwrap_or(0)
        .min(0);
    let highest = preview.buckets.iter().map(|b| b.1).max().unwrap_or(0);
    let span = (highest - lowest).max(1) as f32;
    // Entries of the whole file, from the share of its bytes read.
    let expected = match fraction {
        Some(f) if f > 0.0 => (preview.entries as f32 / f).max(preview.entries as f32),
        _ => preview.entries as f32,
    }
    .max(1.0);
    let colour = crate::palette::color32(memsnap_plot::palette::residual(ui.visuals().dark_mode));
    let mut mesh = egui::epaint::Mesh::default();
    let per_bucket = preview.bucket_entries as f32;
    for (i, &(_, max)) in preview.buckets.iter().enumerate() {
        let x0 = rect.left() + rect.width() * (i as f32 * per_bucket / expected);
        let x1 = rect.left()
            + rect.width() * (((i + 1) as f32 * per_bucket).min(preview.entries as f32) / expected);
        let top = rect.bottom() - rect.height() * ((max - lowest) as f32 / span);
        mesh.add_colored_rect(
            egui::Rect::from_x_y_ranges(x0..=x1.max(x0 + 1.0), top..=rect.bottom()),
            colour,
        );
    }
    painter.add(egui::Shape::mesh(mesh));
    painter.text(
        rect.left_top() + egui::vec2(6.0, 4.0),
        egui::Align2::LEFT_TOP,
        format!(
            "memory in use as read so far (all devices), up to {}",
            crate::units::format_size(u64::try_from(highest).unwrap_or(0))
        ),
        egui::FontId::proportional(12.0),
        ui.visuals().weak_text_color(),
    );
}

/// Darkens the window and says what will happen while files are dragged over it.
fn file_drop_overlay_ui(ctx: &egui::Context) {
    let hovered = ctx.input(|i| i.raw.hovered_files.len());
    if hovered == 0 {
        return;
    }
    let painter = ctx.layer_painter(egui::LayerId::new(
        egui::Order::Foreground,
        egui::Id::unique("file_drop_overlay"),
    ));
    let rect = ctx.content_rect();
    painter.rect_filled(rect, 0.0, Color32::from_black_alpha(180));
    let text = if hovered == 1 {
        "Drop to open this snapshot".to_owned()
    } else {
        format!("Drop to open {hovered} snapshots as ranks")
    };
    painter.text(
        rect.center(),
        egui::Align2::CENTER_CENTER,
        text,
        egui::FontId::proportional(24.0),
        Color32::WHITE,
    );
}

impl eframe::App for ViewerApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        ViewerApp::ui(self, ui);
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        eframe::set_value(storage, STORAGE_KEY, &self.settings);
    }
}

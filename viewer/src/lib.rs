//! # memsnap-viewer
//!
//! The desktop viewer for GPU memory snapshots, an eframe (egui) app over the
//! `memsnap-analysis` model.
//!
//! The app logic lives in this library so the `memsnap-viewer` program (which `memsnap view`
//! starts) and the kittest UI tests share it. The library holds the app only: the program's
//! `--bench-frames` measuring mode lives beside its `main` (`src/bin/memsnap-viewer/`) and
//! drives the timeline panel through this crate's public API. Each panel is a function `x_ui(ui, &model, &mut state)` over a UI-free model from
//! `memsnap-analysis` and its own small state; derived numbers (curves, steps, live sets,
//! layouts) come from the analysis crate, never from UI code.
//!
//! * [`app`]: files, loading, messages and the frame layout.
//! * [`job`]: the one way work runs in the background (progress, cancel, panics as errors).
//! * [`loader`]: reading and decoding a file in a job.
//! * [`live`]: attaching to a live recording: the receiver, its bounded rebuilds into a
//!   [`document::Document`], pause, save, reattach ([`live_ui`]: its bar and the Attach
//!   dialog; [`live_tail`]: what arrived after the shown document, drawn until the next).
//! * [`document`]: one open file's model: its snapshot and analysis, free of UI.
//! * [`document_ui`]: how an open file is shown: the device chosen, each panel's state, the
//!   pages that lay the panels out.
//! * [`timeline`] (`timeline_ui`), [`steps_ui`], [`details_ui`], [`instant_ui`], [`ranks_ui`],
//!   [`diff_ui`], [`allocator_ui`] (over [`allocator`]), [`advise_ui`] (over [`advise`]): the
//!   panels.
//! * [`view`]: zoom and pan arithmetic. [`units`]: human sizes. [`export`]: PNG and SVG.

pub mod advise;
pub mod advise_ui;
pub mod allocator;
pub mod allocator_ui;
pub mod app;
pub mod details_ui;
pub mod diff_ui;
pub mod document;
pub mod document_ui;
pub mod export;
pub mod help;
pub mod instant_ui;
pub mod job;
pub mod live;
pub mod live_tail;
pub mod live_ui;
pub mod loader;
pub mod palette;
pub mod ranks_ui;
pub mod settings;
pub mod shortcuts;
pub mod steps_ui;
pub mod timeline;
pub mod units;
pub mod view;

use std::path::PathBuf;

pub use app::ViewerApp;

/// Opens the viewer window on `files` (and the demo run with `demo`), attached to the live
/// recordings at `attach`, and returns when it is closed.
pub fn run_native(
    files: Vec<PathBuf>,
    demo: bool,
    attach: Vec<live::Address>,
    token: Option<String>,
) -> Result<(), eframe::Error> {
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("memsnap viewer")
            .with_inner_size([1280.0, 800.0])
            .with_min_inner_size([480.0, 320.0])
            .with_drag_and_drop(true),
        ..Default::default()
    };
    eframe::run_native(
        "memsnap-viewer",
        options,
        Box::new(move |cc| {
            let mut app = ViewerApp::from_creation_context(cc, files);
            if demo {
                app.open(loader::Source::Demo);
            }
            app.attach_dialog.token = token.unwrap_or_default();
            for address in attach {
                app.attach(address);
            }
            Ok(Box::new(app))
        }),
    )
}

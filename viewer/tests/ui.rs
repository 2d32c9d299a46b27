//! UI tests: the real app driven through its accessibility tree with egui_kittest, plus image
//! snapshots of the main views on a generated training run.
//!
//! Image snapshots render with wgpu's software adapter (lavapipe, or llvmpipe GL with
//! `WGPU_BACKEND=gl`). Record them with `UPDATE_SNAPSHOTS=1 cargo test -p memsnap-viewer`;
//! the tolerance is in `viewer/kittest.toml`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egui::accesskit::Role;
use egui_kittest::kittest::{NodeT, Queryable};
use egui_kittest::Harness;
use memsnap_analysis::{Category, PhaseKind};
use memsnap_format::Format;
use memsnap_plot::palette::{self, ColourBy};
use memsnap_viewer::app::MainView;
use memsnap_viewer::document::{Document, DocumentError};
use memsnap_viewer::loader::{LoadJob, Source};
use memsnap_viewer::settings::{Settings, ThemeChoice};
use memsnap_viewer::ViewerApp;
use memsnap_workload::{generate, TrainingRun};

/// A file dropped on the window, as egui-winit hands it over.
#[derive(Debug)]
struct DroppedBytes {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl egui::DroppedFile for DroppedBytes {
    fn path(&self) -> &Path {
        &self.path
    }

    fn bytes(&self) -> Result<Vec<u8>, String> {
        Ok(self.bytes.clone())
    }
}

/// A small training run with a leak, as a pickle.
fn training_pickle(seed: u64, leak: u64) -> Vec<u8> {
    let (snapshot, _) = generate(&TrainingRun {
        steps: 5,
        layers: 4,
        activations_per_layer: 3,
        leak_bytes_per_step: leak,
        seed,
        ..TrainingRun::default()
    });
    memsnap_format::io::encode(&snapshot, Format::Pickle).expect("encode")
}

/// A run whose ring buffer kept only the newest entries, so it starts mid-run.
fn truncated_pickle() -> Vec<u8> {
    let (snapshot, _) = generate(&TrainingRun {
        steps: 6,
        layers: 4,
        activations_per_layer: 3,
        max_entries: Some(500),
        seed: 16,
        ..TrainingRun::default()
    });
    memsnap_format::io::encode(&snapshot, Format::Pickle).expect("encode")
}

fn harness(settings: Settings) -> Harness<'static, ViewerApp> {
    Harness::builder()
        .with_size([1280.0, 800.0])
        .build_ui_state(
            |ui, app: &mut ViewerApp| app.ui(ui),
            ViewerApp::new(settings),
        )
}

fn drop_file(h: &mut Harness<'_, ViewerApp>, name: &str, bytes: Vec<u8>) {
    h.input_mut().dropped_files.push(Arc::new(DroppedBytes {
        // No such file on disk: the loader falls back to the dropped bytes.
        path: PathBuf::from(format!("/nonexistent/{name}")),
        bytes,
    }));
}

/// Steps frames until the background loads are done.
fn run_until_loaded(h: &mut Harness<'_, ViewerApp>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    h.step();
    while h.state().is_loading() {
        assert!(Instant::now() < deadline, "loading did not finish");
        std::thread::sleep(Duration::from_millis(5));
        h.step();
    }
    h.run_steps(4);
}

fn loaded_app(files: &[(&str, Vec<u8>)], settings: Settings) -> Harness<'static, ViewerApp> {
    let mut h = harness(settings);
    for (name, bytes) in files {
        drop_file(&mut h, name, bytes.clone());
    }
    run_until_loaded(&mut h);
    h
}

#[test]
fn dropping_a_snapshot_opens_its_timeline() {
    let mut h = harness(Settings::default());
    h.get_by_label_contains("Drop PyTorch memory snapshots here");
    drop_file(&mut h, "run.pickle", training_pickle(1, 0));
    run_until_loaded(&mut h);
    assert_eq!(h.state().documents.len(), 1);
    assert!(h.state().notices.is_empty(), "{:?}", h.state().notices);
    h.get_by_role_and_label(Role::Button, "run.pickle");
    let plot = h.get_by_label_contains("Active memory timeline");
    assert_eq!(plot.accesskit_node().role(), Role::Image);
    h.get_by_label_contains("Training steps: ");
}

/// Two files dropped together are listed in the order they were dropped, whichever loads
/// first: the ranks picture once swapped rank0 and rank1 when rank1 finished first. The last
/// one dropped is the one shown, whichever finishes last: the ranks picture once framed
/// rank0 when rank0 finished after rank1.
#[test]
fn files_dropped_together_are_listed_in_the_order_they_were_dropped() {
    let (big, _) = generate(&TrainingRun {
        steps: 40,
        layers: 24,
        seed: 21,
        ..TrainingRun::default()
    });
    let big = memsnap_format::io::encode(&big, Format::Pickle).expect("encode");
    let small = training_pickle(22, 0);
    for _ in 0..3 {
        let h = loaded_app(
            &[
                ("first-big.pickle", big.clone()),
                ("second-small.pickle", small.clone()),
                ("third-small.pickle", small.clone()),
            ],
            Settings::default(),
        );
        let names: Vec<&str> = h
            .state()
            .documents
            .iter()
            .map(|d| d.doc.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "first-big.pickle",
                "second-small.pickle",
                "third-small.pickle"
            ]
        );
        assert_eq!(h.state().active, 2, "the last file dropped is shown");
    }
}

/// A file that arrives slowly (a named pipe written in two halves) loads in the background:
/// frames keep being drawn while the reader waits for the rest, and the file opens once it
/// has all arrived.
#[test]
fn frames_keep_coming_while_a_slow_file_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("slow.pickle");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("notice: mkfifo is not available; skipping the slow-reader test");
        return;
    }
    let bytes = training_pickle(3, 0);
    let (release, released) = std::sync::mpsc::channel::<()>();
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            // Opening blocks until the loader opens the pipe for reading.
            let mut pipe = std::fs::OpenOptions::new()
                .write(true)
                .open(&fifo)
                .expect("open the pipe");
            let half = bytes.len() / 2;
            pipe.write_all(&bytes[..half]).expect("first half");
            // Released by the test, or after a while if the test's frames are stuck
            // waiting for the file (then the frame-time assertion fails instead of a hang).
            let _ = released.recv_timeout(Duration::from_secs(10));
            pipe.write_all(&bytes[half..]).expect("second half");
        })
    };
    let mut h = harness(Settings::default());
    h.state_mut().open(Source::Path(fifo));
    let started = Instant::now();
    let mut frames = 0;
    while started.elapsed() < Duration::from_millis(600) {
        let frame = Instant::now();
        h.step();
        assert!(
            frame.elapsed() < Duration::from_secs(2),
            "a frame waited for the file"
        );
        frames += 1;
    }
    assert!(frames >= 5, "only {frames} frames in 600 ms");
    assert!(h.state().is_loading());
    assert!(h.state().documents.is_empty());
    h.get_by_label_contains("slow.pickle");
    let _ = release.send(());
    run_until_loaded(&mut h);
    writer.join().expect("writer");
    assert_eq!(h.state().documents.len(), 1, "{:?}", h.state().notices);
}

#[test]
fn a_bad_file_shows_an_error_and_the_good_one_stays_open() {
    let mut h = loaded_app(
        &[
            ("good.pickle", training_pickle(2, 0)),
            ("junk.pickle", b"\x80\x04this is not a pickle".to_vec()),
        ],
        Settings::default(),
    );
    assert_eq!(h.state().documents.len(), 1);
    // The error names the file, what failed and where (a byte offset).
    let text = h.state().notices[0].text.clone();
    assert!(text.starts_with("junk.pickle: pickle: "), "{text}");
    assert!(text.contains(" at byte "), "{text}");
    h.get_by_label(&format!("Error: {text}"));
    h.get_by_label_contains("Active memory timeline");
    // Dismissing the error keeps the app running.
    h.get_by_label("×").click();
    h.run();
    assert!(h.state().notices.is_empty());
    assert!(h.query_by_label_contains("junk.pickle: ").is_none());
}

/// Regression: loading, the steps and the allocator view each caught panics their own way
/// (one of them into no error at all). A panic in background work now comes back as the
/// job's error, shown in the window; the other files stay open.
#[test]
fn a_panic_in_background_work_is_shown_as_an_error_not_a_crash() {
    let mut h = loaded_app(
        &[("good.pickle", training_pickle(2, 0))],
        Settings::default(),
    );
    let panicking = LoadJob::spawn(
        99,
        Source::Bytes {
            name: "bad.pickle".into(),
            bytes: training_pickle(4, 0).into(),
        },
        None,
        |_| -> Result<Document, DocumentError> { panic!("a bug in the analysis") },
    );
    h.state_mut().jobs.push(panicking);
    run_until_loaded(&mut h);
    assert_eq!(h.state().documents.len(), 1);
    let notice = h.state().notices[0].clone();
    assert!(notice.is_error);
    assert_eq!(
        notice.text,
        "loading bad.pickle failed unexpectedly: a bug in the analysis"
    );
    h.get_by_label(&format!("Error: {}", notice.text));
    h.get_by_label_contains("Active memory timeline");
}

#[test]
fn moving_the_size_slider_folds_small_allocations_into_one_band() {
    let mut h = loaded_app(
        &[("run.pickle", training_pickle(3, 0))],
        Settings::default(),
    );
    let bands_before = drawn_bands(&h);
    h.get_by_label("everything shown");
    // Slider positions are log2 of bytes: 22 = 4 MiB.
    h.get_by_role(Role::Slider).set_value_accesskit(22.0);
    h.run();
    let state = &h.state().active_document().expect("open").state().timeline;
    assert_eq!(state.min_size, 4 << 20);
    // The slider's text and the legend's residual band both say it.
    assert_eq!(h.query_all_by_label("smaller than 4.0 MiB").count(), 2);
    let bands_after = drawn_bands(&h);
    assert!(
        bands_after < bands_before,
        "fewer bands after filtering: {bands_after} vs {bands_before}"
    );
    let layout = h
        .state()
        .active_document()
        .expect("open")
        .state()
        .timeline
        .cached_layout()
        .expect("drawn");
    // Every column still adds up: drawn bands plus the residual equal the curve.
    assert!(layout
        .columns
        .iter()
        .all(|c| c.drawn_bytes <= c.total_bytes));
    assert!(layout.columns.iter().any(|c| c.total_bytes > c.drawn_bytes));
}

fn drawn_bands(h: &Harness<'_, ViewerApp>) -> usize {
    h.state()
        .active_document()
        .and_then(|d| d.state().timeline.cached_layout())
        .map_or(0, |l| l.bands.len())
}

#[test]
fn clicking_a_step_row_zooms_the_timeline_to_that_step() {
    let mut h = loaded_app(
        &[("run.pickle", training_pickle(4, 0))],
        Settings::default(),
    );
    let steps = h
        .state()
        .active_document()
        .expect("open")
        .device()
        .steps()
        .steps
        .clone();
    assert!(
        steps.len() >= 3,
        "the generated run has steps: {}",
        steps.len()
    );
    h.get_by_label("step 2").click();
    h.run();
    let doc = h.state().active_document().expect("open");
    let window = doc.state().timeline.window;
    let step = &steps[2];
    assert!(window.is_zoomed());
    assert!(window.start <= f64::from(step.start_event) && window.end >= f64::from(step.end_event));
    assert!(window.span() < 1.5 * f64::from(step.end_event - step.start_event + 1));
    assert_eq!(doc.state().steps.selected, Some(2));
}

#[test]
fn clicking_a_band_pins_it_and_shows_its_full_stack() {
    let mut h = loaded_app(
        &[("run.pickle", training_pickle(15, 0))],
        Settings::default(),
    );
    let plot = h.get_by_label_contains("Active memory timeline").rect();
    // The bottom band (a parameter, live from its allocation to the end) spans the right half.
    let pos = egui::pos2(plot.left() + plot.width() * 0.75, plot.bottom() - 2.0);
    h.hover_at(pos);
    h.run();
    assert!(matches!(
        h.state()
            .active_document()
            .expect("open")
            .state()
            .selection
            .hovered,
        Some(memsnap_analysis::Hit::Band(_))
    ));
    h.get_by_label("Allocation");
    h.event(egui::Event::PointerButton {
        pos,
        button: egui::PointerButton::Primary,
        pressed: true,
        modifiers: egui::Modifiers::NONE,
    });
    h.event(egui::Event::PointerButton {
        pos,
        button: egui::PointerButton::Primary,
        pressed: false,
        modifiers: egui::Modifiers::NONE,
    });
    h.run();
    let selection = &h.state().active_document().expect("open").state().selection;
    assert!(selection.pinned.is_some());
    assert!(
        selection.cursor.is_some(),
        "the click also moves the instant cursor"
    );
    h.get_by_label("Pinned allocation");
    h.get_by_role_and_label(Role::Button, "Copy");
    // The details name the allocation's site, category and phase: this band is a parameter
    // made in the set-up.
    for label in ["site", "category", "parameter", "allocated in"] {
        assert!(h.query_all_by_label(label).count() >= 1, "{label}");
    }
    // The SVG export draws the same picture.
    let svg = h
        .state()
        .active_document()
        .expect("open")
        .timeline_svg()
        .expect("drawn");
    assert!(svg.starts_with("<svg") && svg.contains("<rect") && svg.contains("<polyline"));
    h.key_press(egui::Key::Escape);
    h.run();
    assert!(h
        .state()
        .active_document()
        .expect("open")
        .state()
        .selection
        .pinned
        .is_none());
}

#[test]
fn a_leaking_run_is_flagged() {
    let h = loaded_app(
        &[("leaky.pickle", training_pickle(5, 8 << 20))],
        Settings::default(),
    );
    h.get_by_label_contains("Leak suspected");
    // And the code that keeps the memory.
    h.get_by_label_contains("Kept every step: metrics.py:33:record keeps 8.0 MiB per step");
}

/// The step table's change column once counted from after a step's first event, so a step
/// whose first event allocates its batch showed the batch as freed, and a leaking step as
/// shrinking (-11.9 MiB a step where the run kept 64 KiB a step), never flagged.
#[test]
fn a_steps_change_is_what_it_keeps_though_its_first_event_allocates_the_batch() {
    const LEAK: u64 = 8 << 20;
    let h = loaded_app(
        &[("leaky.pickle", training_pickle(5, LEAK))],
        Settings::default(),
    );
    let steps = h.state().active_document().expect("open").device().steps();
    let step = &steps.steps[2];
    assert!(
        step.start_bytes > step.before_bytes,
        "the step's first event allocates"
    );
    assert_eq!(step.kept_bytes(), LEAK as i64);
    // Steps after the warm-up keep the leak, and their rows say so, in the warning colour.
    let rows = h.get_all_by_label("+8.0 MiB").count();
    assert!(rows >= 3, "{rows} rows show the leak as the change");
}

#[test]
fn searching_keeps_only_matching_stacks() {
    let mut h = loaded_app(
        &[("run.pickle", training_pickle(6, 0))],
        Settings::default(),
    );
    let search = h.get_by_role(Role::TextInput);
    search.focus();
    search.type_text("no_such_function_anywhere");
    h.run();
    h.get_by_label("0 matching stacks");
}

#[test]
fn keyboard_zoom_and_reset() {
    let mut h = loaded_app(
        &[("run.pickle", training_pickle(7, 0))],
        Settings::default(),
    );
    h.key_press(egui::Key::Plus);
    h.run();
    assert!(h
        .state()
        .active_document()
        .expect("open")
        .state()
        .timeline
        .window
        .is_zoomed());
    h.key_press(egui::Key::Num0);
    h.run();
    assert!(!h
        .state()
        .active_document()
        .expect("open")
        .state()
        .timeline
        .window
        .is_zoomed());
    h.key_press(egui::Key::F1);
    h.run();
    h.get_by_label_contains("Zoom to the next training step");
}

#[test]
fn two_files_become_ranks_and_can_be_diffed() {
    let mut h = loaded_app(
        &[
            ("rank0.pickle", training_pickle(8, 0)),
            ("rank1.pickle", training_pickle(9, 2 << 20)),
        ],
        Settings::default(),
    );
    h.get_by_role_and_label(Role::Button, "Ranks").click();
    h.run();
    h.get_by_label_contains("Totals of 2 ranks overlaid");
    h.get_by_role_and_label(Role::Button, "Diff").click();
    h.run();
    h.get_by_label_contains("Total memory of rank0.pickle");
    h.get_by_label_contains("Total memory of rank1.pickle");
}

#[test]
fn files_from_the_command_line_open_and_enter_the_recent_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cli.pickle");
    std::fs::write(&path, training_pickle(10, 0)).expect("write");
    let mut app = ViewerApp::new(Settings::default());
    app.open(Source::Path(path.clone()));
    app.finish_loading();
    assert_eq!(app.documents.len(), 1);
    assert_eq!(app.documents[0].doc.path.as_deref(), Some(path.as_path()));
    let canonical = std::fs::canonicalize(&path).expect("canonical");
    assert_eq!(app.settings.recent_files.first(), Some(&canonical));
}

#[test]
fn phases_are_shaded_and_listed_in_the_step_table() {
    let mut h = loaded_app(
        &[("run.pickle", training_pickle(17, 0))],
        Settings::default(),
    );
    let doc = h.state().active_document().expect("open");
    let steps = doc.device().steps().clone();
    assert!(steps.steps.len() >= 3, "{}", steps.steps.len());
    // Every phase in view is shaded behind the bands, in its kind's tint.
    let shading = doc
        .state()
        .timeline
        .last_phase_shading()
        .expect("drawn")
        .to_vec();
    assert_eq!(shading.len(), steps.phases().count());
    for kind in [
        PhaseKind::Forward,
        PhaseKind::Backward,
        PhaseKind::Optimizer,
    ] {
        let tint = palette::phase_shade(kind, true);
        assert!(shading.iter().any(|(_, c)| *c == tint), "{kind} shaded");
        // The legend names each phase kind present.
        h.get_by_role_and_label(Role::Label, memsnap_viewer::steps_ui::phase_label(kind));
    }
    // The table lists the set-up, then the steps, with the method that found them.
    h.get_by_label("from the allocation stacks");
    h.get_by_role_and_label(Role::Button, "set-up");
    assert!(h.query_by_role_and_label(Role::Button, "forward").is_none());
    // Selecting a step lists its phases under it.
    h.get_by_label("step 1").click();
    h.run();
    for kind in ["forward", "backward", "optimizer"] {
        h.get_by_role_and_label(Role::Button, kind);
    }
    // Clicking a phase zooms the timeline to it.
    let phase = steps.steps[1]
        .phases
        .iter()
        .find(|p| p.kind == PhaseKind::Backward)
        .expect("step 1 has a backward phase")
        .clone();
    h.get_by_role_and_label(Role::Button, "backward").click();
    h.run();
    let doc = h.state().active_document().expect("open");
    let window = doc.state().timeline.window;
    let span = f64::from(phase.end_event - phase.start_event + 1);
    assert!(window.is_zoomed());
    assert!(
        window.start <= f64::from(phase.start_event) && window.end >= f64::from(phase.end_event)
    );
    assert!(
        window.span() < 1.5 * span.max(2.0),
        "{window:?} vs {phase:?}"
    );
    assert_eq!(doc.state().steps.selected, Some(1));
    // The header button lists every step's phases, and hides them again.
    h.get_by_role_and_label(Role::Button, "show all phases")
        .click();
    h.run();
    assert!(
        h.query_all_by_role_and_label(Role::Button, "forward")
            .count()
            >= 2
    );
    h.get_by_role_and_label(Role::Button, "hide phases").click();
    h.run();
    assert!(h.query_by_role_and_label(Role::Button, "forward").is_none());
}

#[test]
fn a_warm_up_step_is_labelled_warm_up_not_a_leak() {
    let h = loaded_app(
        &[("run.pickle", training_pickle(18, 0))],
        Settings::default(),
    );
    let steps = &h.state().active_document().expect("open").device().steps();
    let warmup = steps
        .steps
        .iter()
        .find(|s| s.warmup)
        .expect("the first optimizer step creates Adam's state");
    let text = format!(
        "warm-up: creates {} optimizer state",
        memsnap_viewer::units::format_size(warmup.optimizer_state_bytes)
    );
    h.get_by_label_contains(&text);
    assert!(h.query_by_label_contains("Leak suspected").is_none());
}

#[test]
fn the_colour_toggle_and_its_shortcut_recolour_the_bands() {
    let mut h = loaded_app(
        &[("run.pickle", training_pickle(19, 0))],
        Settings::default(),
    );
    let band_colours = |h: &Harness<'_, ViewerApp>| -> HashSet<palette::Colour> {
        let doc = h.state().active_document().expect("open");
        let drawing = doc.state().timeline.last_band_drawing().expect("drawn");
        drawing.rects.iter().map(|(_, c)| *c).collect()
    };
    let by_site = band_colours(&h);
    h.get_by_label("allocations (colour = user-code site)");
    h.get_by_role_and_label(Role::Button, "category").click();
    h.run();
    assert_eq!(timeline_state(&h).color_mode, ColourBy::Category);
    let by_category = band_colours(&h);
    assert_ne!(by_site, by_category);
    let category_colours: HashSet<_> = Category::ALL
        .iter()
        .map(|&c| palette::category_colour(c))
        .collect();
    let special = [palette::residual(true), palette::envelope(true)];
    assert!(by_category
        .iter()
        .all(|c| category_colours.contains(c) || special.contains(c)));
    // The legend lists the categories.
    h.get_by_label("optimizer state");
    h.get_by_label("activation");
    // C cycles on to phase colouring, and round to site.
    h.key_press(egui::Key::C);
    h.run();
    assert_eq!(timeline_state(&h).color_mode, ColourBy::Phase);
    let phase_colours: HashSet<_> = [
        PhaseKind::Forward,
        PhaseKind::Backward,
        PhaseKind::Optimizer,
    ]
    .iter()
    .map(|&k| palette::phase_colour(k))
    .collect();
    let by_phase = band_colours(&h);
    assert!(phase_colours.is_subset(&by_phase), "{by_phase:?}");
    // Then module colouring: each band the colour of its module path, grey outside every
    // module (the optimizer's and the parameters' allocations).
    h.key_press(egui::Key::C);
    h.run();
    assert_eq!(timeline_state(&h).color_mode, ColourBy::Module);
    h.get_by_label("allocations (colour = module path)");
    let by_module = band_colours(&h);
    assert!(by_module.contains(&palette::NO_SITE), "{by_module:?}");
    assert!(by_module.len() >= 3, "{by_module:?}");
    assert_ne!(by_module, by_site);
    h.key_press(egui::Key::C);
    h.run();
    assert_eq!(timeline_state(&h).color_mode, ColourBy::Site);
    assert_eq!(band_colours(&h), by_site);
    // The help lists the shortcut.
    h.key_press(egui::Key::F1);
    h.run();
    h.get_by_label_contains("Colour bands by user-code site, category, phase or module");
}

fn timeline_state<'h>(
    h: &'h Harness<'_, ViewerApp>,
) -> &'h memsnap_viewer::timeline::TimelineState {
    &h.state().active_document().expect("open").state().timeline
}

/// A real snapshot from `MEMSNAP_REAL_SNAPSHOTS`, or `None` (the test is skipped) when unset.
fn real_snapshot(name: &str) -> Option<Vec<u8>> {
    let Some(dir) = std::env::var_os("MEMSNAP_REAL_SNAPSHOTS") else {
        eprintln!("MEMSNAP_REAL_SNAPSHOTS is not set: skipping {name}");
        return None;
    };
    Some(std::fs::read(Path::new(&dir).join(name)).expect("read the real snapshot"))
}

#[test]
fn a_real_training_run_lists_ten_steps_with_their_phases() {
    let Some(bytes) = real_snapshot("11_jaspersolt_snapshot_actions.pickle") else {
        return;
    };
    let h = loaded_app(&[("jaspersolt.pickle", bytes)], Settings::default());
    h.get_by_label("Training steps: 10");
    h.get_by_label("from the allocation stacks");
    let steps = &h.state().active_document().expect("open").device().steps();
    // Whole steps run forward, backward, optimizer; the shading covers every phase.
    for step in steps.steps.iter().filter(|s| !s.partial) {
        let kinds: Vec<PhaseKind> = step.phases.iter().map(|p| p.kind).collect();
        assert_eq!(
            kinds,
            [
                PhaseKind::Forward,
                PhaseKind::Backward,
                PhaseKind::Optimizer
            ],
            "step {}",
            step.index
        );
    }
    let shading = timeline_state(&h).last_phase_shading().expect("drawn");
    assert_eq!(shading.len(), steps.phases().count());
    for kind in [
        PhaseKind::Forward,
        PhaseKind::Backward,
        PhaseKind::Optimizer,
    ] {
        h.get_by_role_and_label(Role::Label, memsnap_viewer::steps_ui::phase_label(kind));
    }
}

#[test]
fn a_real_warm_up_step_is_labelled() {
    let Some(bytes) = real_snapshot("13_bcrafton_new_cpp_frames_annotations.pickle") else {
        return;
    };
    let h = loaded_app(&[("bcrafton.pickle", bytes)], Settings::default());
    h.get_by_label_contains("warm-up: creates");
}

/// An import whose source does not record a quantity: the details panel says it is unknown
/// (the memory timeline: reserved; rocprofv3: allocated) instead of showing 0 B or a copy of
/// reserved.
#[test]
fn the_details_say_unknown_for_what_an_import_does_not_record() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/gpu_h200_torch2.11/memory_timeline.raw.json.gz");
    let mut files = vec![(
        "memory_timeline.raw.json.gz",
        std::fs::read(fixture).expect("fixture"),
        "unknown: the source records no reserved memory",
    )];
    match std::env::var_os("MEMSNAP_REAL_TRACES") {
        Some(dir) => files.push((
            "memory_allocation_trace.csv",
            std::fs::read(
                Path::new(&dir).join("rocprofv3_docs_2025-08_memory_allocation_trace.csv"),
            )
            .expect("real trace"),
            "unknown: the source records the driver's allocations only (reserved)",
        )),
        None => eprintln!("MEMSNAP_REAL_TRACES is not set: checking the memory timeline only"),
    }
    for (name, bytes, unknown) in files {
        let h = loaded_app(&[(name, bytes)], Settings::default());
        assert!(
            h.state().notices.is_empty(),
            "{name}: {:?}",
            h.state().notices
        );
        h.get_by_label(unknown);
    }
}

/// A torch.profiler trace (the GPU fixture: 2 profiled steps of a GPT on an H200) shows the
/// profiler's own peak, `torch.cuda.max_memory_allocated()` over the profile, at its event,
/// with the memory from before the profile counted in.
#[test]
fn an_imported_profiler_trace_shows_the_profilers_peak() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/gpu_h200_torch2.11/profiler.pt.trace.json.gz");
    let bytes = std::fs::read(fixture).expect("fixture");
    let h = loaded_app(&[("profiler.pt.trace.json.gz", bytes)], Settings::default());
    assert!(h.state().notices.is_empty(), "{:?}", h.state().notices);
    let document = h.state().active_document().expect("open");
    let timeline = &document.device().timeline;
    let peak = timeline.peak(memsnap_analysis::CurveKind::Allocated);
    assert_eq!(peak.bytes, 8_593_483_264);
    assert!(timeline.replay().before_window_bytes > 0);
    h.get_by_label(&format!(
        "{} at event {}",
        memsnap_units::format_size(peak.bytes),
        peak.event
    ));
}

/// A run recorded by memsnap's allocator whose fragmentation `expandable_segments:True`
/// removes: growing activations, each freed before the next, a small tensor kept after each.
fn fragmenting_pickle() -> Vec<u8> {
    use memsnap_recorder::{CachingAllocator, HistoryOptions, SimulatedDevice, Stream};
    const MIB: u64 = 1 << 20;
    let alloc = CachingAllocator::new(SimulatedDevice::new(80 << 30));
    alloc.record_memory_history(HistoryOptions::default());
    let mut keep = Vec::new();
    for i in 0..16u64 {
        let big = alloc
            .malloc((40 + 6 * i) * MIB, Stream::DEFAULT)
            .expect("malloc");
        keep.push(alloc.malloc(3 * MIB, Stream::DEFAULT).expect("malloc"));
        alloc.free(big).expect("free");
    }
    memsnap_format::io::encode(&alloc.snapshot(), Format::Pickle).expect("encode")
}

fn allocator_state<'h>(
    h: &'h Harness<'_, ViewerApp>,
) -> &'h memsnap_viewer::allocator_ui::AllocatorState {
    &h.state().active_document().expect("open").state().allocator
}

/// Steps frames until the Allocator view's worker is done.
fn run_until_simulated(h: &mut Harness<'_, ViewerApp>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    h.step();
    while allocator_state(h).is_running() {
        assert!(Instant::now() < deadline, "the simulation did not finish");
        std::thread::sleep(Duration::from_millis(5));
        h.step();
    }
    h.run_steps(3);
}

#[test]
fn the_allocator_view_simulates_expandable_segments_and_suggests() {
    let mut h = loaded_app(
        &[("fragmenting.pickle", fragmenting_pickle())],
        Settings::default(),
    );
    h.get_by_role_and_label(Role::Button, "Allocator").click();
    h.run_steps(2);
    // The file's own settings (PyTorch's defaults here) replay first, on the worker.
    run_until_simulated(&mut h);
    let recorded_peak = {
        let run = allocator_state(&h).run.as_ref().expect("simulated");
        assert_eq!(run.alloc_conf, "");
        assert_eq!(
            run.simulated.reserved_peak_bytes,
            run.baseline.recorded.reserved_peak_bytes
        );
        run.baseline.recorded.reserved_peak_bytes
    };
    h.get_by_label_contains("Fidelity with the file's own settings: all ");
    h.get_by_label_contains("Reserved memory, recorded (peak");

    let field = h.get_by_label("PYTORCH_CUDA_ALLOC_CONF");
    field.focus();
    field.type_text("expandable_segments:True");
    h.run_steps(2);
    h.get_by_role_and_label(Role::Button, "Simulate").click();
    run_until_simulated(&mut h);
    let run = allocator_state(&h).run.as_ref().expect("simulated");
    assert_eq!(run.alloc_conf, "expandable_segments:True");
    let simulated_peak = run.simulated.reserved_peak_bytes;
    assert!(
        simulated_peak < recorded_peak,
        "{simulated_peak} vs {recorded_peak}"
    );
    h.get_by_label(&format!(
        "Simulated reserved peak {} vs {} recorded (-{:.1}%)",
        memsnap_viewer::units::format_size(simulated_peak),
        memsnap_viewer::units::format_size(recorded_peak),
        (recorded_peak - simulated_peak) as f64 / recorded_peak as f64 * 100.0
    ));

    // Suggest ranks the common settings; clicking one simulates it.
    h.get_by_role_and_label(Role::Button, "Suggest").click();
    run_until_simulated(&mut h);
    let best = allocator_state(&h)
        .suggestions
        .as_ref()
        .expect("suggestions")
        .candidates[0]
        .clone();
    assert!(best.change.contains("expandable_segments:True"), "{best:?}");
    h.get_by_label_contains("would have cut the reserved peak");
    h.get_by_label("max_split_size_mb:128").click();
    run_until_simulated(&mut h);
    let run = allocator_state(&h).run.as_ref().expect("simulated");
    assert_eq!(run.alloc_conf, "max_split_size_mb:128");
    assert_eq!(
        allocator_state(&h).conf.as_deref(),
        Some("max_split_size_mb:128")
    );
}

#[test]
fn a_real_oom_shows_on_the_allocator_view() {
    let Some(bytes) = real_snapshot("14_constructorsun_expandable_oom_4dev.pickle") else {
        return;
    };
    let mut h = loaded_app(&[("oom.pickle", bytes)], Settings::default());
    h.state_mut().view = MainView::Allocator;
    if let Some(doc) = h.state_mut().active_document_mut() {
        doc.device_index = doc
            .doc
            .devices
            .iter()
            .position(|d| d.device == 1)
            .expect("device 1");
    }
    h.run_steps(2);
    run_until_simulated(&mut h);
    let run = allocator_state(&h).run.as_ref().expect("simulated");
    assert_eq!(run.simulated.device, 1);
    assert_eq!(run.baseline.recorded.oom_event, Some(421));
    assert_eq!(run.simulated.oom.as_ref().map(|o| o.event), Some(421));
    assert!(run.baseline.fidelity.exact());
    h.get_by_label_contains(
        "Fidelity with the file's own settings: all 46 segment decisions reproduced",
    );
}

// ---- image snapshots -----------------------------------------------------------------

fn snapshot_app(files: &[(&str, Vec<u8>)], theme: ThemeChoice) -> Harness<'static, ViewerApp> {
    let mut h = loaded_app(
        files,
        Settings {
            theme,
            ..Settings::default()
        },
    );
    // Move the pointer away so no hover card is in the picture.
    h.remove_cursor();
    h.run();
    h
}

#[test]
fn snapshot_timeline_dark() {
    let mut h = snapshot_app(
        &[("run.pickle", training_pickle(11, 1 << 20))],
        ThemeChoice::Dark,
    );
    h.snapshot("timeline_dark");
}

#[test]
fn snapshot_timeline_light_filtered() {
    let mut h = snapshot_app(
        &[("truncated.pickle", truncated_pickle())],
        ThemeChoice::Light,
    );
    h.get_by_label_contains("before the recording");
    h.get_by_role(Role::Slider).set_value_accesskit(20.0);
    h.run();
    h.snapshot("timeline_light_filtered");
}

#[test]
fn snapshot_at_an_instant() {
    let mut h = snapshot_app(&[("run.pickle", training_pickle(12, 0))], ThemeChoice::Dark);
    h.state_mut().view = MainView::Instant;
    h.run();
    h.snapshot("at_an_instant");
}

#[test]
fn snapshot_ranks() {
    let mut h = snapshot_app(
        &[
            ("rank0.pickle", training_pickle(13, 0)),
            ("rank1.pickle", training_pickle(14, 0)),
        ],
        ThemeChoice::Dark,
    );
    h.state_mut().view = MainView::Ranks;
    h.run();
    h.snapshot("ranks");
}

// ---- the Advise view ----------------------------------------------------------------

fn advise_state<'h>(h: &'h Harness<'_, ViewerApp>) -> &'h memsnap_viewer::advise_ui::AdviseState {
    &h.state().active_document().expect("open").state().advise
}

/// Steps frames until the Advise view's worker is done.
fn run_until_advised(h: &mut Harness<'_, ViewerApp>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    h.step();
    while advise_state(h).is_running() {
        assert!(Instant::now() < deadline, "the advice did not finish");
        std::thread::sleep(Duration::from_millis(5));
        h.step();
    }
    h.run_steps(3);
}

/// A training run with a forward and a backward per step, big activations and module
/// frames, so that checkpointing and micro-batches both have something to edit.
fn advisable_run() -> TrainingRun {
    TrainingRun {
        steps: 3,
        layers: 4,
        activations_per_layer: 4,
        activation_bytes: 8 << 20,
        param_bytes_per_layer: 4 << 20,
        ordered_forward_stacks: true,
        ..TrainingRun::default()
    }
}

/// `advise`'s answer for `snapshot` (no budget) and the place in its ranking of the first fix
/// `wanted` picks: what the view must show at the same place.
fn advised_fix(
    snapshot: &memsnap_format::Snapshot,
    wanted: impl Fn(&memsnap_advise::Prediction) -> bool,
) -> (memsnap_advise::Advice, usize) {
    let advice =
        memsnap_advise::advise(snapshot, &memsnap_advise::Options::default()).expect("advice");
    let found = advice.predictions.iter().position(wanted);
    let i = found.unwrap_or_else(|| panic!("no such fix in {:#?}", advice.predictions));
    (advice, i)
}

fn open_advise_from_the_view_menu(h: &mut Harness<'_, ViewerApp>) {
    h.get_by_label("View").click();
    h.run_steps(2);
    h.get_by_label("Advise").click();
    h.run_steps(2);
    assert_eq!(h.state().view, MainView::Advise);
}

#[test]
fn advise_ranks_fixes_for_a_typed_budget_with_the_advisors_peaks() {
    let (snapshot, _) = generate(&advisable_run());
    let unbudgeted =
        memsnap_advise::advise(&snapshot, &memsnap_advise::Options::default()).expect("advice");
    // A budget the recorded run does not fit: 80 % of its replayed reserved peak.
    let budget = unbudgeted.baseline.reserved_peak_bytes / 10 * 8;
    let direct = memsnap_advise::advise(
        &snapshot,
        &memsnap_advise::Options {
            budget: Some(budget),
            ..memsnap_advise::Options::default()
        },
    )
    .expect("advice");
    assert_eq!(direct.baseline.fits, Some(false));
    let best = direct.predictions[0].clone();
    assert_eq!(best.fits, Some(true), "{:#?}", direct.predictions);

    let bytes = memsnap_format::io::encode(&snapshot, Format::Pickle).expect("encode");
    let mut h = loaded_app(&[("run.pickle", bytes)], Settings::default());
    open_advise_from_the_view_menu(&mut h);
    // No OOM entry: the file does not state the device's memory, so no default budget.
    assert_eq!(advise_state(&h).budget.as_deref(), Some(""));
    h.get_by_label_contains("No advice yet");
    let field = h.get_by_label("budget");
    field.focus();
    field.type_text(&budget.to_string());
    h.run_steps(2);
    h.get_by_role_and_label(Role::Button, "Run").click();
    run_until_advised(&mut h);

    let advice = advise_state(&h).advice.as_ref().expect("advice");
    assert_eq!(advice.budget_bytes, Some(budget));
    let shown = &advice.predictions[0];
    assert_eq!(shown.description, best.description);
    assert_eq!(
        (
            shown.allocated_peak_bytes,
            shown.reserved_peak_bytes,
            shown.fits
        ),
        (
            best.allocated_peak_bytes,
            best.reserved_peak_bytes,
            Some(true)
        )
    );
    assert!(advice.baseline.fits == Some(false));
    h.get_by_label_contains("As recorded (replayed): allocated peak");
    h.get_by_label_contains(", does not fit");
    assert!(h.query_all_by_label("yes").count() >= 1);
    // Selecting the best fix shows its predicted peaks against the recorded ones.
    h.get_by_label(&best.description).click();
    h.run_steps(3);
    assert_eq!(advise_state(&h).selected, Some(0));
    h.get_by_label("Fix 1");
    h.get_by_label_contains(&format!(
        "Predicted reserved peak {} vs {} recorded",
        memsnap_viewer::units::format_size(best.reserved_peak_bytes),
        memsnap_viewer::units::format_size(direct.baseline.reserved_peak_bytes),
    ));
    h.get_by_label_contains(&format!(
        "Fits the budget of {}",
        memsnap_viewer::units::format_size(budget)
    ));
    // Each checkpointing fix names the module it touches.
    let (i, module) = direct
        .predictions
        .iter()
        .enumerate()
        .find_map(|(i, p)| {
            p.fixes.iter().find_map(|f| match f {
                memsnap_advise::Fix::Checkpoint { module, .. } => Some((i, module.clone())),
                _ => None,
            })
        })
        .expect("a checkpointing fix");
    h.get_by_label(&direct.predictions[i].description).click();
    h.run_steps(3);
    assert_eq!(advise_state(&h).selected, Some(i));
    h.get_by_label_contains(&format!("Modules touched: {module}"));
    // The module list marks it, in the list and in the details.
    assert_eq!(
        h.query_all_by_label(&format!("{module}  (checkpointed by the fix)"))
            .count(),
        2
    );
}

/// A run recorded with module names: the Advise view offers the blocks by name, says which it
/// touches (`blocks.0 to blocks.1`), and marks them in the module list: the pattern and the
/// blocks in the range, not the ones outside it.
#[test]
fn advise_names_the_blocks_of_a_run_with_module_names_and_marks_those_a_fix_touches() {
    let run = TrainingRun {
        module_ranges: true,
        ordered_forward_stacks: false,
        ..advisable_run()
    };
    let (snapshot, _) = generate(&run);
    let (direct, i) = advised_fix(&snapshot, |p| {
        p.description.contains("blocks.0 to blocks.1 (blocks.*)")
    });
    let fix = &direct.predictions[i];
    let bytes = memsnap_format::io::encode(&snapshot, Format::Pickle).expect("encode");
    let mut h = loaded_app(&[("run.pickle", bytes)], Settings::default());
    open_advise_from_the_view_menu(&mut h);
    h.get_by_role_and_label(Role::Button, "Run").click();
    run_until_advised(&mut h);
    h.get_by_label(&fix.description).click();
    h.run_steps(3);
    assert_eq!(advise_state(&h).selected, Some(i));
    h.get_by_label("Modules touched: blocks.0 to blocks.1");
    assert!(
        h.query_all_by_label("* stands for a number: blocks.* is every blocks.N")
            .count()
            >= 1
    );
    let marked = |label: &str| {
        h.query_all_by_label(&format!("{label}  (checkpointed by the fix)"))
            .count()
    };
    let listed: Vec<&str> = direct
        .modules
        .iter()
        .take(8)
        .map(|m| m.module.as_str())
        .collect();
    assert!(
        listed.contains(&"blocks.1") && listed.contains(&"blocks.2"),
        "{listed:?}"
    );
    for module in listed {
        let expected = match module {
            "blocks.*" | "blocks.0" | "blocks.1" => 2,
            _ => 0,
        };
        assert_eq!(marked(module), expected, "{module}");
    }
}

/// Steps frames until the selected fix's overlay replay is done.
fn run_until_overlaid(h: &mut Harness<'_, ViewerApp>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    h.step();
    while advise_state(h).overlay_is_running() {
        assert!(Instant::now() < deadline, "the overlay did not finish");
        std::thread::sleep(Duration::from_millis(5));
        h.step();
    }
    h.run_steps(3);
}

#[test]
fn selecting_a_fix_draws_its_predicted_run_on_the_timeline_and_deselecting_removes_it() {
    let (snapshot, _) = generate(&advisable_run());
    let (direct, i) = advised_fix(&snapshot, |p| {
        matches!(p.fixes[..], [memsnap_advise::Fix::Checkpoint { .. }])
    });
    let fix = &direct.predictions[i];
    let legend = format!("predicted: {}", fix.description);
    let bytes = memsnap_format::io::encode(&snapshot, Format::Pickle).expect("encode");
    let mut h = loaded_app(&[("run.pickle", bytes)], Settings::default());
    assert!(h.query_by_label(&legend).is_none());
    open_advise_from_the_view_menu(&mut h);
    h.get_by_role_and_label(Role::Button, "Run").click();
    run_until_advised(&mut h);
    h.get_by_label(&fix.description).click();
    run_until_overlaid(&mut h);
    assert_eq!(advise_state(&h).selected, Some(i));
    let overlay = advise_state(&h).overlay().expect("replayed").clone();
    // Its curve on the recorded axis peaks where the prediction says.
    assert_eq!(
        overlay.max_in(0, overlay.len()),
        Some((fix.allocated_peak_bytes, fix.reserved_peak_bytes))
    );
    assert!(
        overlay.touched_count > 0,
        "the checkpointed module's allocations"
    );
    h.get_by_label_contains("The Timeline draws the predicted run");

    // On the timeline: the legend names the fix, and marks what it checkpoints.
    h.state_mut().view = MainView::Timeline;
    h.run_steps(3);
    h.get_by_label(&legend);
    h.get_by_label("checkpointed by the fix");
    assert!(timeline_state(&h).predicted.is_some());

    // Deselecting the fix (a second click) removes both.
    h.state_mut().view = MainView::Advise;
    h.run_steps(3);
    // The list's entry (the details repeat the description as a label).
    h.get_by_role_and_label(Role::Button, &fix.description)
        .click();
    h.run_steps(3);
    assert_eq!(advise_state(&h).selected, None);
    assert!(advise_state(&h).overlay().is_none());
    h.state_mut().view = MainView::Timeline;
    h.run_steps(3);
    assert!(h.query_by_label(&legend).is_none());
    assert!(h.query_by_label("checkpointed by the fix").is_none());
    assert!(timeline_state(&h).predicted.is_none());
}

#[test]
fn the_instant_page_shows_the_live_set_as_a_module_tree() {
    let (snapshot, _) = generate(&advisable_run());
    let timeline = memsnap_analysis::DeviceTimeline::build(&snapshot, 0).expect("timeline");
    let peak = timeline.resolve(memsnap_analysis::Instant::Peak);
    let tree = memsnap_analysis::modules::module_tree_at(
        &snapshot,
        &timeline,
        peak,
        memsnap_analysis::Lifetime::Active,
        0,
    );
    let row = |n: &memsnap_analysis::modules::ModuleNode| {
        format!(
            "{}  {}  (",
            memsnap_viewer::units::format_size(n.bytes),
            n.label
        )
    };
    let blocks = tree
        .iter()
        .find(|n| n.label == "model.py:212")
        .expect("the model's loop over its blocks");
    let inner = &blocks.children[0];
    let bytes = memsnap_format::io::encode(&snapshot, Format::Pickle).expect("encode");
    let mut h = loaded_app(&[("run.pickle", bytes)], Settings::default());
    h.state_mut().view = MainView::Instant;
    h.run();
    h.get_by_label("module tree").click();
    h.run();
    // Largest first; the calls inside a module show once it is expanded.
    for n in &tree {
        h.get_by_label_contains(&row(n));
    }
    assert!(h.query_by_label_contains(&row(inner)).is_none());
    h.get_by_label_contains(&row(blocks)).click();
    h.run();
    h.get_by_label_contains(&row(inner));
}

#[test]
fn an_oom_run_is_advised_on_the_devices_memory_by_default() {
    const DEVICE: u64 = 1 << 30;
    let (snapshot, truth) = generate(&TrainingRun {
        device_memory: DEVICE,
        activation_bytes: 24 << 20,
        param_bytes_per_layer: 16 << 20,
        layers: 6,
        activations_per_layer: 8,
        ..advisable_run()
    });
    assert!(truth.devices[0].oom.is_some(), "the run outgrows 1 GiB");
    // The device memory the file implies, as `memsnap simulate` reads it from the OOM entry.
    let capacity = memsnap_simulate::simulate(&snapshot, &memsnap_simulate::Options::default())
        .expect("simulate")
        .devices[0]
        .capacity_bytes;
    let bytes = memsnap_format::io::encode(&snapshot, Format::Pickle).expect("encode");
    let mut h = loaded_app(&[("oom.pickle", bytes)], Settings::default());
    h.state_mut().view = MainView::Advise;
    h.run_steps(2);
    let field = advise_state(&h).budget.clone().expect("shown");
    assert_eq!(
        memsnap_viewer::advise::parse_budget(&field).expect("parses"),
        Some(capacity)
    );
    h.get_by_role_and_label(Role::Button, "Run").click();
    run_until_advised(&mut h);
    let direct = memsnap_advise::advise(
        &snapshot,
        &memsnap_advise::Options {
            budget: Some(capacity),
            ..memsnap_advise::Options::default()
        },
    )
    .expect("advice");
    let advice = advise_state(&h).advice.as_ref().expect("advice");
    assert!(advice.completion.is_some());
    let peaks = |a: &memsnap_advise::Advice| -> Vec<(String, u64, u64, Option<bool>)> {
        a.predictions
            .iter()
            .map(|p| {
                (
                    p.description.clone(),
                    p.allocated_peak_bytes,
                    p.reserved_peak_bytes,
                    p.fits,
                )
            })
            .collect()
    };
    assert_eq!(peaks(advice), peaks(&direct));
    assert!(direct.predictions.iter().any(|p| p.fits == Some(true)));
    h.get_by_label_contains("ran out of memory (event");
    h.get_by_label_contains("Completed run (replayed)");
}

#[test]
fn an_unparsable_budget_is_an_error_and_starts_nothing() {
    let (snapshot, _) = generate(&advisable_run());
    let bytes = memsnap_format::io::encode(&snapshot, Format::Pickle).expect("encode");
    let mut h = loaded_app(&[("run.pickle", bytes)], Settings::default());
    h.state_mut().view = MainView::Advise;
    h.run_steps(2);
    let field = h.get_by_label("budget");
    field.focus();
    field.type_text("lots");
    h.run_steps(2);
    h.get_by_role_and_label(Role::Button, "Run").click();
    h.run_steps(2);
    assert!(!advise_state(&h).is_running());
    assert!(advise_state(&h).advice.is_none());
    h.get_by_label_contains("Error: `lots` is not a memory budget");
}

#[test]
fn advising_a_file_without_a_trace_shows_the_advisors_error() {
    let mut s = memsnap_format::Snapshot::new(1);
    s.segments
        .push(memsnap_format::Segment::new(0, 0x1000, 2 << 20, 0));
    let expected = memsnap_advise::advise(
        &s,
        &memsnap_advise::Options {
            budget: None,
            device: Some(0),
            ..memsnap_advise::Options::default()
        },
    )
    .expect_err("no trace")
    .to_string();
    let bytes = memsnap_format::io::encode(&s, Format::Pickle).expect("encode");
    let mut h = loaded_app(&[("no_trace.pickle", bytes)], Settings::default());
    h.state_mut().view = MainView::Advise;
    h.run_steps(2);
    h.get_by_role_and_label(Role::Button, "Run").click();
    run_until_advised(&mut h);
    assert!(advise_state(&h).advice.is_none());
    assert!(advise_state(&h).error.is_some());
    h.get_by_label(&format!("Error: {expected}"));
}

/// A host allocator recording its history (what a program serving it live records).
fn live_recorder() -> Arc<memsnap_recorder::CachingAllocator<memsnap_recorder::HostDevice>> {
    let alloc = Arc::new(memsnap_recorder::CachingAllocator::new(
        memsnap_recorder::HostDevice::new(1 << 30),
    ));
    alloc.record_memory_history(memsnap_recorder::HistoryOptions {
        max_entries: usize::MAX,
        stacks: memsnap_recorder::StackMode::None,
        ..memsnap_recorder::HistoryOptions::default()
    });
    // A manual clock: the durations and rates in the picture are the same in every run.
    alloc.use_manual_clock(1_700_000_000_000_000);
    alloc
}

/// `steps` training steps: activations made in the forward pass and freed in the backward
/// pass (which makes a gradient buffer for each), and 1 MiB kept by the optimizer each step (a leak), each with its own stack.
fn record_steps(
    alloc: &memsnap_recorder::CachingAllocator<memsnap_recorder::HostDevice>,
    steps: usize,
) {
    use memsnap_format::Frame;
    use memsnap_recorder::Stream;
    let stack = |name: &str, line| {
        alloc
            .register_stack(&[
                Frame::new(name, "model.py", line),
                Frame::new("train", "train.py", 3),
            ])
            .unwrap()
    };
    let (fwd, bwd, opt) = (
        stack("forward", 10),
        stack("backward", 20),
        stack("optimizer_step", 30),
    );
    let tick = || alloc.advance_clock(Duration::from_micros(250));
    for _ in 0..steps {
        let acts: Vec<u64> = (0..12u64)
            .map(|i| {
                tick();
                alloc
                    .malloc_with_stack((1 + i % 4) << 20, Stream::DEFAULT, fwd)
                    .unwrap()
            })
            .collect();
        for p in acts.into_iter().rev() {
            tick();
            let grad = alloc
                .malloc_with_stack(512 << 10, Stream::DEFAULT, bwd)
                .unwrap();
            alloc.free_with_stack(p, bwd).unwrap();
            alloc.free_with_stack(grad, bwd).unwrap();
        }
        tick();
        alloc
            .malloc_with_stack(1 << 20, Stream::DEFAULT, opt)
            .unwrap();
    }
}

/// Steps frames until `done` holds (a deadline turns a hang into a failure).
fn step_until(h: &mut Harness<'_, ViewerApp>, what: &str, done: impl Fn(&ViewerApp) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    h.step();
    while !done(h.state()) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
        h.step();
    }
}

/// A viewer attached to `alloc` served on a socket of a new directory, once the first live
/// document is open; the server and the directory live as long as the caller keeps them.
fn attached_viewer(
    alloc: &Arc<memsnap_recorder::CachingAllocator<memsnap_recorder::HostDevice>>,
) -> (
    Harness<'static, ViewerApp>,
    memsnap_recorder::LiveServer,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("unix:{}", dir.path().join("run.sock").display());
    let server = alloc.serve_live(&url).unwrap();
    let mut h = harness(Settings::default());
    h.state_mut()
        .attach(memsnap_viewer::live::Address::parse(&url).unwrap());
    step_until(&mut h, "the live document", |app| app.documents.len() == 1);
    (h, server, dir)
}

fn live_entries_shown(app: &ViewerApp) -> u64 {
    app.documents
        .first()
        .map_or(0, |d| d.doc.snapshot.entry_count() as u64)
}

fn live_entries_received(app: &ViewerApp) -> u64 {
    app.documents
        .first()
        .and_then(|d| d.live.as_ref())
        .map_or(0, |l| l.status().entries)
}

#[test]
fn attaching_shows_the_timeline_grow_pauses_and_says_when_disconnected() {
    let alloc = live_recorder();
    record_steps(&alloc, 2);
    let (mut h, server, _dir) = attached_viewer(&alloc);
    h.get_by_role_and_label(Role::Button, "live run.sock");
    h.get_by_label_contains("Active memory timeline");
    h.get_by_label_contains("entries received from unix:");

    // The program goes on: the timeline grows to every entry recorded.
    let first = live_entries_shown(h.state());
    record_steps(&alloc, 6);
    let recorded = alloc.recorded_entries();
    assert!(recorded > first);
    step_until(&mut h, "the timeline to grow", |app| {
        live_entries_shown(app) == recorded
    });

    // Paused, the view stays while the stream is still received.
    h.get_by_label("Pause").click();
    h.run_steps(2);
    assert!(h.state().documents[0].live_bar.paused);
    let frozen = live_entries_shown(h.state());
    record_steps(&alloc, 3);
    let recorded = alloc.recorded_entries();
    step_until(&mut h, "the entries received while paused", |app| {
        live_entries_received(app) == recorded
    });
    h.run_steps(4);
    assert_eq!(live_entries_shown(h.state()), frozen);
    h.get_by_label_contains(&format!("(paused: showing {frozen} entries)"));
    // Resuming jumps to the newest.
    h.get_by_label("Pause").click();
    step_until(&mut h, "the view to resume", |app| {
        live_entries_shown(app) == recorded
    });

    // The program stops serving: everything received stays, and the bar says so.
    drop(server);
    step_until(&mut h, "the disconnect", |app| !app.is_receiving());
    h.run_steps(2);
    assert_eq!(live_entries_shown(h.state()), recorded);
    h.get_by_label_contains(&format!(
        "disconnected: the recorder closed the connection; {recorded} entries received"
    ));
    h.get_by_role_and_label(Role::Button, "Reattach");
    step_until(&mut h, "the steps", |app| {
        app.documents[0].doc.steps_ready()
    });
    h.get_by_label_contains("Training steps: ");
    // Coloured by phase: a site's colour follows its frame's id, and the recorder's state
    // interns the frames in an order that differs from run to run.
    h.state_mut().documents[0].states[0].timeline.color_mode = ColourBy::Phase;
    h.remove_cursor();
    h.run_steps(4);
    h.snapshot("live_disconnected");
}

/// Between two documents (at 10M entries one takes a second to build) the timeline draws
/// what arrived after the shown one past its end, and its range reaches the newest entry.
#[test]
fn entries_received_after_the_shown_document_extend_the_timeline_until_the_next() {
    let alloc = live_recorder();
    record_steps(&alloc, 2);
    let (mut h, server, _dir) = attached_viewer(&alloc);
    // Recorded until a frame shows a tail (each step keeps 1 MiB: at most 500 of them).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let recording = {
        let (alloc, stop) = (alloc.clone(), stop.clone());
        std::thread::spawn(move || {
            for _ in 0..500 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                record_steps(&alloc, 1);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    step_until(&mut h, "a frame with entries past the document", |app| {
        let open = &app.documents[0];
        let state = &open.states[open.device_index].timeline;
        let events = open.doc.devices[open.device_index]
            .timeline
            .replay()
            .axis_len();
        state.live_tail.as_ref().is_some_and(|tail| {
            tail.entries > 0
                && tail.continues(&open.doc.snapshot, 0)
                && state.window.full_end == f64::from(events) + tail.entries as f64
                && state.window.end == state.window.full_end
        })
    });
    // The pointer over the tail (past every recorded allocation of the document), a click
    // there, and the wall-time axis: frames go on without a panic.
    let plot = h.get_by_label_contains("Active memory timeline").rect();
    let pos = egui::pos2(plot.right() - 3.0, plot.center().y);
    h.hover_at(pos);
    h.run_steps(3);
    for pressed in [true, false] {
        h.event(egui::Event::PointerButton {
            pos,
            button: egui::PointerButton::Primary,
            pressed,
            modifiers: egui::Modifiers::NONE,
        });
    }
    h.run_steps(3);
    h.get_by_label("wall time").click();
    h.run_steps(3);
    let open = &h.state().documents[0];
    assert_eq!(
        open.states[open.device_index].timeline.axis,
        memsnap_analysis::Axis::Time
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    recording.join().unwrap();
    drop(server);
}

#[test]
fn the_attach_dialog_says_what_is_wrong_with_an_address_and_attaches_to_a_typed_one() {
    let alloc = live_recorder();
    record_steps(&alloc, 2);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("unix:{}", dir.path().join("typed.sock").display());
    let server = alloc.serve_live(&url).unwrap();
    let mut h = harness(Settings::default());
    h.get_by_label("File").click();
    h.run_steps(2);
    h.get_by_label("Attach…").click();
    h.run_steps(2);
    assert!(h.state().attach_dialog.open);
    h.get_by_label_contains("Recordings serving their history");
    let field = h.get_by_role(Role::TextInput);
    field.focus();
    field.type_text("tcp:");
    h.run_steps(2);
    h.get_by_label("Attach to address").click();
    h.run_steps(2);
    h.get_by_label_contains("tcp: needs HOST:PORT");
    assert!(h.state().attaching.is_empty() && h.state().documents.is_empty());

    h.state_mut().attach_dialog.address = url.clone();
    h.run_steps(2);
    h.get_by_label("Attach to address").click();
    step_until(&mut h, "the attached document", |app| {
        app.documents.len() == 1
    });
    assert!(!h.state().attach_dialog.open, "the dialog closes");
    h.get_by_role_and_label(Role::Button, "live typed.sock");
    assert_eq!(live_entries_shown(h.state()), alloc.recorded_entries());
    drop(server);
}

/// The program's real window (eframe, glow) under Xvfb: `--bench-window` opens it, attaches it
/// to a live recording in the same process, receives every entry, zooms and pans, closes
/// itself and reports its frames. Skipped, with a notice, where `xvfb-run` is missing (CI
/// installs it).
#[test]
fn the_real_window_attaches_to_a_live_recording_and_reports_its_frames() {
    let has_xvfb = std::process::Command::new("sh")
        .args(["-c", "command -v xvfb-run"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_xvfb {
        eprintln!("skipped: xvfb-run is not installed");
        return;
    }
    let out = std::process::Command::new("xvfb-run")
        .args(["-a", "-s", "-screen 0 1920x1080x24"])
        .arg(env!("CARGO_BIN_EXE_memsnap-viewer"))
        .args([
            "--bench-attach",
            "20000",
            "--bench-attach-seconds",
            "1",
            "--bench-window",
            "1",
        ])
        .output()
        .expect("run memsnap-viewer under xvfb-run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    let recorded = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("recorded ")?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(recorded >= 20_000, "{stdout}");
    let after = stdout
        .lines()
        .find(|l| l.starts_with("window frames with every entry shown"))
        .unwrap_or_else(|| panic!("{stdout}"));
    // `N frames, p50 ...`: some frames were drawn once everything was shown.
    let frames: u64 = after
        .split(": ")
        .nth(1)
        .and_then(|r| r.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{after}"));
    assert!(frames >= 2, "{stdout}");
}

//! `memsnap-viewer --bench-attach N --bench-window`: the frame rate of the real window while a
//! live recording arrives and after, where `--bench-attach` alone draws headless.
//!
//! The recording is `--bench-attach`'s ([`Recording`]: N entries at an even pace over
//! `--bench-attach-seconds`, served on a unix socket). The viewer is started as usual
//! (eframe, glow), attached to it, with vsync off and a repaint asked for after every frame,
//! so each frame starts as soon as the one before is presented: the time between two frames
//! is what one frame costs through the window (the UI pass, tessellation, the GL upload and
//! paint, the swap), and its inverse the frame rate the viewer can reach. Once every entry is
//! shown, the pointer is moved over the timeline and the wheel zooms in, pans and zooms out
//! (input put into the frames' raw input, as a user's would be) for the first half of
//! `--bench-window`'s seconds, then the other views of one file (At an instant, Allocator,
//! Advise) are shown in turn, the pointer hovering and the wheel scrolling; then the window
//! closes and the report is printed: the frame intervals (p50 / p95 / max, the frame rate at
//! p95) and the time `update` itself took, while recording and in each view after.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memsnap_viewer::app::MainView;
use memsnap_viewer::live::Address;
use memsnap_viewer::ViewerApp;

use crate::bench_attach::{frame_line, Recording};

/// The views drawn once every entry is shown, and what the pointer does there.
const VIEWS: [(MainView, &str); 4] = [
    (
        MainView::Timeline,
        "hovering, zooming in, panning, zooming out",
    ),
    (MainView::Instant, "hovering, scrolling"),
    (MainView::Allocator, "hovering, scrolling"),
    (MainView::Advise, "hovering, scrolling"),
];

/// Where the measured run is.
#[derive(Clone, Copy, PartialEq)]
enum Phase {
    /// Entries arriving.
    Recording,
    /// The recording ended; the viewer has not shown every entry yet.
    CatchingUp { recorded: u64 },
    /// Every entry shown since then: the user zooms and pans.
    Interacting { since: Instant },
}

/// The viewer, with each frame timed.
struct Measured {
    app: ViewerApp,
    recording_done: Arc<std::sync::atomic::AtomicBool>,
    alloc: Arc<memsnap_recorder::CachingAllocator<memsnap_recorder::HostDevice>>,
    phase: Phase,
    interact_for: Duration,
    last_frame: Option<Instant>,
    /// Intervals between frames while entries arrive.
    intervals_recording: Vec<Duration>,
    /// `ViewerApp::ui`'s own time then.
    updates_recording: Vec<Duration>,
    /// Once all are shown, per view in [`VIEWS`] order: the intervals and `ui`'s time.
    after: Vec<(Vec<Duration>, Vec<Duration>)>,
    caught_up_after: Option<Duration>,
    recording_ended: Option<Instant>,
    report: Arc<Mutex<Option<String>>>,
}

impl Measured {
    /// The entries the shown live document has (the newest of the attached sessions).
    fn shown_entries(&self) -> u64 {
        self.app
            .documents
            .iter()
            .filter_map(|d| d.live.as_ref())
            .map(|s| s.shown_entries())
            .max()
            .unwrap_or(0)
    }

    fn report(&mut self) -> String {
        let mut out = format!(
            "window frames while recording: {}\n\
             window update() while recording: {}\n\
             every entry shown {:.0} ms after the recording ended\n",
            frame_line(&mut self.intervals_recording),
            frame_line(&mut self.updates_recording),
            self.caught_up_after.unwrap_or_default().as_secs_f64() * 1e3,
        );
        for ((view, doing), (intervals, updates)) in VIEWS.iter().zip(&mut self.after) {
            out.push_str(&format!(
                "window frames with every entry shown, {} ({doing}): {}\n\
                 window update() with every entry shown, {}: {}\n",
                view.label(),
                frame_line(intervals),
                view.label(),
                frame_line(updates),
            ));
        }
        out
    }

    /// The view shown at `since.elapsed()` into the interacting phase: the timeline for the
    /// first half, then each other view for an equal share.
    fn view_at(&self, since: Instant) -> usize {
        let t = (since.elapsed().as_secs_f64() / self.interact_for.as_secs_f64()).min(1.0);
        if t < 0.5 {
            0
        } else {
            let others = VIEWS.len() - 1;
            1 + (((t - 0.5) * 2.0 * others as f64) as usize).min(others - 1)
        }
    }
}

impl eframe::App for Measured {
    fn raw_input_hook(&mut self, ctx: &egui::Context, raw_input: &mut egui::RawInput) {
        eframe::App::raw_input_hook(&mut self.app, ctx, raw_input);
        let Phase::Interacting { since } = self.phase else {
            return;
        };
        let screen = raw_input.screen_rect.unwrap_or(egui::Rect::from_min_size(
            egui::Pos2::ZERO,
            egui::vec2(1600.0, 900.0),
        ));
        // Over the timeline's plot: the middle of the window, sweeping left to right; zooming
        // in, panning and zooming out over the timeline's half of the time.
        let t = (since.elapsed().as_secs_f64() / self.interact_for.as_secs_f64()).min(1.0) * 2.0;
        let x = screen.left() + screen.width() * (0.25 + 0.5 * ((t * 12.0).fract() as f32));
        let pos = egui::pos2(x, screen.center().y);
        raw_input.events.push(egui::Event::PointerMoved(pos));
        let delta = match (t * 3.0) as u32 {
            0 => egui::vec2(0.0, 12.0),
            1 => egui::vec2(-20.0, 0.0),
            2 => egui::vec2(0.0, -12.0),
            // The other views: their lists scroll.
            _ => egui::vec2(0.0, -4.0),
        };
        raw_input.events.push(egui::Event::MouseWheel {
            unit: egui::MouseWheelUnit::Point,
            delta,
            phase: egui::TouchPhase::Move,
            source: egui::MouseWheelSource::Unknown,
            modifiers: egui::Modifiers::NONE,
        });
    }

    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        let now = Instant::now();
        let interval = self.last_frame.map(|last| now - last);
        self.last_frame = Some(now);
        eframe::App::ui(&mut self.app, ui, frame);
        let took = now.elapsed();
        let ctx = ui.ctx().clone();
        match self.phase {
            Phase::Recording | Phase::CatchingUp { .. } => {
                if self.phase == Phase::Recording {
                    self.intervals_recording.extend(interval);
                    self.updates_recording.push(took);
                }
            }
            Phase::Interacting { since } => {
                let view = self.view_at(since);
                let (intervals, updates) = &mut self.after[view];
                intervals.extend(interval);
                updates.push(took);
            }
        }
        if self.phase == Phase::Recording && self.recording_done.load(Ordering::Relaxed) {
            self.phase = Phase::CatchingUp {
                recorded: self.alloc.recorded_entries(),
            };
            self.recording_ended = Some(now);
        }
        if let Phase::CatchingUp { recorded } = self.phase {
            if self.shown_entries() >= recorded {
                self.caught_up_after = self.recording_ended.map(|t| t.elapsed());
                self.phase = Phase::Interacting {
                    since: Instant::now(),
                };
                // The frame just drawn was the first with every entry: start timing afresh.
                self.last_frame = None;
            }
        }
        if let Phase::Interacting { since } = self.phase {
            let view = self.view_at(since);
            if self.app.view != VIEWS[view].0 {
                self.app.view = VIEWS[view].0;
                // The first frame of a view builds what it shows: timed from the next.
                self.last_frame = None;
            }
            if since.elapsed() >= self.interact_for {
                let report = self.report();
                if let Ok(mut slot) = self.report.lock() {
                    *slot = Some(report);
                }
                ctx.send_viewport_cmd(egui::ViewportCommand::Close);
                return;
            }
        }
        ctx.request_repaint();
    }
}

/// Runs the window benchmark and returns its report.
pub fn bench_window(entries: u64, seconds: f64, interact_seconds: f64) -> anyhow::Result<String> {
    let recording = Recording::start(entries, seconds)?;
    let report: Arc<Mutex<Option<String>>> = Arc::default();
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("memsnap viewer (bench)")
            .with_inner_size([1600.0, 900.0]),
        glow_options: eframe::egui_glow::GlowConfiguration {
            vsync: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let measured = {
        let (alloc, done, path, report) = (
            recording.alloc.clone(),
            recording.done.clone(),
            recording.path.clone(),
            report.clone(),
        );
        move |cc: &eframe::CreationContext<'_>| -> Result<Box<dyn eframe::App>, _> {
            let mut app = ViewerApp::from_creation_context(cc, Vec::new());
            app.attach(Address::Unix(path));
            Ok(Box::new(Measured {
                app,
                recording_done: done,
                alloc,
                phase: Phase::Recording,
                interact_for: Duration::from_secs_f64(interact_seconds),
                last_frame: None,
                intervals_recording: Vec::new(),
                updates_recording: Vec::new(),
                after: vec![Default::default(); VIEWS.len()],
                caught_up_after: None,
                recording_ended: None,
                report,
            }))
        }
    };
    eframe::run_native("memsnap-viewer-bench", options, Box::new(measured))
        .map_err(|e| anyhow::anyhow!("cannot open the window: {e}"))?;
    let alloc = recording.alloc.clone();
    let took = recording.finish()?;
    let report = report
        .lock()
        .ok()
        .and_then(|mut r| r.take())
        .ok_or_else(|| anyhow::anyhow!("the window closed before every entry was shown"))?;
    Ok(format!(
        "recorded {} entries in {:.2} s, served live; the viewer's window (1600 x 900, glow, vsync off)\n{report}",
        alloc.recorded_entries(),
        took.as_secs_f64()
    ))
}

//! `memsnap-viewer --bench-frames N`: measures what the quality bar asks for without a window.
//!
//! This is part of the `memsnap-viewer` program, not of the `memsnap_viewer` library: the
//! library holds the app, and the benchmark drives the library's own pieces from outside
//! through their public API (`DeviceModel::build`, `timeline_ui`, `TimelineState`), as the app
//! does, so what it times is what the app runs.
//!
//! It generates training-run snapshots (by default of 1M and 10M entries) or loads a file, builds
//! the analysis (open to first picture, after parsing), then runs the real timeline panel in a
//! headless egui context for N frames while zooming in and panning, timing each frame's UI pass
//! (layout, geometry) plus egui's tessellation. GPU upload and drawing are not included.

use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use memsnap_format::Snapshot;
use memsnap_workload::{generate, TrainingRun};

use memsnap_viewer::document::{DeviceModel, TimelineModel};
use memsnap_viewer::timeline::{timeline_ui, TimelineState};
use memsnap_viewer::view::Selection;

/// Errors a benchmark run can meet.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error("{0}")]
    Read(#[from] memsnap_format::FormatError),
    #[error("analysis: {0}")]
    Analysis(#[source] memsnap_analysis::AnalysisError),
    #[error("finding the site colours panicked")]
    SitesPanicked,
    #[error("the snapshot has no device to draw")]
    NoDevice,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct BenchReport {
    pub entries: usize,
    pub allocations: usize,
    pub parse: Option<Duration>,
    /// What the picture needs: `DeviceTimeline::build` and its drawing indexes, the site
    /// colours (alongside).
    pub analysis: Duration,
    /// The steps, phases and categories, which the viewer computes on another thread once
    /// the picture is up (timed after the first frame; the later frames draw them).
    pub steps: Duration,
    /// The summary and per-site profile (ranks table, diff), which the viewer computes on
    /// another thread once the picture is up (with the steps it found before).
    pub profile: Duration,
    /// The first frame: layout of the whole run, geometry and tessellation.
    pub first_frame: Duration,
    /// Later frames, sorted.
    pub frames: Vec<Duration>,
    /// The layout part of each later frame (zero when the layout was reused), sorted.
    pub layouts: Vec<Duration>,
    /// Triangles tessellated per later frame, sorted: a measure of drawing work that does
    /// not depend on how busy the CPU is.
    pub triangles: Vec<usize>,
    pub bands_first_frame: usize,
    pub triangles_first_frame: usize,
    pub width_px: f32,
    /// Resident memory (Linux `/proc/self/status`) with the snapshot read, with the analysis
    /// too, and the process's peak, in bytes.
    pub rss_read: Option<u64>,
    pub rss_analysed: Option<u64>,
    pub rss_peak: Option<u64>,
    /// The peak from the snapshot read on (the generator's own peak left out), when the
    /// kernel lets the peak be reset (`/proc/self/clear_refs`).
    pub rss_peak_viewer: Option<u64>,
}

/// Resets the process's peak resident memory (`VmHWM`) to the current one; false when the
/// kernel does not allow it (or off Linux).
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// A `/proc/self/status` memory line (`VmRSS`, `VmHWM`) in bytes; `None` off Linux.
fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The `p` quantile of sorted values (the default when there are none).
fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

impl BenchReport {
    fn percentile(&self, p: f64) -> Duration {
        percentile(&self.frames, p)
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        writeln!(f, "entries:            {}", self.entries)?;
        writeln!(f, "allocations:        {}", self.allocations)?;
        if let Some(parse) = self.parse {
            writeln!(f, "parse:              {:.1} ms", ms(parse))?;
        }
        writeln!(
            f,
            "analysis build:     {:.1} ms (then in the background: steps {:.1} ms, ranks/diff profile {:.1} ms)",
            ms(self.analysis),
            ms(self.steps),
            ms(self.profile)
        )?;
        writeln!(
            f,
            "first frame:        {:.1} ms ({} bands, {} triangles, {} px wide)",
            ms(self.first_frame),
            self.bands_first_frame,
            self.triangles_first_frame,
            self.width_px
        )?;
        writeln!(
            f,
            "open to first picture (after parsing): {:.1} ms",
            ms(self.analysis + self.first_frame)
        )?;
        writeln!(
            f,
            "zoom/pan frames:    {} frames, p50 {:.2} ms, p95 {:.2} ms, max {:.2} ms",
            self.frames.len(),
            ms(self.percentile(0.5)),
            ms(self.percentile(0.95)),
            ms(self.frames.last().copied().unwrap_or_default())
        )?;
        writeln!(
            f,
            "  of which layout:  p50 {:.2} ms, p95 {:.2} ms, max {:.2} ms",
            ms(percentile(&self.layouts, 0.5)),
            ms(percentile(&self.layouts, 0.95)),
            ms(self.layouts.last().copied().unwrap_or_default())
        )?;
        writeln!(
            f,
            "  triangles/frame:  p50 {}, p95 {}, max {}",
            percentile(&self.triangles, 0.5),
            percentile(&self.triangles, 0.95),
            self.triangles.last().copied().unwrap_or_default()
        )?;
        let mb = |b: Option<u64>| b.map_or("?".to_owned(), |b| format!("{:.0} MB", b as f64 / 1e6));
        writeln!(
            f,
            "memory:             {} with the snapshot read, {} with the analysis, peak {} (from the snapshot read on: {})",
            mb(self.rss_read),
            mb(self.rss_analysed),
            mb(self.rss_peak),
            mb(self.rss_peak_viewer)
        )?;
        write!(
            f,
            "60 fps budget (16.7 ms) met by p95: {}",
            if ms(self.percentile(0.95)) <= 16.7 {
                "yes"
            } else {
                "no"
            }
        )
    }
}

/// Benchmarks a generated run of about `entries` trace entries.
/// The headless window both benchmarks draw into (points).
pub const HEADLESS_SCREEN: (f32, f32) = (1600.0, 900.0);

/// The timeline panel drawn as the window draws it, without one: the UI pass and the
/// tessellation at [`HEADLESS_SCREEN`], no GPU (no renderer takes the font texture).
pub struct HeadlessTimeline {
    ctx: egui::Context,
    selection: Selection,
    frames: u32,
}

impl HeadlessTimeline {
    pub fn new() -> Self {
        HeadlessTimeline {
            ctx: egui::Context::default(),
            selection: Selection::default(),
            frames: 0,
        }
    }

    /// Draws one frame; returns its time and its triangles.
    pub fn draw(
        &mut self,
        model: &TimelineModel<'_>,
        state: &mut TimelineState,
    ) -> (Duration, usize) {
        self.frames += 1;
        let input = egui::RawInput {
            screen_rect: Some(egui::Rect::from_min_size(
                egui::Pos2::ZERO,
                egui::vec2(HEADLESS_SCREEN.0, HEADLESS_SCREEN.1),
            )),
            // 60 frames per second of input time, so the view counts as moving while zooming.
            time: Some(f64::from(self.frames) / 60.0),
            ..Default::default()
        };
        let selection = &mut self.selection;
        let started = Instant::now();
        let mut output = self.ctx.run_ui(input, |ui| {
            egui::CentralPanel::default().show(ui, |ui| {
                timeline_ui(ui, model, state, selection);
            });
        });
        output.textures_delta.clear();
        let primitives = self.ctx.tessellate(output.shapes, output.pixels_per_point);
        let triangles = primitives
            .iter()
            .map(|p| match &p.primitive {
                egui::epaint::Primitive::Mesh(m) => m.indices.len() / 3,
                egui::epaint::Primitive::Callback(_) => 0,
            })
            .sum();
        (started.elapsed(), triangles)
    }
}

pub fn bench_generated(entries: usize, frames: usize) -> Result<BenchReport, BenchError> {
    let run = TrainingRun {
        target_entries: Some(entries),
        layers: 24,
        activations_per_layer: 6,
        stack_pool: 400,
        leak_bytes_per_step: 1 << 20,
        ..TrainingRun::default()
    };
    let (snapshot, _) = generate(&run);
    bench_snapshot(&snapshot, None, frames)
}

/// Benchmarks a snapshot file.
pub fn bench_file(path: &Path, frames: usize) -> Result<BenchReport, BenchError> {
    let started = Instant::now();
    let (snapshot, _) = memsnap_format::read_path(path)?;
    bench_snapshot(&snapshot, Some(started.elapsed()), frames)
}

/// Times the analysis build, the first frame and `frames` zoom/pan frames.
pub fn bench_snapshot(
    snapshot: &Snapshot,
    parse: Option<Duration>,
    frames: usize,
) -> Result<BenchReport, BenchError> {
    let device = memsnap_analysis::DeviceTimeline::devices(snapshot)
        .into_iter()
        .max_by_key(|&d| {
            usize::try_from(d)
                .ok()
                .and_then(|i| snapshot.traces().get(i))
                .map_or(0, Vec::len)
        })
        .ok_or(BenchError::NoDevice)?;
    // What `Document::prepare` does: the device's timeline and its drawing indexes, the
    // sites alongside; then the picture. The steps and the profile (ranks table, diff) follow
    // in background jobs in the viewer; here the steps are timed after the first frame, the
    // profile after the frames.
    let rss_read = proc_status_bytes("VmRSS:");
    let peak_reset = reset_peak_rss();
    let started = Instant::now();
    let (model, sites) = std::thread::scope(|scope| {
        let sites = scope.spawn(|| memsnap_plot::sites::StackSites::new(snapshot));
        let model = DeviceModel::build(snapshot, device);
        (model, sites.join())
    });
    let mut model = model.map_err(BenchError::Analysis)?;
    let sites = sites.map_err(|_| BenchError::SitesPanicked)?;
    let analysis = started.elapsed();
    let rss_analysed = proc_status_bytes("VmRSS:");
    let timeline_arc = model.timeline.clone();
    let timeline = &*timeline_arc;
    let mut state = TimelineState::new(timeline);

    let mut headless = HeadlessTimeline::new();
    let mut frame = |state: &mut TimelineState, model: &DeviceModel| -> (Duration, usize) {
        let timeline_model = TimelineModel {
            snapshot,
            timeline,
            steps: model.steps(),
            sites: &sites,
        };
        headless.draw(&timeline_model, state)
    };
    // egui lays out fonts on the first pass; that is start-up, not drawing.
    let _ = frame(&mut state, &model);
    state.window.reset();
    let (first_frame, triangles_first_frame) = {
        // Force a fresh layout for the measured first frame.
        state.min_size = 1;
        frame(&mut state, &model)
    };
    let started = Instant::now();
    model.compute_steps();
    let steps = started.elapsed();
    let bands_first_frame = state.cached_layout().map_or(0, |l| l.bands.len());
    let mut times = Vec::with_capacity(frames);
    let mut layouts = Vec::with_capacity(frames);
    let mut triangles = Vec::with_capacity(frames);
    for i in 0..frames {
        // Zoom in towards the middle for the first half, then pan, then zoom back out.
        let center = (state.window.start + state.window.end) / 2.0;
        match (i * 3) / frames.max(1) {
            0 => state.window.zoom_at(center, 0.92),
            1 => state.window.pan_by_fraction(0.03),
            _ => state.window.zoom_at(center, 1.0 / 0.92),
        }
        state.last_layout_ms = 0.0;
        let (time, tris) = frame(&mut state, &model);
        times.push(time);
        layouts.push(Duration::from_secs_f64(state.last_layout_ms / 1e3));
        triangles.push(tris);
    }
    let started = Instant::now();
    // As the viewer does: with the steps it found above.
    let _profile = memsnap_analysis::compare::device_profile_with_steps(
        snapshot,
        timeline,
        &memsnap_viewer::document::profile_options(),
        model.shared_steps(),
    );
    let profile = started.elapsed();
    times.sort_unstable();
    layouts.sort_unstable();
    triangles.sort_unstable();
    Ok(BenchReport {
        entries: snapshot.entry_count(),
        allocations: timeline.replay().allocations.len(),
        parse,
        analysis,
        steps,
        profile,
        first_frame,
        frames: times,
        layouts,
        triangles,
        bands_first_frame,
        triangles_first_frame,
        width_px: HEADLESS_SCREEN.0,
        rss_read,
        rss_analysed,
        rss_peak: proc_status_bytes("VmHWM:"),
        rss_peak_viewer: peak_reset.then(|| proc_status_bytes("VmHWM:")).flatten(),
    })
}

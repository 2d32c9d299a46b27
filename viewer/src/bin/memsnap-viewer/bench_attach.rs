//! `memsnap-viewer --bench-attach N`: measures attaching to a live recording without a window.
//!
//! A host-backend allocator in this process records N trace entries (training-like steps:
//! activations made and freed, one block kept per step) at an even pace over
//! `--bench-attach-seconds`, serving its history on a unix socket (`serve_live`). A
//! [`LiveSession`] attached to it is polled as the window polls it, 60 times a second (taking
//! each new document and polling its steps, and drawing the timeline panel headless as the
//! window would, the live tail included, at 1600 x 900). Printed: the rate the entries arrived, the
//! status updates, picture updates (a document or the live tail past it) and documents the
//! UI got per second while they arrived, each rebuild's
//! duration and size, the longest UI poll, and how long after the last entry the UI showed
//! everything.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memsnap_format::Frame;
use memsnap_recorder::{CachingAllocator, HistoryOptions, HostDevice, StackMode, Stream};
use memsnap_viewer::document::{Document, TimelineModel};
use memsnap_viewer::live::{Address, LiveSession};
use memsnap_viewer::live_tail::LiveTail;
use memsnap_viewer::timeline::TimelineState;

use crate::bench::HeadlessTimeline;

/// The timeline panel of the shown document, drawn headless each poll as the window draws
/// it ([`HeadlessTimeline`]): what a frame costs while entries arrive and after.
struct Frames {
    headless: HeadlessTimeline,
    state: Option<TimelineState>,
}

impl Frames {
    fn new() -> Self {
        Frames {
            headless: HeadlessTimeline::new(),
            state: None,
        }
    }

    /// The new document's range, as `OpenDocument::replace_document` follows it.
    fn follow(&mut self, document: &Document) {
        let timeline = &document.devices[document.default_device].timeline;
        match &mut self.state {
            Some(state) => state.follow(timeline),
            None => self.state = Some(TimelineState::new(timeline)),
        }
    }

    /// Draws one frame of `document` with `tail` past its end; returns its time.
    fn draw(&mut self, document: &Document, tail: Option<Arc<LiveTail>>) -> Duration {
        let model = &document.devices[document.default_device];
        let Some(state) = &mut self.state else {
            return Duration::ZERO;
        };
        state.live_tail = tail;
        let timeline_model = TimelineModel {
            snapshot: &document.snapshot,
            timeline: &model.timeline,
            steps: model.steps(),
            sites: &document.sites,
        };
        self.headless.draw(&timeline_model, state).0
    }
}

/// `p50 / p95 / max` of frame times, and the frames a second the p95 allows.
pub fn frame_line(times: &mut [Duration]) -> String {
    if times.is_empty() {
        return "none".into();
    }
    times.sort_unstable();
    let at = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "{} frames, p50 {:.1} / p95 {:.1} / max {:.1} ms ({:.0} fps at p95)",
        times.len(),
        ms(at(0.5)),
        ms(at(0.95)),
        ms(at(1.0)),
        1.0 / at(0.95).as_secs_f64().max(1e-6)
    )
}

/// Entries one step records: 20 activations made (`alloc`) and freed (`free_requested`,
/// `free_completed`), one block kept (a few `segment_alloc`s besides).
const ENTRIES_PER_STEP: u64 = 61;

fn record_step(alloc: &CachingAllocator<HostDevice>, stacks: &[memsnap_recorder::GivenStack; 3]) {
    let acts: Vec<u64> = (0..20u64)
        .filter_map(|i| {
            alloc
                .malloc_with_stack(4096 * (1 + i % 7), Stream::DEFAULT, stacks[0])
                .ok()
        })
        .collect();
    for p in acts {
        let _ = alloc.free_with_stack(p, stacks[1]);
    }
    // A few KiB kept per step: over a million entries about 100 MB, like a slow leak.
    let _ = alloc.malloc_with_stack(4096, Stream::DEFAULT, stacks[2]);
}

/// The benchmarks' recording program, running: a host-backend allocator recording N entries
/// at an even pace on a thread of this process, serving its history on a unix socket.
pub struct Recording {
    pub alloc: Arc<CachingAllocator<HostDevice>>,
    pub path: std::path::PathBuf,
    /// Set when the last entry was recorded.
    pub done: Arc<AtomicBool>,
    pub started: Instant,
    server: memsnap_recorder::LiveServer,
    thread: std::thread::JoinHandle<Duration>,
}

impl Recording {
    /// Starts recording `entries` entries over `seconds`.
    pub fn start(entries: u64, seconds: f64) -> anyhow::Result<Recording> {
        let alloc = Arc::new(CachingAllocator::new(HostDevice::new(64 << 30)));
        alloc.record_memory_history(HistoryOptions {
            max_entries: usize::MAX,
            stacks: StackMode::None,
            ..HistoryOptions::default()
        });
        let stack = |name: &str| {
            alloc
                .register_stack(&[
                    Frame::new(name, "model.py", 10),
                    Frame::new("train", "train.py", 3),
                ])
                .ok_or_else(|| anyhow::anyhow!("cannot register a stack"))
        };
        let stacks = [
            stack("forward")?,
            stack("backward")?,
            stack("optimizer_step")?,
        ];
        let path =
            std::env::temp_dir().join(format!("memsnap-bench-attach-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let server = alloc
            .serve_live(&format!("unix:{}", path.display()))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        // The program: N entries at an even pace.
        let steps = entries.div_ceil(ENTRIES_PER_STEP);
        let done = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let thread = {
            let (alloc, done) = (alloc.clone(), done.clone());
            std::thread::spawn(move || {
                let per_step = Duration::from_secs_f64(seconds / steps as f64);
                for step in 0..steps {
                    record_step(&alloc, &stacks);
                    let due = per_step * (step as u32 + 1);
                    if let Some(wait) = due.checked_sub(started.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
                done.store(true, Ordering::Relaxed);
                started.elapsed()
            })
        };
        Ok(Recording {
            alloc,
            path,
            done,
            started,
            server,
            thread,
        })
    }

    /// Waits for the recording to end; returns how long it took. The socket closes.
    pub fn finish(self) -> anyhow::Result<Duration> {
        let took = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("the recording thread panicked"))?;
        drop(self.server);
        Ok(took)
    }
}

/// Runs the benchmark and returns its report.
pub fn bench_attach(entries: u64, seconds: f64) -> anyhow::Result<String> {
    let recording = Recording::start(entries, seconds)?;
    let (alloc, path, recording_done, started) = (
        recording.alloc.clone(),
        recording.path.clone(),
        recording.done.clone(),
        recording.started,
    );
    let mut session = LiveSession::start(1, Address::Unix(path.clone()), None, None);

    // The UI: 60 polls a second.
    let frame = Duration::from_micros(16_667);
    let mut shown: Option<Document> = None;
    let mut documents = Vec::new();
    let mut longest_poll = Duration::ZERO;
    let mut rebuilds: Vec<(u64, u64, Duration)> = Vec::new();
    let mut recorded_at_end = None;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds * 4.0 + 120.0);
    let mut updates_during_recording = 0;
    let (mut last_picture, mut pictures_during_recording) = ((0u64, 0u64), 0u64);
    let mut frames = Frames::new();
    let mut frames_recording = Vec::new();
    let all_shown_at = loop {
        let tick = Instant::now();
        session.poll();
        if let Some(document) = session.take_document() {
            documents.push((started.elapsed(), document.snapshot.entry_count()));
            frames.follow(&document);
            // As the window does (`OpenDocument::replace_document`).
            if let Some(old) = shown.replace(document) {
                memsnap_viewer::live::retire(old);
            }
        }
        if let Some(document) = &mut shown {
            document.poll();
        }
        // What the picture shows: the document, and the tail drawn past its end (as the
        // timeline page takes it each frame).
        let tail_end = session
            .tail()
            .filter(|t| {
                shown
                    .as_ref()
                    .is_some_and(|d| t.continues(&d.snapshot, t.device))
            })
            .map_or(0, |t| t.entries);
        let picture = (session.shown_entries(), tail_end);
        if picture != last_picture {
            last_picture = picture;
            if recorded_at_end.is_none() {
                pictures_during_recording += 1;
            }
        }
        longest_poll = longest_poll.max(tick.elapsed());
        // Then the frame (timed on its own).
        if let Some(document) = &shown {
            let tail = session
                .tail()
                .filter(|t| t.continues(&document.snapshot, t.device));
            let took = frames.draw(document, tail);
            if recorded_at_end.is_none() {
                frames_recording.push(took);
            }
        }
        let status = session.status();
        if status.rebuilds != rebuilds.last().map_or(0, |r: &(u64, u64, Duration)| r.0) {
            rebuilds.push((
                status.rebuilds,
                status.rebuilt_entries,
                status.last_rebuild.unwrap_or_default(),
            ));
        }
        if recorded_at_end.is_none() && recording_done.load(Ordering::Relaxed) {
            recorded_at_end = Some((alloc.recorded_entries(), started.elapsed()));
            updates_during_recording = status.updates;
        }
        if let Some((recorded, _)) = recorded_at_end {
            if session.shown_entries() == recorded {
                break started.elapsed();
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "the UI did not get every entry in time: {:?}",
                session.status()
            );
        }
        std::thread::sleep(frame.saturating_sub(tick.elapsed()));
    };
    // Everything received and shown: the window goes on drawing it (zoom, pan, hover).
    // As `--bench-frames` does: zoom in towards the middle, pan, zoom back out.
    let mut frames_after = Vec::new();
    if let Some(document) = &shown {
        const AFTER: usize = 120;
        for i in 0..AFTER {
            if let Some(state) = &mut frames.state {
                let center = (state.window.start + state.window.end) / 2.0;
                match (i * 3) / AFTER {
                    0 => state.window.zoom_at(center, 0.92),
                    1 => state.window.pan_by_fraction(0.03),
                    _ => state.window.zoom_at(center, 1.0 / 0.92),
                }
            }
            frames_after.push(frames.draw(document, None));
        }
    }
    let status = session.status();
    let recording_took = recording.finish()?;
    session.wait();
    let (recorded, _) = recorded_at_end.unwrap_or_default();

    let mut out = String::new();
    let secs = recording_took.as_secs_f64();
    writeln!(
        out,
        "recorded {recorded} entries in {secs:.2} s ({:.0} entries/s), served on {}",
        recorded as f64 / secs,
        path.display()
    )?;
    writeln!(
        out,
        "received {} entries, {} dropped, {} frames, {:.1} MB",
        status.entries,
        status.dropped,
        status.frames,
        status.bytes as f64 / 1e6
    )?;
    writeln!(
        out,
        "status updates while recording: {updates_during_recording} in {secs:.2} s ({:.1}/s)",
        updates_during_recording as f64 / secs
    )?;
    writeln!(
        out,
        "picture updates while recording (a new document, or the live tail past it grew): {pictures_during_recording} ({:.1}/s)",
        pictures_during_recording as f64 / secs
    )?;
    let during = documents
        .iter()
        .filter(|(at, _)| *at <= recording_took)
        .count();
    writeln!(
        out,
        "documents shown while recording: {during} ({:.1}/s); {} in all",
        during as f64 / secs,
        documents.len()
    )?;
    let shown_list: Vec<String> = documents
        .iter()
        .map(|(at, n)| format!("{:.2}s:{n}", at.as_secs_f64()))
        .collect();
    writeln!(out, "documents (time: entries): {}", shown_list.join(" "))?;
    writeln!(
        out,
        "rebuilds: {}, the last of {} entries took {:.1} ms (merge + Document::prepare)",
        status.rebuilds,
        status.rebuilt_entries,
        status.last_rebuild.unwrap_or_default().as_secs_f64() * 1e3
    )?;
    let each: Vec<String> = rebuilds
        .iter()
        .map(|(_, n, took)| format!("{n}:{:.0}ms", took.as_secs_f64() * 1e3))
        .collect();
    writeln!(out, "rebuilds seen (entries: duration): {}", each.join(" "))?;
    writeln!(
        out,
        "every entry shown {:.0} ms after the recording ended; longest UI poll {:.2} ms",
        all_shown_at.saturating_sub(recording_took).as_secs_f64() * 1e3,
        longest_poll.as_secs_f64() * 1e3
    )?;
    writeln!(
        out,
        "timeline frames while recording: {}",
        frame_line(&mut frames_recording)
    )?;
    writeln!(
        out,
        "timeline frames with every entry shown (zooming in, panning, zooming out): {}",
        frame_line(&mut frames_after)
    )?;
    if let Some(peak) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(str::to_owned)
        })
    {
        writeln!(out, "peak RSS ({peak})")?;
    }
    Ok(out)
}

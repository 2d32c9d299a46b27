//! Benchmarks of the analysis on a large history, each printed next to its reference as a
//! ratio:
//!
//! * `summary / load`: loading a snapshot plus summarising it, against loading alone (target:
//!   at most 2x, i.e. the analysis costs at most as much as the load);
//! * `DeviceTimeline::build_for_drawing`, the timeline with its drawing indexes (the viewer's
//!   one-time precomputation; budget 1 s; CPU of all its threads) and one
//!   screen of layout at 1920 px for several zoom levels (budget 16 ms a frame);
//! * `ranks`: summarising N files on all cores against one core.
//!
//! ```text
//! cargo bench -p memsnap-analysis --bench timeline
//! MEMSNAP_BENCH_SNAPSHOT=/tmp/big.pickle cargo bench -p memsnap-analysis --bench timeline
//! MEMSNAP_BENCH_ENTRIES=200000 MEMSNAP_BENCH_RANK_FILES=16 cargo bench ...
//! ```
//! `MEMSNAP_BENCH_PARTS=summary,layout,ranks` picks parts (default: all).
//! Without `MEMSNAP_BENCH_SNAPSHOT` a synthetic run of `MEMSNAP_BENCH_ENTRIES` (default
//! 1,000,000) entries is generated and written as a pickle to a temporary file first.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memsnap_analysis::{summarize, Axis, DeviceTimeline, LayoutRequest, Lifetime, SummaryOptions};
use memsnap_workload::{generate, TrainingRun};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time of the calling thread (Linux `schedstat`, nanoseconds on CPU), so numbers stay
/// meaningful on a machine shared with other builds; `None` elsewhere.
fn thread_cpu_time() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// CPU time of the whole process, threads that ended included (`/proc/self/stat` utime +
/// stime, in the kernel's fixed 100 Hz `USER_HZ` ticks): `DeviceTimeline::build_for_drawing`
/// spreads over threads, which this thread's time would leave out.
fn process_cpu_time() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses; utime and stime
    // are the 14th and 15th fields, the 12th and 13th after it.
    let mut fields = text.rsplit_once(')')?.1.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Timings of `runs` runs: (best wall, mean CPU of this thread when known, else best wall).
/// The CPU time is the mean, not the best: the kernel may account it in scheduler ticks
/// (4 ms), so one short run can read as 0 or one tick; the mean over the runs is exact.
fn best<T>(runs: usize, f: impl FnMut() -> T) -> (Duration, Duration, T) {
    best_by(runs, thread_cpu_time, f)
}

/// [`best`] with another CPU clock.
fn best_by<T>(
    runs: usize,
    cpu_time: fn() -> Option<Duration>,
    mut f: impl FnMut() -> T,
) -> (Duration, Duration, T) {
    let (mut wall, mut cpu_total, mut cpu_known) = (Duration::MAX, Duration::ZERO, true);
    let mut last = None;
    for _ in 0..runs {
        let (start, cpu_start) = (Instant::now(), cpu_time());
        let out = f();
        let elapsed = start.elapsed();
        wall = wall.min(elapsed);
        match (cpu_start, cpu_time()) {
            (Some(a), Some(b)) => cpu_total += b.saturating_sub(a),
            _ => cpu_known = false,
        }
        last = Some(out);
    }
    let cpu = if cpu_known {
        cpu_total / runs as u32
    } else {
        wall
    };
    (wall, cpu, last.expect("runs > 0"))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn load(path: &Path) -> memsnap_format::Snapshot {
    memsnap_format::read_path(path).expect("read snapshot").0
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this with no such flag and
    // must stay fast.
    if !std::env::args().any(|a| a == "--bench") {
        println!("timeline bench: run with `cargo bench` to measure");
        return;
    }
    let entries = env_usize("MEMSNAP_BENCH_ENTRIES", 1_000_000);
    let tmp = std::env::temp_dir().join(format!("memsnap-bench-{}.pickle", std::process::id()));
    let path: PathBuf = match std::env::var_os("MEMSNAP_BENCH_SNAPSHOT") {
        Some(p) => PathBuf::from(p),
        None => {
            let run = TrainingRun {
                target_entries: Some(entries),
                layers: 24,
                activations_per_layer: 8,
                with_annotations: false,
                seed: 1,
                ..Default::default()
            };
            let (snapshot, _) = generate(&run);
            memsnap_format::write_path(&tmp, &snapshot, None).expect("write snapshot");
            tmp.clone()
        }
    };
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "snapshot {} ({:.1} MiB)",
        path.display(),
        size as f64 / (1 << 20) as f64
    );

    let parts =
        std::env::var("MEMSNAP_BENCH_PARTS").unwrap_or_else(|_| "summary,layout,ranks".into());
    let part = |name: &str| parts.split(',').any(|p| p.trim() == name);

    // 1. summary end to end vs load alone.
    let options = SummaryOptions::default();
    let (load_wall, load_cpu, snapshot) = best(if part("summary") { 3 } else { 1 }, || load(&path));
    let summary = summarize(&snapshot, &options).expect("summary");
    let device = summary.busiest().map_or(0, |d| d.device);
    println!(
        "entries {}, steps {}, peak {} bytes",
        snapshot.entry_count(),
        summary.busiest().map_or(0, |d| d.steps.len()),
        summary.busiest().map_or(0, |d| d.peak.bytes)
    );
    if part("summary") {
        let (e2e_wall, e2e_cpu, _) = best(3, || {
            let s = load(&path);
            summarize(&s, &options).expect("summary")
        });
        println!(
            "load {:.0} ms CPU ({:.0} ms wall) | load + summary {:.0} ms CPU ({:.0} ms wall) | ratio {:.2}x CPU, {:.2}x wall (target <= 2x)",
            ms(load_cpu),
            ms(load_wall),
            ms(e2e_cpu),
            ms(e2e_wall),
            e2e_cpu.as_secs_f64() / load_cpu.as_secs_f64(),
            e2e_wall.as_secs_f64() / load_wall.as_secs_f64()
        );
    }

    // 2. The viewer's precomputation and per-frame layout.
    // What the viewer builds for its first picture: the timeline with its drawing indexes,
    // on several threads (so the CPU is the whole process's, in 10 ms ticks).
    let (build_wall, build_cpu, timeline) = best_by(10, process_cpu_time, || {
        let timeline = DeviceTimeline::build_for_drawing(&snapshot, device).expect("build");
        std::hint::black_box(timeline.by_size_desc().len());
        timeline
    });
    println!(
        "DeviceTimeline::build_for_drawing {:.0} ms CPU, all threads ({:.0} ms wall) | budget 1000 ms | ratio {:.2}x of budget",
        ms(build_cpu),
        ms(build_wall),
        build_cpu.as_secs_f64()
    );
    let n = f64::from(timeline.replay().axis_len());
    let layouts = if part("layout") {
        vec![
            ("whole trace, 15000 bands", 0.0, n, 15_000),
            ("whole trace, 2000 bands", 0.0, n, 2_000),
            ("10% zoom", n * 0.45, n * 0.55, 15_000),
            ("1% zoom", n * 0.5, n * 0.51, 15_000),
            ("500 events", n * 0.5, n * 0.5 + 500.0, 15_000),
        ]
    } else {
        Vec::new()
    };
    for (label, start, end, max_bands) in layouts {
        let req = LayoutRequest {
            axis: Axis::Event,
            start,
            end,
            width_px: 1920,
            min_size: 0,
            max_bands,
            lifetime: Lifetime::Active,
        };
        let (wall, t, layout) = best(20, || timeline.layout(&req).expect("layout"));
        let (_, hit, _) = best(1000, || {
            let c = &layout.columns[960];
            layout.hit_test((c.x0 + c.x1) / 2.0, c.total_bytes / 2)
        });
        println!(
            "layout 1920 px, {label}: {:.2} ms CPU ({:.2} ms wall, {} bands) | budget 16 ms | ratio {:.3}x of budget | hit test {:.3} ms",
            ms(t),
            ms(wall),
            layout.bands.len(),
            ms(t) / 16.0,
            ms(hit)
        );
    }
    drop(timeline);

    // 3. ranks: N files summarised on all cores vs one.
    if !part("ranks") {
        return;
    }
    let files = env_usize("MEMSNAP_BENCH_RANK_FILES", 4);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let summarize_all = |threads: usize| {
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < files {
                        let snap = load(&path);
                        summarize(&snap, &options).expect("summary");
                    }
                });
            }
        });
    };
    drop(snapshot);
    // Wall time: the point is how the work spreads over the cores.
    let (one, _, _) = best(1, || summarize_all(1));
    let (all, _, _) = best(1, || summarize_all(cores));
    println!(
        "ranks over {files} files: 1 thread {:.0} ms | {cores} threads {:.0} ms | speedup {:.2}x (ideal {}x)",
        ms(one),
        ms(all),
        one.as_secs_f64() / all.as_secs_f64(),
        cores.min(files)
    );
    let _ = std::fs::remove_file(&tmp);
}

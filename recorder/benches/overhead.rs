//! Recording overhead per alloc+free pair on `SimulatedDevice`, side by side in one run:
//!
//! * `baseline-freelist`: a plain Vec-backed best-fit free-list allocator doing the same work
//!   (best fit by size then address, split, merge with both neighbours, a pointer map);
//! * `history-off`, `history` (ring buffer, no stacks), `history+stacks-fp`,
//!   `history+stacks-backtrace` (DWARF unwinding with each return address's rule cached, on
//!   x86-64 Linux) and `history+stacks-libgcc` (DWARF unwinding through libgcc for every frame)
//!   (a native stack captured at every malloc and free, ~30 frames deep);
//! * `history+listener`: `history` with one live listener attached (`serve_live`, a thread
//!   that reads and decodes every frame; `MEMSNAP_BENCH_LIVE_VERBOSE=1` prints what it got);
//! * `history-manual-clock`: `history` with the manual clock, which reads a field instead
//!   of the CPU's counter, so that the difference is what the two clock readings of a pair
//!   cost.
//!
//! ```text
//! cargo bench -p memsnap-recorder --bench overhead
//! MEMSNAP_BENCH_CLOCK=cpu cargo bench -p memsnap-recorder --bench overhead   # on-CPU time
//! ```
//!
//! The frame-pointer walk only sees the whole stack when the build keeps frame pointers (this
//! workspace's `.cargo/config.toml` gives every build them); otherwise the capture falls back
//! to DWARF unwinding, and the bench says so. It also compares one frame-pointer walk with a
//! DWARF unwind from the same place (`stacks::check_frame_pointers`), on the main thread and
//! on a spawned one: the frames the walk misses are std's prebuilt start-up frames.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

use memsnap_recorder::stacks::{check_frame_pointers, walk_frame_pointers, FramePointerCheck};
use memsnap_recorder::{
    CachingAllocator, ContextMode, HistoryOptions, SimulatedDevice, StackMode, Stream, Unwinder,
};

const LIVE: usize = 64;
const PAIRS: usize = 200_000;
const STACK_PAIRS: usize = 40_000;
const ROUNDS: usize = 5;
/// Frames of recursion above the measured loop (the stack depth is about this plus the
/// harness frames).
const DEPTH: usize = 26;

/// The request sizes, cycled (all small-pool sizes, so one segment serves the steady state).
fn size_at(i: usize) -> u64 {
    const SIZES: [u64; 8] = [512, 1000, 4096, 700, 16_384, 2048, 9000, 65_536];
    SIZES[i % SIZES.len()] + (i % 5) as u64 * 512
}

trait PairAllocator {
    fn alloc(&mut self, size: u64) -> u64;
    fn free(&mut self, ptr: u64);
}

/// A Vec-backed free-list allocator with PyTorch's core steps and nothing else.
struct FreeListBaseline {
    /// Free blocks sorted by (size, address).
    free_by_size: Vec<(u64, u64)>,
    /// Free blocks sorted by address: (address, size).
    free_by_addr: Vec<(u64, u64)>,
    live: HashMap<u64, u64>,
    next_segment: u64,
}

impl FreeListBaseline {
    fn new() -> Self {
        FreeListBaseline {
            free_by_size: Vec::new(),
            free_by_addr: Vec::new(),
            live: HashMap::new(),
            next_segment: 0x7f00_0000_0000,
        }
    }

    fn insert_free(&mut self, addr: u64, size: u64) {
        let i = self.free_by_size.partition_point(|&b| b < (size, addr));
        self.free_by_size.insert(i, (size, addr));
        let j = self.free_by_addr.partition_point(|&b| b.0 < addr);
        self.free_by_addr.insert(j, (addr, size));
    }

    fn remove_free(&mut self, addr: u64, size: u64) {
        let i = self.free_by_size.partition_point(|&b| b < (size, addr));
        self.free_by_size.remove(i);
        let j = self.free_by_addr.partition_point(|&b| b.0 < addr);
        self.free_by_addr.remove(j);
    }
}

impl PairAllocator for FreeListBaseline {
    fn alloc(&mut self, size: u64) -> u64 {
        let rounded = size.div_ceil(512) * 512;
        let i = self.free_by_size.partition_point(|&b| b.0 < rounded);
        let (block_size, addr) = match self.free_by_size.get(i) {
            Some(&(s, a)) => {
                self.remove_free(a, s);
                (s, a)
            }
            None => {
                let a = self.next_segment;
                self.next_segment += 2 << 20;
                (2 << 20, a)
            }
        };
        if block_size - rounded >= 512 {
            self.insert_free(addr + rounded, block_size - rounded);
        }
        let size = if block_size - rounded >= 512 {
            rounded
        } else {
            block_size
        };
        self.live.insert(addr, size);
        addr
    }

    fn free(&mut self, ptr: u64) {
        let Some(mut size) = self.live.remove(&ptr) else {
            return;
        };
        let mut addr = ptr;
        let j = self.free_by_addr.partition_point(|&b| b.0 < addr);
        if let Some(&(next_addr, next_size)) = self.free_by_addr.get(j) {
            if next_addr == addr + size {
                self.remove_free(next_addr, next_size);
                size += next_size;
            }
        }
        if j > 0 {
            if let Some(&(prev_addr, prev_size)) = self.free_by_addr.get(j - 1) {
                if prev_addr + prev_size == addr {
                    self.remove_free(prev_addr, prev_size);
                    addr = prev_addr;
                    size += prev_size;
                }
            }
        }
        self.insert_free(addr, size);
    }
}

struct Caching(CachingAllocator<SimulatedDevice>);

impl PairAllocator for Caching {
    fn alloc(&mut self, size: u64) -> u64 {
        self.0.malloc(size, Stream(0)).unwrap_or(0)
    }
    fn free(&mut self, ptr: u64) {
        let _ = self.0.free(ptr);
    }
}

/// Nanoseconds this thread has run on a CPU (`/proc/thread-self/schedstat`, Linux), or
/// `None`. Unlike wall time it leaves out the time other processes hold the CPU.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Which clock the pairs are timed with: `MEMSNAP_BENCH_CLOCK=cpu` for on-CPU time
/// (steadier on a loaded machine), wall time otherwise.
fn cpu_clock() -> bool {
    std::env::var("MEMSNAP_BENCH_CLOCK").is_ok_and(|c| c == "cpu") && thread_cpu_ns().is_some()
}

/// Steady state: `LIVE` blocks alive; each iteration frees the oldest and allocates a new one.
#[inline(never)]
fn run_pairs(a: &mut dyn PairAllocator, pairs: usize) -> f64 {
    let mut ring: Vec<u64> = (0..LIVE).map(|i| a.alloc(size_at(i))).collect();
    let cpu = cpu_clock();
    let cpu_start = if cpu { thread_cpu_ns() } else { None };
    let start = Instant::now();
    for i in 0..pairs {
        let slot = i % LIVE;
        a.free(ring[slot]);
        ring[slot] = a.alloc(size_at(i + LIVE));
    }
    let wall_ns = start.elapsed().as_nanos() as f64;
    let ns = match (cpu_start, thread_cpu_ns()) {
        (Some(s), Some(e)) if cpu => e.saturating_sub(s) as f64,
        _ => wall_ns,
    } / pairs as f64;
    for p in ring {
        a.free(p);
    }
    black_box(ns)
}

#[inline(never)]
fn at_depth(depth: usize, a: &mut dyn PairAllocator, pairs: usize) -> f64 {
    if depth == 0 {
        run_pairs(a, pairs)
    } else {
        black_box(at_depth(black_box(depth - 1), a, pairs))
    }
}

#[inline(never)]
fn fp_depth_at(depth: usize) -> usize {
    if depth == 0 {
        let mut buf = [0usize; 128];
        walk_frame_pointers(&mut buf)
    } else {
        black_box(fp_depth_at(black_box(depth - 1)))
    }
}

#[inline(never)]
fn check_at(depth: usize) -> Option<FramePointerCheck> {
    if depth == 0 {
        check_frame_pointers()
    } else {
        black_box(check_at(black_box(depth - 1)))
    }
}

/// `history` with one live listener attached (`serve_live` on a unix socket): a thread that
/// reads every frame, decodes it and counts the entries it received.
struct CachingLive {
    alloc: std::sync::Arc<CachingAllocator<SimulatedDevice>>,
    server: Option<memsnap_recorder::LiveServer>,
    reader: Option<std::thread::JoinHandle<(u64, f64)>>,
    _dir: std::path::PathBuf,
}

impl CachingLive {
    fn new(history: HistoryOptions) -> Self {
        use memsnap_format::live::{FrameReader, Message};
        use std::io::Read;
        let alloc = std::sync::Arc::new(CachingAllocator::new(SimulatedDevice::new(80 << 30)));
        alloc.record_memory_history(history);
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "memsnap-bench-live-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let server = alloc
            .serve_live(&format!("unix:{}", path.display()))
            .unwrap();
        let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let reader = std::thread::spawn(move || {
            let mut frames = FrameReader::new();
            let mut buf = vec![0; 1 << 16];
            let mut entries = 0u64;
            let mut first: Option<std::time::Instant> = None;
            let mut last = std::time::Instant::now();
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                frames.push(&buf[..n]);
                while let Ok(Some(m)) = frames.next_message() {
                    if let Message::Entries(b) = m {
                        entries += b.entries.len() as u64;
                        first.get_or_insert_with(std::time::Instant::now);
                        last = std::time::Instant::now();
                    }
                }
            }
            let secs = first.map_or(0.0, |f| (last - f).as_secs_f64());
            (entries, secs)
        });
        CachingLive {
            alloc,
            server: Some(server),
            reader: Some(reader),
            _dir: dir,
        }
    }
}

impl Drop for CachingLive {
    fn drop(&mut self) {
        // Let the listener catch up (for the entries/s line), then stop it.
        let recorded = self.alloc.recorded_entries();
        let start = std::time::Instant::now();
        if let Some(server) = self.server.take() {
            while server
                .counters()
                .entries_sent
                .load(std::sync::atomic::Ordering::Relaxed)
                + server
                    .counters()
                    .entries_dropped
                    .load(std::sync::atomic::Ordering::Relaxed)
                < recorded
                && start.elapsed() < std::time::Duration::from_secs(10)
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let dropped = server
                .counters()
                .entries_dropped
                .load(std::sync::atomic::Ordering::Relaxed);
            drop(server);
            let (received, secs) = self
                .reader
                .take()
                .and_then(|r| r.join().ok())
                .unwrap_or_default();
            if std::env::var_os("MEMSNAP_BENCH_LIVE_VERBOSE").is_some() {
                eprintln!(
                    "listener: {received} of {recorded} entries received ({:.2} M entries/s from the first batch to the last), {dropped} dropped",
                    received as f64 / secs.max(1e-9) / 1e6
                );
            }
        }
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

impl PairAllocator for CachingLive {
    fn alloc(&mut self, size: u64) -> u64 {
        self.alloc.malloc(size, Stream(0)).unwrap_or(0)
    }
    fn free(&mut self, ptr: u64) {
        let _ = self.alloc.free(ptr);
    }
}

fn caching(history: Option<HistoryOptions>) -> Caching {
    let a = CachingAllocator::new(SimulatedDevice::new(80 << 30));
    if let Some(options) = history {
        a.record_memory_history(options);
    }
    Caching(a)
}

fn main() {
    // `MEMSNAP_BENCH_MAX_ENTRIES` changes the ring size (100,000 entries by default: larger
    // than the caches, like a real recording).
    let max_entries = std::env::var("MEMSNAP_BENCH_MAX_ENTRIES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let history = HistoryOptions {
        max_entries,
        ..HistoryOptions::without_stacks()
    };
    let stacks = move |unwinder| HistoryOptions {
        context: ContextMode::All,
        stacks: StackMode::Native,
        unwinder,
        ..history
    };
    type Make = Box<dyn Fn() -> Box<dyn PairAllocator>>;
    let configs: Vec<(&str, usize, Make)> = vec![
        (
            "baseline-freelist",
            PAIRS,
            Box::new(|| Box::new(FreeListBaseline::new())),
        ),
        ("history-off", PAIRS, Box::new(|| Box::new(caching(None)))),
        (
            "history",
            PAIRS,
            Box::new(move || Box::new(caching(Some(history)))),
        ),
        (
            "history+listener",
            PAIRS,
            Box::new(move || Box::new(CachingLive::new(history))),
        ),
        (
            "history+stacks-fp",
            STACK_PAIRS,
            Box::new(move || Box::new(caching(Some(stacks(Unwinder::FramePointers))))),
        ),
        (
            "history+stacks-backtrace",
            STACK_PAIRS / 4,
            Box::new(move || Box::new(caching(Some(stacks(Unwinder::Backtrace))))),
        ),
        (
            "history+stacks-libgcc",
            STACK_PAIRS / 4,
            Box::new(move || Box::new(caching(Some(stacks(Unwinder::Libgcc))))),
        ),
        (
            "history-manual-clock",
            PAIRS,
            Box::new(move || {
                let a = caching(Some(history));
                a.0.use_manual_clock(0);
                Box::new(a)
            }),
        ),
    ];
    // `MEMSNAP_BENCH_ONLY=history-off` runs one configuration (for profiling).
    if let Ok(only) = std::env::var("MEMSNAP_BENCH_ONLY") {
        for (name, pairs, make) in &configs {
            if *name == only {
                let ns = (0..ROUNDS * 4)
                    .map(|_| at_depth(DEPTH, make().as_mut(), *pairs))
                    .fold(f64::INFINITY, f64::min);
                println!("{name}: {ns:.1} ns/pair");
            }
        }
        return;
    }
    // Best of ROUNDS (or `MEMSNAP_BENCH_ROUNDS`), configurations interleaved so drift hits all
    // of them alike.
    let rounds = std::env::var("MEMSNAP_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS)
        .max(1);
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        println!(
            "best of {rounds} rounds; load average {}; {} time",
            load.join(" "),
            if cpu_clock() { "on-CPU" } else { "wall" }
        );
    }
    let mut best = vec![f64::INFINITY; configs.len()];
    for _ in 0..rounds {
        for (i, (_, pairs, make)) in configs.iter().enumerate() {
            let mut a = make();
            best[i] = best[i].min(at_depth(DEPTH, a.as_mut(), *pairs));
        }
    }
    let off = best[1];
    println!("baseline-freelist: {:.1} ns/pair", best[0]);
    for (i, (name, _, _)) in configs.iter().enumerate().skip(1) {
        println!(
            "{name}: {:.1} ns/pair ({:.2} x history-off)",
            best[i],
            best[i] / off
        );
    }
    println!(
        "history-off vs baseline-freelist: {:.2} x (target <= 2)",
        off / best[0]
    );
    // The manual clock reads a field: the difference is what the two clock readings of a
    // pair cost where they are taken.
    let clock = best[2] - best[6];
    println!(
        "clock readings (history - history-manual-clock): {clock:.1} ns/pair ({:.2} x history-off)",
        clock / off
    );
    // Two stacks (malloc and free) are captured per pair.
    for (i, name) in [
        (3, "fp"),
        (4, "DWARF, rules cached per return address"),
        (5, "DWARF, libgcc for every frame"),
    ] {
        println!(
            "per captured stack ({name}): {:.0} ns",
            (best[i] - best[2]).max(0.0) / 2.0
        );
    }
    // What the walk misses against DWARF unwinding: std's prebuilt start-up frames (it has no
    // frame pointers), on the main thread and on a spawned one.
    for (thread, check) in [
        ("main thread", check_at(DEPTH)),
        (
            "spawned thread",
            std::thread::spawn(|| check_at(DEPTH)).join().ok().flatten(),
        ),
    ] {
        if let Some(c) = check {
            println!(
                "frame-pointer walk vs DWARF ({thread}): walked {} frames, DWARF {}, missed {}{}",
                c.walked,
                c.unwound,
                c.missed,
                if c.host_lacks_frame_pointers() {
                    " (this build lacks frame pointers)"
                } else {
                    ""
                }
            );
        }
    }
    let depth = fp_depth_at(DEPTH);
    if depth < DEPTH {
        println!(
            "note: the frame-pointer walk sees {depth} frames (expected > {DEPTH}): this build \
             lacks frame pointers, so history+stacks-fp fell back to DWARF unwinding; rerun with \
             RUSTFLAGS=\"-C force-frame-pointers=yes\""
        );
    } else {
        println!("frame-pointer walk depth: {depth} frames");
    }
}

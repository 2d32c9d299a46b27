//! ROCm allocation events → snapshot trace entries (see the module docs for the rules).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use memsnap_format::{Action, Block, BlockState, RecorderInfo, Segment, Snapshot, TraceEntry};

use super::{Import, Rank, RocmFormat};

/// What an event does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Alloc,
    Free,
}

/// The agent an event names, resolved to what the mapping needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Agent {
    /// A GPU, by ordinal (the snapshot's device).
    Gpu(i64),
    /// A CPU agent (host pool): skipped.
    Cpu,
    /// No agent (frees), or one the file does not describe.
    Unknown,
}

/// One allocation or free of a process, in the source's units.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    pub op: Op,
    pub address: u64,
    /// Bytes; 0 on frees (the allocation's size is used).
    pub size: u64,
    pub agent: Agent,
    /// ns, CLOCK_BOOTTIME: the end of an allocation call, the start of a free call.
    pub time_ns: i64,
    pub stream: i64,
    /// Where the event is in the input (a line, record index or row id), for warnings.
    pub place: u64,
}

/// One process's events, before mapping.
#[derive(Clone, Debug, Default)]
pub(crate) struct Process {
    pub label: String,
    pub events: Vec<Event>,
}

/// Something the import skipped or guessed; the import itself went on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Warning {
    /// Frees of addresses the trace never allocated (allocated before tracing began): their
    /// size is unknown, so they were skipped. `place` is the first one's (`line 17`, ...).
    UnmatchedFrees {
        path: PathBuf,
        rank: String,
        count: u64,
        first_address: u64,
        first_place: String,
    },
    /// An address allocated again while live (a lost free): the first allocation is freed
    /// at the second's time.
    AllocatedTwice {
        path: PathBuf,
        rank: String,
        address: u64,
        place: String,
    },
    /// Allocations whose agent the file does not describe as CPU or GPU (or as a GPU of an
    /// ordinal beyond 65535): skipped.
    UnknownAgent {
        path: PathBuf,
        rank: String,
        count: u64,
        first_place: String,
    },
    /// No `<pid>_agent_info.csv` beside the CSV: `Agent N` was taken as device N, which is
    /// wrong where CPU agents come first (GPU 0 is then often `Agent 2`).
    NoAgentInfo { path: PathBuf, expected: PathBuf },
    /// Scratch-memory rows (`level = 'SCRATCH'`), not allocations of the program: skipped.
    SkippedScratch { path: PathBuf, rows: u64 },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::UnmatchedFrees {
                path,
                rank,
                count,
                first_address,
                first_place,
            } => write!(
                f,
                "{}: {rank}: skipped {count} free(s) of memory allocated before the trace began \
                 (first: {first_address:#x} at {first_place})",
                path.display()
            ),
            Warning::AllocatedTwice {
                path,
                rank,
                address,
                place,
            } => write!(
                f,
                "{}: {rank}: {address:#x} allocated again at {place} without a free in between \
                 (the first allocation ends there)",
                path.display()
            ),
            Warning::UnknownAgent {
                path,
                rank,
                count,
                first_place,
            } => write!(
                f,
                "{}: {rank}: skipped {count} allocation(s) on an agent the file does not \
                 describe (first at {first_place})",
                path.display()
            ),
            Warning::NoAgentInfo { path, expected } => write!(
                f,
                "{}: no {} beside it: `Agent N` is taken as GPU N (CPU agents usually come \
                 first, so devices may be off by the CPU count)",
                path.display(),
                expected.file_name().map_or_else(
                    || expected.display().to_string(),
                    |n| n.to_string_lossy().into_owned()
                )
            ),
            Warning::SkippedScratch { path, rows } => write!(
                f,
                "{}: skipped {rows} scratch-memory row(s) (level SCRATCH)",
                path.display()
            ),
        }
    }
}

/// GPU ordinals from the file at or beyond this are taken as damage (one trace per ordinal
/// would be allocated): their allocations are skipped as of an unknown agent.
const MAX_GPU_ORDINAL: i64 = 1 << 16;

/// Live allocation: `None` device for CPU allocations (their frees are skipped silently).
#[derive(Clone, Copy)]
struct Live {
    device: Option<i64>,
    size: u64,
    stream: i64,
}

/// Maps every process and sorts the ranks by label.
pub(crate) fn build(
    format: RocmFormat,
    path: &Path,
    place_kind: &str,
    processes: Vec<Process>,
    mut warnings: Vec<Warning>,
) -> Import {
    let mut ranks: Vec<Rank> = processes
        .into_iter()
        .map(|p| map_process(format, path, place_kind, p, &mut warnings))
        .collect();
    ranks.sort_by_key(|r| natural_key(&r.label));
    Import {
        format,
        ranks,
        warnings,
    }
}

/// Label order with numbers compared as numbers (`host/99` before `host/100`).
pub(crate) fn natural_key(label: &str) -> (String, u64, String) {
    match label.rsplit_once('/') {
        Some((host, pid)) => match pid.parse() {
            Ok(n) => (host.to_string(), n, String::new()),
            Err(_) => (host.to_string(), 0, pid.to_string()),
        },
        None => (label.to_string(), 0, String::new()),
    }
}

fn map_process(
    format: RocmFormat,
    path: &Path,
    place_kind: &str,
    mut process: Process,
    warnings: &mut Vec<Warning>,
) -> Rank {
    // Records come per thread and per buffer flush: put them in time order (stable, so
    // equal times keep the file's order).
    process.events.sort_by_key(|e| e.time_ns);
    let rank = process.label;
    let place = |p: u64| format!("{place_kind} {p}");

    let mut live: HashMap<u64, Live> = HashMap::new();
    let mut traces: Vec<Vec<TraceEntry>> = Vec::new();
    let mut unmatched: Option<(u64, u64, u64)> = None; // count, first address, first place
    let mut unknown_agent: Option<(u64, u64)> = None; // count, first place
    let entry = |action, addr, size, stream, time_ns: i64| {
        let mut e = TraceEntry::new(action, addr, size, stream);
        e.set_time_us(Some(time_ns.div_euclid(1000)));
        e
    };
    let trace_of = |traces: &mut Vec<Vec<TraceEntry>>, device: i64| -> usize {
        let d = usize::try_from(device).unwrap_or(0);
        if traces.len() <= d {
            traces.resize_with(d + 1, Vec::new);
        }
        d
    };
    let free_entries = |trace: &mut Vec<TraceEntry>, addr, l: Live, time_ns| {
        trace.push(entry(
            Action::FreeRequested,
            addr,
            l.size,
            l.stream,
            time_ns,
        ));
        trace.push(entry(
            Action::FreeCompleted,
            addr,
            l.size,
            l.stream,
            time_ns,
        ));
        trace.push(entry(Action::SegmentFree, addr, l.size, l.stream, time_ns));
    };

    for event in &process.events {
        match event.op {
            Op::Alloc => {
                let device = match event.agent {
                    Agent::Gpu(d) if (0..MAX_GPU_ORDINAL).contains(&d) => Some(d),
                    Agent::Cpu => None,
                    Agent::Gpu(_) | Agent::Unknown => {
                        let u = unknown_agent.get_or_insert((0, event.place));
                        u.0 += 1;
                        continue;
                    }
                };
                let new = Live {
                    device,
                    size: event.size,
                    stream: event.stream,
                };
                if let Some(old) = live.insert(event.address, new) {
                    if let Some(d) = old.device {
                        warnings.push(Warning::AllocatedTwice {
                            path: path.to_path_buf(),
                            rank: rank.clone(),
                            address: event.address,
                            place: place(event.place),
                        });
                        let t = trace_of(&mut traces, d);
                        free_entries(&mut traces[t], event.address, old, event.time_ns);
                    }
                }
                if let Some(d) = device {
                    let t = trace_of(&mut traces, d);
                    let (addr, size, stream) = (event.address, event.size, event.stream);
                    traces[t].push(entry(
                        Action::SegmentAlloc,
                        addr,
                        size,
                        stream,
                        event.time_ns,
                    ));
                    traces[t].push(entry(Action::Alloc, addr, size, stream, event.time_ns));
                }
            }
            Op::Free => {
                if event.address == 0 {
                    continue; // hipStreamDestroy frees null
                }
                match live.remove(&event.address) {
                    Some(l) => {
                        if let Some(d) = l.device {
                            let t = trace_of(&mut traces, d);
                            free_entries(&mut traces[t], event.address, l, event.time_ns);
                        }
                    }
                    None => {
                        let u = unmatched.get_or_insert((0, event.address, event.place));
                        u.0 += 1;
                    }
                }
            }
        }
    }

    if let Some((count, first_address, first)) = unmatched {
        warnings.push(Warning::UnmatchedFrees {
            path: path.to_path_buf(),
            rank: rank.clone(),
            count,
            first_address,
            first_place: place(first),
        });
    }
    if let Some((count, first)) = unknown_agent {
        warnings.push(Warning::UnknownAgent {
            path: path.to_path_buf(),
            rank: rank.clone(),
            count,
            first_place: place(first),
        });
    }

    // What is still allocated at the end is the snapshot's memory.
    let mut segments: Vec<Segment> = live
        .iter()
        .filter_map(|(&addr, l)| {
            let device = l.device?;
            let mut seg = Segment::new(device, addr, l.size, l.stream);
            seg.allocated_size = Some(l.size);
            seg.active_size = Some(l.size);
            seg.requested_size = Some(l.size);
            seg.blocks = vec![Block::new(addr, l.size, BlockState::ActiveAllocated)];
            Some(seg)
        })
        .collect();
    segments.sort_by_key(|s| (s.device, s.address));

    let devices: Vec<i64> = traces
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .map(|(d, _)| d as i64)
        .collect();
    let mut snapshot = Snapshot::new(traces.len());
    snapshot.device_traces = Some(traces);
    snapshot.segments = segments;
    let mut info = RecorderInfo {
        producer: producer(format, &rank, None),
        ..Default::default()
    };
    info.set_sources(&driver_only_sources(&snapshot));
    snapshot.recorder_info = Some(info);
    Rank {
        label: rank,
        devices,
        snapshot,
    }
}

/// The producer line: what the snapshot came from and which clock its times use.
fn producer(format: RocmFormat, rank: &str, devices: Option<&str>) -> String {
    let mut s = format!(
        "memsnap import of {format} ({rank}); times: CLOCK_BOOTTIME µs since boot, not epoch"
    );
    if let Some(devices) = devices {
        s.push_str("; devices: ");
        s.push_str(devices);
    }
    s
}

/// All ranks in one snapshot: device `d` is the `d`-th (rank, GPU) pair. O(s log s + e) in
/// the segments and trace entries.
pub(crate) fn merge_ranks(format: RocmFormat, mut ranks: Vec<Rank>) -> Snapshot {
    if ranks.len() == 1 {
        if let Some(rank) = ranks.pop() {
            return rank.snapshot;
        }
    }
    let mut traces = Vec::new();
    let mut segments = Vec::new();
    let mut names = Vec::new();
    for rank in ranks {
        let used: BTreeSet<i64> = rank
            .devices
            .iter()
            .copied()
            .chain(rank.snapshot.segments.iter().map(|s| s.device))
            .collect();
        let mut rank_traces = rank.snapshot.device_traces.unwrap_or_default();
        // Each GPU's segments in file order, grouped once (a scan of all segments per GPU was
        // O(GPUs × segments), and a file can name up to 2^16 GPUs).
        let mut segments_of: BTreeMap<i64, Vec<&Segment>> = BTreeMap::new();
        for seg in &rank.snapshot.segments {
            segments_of.entry(seg.device).or_default().push(seg);
        }
        for gpu in used {
            let new_device = traces.len() as i64;
            names.push(format!("{new_device} = {} GPU {gpu}", rank.label));
            let trace = usize::try_from(gpu)
                .ok()
                .and_then(|g| rank_traces.get_mut(g))
                .map(std::mem::take)
                .unwrap_or_default();
            traces.push(trace);
            for &seg in segments_of.get(&gpu).into_iter().flatten() {
                let mut seg = seg.clone();
                seg.device = new_device;
                segments.push(seg);
            }
        }
    }
    let mut snapshot = Snapshot::new(traces.len());
    snapshot.device_traces = Some(traces);
    snapshot.segments = segments;
    let mut info = RecorderInfo {
        producer: producer(format, "several processes", Some(&names.join(", "))),
        ..Default::default()
    };
    info.set_sources(&driver_only_sources(&snapshot));
    snapshot.recorder_info = Some(info);
    snapshot
}

/// rocprofv3 records the driver's allocations (`hipMalloc` and kin): under PyTorch's caching
/// allocator those are its segments, reserved memory, and the tensors inside them are not in
/// the trace. Each device's source says so (`allocated_known: false`), so that views call
/// what they show reserved memory and the allocated bytes unknown, not equal to it.
fn driver_only_sources(snapshot: &Snapshot) -> Vec<memsnap_format::SourceInfo> {
    (0..snapshot.traces().len() as i64)
        .map(|device| memsnap_format::SourceInfo {
            allocated_known: false,
            ..memsnap_format::SourceInfo::new(device, "rocprofv3")
        })
        .collect()
}

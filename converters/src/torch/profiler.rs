//! torch.profiler's `[memory]` events into trace entries (see the [module docs](super)).

use foldhash::HashMap;
use serde::Deserialize;

use memsnap_format::{
    Action, Frame, RecorderInfo, Snapshot, SourceInfo, StackId, Steps, TraceEntry,
};

use super::{
    integer, micros_to_ns, DeviceReport, Event, ImportReport, Imported, TraceDoc, TraceError,
};

/// `c10::DeviceType::CPU`.
const DEVICE_TYPE_CPU: i64 = 0;

/// The categories of `X` slices whose names make stack frames.
const STACK_CATEGORIES: [&str; 3] = ["python_function", "cpu_op", "user_annotation"];

/// The args of a `[memory]` / `[OutOfMemory]` event (PyTorch's names).
#[derive(Deserialize)]
struct MemoryArgs {
    #[serde(rename = "Device Type", default)]
    device_type: Option<serde_json::Value>,
    #[serde(rename = "Device Id", default)]
    device_id: Option<serde_json::Value>,
    #[serde(rename = "Addr", default)]
    addr: Option<serde_json::Value>,
    #[serde(rename = "Bytes", default)]
    bytes: Option<serde_json::Value>,
    #[serde(rename = "Total Allocated", default)]
    total_allocated: Option<serde_json::Value>,
    #[serde(rename = "Total Reserved", default)]
    total_reserved: Option<serde_json::Value>,
    #[serde(rename = "Ev Idx", default)]
    ev_idx: Option<serde_json::Value>,
}

/// One memory event, decoded.
struct Memory {
    /// Index in `traceEvents`.
    index: usize,
    oom: bool,
    device: i64,
    addr: u64,
    bytes: i128,
    total_allocated: Option<i128>,
    total_reserved: Option<i128>,
    ev_idx: i128,
    time_ns: i128,
    stack: Option<StackId>,
}

fn is_memory(e: &Event) -> bool {
    matches!(e.name.as_deref(), Some("[memory]" | "[OutOfMemory]"))
}

/// Imports the `[memory]` events of a torch.profiler trace.
pub(crate) fn import(doc: &TraceDoc) -> Result<Imported, TraceError> {
    let mut memory = Vec::new();
    let mut cpu = 0usize;
    let mut unknown_device = 0usize;
    let mut first_unknown_device = None;
    for (index, event) in doc.events.iter().enumerate() {
        if !is_memory(event) {
            continue;
        }
        let bad = |what: String| TraceError::BadEvent { index, what };
        let oom = event.name.as_deref() == Some("[OutOfMemory]");
        let args: MemoryArgs = match &event.args {
            Some(raw) => serde_json::from_str(raw.get()).map_err(|e| {
                bad(format!(
                    "args of {}: {e}",
                    event.name.as_deref().unwrap_or("")
                ))
            })?,
            None => return Err(bad("a memory event without args".into())),
        };
        let int = |v: &Option<serde_json::Value>, key: &str| -> Result<Option<i128>, TraceError> {
            match v {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => integer(v)
                    .map(Some)
                    .ok_or_else(|| bad(format!("\"{key}\" is not an integer: {v}"))),
            }
        };
        let device_type = int(&args.device_type, "Device Type")?;
        let device_id = int(&args.device_id, "Device Id")?;
        if device_type == Some(i128::from(DEVICE_TYPE_CPU)) {
            cpu += 1;
            continue;
        }
        let Some(device) = device_id
            .and_then(|d| i64::try_from(d).ok())
            .filter(|d| (0..1 << 16).contains(d))
        else {
            unknown_device += 1;
            first_unknown_device.get_or_insert(index);
            continue;
        };
        let bytes = int(&args.bytes, "Bytes")?.ok_or_else(|| bad("no \"Bytes\"".into()))?;
        let addr = match int(&args.addr, "Addr")? {
            // intptr_t: negative values are the same bits.
            Some(a) => a as u64,
            None if oom => 0,
            None => return Err(TraceError::NoAddresses { index }),
        };
        let time_ns = event
            .ts
            .as_ref()
            .and_then(micros_to_ns)
            .ok_or_else(|| bad("no numeric \"ts\"".into()))?;
        let time_ns = match doc.base_time_ns {
            Some(base) => base + time_ns,
            None => time_ns,
        };
        memory.push(Memory {
            index,
            oom,
            device,
            addr,
            bytes,
            total_allocated: int(&args.total_allocated, "Total Allocated")?,
            total_reserved: int(&args.total_reserved, "Total Reserved")?,
            ev_idx: int(&args.ev_idx, "Ev Idx")?.unwrap_or(0),
            time_ns,
            stack: None,
        });
    }
    if memory.is_empty() {
        if let Some(index) = first_unknown_device {
            return Err(TraceError::BadEvent {
                index,
                what: format!(
                    "{unknown_device} GPU [memory] events, none with a usable \"Device Id\" (0..65535)"
                ),
            });
        }
        if cpu > 0 {
            return Err(TraceError::OnlyCpu { cpu });
        }
        return Err(TraceError::NoMemoryEvents {
            events: doc.events.len(),
        });
    }

    let mut snapshot = Snapshot::new(0);
    let with_stacks = attach_stacks(doc, &mut memory, &mut snapshot);

    // Per device, in time order (ties: Kineto's event index, then file order).
    memory.sort_by_key(|m| (m.device, m.time_ns, m.ev_idx, m.index));
    let devices = memory.last().map_or(0, |m| m.device as usize + 1);
    let mut traces = vec![Vec::new(); devices];
    let mut report = ImportReport {
        format: "torch.profiler trace".into(),
        rank: rank_of(doc),
        ..ImportReport::default()
    };
    let mut pre_window = (0u64, 0u128);
    let mut unattributed = 0u128;
    let mut over_counted = 0u64;
    let mut reused = 0u64;
    let mut size_mismatch = 0u64;
    let mut peak_reserved: Option<(i64, i128)> = None;
    let mut sources = Vec::new();
    for chunk in memory.chunk_by(|a, b| a.device == b.device) {
        let device = chunk[0].device;
        let start_us = time_us(chunk[0].time_ns);
        let mut before = Vec::new();
        let mut entries = Vec::with_capacity(chunk.len() * 2);
        let mut live: HashMap<u64, u64> = HashMap::default();
        let mut stats = DeviceReport {
            device,
            ..DeviceReport::default()
        };
        let mut pre_window_bytes = 0u128;
        // Per event: the index in `entries` of its last entry, the change it makes to the
        // blocks' allocated bytes, and the allocator's totals after it.
        let mut totals: Vec<(usize, i128, Option<i128>, Option<i128>)> =
            Vec::with_capacity(chunk.len());
        let entry = |action, addr, size, m: &Memory| {
            let mut e = TraceEntry::new(action, addr, size, 0);
            e.set_time_us(Some(time_us(m.time_ns)));
            e.frames = m.stack;
            e
        };
        for m in chunk {
            if let Some(r) = m.total_reserved {
                if peak_reserved.is_none_or(|(_, p)| r > p) {
                    peak_reserved = Some((device, r));
                }
            }
            let size = u64::try_from(m.bytes.unsigned_abs()).unwrap_or(u64::MAX);
            let mut delta = 0i128;
            if m.oom {
                let mut e = entry(Action::Oom, 0, size, m);
                let rare = e.rare_mut();
                rare.no_addr = true;
                rare.device_free = Some(0);
                entries.push(e);
                stats.ooms += 1;
            } else if m.bytes > 0 {
                if let Some(old) = live.insert(m.addr, size) {
                    // The free was not recorded: close the old block here.
                    reused += 1;
                    delta -= i128::from(old);
                    entries.push(entry(Action::FreeRequested, m.addr, old, m));
                    entries.push(entry(Action::FreeCompleted, m.addr, old, m));
                }
                delta += i128::from(size);
                entries.push(entry(Action::Alloc, m.addr, size, m));
                stats.allocs += 1;
                stats.with_stack += u64::from(m.stack.is_some());
            } else if m.bytes < 0 {
                match live.remove(&m.addr) {
                    Some(alloc_size) => {
                        size_mismatch += u64::from(alloc_size != size);
                        // The replay closes the block it opened, whatever this free says.
                        delta -= i128::from(alloc_size);
                    }
                    None => {
                        // Allocated before the profile: its alloc goes at the start.
                        let mut e = TraceEntry::new(Action::Alloc, m.addr, size, 0);
                        e.set_time_us(Some(start_us));
                        before.push(e);
                        pre_window.0 += 1;
                        pre_window_bytes += u128::from(size);
                        delta -= i128::from(size);
                    }
                }
                entries.push(entry(Action::FreeRequested, m.addr, size, m));
                entries.push(entry(Action::FreeCompleted, m.addr, size, m));
                stats.frees += 1;
            } else {
                // `Bytes` 0: nothing to replay, but its totals still count.
                continue;
            }
            totals.push((
                entries.len() - 1,
                delta,
                m.total_allocated,
                m.total_reserved,
            ));
        }
        pre_window.1 += pre_window_bytes;
        let offset = before.len();
        let (source, over) = source_info(device, offset, pre_window_bytes, &totals);
        over_counted += over;
        if let Some(u) = &source.unattributed {
            unattributed += u128::from(u.before);
        }
        sources.push(source);
        before.append(&mut entries);
        stats.entries = before.len();
        traces[device as usize] = before;
        report.devices.push(stats);
    }
    snapshot.device_traces = Some(traces);
    let mut info = RecorderInfo {
        producer: "memsnap import of a torch.profiler trace".into(),
        ..RecorderInfo::default()
    };
    info.set_sources(&sources);
    snapshot.recorder_info = Some(info);

    let w = &mut report.warnings;
    w.push(
        "sizes are the caching allocator's rounded block sizes (multiples of 512), not the \
         requested sizes; streams are unknown (0)"
            .into(),
    );
    if pre_window.0 > 0 {
        w.push(format!(
            "{} frees of blocks allocated before the profile ({} bytes): their allocs are placed at the profile's start",
            pre_window.0, pre_window.1
        ));
    }
    if unattributed > 0 {
        w.push(format!(
            "{unattributed} bytes were live before the profile and not freed in it: kept as \
             memory from before the profile, unattributed (no block, no stack)"
        ));
    }
    if over_counted > 0 {
        w.push(format!(
            "{over_counted} events where the blocks seen add up to more than Total Allocated \
             (the unattributed memory is taken as 0 there)"
        ));
    }
    if reused > 0 {
        w.push(format!(
            "{reused} allocations at an address still live (its free is missing): the old block was closed there"
        ));
    }
    if size_mismatch > 0 {
        w.push(format!(
            "{size_mismatch} frees whose size differs from their alloc's"
        ));
    }
    if cpu > 0 {
        w.push(format!("{cpu} CPU memory events (Device Type 0) skipped"));
    }
    if unknown_device > 0 {
        w.push(format!(
            "{unknown_device} memory events without a usable Device Id skipped"
        ));
    }
    if with_stacks == 0 {
        w.push(
            "no enclosing python_function/cpu_op slices: no stacks (record with with_stack=True)"
                .into(),
        );
    }
    if let Some((device, reserved)) = peak_reserved {
        w.push(format!(
            "Total Reserved (peak {reserved} bytes, device {device}) has no addresses: kept as \
             the reserved series, no segments imported"
        ));
    }
    Ok(Imported { snapshot, report })
}

/// The allocator's totals of one device as series over its entries: `Total Allocated` minus
/// the blocks the trace shows (the unattributed memory) and `Total Reserved`.
///
/// `totals` is, per event, the index (in the event entries, before the `offset` synthesized
/// allocs) of its last entry, its change to the blocks' bytes and the totals after it;
/// `pre_window` the bytes of the synthesized allocs. Returns the source and how many events
/// had the blocks above `Total Allocated`. O(events).
fn source_info(
    device: i64,
    offset: usize,
    pre_window: u128,
    totals: &[(usize, i128, Option<i128>, Option<i128>)],
) -> (SourceInfo, u64) {
    let mut source = SourceInfo::new(device, "torch.profiler");
    let mut blocks = i128::try_from(pre_window).unwrap_or(i128::MAX);
    let mut over = 0u64;
    let mut unattributed: Option<Steps> = None;
    let mut reserved: Option<Steps> = None;
    let clamp = |v: i128| u64::try_from(v.max(0)).unwrap_or(u64::MAX);
    let push = |series: &mut Option<Steps>, entry: u32, value: u64| match series {
        None => *series = Some(Steps::constant(value)),
        Some(s) => {
            let last = s.after.last().map_or(s.before, |&(_, v)| v);
            if last != value {
                s.after.push((entry, value));
            }
        }
    };
    for &(index, delta, allocated, total_reserved) in totals {
        blocks += delta;
        let entry = u32::try_from(index + offset).unwrap_or(u32::MAX);
        if let Some(total) = allocated {
            let u = total - blocks;
            over += u64::from(u < 0);
            push(&mut unattributed, entry, clamp(u));
        }
        if let Some(r) = total_reserved {
            push(&mut reserved, entry, clamp(r));
        }
    }
    source.unattributed = unattributed;
    source.reserved = reserved;
    (source, over)
}

fn time_us(ns: i128) -> i64 {
    i64::try_from(ns.div_euclid(1000)).unwrap_or(i64::MAX)
}

fn rank_of(doc: &TraceDoc) -> Option<i64> {
    let raw = doc.distributed_info.as_ref()?;
    let info: serde_json::Map<String, serde_json::Value> = serde_json::from_str(raw.get()).ok()?;
    integer(info.get("rank")?).and_then(|r| i64::try_from(r).ok())
}

/// `(pid, tid)` as written (numbers or strings).
type ThreadKey = (String, String);

/// An `X` slice: start and end (ns, the trace's relative clock) and its event index.
type Slice = (i128, i128, usize);

/// Gives each memory event the stack of the `X` slices enclosing it on its thread; returns
/// how many got one.
fn attach_stacks(doc: &TraceDoc, memory: &mut [Memory], snapshot: &mut Snapshot) -> usize {
    let key = |e: &Event| {
        (
            e.pid.as_ref().map(|v| v.to_string()).unwrap_or_default(),
            e.tid.as_ref().map(|v| v.to_string()).unwrap_or_default(),
        )
    };
    let mut wanted: HashMap<ThreadKey, Vec<usize>> = HashMap::default();
    for (i, m) in memory.iter().enumerate() {
        wanted.entry(key(&doc.events[m.index])).or_default().push(i);
    }
    // Slices per thread: (start, end, event index).
    let mut slices: HashMap<ThreadKey, Vec<Slice>> = HashMap::default();
    for (index, e) in doc.events.iter().enumerate() {
        if e.ph.as_deref() != Some("X")
            || !e
                .cat
                .as_deref()
                .is_some_and(|c| STACK_CATEGORIES.contains(&c))
        {
            continue;
        }
        let k = key(e);
        if !wanted.contains_key(&k) {
            continue;
        }
        let (Some(ts), Some(dur)) = (
            e.ts.as_ref().and_then(micros_to_ns),
            e.dur.as_ref().and_then(micros_to_ns),
        ) else {
            continue;
        };
        slices
            .entry(k)
            .or_default()
            .push((ts, ts + dur.max(0), index));
    }
    let mut frames_of: HashMap<usize, Frame> = HashMap::default();
    let mut count = 0;
    for (k, mut list) in slices {
        let Some(events) = wanted.get(&k) else {
            continue;
        };
        // Outer slices first at equal starts.
        list.sort_by_key(|&(s, e, i)| (s, std::cmp::Reverse(e), i));
        let mut order = events.clone();
        // Memory event times here are relative `ts` like the slices' (no base added).
        let rel = |m: &Memory| m.time_ns - doc.base_time_ns.unwrap_or(0);
        order.sort_by_key(|&i| rel(&memory[i]));
        let mut open: Vec<Slice> = Vec::new();
        let mut next = 0;
        for i in order {
            let t = rel(&memory[i]);
            while next < list.len() && list[next].0 <= t {
                let slice = list[next];
                while open.last().is_some_and(|o| o.1 < slice.0) {
                    open.pop();
                }
                open.push(slice);
                next += 1;
            }
            while open.last().is_some_and(|o| o.1 < t) {
                open.pop();
            }
            let enclosing: Vec<usize> = open
                .iter()
                .rev()
                .filter(|o| o.0 <= t && t <= o.1)
                .map(|o| o.2)
                .collect();
            if enclosing.is_empty() {
                continue;
            }
            let frames: Vec<Frame> = enclosing
                .iter()
                .map(|&e| {
                    frames_of
                        .entry(e)
                        .or_insert_with(|| frame_of(doc.events[e].name.as_deref().unwrap_or("")))
                        .clone()
                })
                .collect();
            memory[i].stack = Some(snapshot.intern_stack(frames));
            count += 1;
        }
    }
    count
}

/// A slice name as a frame: `torch/nn/modules/linear.py(124): forward` has a file and line;
/// op and module names (`aten::addmm`, `nn.Module: Linear_4`) are a name only.
pub(crate) fn frame_of(name: &str) -> Frame {
    if let Some((head, function)) = name.split_once("): ") {
        if let Some((file, line)) = head.rsplit_once('(') {
            if let Ok(line) = line.trim().parse::<i64>() {
                return Frame::new(function, file, line);
            }
        }
    }
    Frame::new(name, "", 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_function_names_become_file_line_and_name() {
        let f = frame_of("torch/nn/modules/linear.py(124): forward");
        assert_eq!(
            (f.filename.as_str(), f.name.as_str()),
            ("torch/nn/modules/linear.py", "forward")
        );
        assert_eq!(f.line.as_i64(), Some(124));
        let f = frame_of("nn.Module: Linear_4");
        assert_eq!(
            (f.filename.as_str(), f.name.as_str()),
            ("", "nn.Module: Linear_4")
        );
        let f = frame_of("<built-in method (x): y>");
        assert_eq!(f.filename, "");
    }
}

//! memsnap's own Chrome export back into a snapshot, exactly (see [`crate::chrome`]).

use foldhash::HashMap;
use serde::Deserialize;

use memsnap_format::{
    Action, Annotation, Frame, FrameId, PyInt, RecorderInfo, Snapshot, SourceInfo, TraceEntry,
};

use super::{micros_to_ns, DeviceReport, ImportReport, Imported, TraceDoc, TraceError};
use crate::chrome_layout::tid;

/// `otherData.memsnap`.
#[derive(Deserialize)]
pub(crate) struct Meta {
    version: u32,
    #[serde(default)]
    rank: Option<i64>,
    #[serde(default)]
    device_traces: Option<usize>,
    #[serde(default)]
    time_base: Option<i64>,
    devices: Vec<MetaDevice>,
    #[serde(default)]
    frames: Vec<(String, serde_json::Value, String)>,
    #[serde(default)]
    stacks: Vec<Vec<u32>>,
    /// What an import's source knew per device (unattributed memory, reserved series,
    /// categories), when the exported snapshot had it.
    #[serde(default)]
    sources: Vec<SourceInfo>,
    /// The allocator's final state (segments) and settings, as memsnap's JSON snapshot.
    #[serde(default)]
    state: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Deserialize)]
struct MetaDevice {
    device: i64,
    pid: i64,
    entries: usize,
    #[serde(default)]
    timed: bool,
}

/// A record: `[index, action, addr, size, stream, time_us, stack, device_free]`.
type Record = (
    usize,
    String,
    Option<u64>,
    u64,
    i64,
    Option<i64>,
    Option<u32>,
    Option<u64>,
);

#[derive(Deserialize)]
struct Carried {
    #[serde(default)]
    memsnap: Option<Vec<Record>>,
}

/// `otherData.memsnap` when the trace has it.
pub(crate) fn meta(doc: &TraceDoc) -> Result<Option<Meta>, TraceError> {
    let Some(raw) = &doc.other_data else {
        return Ok(None);
    };
    #[derive(Deserialize)]
    struct Other {
        #[serde(default)]
        memsnap: Option<Box<serde_json::value::RawValue>>,
    }
    let Ok(other) = serde_json::from_str::<Other>(raw.get()) else {
        return Ok(None);
    };
    let Some(raw) = other.memsnap else {
        return Ok(None);
    };
    serde_json::from_str(raw.get())
        .map(Some)
        .map_err(|e| TraceError::Own {
            what: format!("otherData.memsnap: {e}"),
        })
}

/// Rebuilds the snapshot memsnap exported.
pub(crate) fn import(doc: &TraceDoc, meta: Meta) -> Result<Imported, TraceError> {
    let own = |what: String| TraceError::Own { what };
    if meta.version != crate::chrome_layout::LAYOUT_VERSION {
        return Err(own(format!(
            "layout version {} (this memsnap reads {})",
            meta.version,
            crate::chrome_layout::LAYOUT_VERSION
        )));
    }
    let mut snapshot = Snapshot::default();
    let frame_ids: Vec<FrameId> = meta
        .frames
        .iter()
        .map(|(file, line, name)| {
            let line = match line {
                serde_json::Value::Number(n) => n
                    .as_i64()
                    .map(PyInt::from)
                    .or_else(|| n.as_u64().map(PyInt::from)),
                serde_json::Value::String(s) => PyInt::parse_decimal(s),
                _ => None,
            }
            .unwrap_or_default();
            snapshot
                .frames
                .intern(Frame::new(name.as_str(), file.as_str(), line))
        })
        .collect();
    let mut stack_ids = Vec::with_capacity(meta.stacks.len());
    for (i, stack) in meta.stacks.iter().enumerate() {
        let frames = stack
            .iter()
            .map(|&f| frame_ids.get(f as usize).copied())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| own(format!("stacks[{i}] names a frame that is not in frames")))?;
        stack_ids.push(snapshot.stacks.intern(&frames));
    }

    let by_pid: HashMap<i64, usize> = meta
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| (d.pid, i))
        .collect();
    let device_count = meta.device_traces.unwrap_or(0).max(
        meta.devices
            .iter()
            .map(|d| d.device as usize + 1)
            .max()
            .unwrap_or(0),
    );
    let mut slots: Vec<Vec<Option<TraceEntry>>> =
        meta.devices.iter().map(|d| vec![None; d.entries]).collect();
    let mut annotations = Vec::new();
    for (index, event) in doc.events.iter().enumerate() {
        let Some(pid) = event.pid.as_ref().and_then(|p| p.as_i64()) else {
            continue;
        };
        let Some(&d) = by_pid.get(&pid) else { continue };
        let ph = event.ph.as_deref().unwrap_or("");
        if matches!(ph, "B" | "E")
            && event.tid.as_ref().and_then(|t| t.as_i64()) == Some(tid::ANNOTATIONS)
        {
            if let Some(ns) = event.ts.as_ref().and_then(micros_to_ns) {
                let ns = ns + i128::from(meta.time_base.unwrap_or(0));
                annotations.push((
                    ns,
                    index,
                    Annotation::record(
                        ph != "B",
                        event.name.clone().unwrap_or_default(),
                        meta.devices[d].device,
                        i64::try_from(ns.div_euclid(1000)).unwrap_or(i64::MAX),
                    ),
                ));
            }
            continue;
        }
        let Some(args) = &event.args else { continue };
        let Ok(carried) = serde_json::from_str::<Carried>(args.get()) else {
            continue;
        };
        for (i, action, addr, size, stream, time_us, stack, device_free) in
            carried.memsnap.into_iter().flatten()
        {
            let bad = |what: &str| own(format!("traceEvents[{index}]: entry {i}: {what}"));
            let slot = slots[d]
                .get_mut(i)
                .ok_or_else(|| bad("index beyond the device's entry count"))?;
            if slot.is_some() {
                return Err(bad("carried twice"));
            }
            let known = Action::from_name(&action);
            let mut entry = TraceEntry::new(
                known.unwrap_or(Action::Other),
                addr.unwrap_or(0),
                size,
                stream,
            );
            if known.is_none() {
                entry.set_other_action(snapshot.strings.intern(&action));
            }
            entry.set_time_us(time_us);
            entry.frames = match stack {
                Some(s) => Some(
                    *stack_ids
                        .get(s as usize)
                        .ok_or_else(|| bad("stack id not in stacks"))?,
                ),
                None => None,
            };
            if addr.is_none() {
                entry.rare_mut().no_addr = true;
            }
            if device_free.is_some() {
                entry.rare_mut().device_free = device_free;
            }
            *slot = Some(entry);
        }
    }

    let mut traces = vec![Vec::new(); device_count];
    let mut report = ImportReport {
        format: "memsnap Chrome trace export".into(),
        rank: meta.rank,
        ..ImportReport::default()
    };
    for (d, slots) in slots.into_iter().enumerate() {
        let device = meta.devices[d].device;
        let entries: Vec<TraceEntry> = slots
            .into_iter()
            .enumerate()
            .map(|(i, e)| e.ok_or_else(|| own(format!("device {device}: entry {i} is missing"))))
            .collect::<Result<_, _>>()?;
        let mut stats = DeviceReport {
            device,
            entries: entries.len(),
            ..DeviceReport::default()
        };
        for e in &entries {
            match e.action {
                Action::Alloc => {
                    stats.allocs += 1;
                    stats.with_stack += u64::from(e.frames.is_some());
                }
                Action::FreeRequested | Action::Free => stats.frees += 1,
                Action::Oom => stats.ooms += 1,
                _ => {}
            }
        }
        if !meta.devices[d].timed && !entries.is_empty() {
            report
                .warnings
                .push(format!("device {device}: the trace has no times"));
        }
        if let Some(slot) = usize::try_from(device).ok().and_then(|i| traces.get_mut(i)) {
            *slot = entries;
        }
        report.devices.push(stats);
    }
    snapshot.device_traces = meta.device_traces.map(|_| traces);
    if !annotations.is_empty() {
        annotations.sort_by_key(|(ns, index, _)| (*ns, *index));
        snapshot.external_annotations = Some(annotations.into_iter().map(|(_, _, a)| a).collect());
    }
    if !meta.sources.is_empty() {
        let mut info = RecorderInfo {
            producer: "memsnap import of memsnap's Chrome export".into(),
            ..RecorderInfo::default()
        };
        info.set_sources(&meta.sources);
        snapshot.recorder_info = Some(info);
    }
    match &meta.state {
        Some(state) => {
            let (state, _) = memsnap_format::read_bytes(state.get().as_bytes())
                .map_err(|e| own(format!("otherData.memsnap.state: {e}")))?;
            adopt_state(&mut snapshot, state);
        }
        None => report.warnings.push(
            "segments (the allocator's final state) are not part of this export (written by \
             an older memsnap): the imported snapshot has the traces only"
                .into(),
        ),
    }
    Ok(Imported { snapshot, report })
}

/// Moves the exported state's segments and allocator settings into `snapshot`, their stacks
/// interned into its tables.
fn adopt_state(snapshot: &mut Snapshot, mut state: Snapshot) {
    let segments = std::mem::take(&mut state.segments);
    snapshot.add_segments_from(&state, segments);
    snapshot.allocator_settings = state.allocator_settings.take();
}

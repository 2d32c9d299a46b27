//! Snapshots of several allocators as one: [`merge_device_snapshots`].
//!
//! [`CachingAllocator::snapshot`](crate::CachingAllocator::snapshot) describes one device. A
//! process that runs one allocator per device (as the C ABI does) writes one file with every
//! device in it, as PyTorch's `torch.cuda.memory._snapshot()` does.

use memsnap_format::{Frame, Snapshot, StackId};

/// One snapshot of several devices: segments in the order given, one trace per device index
/// (each source's non-empty traces go to their own device's slot), dropped-entry counts
/// summed per device, the first source's recorder info and allocator settings, and every
/// source's annotations in time order.
///
/// Stacks, compile contexts and user metadata are interned again in the merged tables;
/// `restack` sees each distinct stack of each source once, on the way, and may rewrite it
/// (the C ABI drops its own frames from the top). Pass `|frames| frames` to keep them as they
/// are. O(entries + blocks + the frames of each source's distinct stacks): a stack is
/// re-interned once per source, not once per entry that uses it (it was, at some 50 µs an
/// entry: 7 s for each extra device of 125k entries).
///
/// ```
/// use memsnap_recorder::snapshot::merge_device_snapshots;
/// use memsnap_recorder::{CachingAllocator, HistoryOptions, SimulatedDevice, Stream};
///
/// let gpus: Vec<_> = (0..2)
///     .map(|i| CachingAllocator::new(SimulatedDevice::new(1 << 30)).with_device_index(i))
///     .collect();
/// for gpu in &gpus {
///     gpu.record_memory_history(HistoryOptions::without_stacks());
///     gpu.malloc(1 << 20, Stream::DEFAULT)?;
/// }
/// let snapshot = merge_device_snapshots(gpus.iter().map(|g| g.snapshot()).collect(), |f| f);
/// assert_eq!(snapshot.traces().len(), 2);
/// assert_eq!(snapshot.segments.len(), 2);
/// # Ok::<(), memsnap_recorder::Error>(())
/// ```
pub fn merge_device_snapshots(
    snapshots: Vec<Snapshot>,
    mut restack: impl FnMut(Vec<Frame>) -> Vec<Frame>,
) -> Snapshot {
    let devices = snapshots
        .iter()
        .flat_map(|s| s.devices())
        .max()
        .map_or(1, |d| usize::try_from(d).unwrap_or(0) + 1);
    let mut out = Snapshot::new(devices);
    let mut dropped = vec![0u64; devices];
    for source in snapshots {
        // The merged id of each of this source's stacks, once it has been seen.
        let mut merged: Vec<Option<StackId>> = vec![None; source.stacks.len()];
        let mut reintern = |out: &mut Snapshot, id: Option<StackId>| {
            let id = id?;
            if let Some(Some(known)) = merged.get(id.index()) {
                return Some(*known);
            }
            let new = out.intern_stack(restack(source.stack_frames(id).cloned().collect()));
            if let Some(slot) = merged.get_mut(id.index()) {
                *slot = Some(new);
            }
            Some(new)
        };
        for segment in &source.segments {
            let mut segment = segment.clone();
            segment.frames = reintern(&mut out, segment.frames);
            for block in &mut segment.blocks {
                block.frames = reintern(&mut out, block.frames);
            }
            out.segments.push(segment);
        }
        for (device, trace) in source.traces().iter().enumerate() {
            if trace.is_empty() {
                continue;
            }
            let mut entries = Vec::with_capacity(trace.len());
            for entry in trace {
                let mut entry = entry.clone();
                entry.frames = reintern(&mut out, entry.frames);
                let context = entry
                    .compile_context(&source.strings)
                    .map(|id| out.strings.intern(source.str(id)));
                entry.set_compile_context(context, &out.strings);
                let metadata = entry
                    .user_metadata(&source.strings)
                    .map(|id| out.strings.intern(source.str(id)));
                entry.set_user_metadata(metadata, &out.strings);
                entries.push(entry);
            }
            if let Some(slot) = out.device_traces.as_mut().and_then(|t| t.get_mut(device)) {
                *slot = entries;
            }
        }
        if let Some(info) = &source.recorder_info {
            for (slot, &n) in dropped.iter_mut().zip(&info.dropped_entries) {
                *slot += n;
            }
            if out.recorder_info.is_none() {
                out.recorder_info = Some(info.clone());
            }
        }
        if out.allocator_settings.is_none() {
            out.allocator_settings = source.allocator_settings.clone();
        }
        // Each device keeps its own annotations (they carry their device).
        if let Some(annotations) = &source.external_annotations {
            out.external_annotations
                .get_or_insert_with(Vec::new)
                .extend(annotations.iter().cloned());
        }
    }
    if let Some(annotations) = out.external_annotations.as_mut() {
        annotations.sort_by_key(|a| a.time_us);
    }
    if let Some(info) = out.recorder_info.as_mut() {
        info.dropped_entries = dropped;
    }
    out
}

#[cfg(test)]
mod tests {
    use memsnap_format::{validate, Action};

    use super::*;
    use crate::{CachingAllocator, HistoryOptions, SimulatedDevice, Stream};

    #[test]
    fn devices_keep_their_traces_and_stacks_pass_through_restack() {
        let gpus: Vec<_> = (0..3)
            .map(|i| CachingAllocator::new(SimulatedDevice::new(1 << 30)).with_device_index(i))
            .collect();
        // Device 1 records nothing: its slot stays empty.
        for (i, gpu) in gpus.iter().enumerate().filter(|(i, _)| *i != 1) {
            gpu.record_memory_history(HistoryOptions::default());
            for _ in 0..=i {
                let ptr = gpu.malloc(4096, Stream::DEFAULT).unwrap();
                gpu.free(ptr).unwrap();
            }
        }
        let mut seen = 0;
        let merged = merge_device_snapshots(gpus.iter().map(|g| g.snapshot()).collect(), |f| {
            seen += 1;
            vec![Frame::new("entry", "abi.rs", f.len() as i64)]
        });
        assert_eq!(validate(&merged), vec![]);
        let allocs = |device: usize| {
            merged.traces()[device]
                .iter()
                .filter(|e| e.action == Action::Alloc)
                .count()
        };
        assert_eq!((allocs(0), allocs(1), allocs(2)), (1, 0, 3));
        assert_eq!(
            merged.segments.len(),
            2,
            "one small segment per device that allocated"
        );
        assert!(seen > 0);
        let entry = merged.traces()[2]
            .iter()
            .find(|e| e.action == Action::Alloc)
            .unwrap();
        let frames: Vec<&str> = merged
            .stack_frames(entry.frames.expect("a native stack"))
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(frames, ["entry"]);
        assert_eq!(
            merged
                .recorder_info
                .as_ref()
                .map(|i| i.dropped_entries.len()),
            Some(3)
        );
    }
}

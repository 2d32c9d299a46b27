//! Imports of the real profiler traces (`$MEMSNAP_REAL_TRACES`, never in the repo) checked
//! against the source's own numbers: allocated and reserved at every `[memory]` event, the
//! peak and its event, in every view (summary, the live set `top` shows, the Chrome export's
//! counters, Parquet's `devices`) and after every codec's round trip.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use memsnap_analysis::{summarize, DeviceTimeline, Lifetime, Origin, SummaryOptions};
use memsnap_converters::chrome::{self, ChromeOptions};
use memsnap_converters::parquet::{export_files, ExportOptions};
use memsnap_converters::{open_path, OpenOptions};
use memsnap_format::{Format, Snapshot};
use serde_json::Value;

use super::common::write_file;
use super::parquet_export::{ints, read_table};

/// `$MEMSNAP_REAL_TRACES`, or `None` with a notice.
pub fn real_traces_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("MEMSNAP_REAL_TRACES");
    if dir.is_none() {
        eprintln!("notice: MEMSNAP_REAL_TRACES is unset; skipping the real-trace tests");
    }
    dir.map(PathBuf::from)
}

/// The torch.profiler traces and the source's numbers from the traces' README: max `Total
/// Allocated`, max `Total Reserved`, bytes live before the profile.
const PROFILER_TRACES: [(&str, u64, u64, u64); 2] = [
    (
        "tracelens_h100_bert-small.pt.trace.json.gz",
        101_305_344,
        121_634_816,
        91_360_768,
    ),
    (
        "tracelens_mi300_falconsai.pt.trace.json.gz",
        272_628_736,
        291_504_128,
        181_322_752,
    ),
];

/// One GPU `[memory]` event as the profiler wrote it.
struct MemoryEvent {
    time_us: i64,
    total_allocated: u64,
    total_reserved: u64,
}

/// The GPU `[memory]` events of a trace (device 0: both traces have one GPU), in the order
/// the allocator made them: `(ts, Ev Idx)`.
fn memory_events(path: &Path) -> Vec<MemoryEvent> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let base_ns = doc["baseTimeNanoseconds"].as_i64().unwrap_or(0);
    let mut events: Vec<(f64, i64, MemoryEvent)> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "[memory]" && e["args"]["Device Type"].as_i64() != Some(0))
        .map(|e| {
            let a = &e["args"];
            assert_eq!(a["Device Id"].as_i64(), Some(0));
            let ts = e["ts"].as_f64().unwrap();
            let ns = base_ns + (ts * 1000.0).round() as i64;
            (
                ts,
                a["Ev Idx"].as_i64().unwrap(),
                MemoryEvent {
                    time_us: ns.div_euclid(1000),
                    total_allocated: a["Total Allocated"].as_u64().unwrap(),
                    total_reserved: a["Total Reserved"].as_u64().unwrap(),
                },
            )
        })
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    events.into_iter().map(|(_, _, e)| e).collect()
}

/// Checks the snapshot's device 0 against the profiler's events: allocated (and active: the
/// profiler frees at once) and reserved after the entry of every event equal its `Total
/// Allocated` and `Total Reserved`; the peak is the profiler's, at its event.
fn check_against_source(name: &str, snapshot: &Snapshot, events: &[MemoryEvent]) {
    let timeline = DeviceTimeline::build(snapshot, 0).unwrap();
    let curves = timeline.curves();
    let trace = &snapshot.traces()[0];
    // The entries of one event share its time; the last of them is the state after it.
    let mut last_entry_at: BTreeMap<i64, u32> = BTreeMap::new();
    for (i, e) in trace.iter().enumerate() {
        last_entry_at.insert(e.time_us().unwrap(), i as u32);
    }
    // Events in the same microsecond: the state after the last of them.
    let mut after: BTreeMap<i64, &MemoryEvent> = BTreeMap::new();
    for e in events {
        after.insert(e.time_us, e);
    }
    for (t, e) in &after {
        let i = last_entry_at[t];
        assert_eq!(
            curves.allocated.at(i),
            e.total_allocated,
            "{name}: allocated after entry {i}"
        );
        assert_eq!(
            curves.active.at(i),
            e.total_allocated,
            "{name}: active after entry {i}"
        );
        assert_eq!(
            curves.reserved.at(i),
            e.total_reserved,
            "{name}: reserved after entry {i}"
        );
    }
    let peak = events.iter().map(|e| e.total_allocated).max().unwrap();
    let first_peak = events.iter().find(|e| e.total_allocated == peak).unwrap();
    let (bytes, event) = curves.active.max();
    assert_eq!(bytes, peak, "{name}: peak");
    assert_eq!(
        event,
        Some(last_entry_at[&first_peak.time_us]),
        "{name}: peak event"
    );
}

/// The highest value of each counter track of the Perfetto export, by track name.
fn perfetto_counter_max(snapshot: &Snapshot) -> BTreeMap<String, u64> {
    use memsnap_converters::chrome::perfetto::{Trace, TYPE_COUNTER};
    use prost::Message;
    let mut out = Vec::new();
    chrome::write_perfetto(snapshot, &ChromeOptions::default(), &mut out).unwrap();
    let trace = Trace::decode(&out[..]).unwrap();
    let mut names = BTreeMap::new();
    let mut max: BTreeMap<String, u64> = BTreeMap::new();
    for p in &trace.packet {
        if let Some(d) = &p.track_descriptor {
            if d.counter.is_some() {
                names.insert(d.uuid.unwrap(), d.name.clone().unwrap());
            }
        }
        if let Some(e) = p
            .track_event
            .as_ref()
            .filter(|e| e.r#type == Some(TYPE_COUNTER))
        {
            let name = &names[&e.track_uuid.unwrap()];
            let value = u64::try_from(e.counter_value.unwrap()).unwrap();
            let m = max.entry(name.clone()).or_default();
            *m = (*m).max(value);
        }
    }
    max
}

/// The counter names of the Chrome export.
fn chrome_counters(snapshot: &Snapshot) -> Vec<String> {
    let mut json = Vec::new();
    chrome::write_trace(snapshot, &ChromeOptions::default(), &mut json).unwrap();
    let doc: Value = serde_json::from_slice(&json).unwrap();
    let mut names: Vec<String> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C")
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A rocprofv3 trace records the driver's allocations (reserved memory) only, the memory
/// timeline no reserved memory: the counters and Parquet's peaks leave out what the source
/// does not know instead of showing a zero (the timeline's reserved) or a copy of reserved
/// (rocprofv3's allocated), as they did.
#[test]
fn exports_leave_out_what_the_source_does_not_know() {
    let Some(dir) = real_traces_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    for (file, counters) in [
        (
            "rocprofv3_docs_2025-08_memory_allocation_trace.csv",
            &["reserved"][..],
        ),
        (
            "hta_memory_timeline.raw.json.gz",
            &["active", "allocated"][..],
        ),
    ] {
        let path = dir.join(file);
        let (snapshot, _) = open_path(&path).unwrap();
        assert_eq!(chrome_counters(&snapshot), counters, "{file}: Chrome");
        let perfetto: Vec<String> = perfetto_counter_max(&snapshot).into_keys().collect();
        assert_eq!(perfetto, counters, "{file}: Perfetto");

        let out = tmp.path().join(format!("pq_{file}"));
        export_files(std::slice::from_ref(&path), &out, &ExportOptions::default()).unwrap();
        let devices = read_table(&out, "devices");
        let rows = ints(&devices, "peak_bytes").len();
        let allocated_known = counters.contains(&"allocated");
        assert_eq!(
            ints(&devices, "peak_bytes").iter().all(Option::is_some),
            allocated_known,
            "{file}"
        );
        assert_eq!(
            ints(&devices, "peak_event").iter().all(Option::is_some),
            allocated_known,
            "{file}"
        );
        let reserved = ints(&devices, "peak_reserved_bytes");
        assert_eq!(reserved.len(), rows);
        assert_eq!(
            reserved.iter().all(Option::is_some),
            counters.contains(&"reserved"),
            "{file}"
        );
        if allocated_known {
            continue;
        }
        // What the source does know is still there: rocprofv3's reserved peak per device.
        let devices_column = ints(&devices, "device");
        for (device, reserved) in devices_column.iter().zip(&reserved) {
            let timeline = DeviceTimeline::build(&snapshot, device.unwrap()).unwrap();
            let peak = timeline.peak(memsnap_analysis::CurveKind::Reserved).bytes;
            assert_eq!(*reserved, Some(peak as i64), "{file}: device {device:?}");
        }
        assert!(reserved.iter().any(|r| r.unwrap() > 0), "{file}");
    }
}

#[test]
fn imported_profiler_traces_agree_with_the_profiler_in_every_view() {
    let Some(dir) = real_traces_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    for (name, max_allocated, max_reserved, before) in PROFILER_TRACES {
        let path = dir.join(name);
        let events = memory_events(&path);
        assert_eq!(
            events.iter().map(|e| e.total_allocated).max(),
            Some(max_allocated)
        );
        assert_eq!(
            events.iter().map(|e| e.total_reserved).max(),
            Some(max_reserved)
        );
        let import = OpenOptions::new().open(&path).unwrap();
        let snapshot = import.snapshot;
        check_against_source(name, &snapshot, &events);

        // The memory from before the profile is a band of its own, in the before-window
        // count, and what the import prints.
        let replay = DeviceTimeline::build(&snapshot, 0)
            .unwrap()
            .replay()
            .clone();
        let unattributed: u64 = replay
            .allocations
            .iter()
            .filter(|a| a.origin == Origin::Unattributed)
            .map(|a| a.size)
            .sum();
        assert_eq!(unattributed, replay.unattributed_bytes);
        assert_eq!(replay.before_window_bytes, before, "{name}");
        assert!(replay.reserved_from_source);
        let notes = import.report.unwrap().warnings.join("\n");
        assert!(
            notes.contains(&format!(
                "{} bytes were live before the profile",
                replay.unattributed_bytes
            )),
            "{notes}"
        );

        // Summary.
        let summary = summarize(&snapshot, &SummaryOptions::default()).unwrap();
        let d = &summary.devices[0];
        assert_eq!(
            (d.peak.bytes, d.peak_allocated_bytes, d.peak_reserved_bytes),
            (max_allocated, max_allocated, max_reserved),
            "{name}: summary"
        );
        assert_eq!(d.before_window_bytes, before);

        // What `top` lists at the peak: the live set adds up to the peak.
        let live: u64 = replay
            .live_at(d.peak.event, Lifetime::Active)
            .iter()
            .map(|&id| replay.get(id).unwrap().size)
            .sum();
        assert_eq!(live, max_allocated, "{name}: live set at the peak");

        // Chrome export: the counters reach the profiler's peaks; read back, the same.
        let mut json = Vec::new();
        chrome::write_trace(&snapshot, &ChromeOptions::default(), &mut json).unwrap();
        let doc: Value = serde_json::from_slice(&json).unwrap();
        let counter_max = |counter: &str| {
            doc["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["ph"] == "C" && e["name"] == counter)
                .map(|e| e["args"]["bytes"].as_u64().unwrap())
                .max()
        };
        assert_eq!(counter_max("allocated"), Some(max_allocated), "{name}");
        assert_eq!(counter_max("reserved"), Some(max_reserved), "{name}");
        // Perfetto's protobuf: the same counters.
        let perfetto = perfetto_counter_max(&snapshot);
        assert_eq!(perfetto.get("allocated"), Some(&max_allocated), "{name}");
        assert_eq!(perfetto.get("reserved"), Some(&max_reserved), "{name}");
        let back_path = write_file(tmp.path(), "back.json", &json);
        let (back, _) = open_path(&back_path).unwrap();
        check_against_source(&format!("{name} via Chrome"), &back, &events);

        // Every codec keeps it.
        for format in [Format::Pickle, Format::Msgpack, Format::Json] {
            let file = tmp.path().join(format!("codec.{format:?}"));
            memsnap_format::write_path(&file, &snapshot, Some(format)).unwrap();
            let again = memsnap_format::read_path(&file).unwrap().0;
            check_against_source(&format!("{name} via {format:?}"), &again, &events);
        }

        // Parquet's devices row.
        let out = tmp.path().join(format!("pq_{name}"));
        export_files(std::slice::from_ref(&path), &out, &ExportOptions::default()).unwrap();
        let devices = read_table(&out, "devices");
        assert_eq!(
            ints(&devices, "peak_bytes"),
            vec![Some(max_allocated as i64)],
            "{name}"
        );
        assert_eq!(
            ints(&devices, "peak_reserved_bytes"),
            vec![Some(max_reserved as i64)],
            "{name}"
        );
        assert_eq!(
            ints(&devices, "before_window_bytes"),
            vec![Some(before as i64)],
            "{name}"
        );
    }
}

/// `export_memory_timeline`'s raw events (HTA's test file): memsnap's categories are PyTorch's,
/// and at memsnap's peak they split as PyTorch's running sums do at its own peak (the traces'
/// README: 3,082,832,104 bytes at row 1639); the made-up category frames neither put the peak
/// in an optimizer phase nor become sites.
#[test]
fn an_imported_memory_timeline_has_pytorchs_categories_at_pytorchs_peak() {
    let Some(dir) = real_traces_dir() else {
        return;
    };
    let path = dir.join("hta_memory_timeline.raw.json.gz");
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let rows: Vec<[i64; 4]> = serde_json::from_str(&text).unwrap();
    // PyTorch's running totals, the first row reaching the highest, and each row's last
    // entry in the import (an opening row makes one entry, a closing row two).
    let (mut total, mut by_category) = (0i64, [0i64; 8]);
    let (mut peak, mut peak_row, mut peak_split, mut peak_entry) = (0i64, 0, [0i64; 8], 0u32);
    let mut entries = 0u32;
    for (i, &[_, _, bytes, category]) in rows.iter().enumerate() {
        total += bytes;
        by_category[category as usize] += bytes;
        entries += if bytes > 0 { 1 } else { 2 };
        if total > peak {
            (peak, peak_row, peak_split, peak_entry) = (total, i, by_category, entries - 1);
        }
    }
    assert_eq!((peak, peak_row), (3_082_832_104, 1639));

    let (snapshot, _) = open_path(&path).unwrap();
    let summary = summarize(&snapshot, &SummaryOptions::default()).unwrap();
    let d = &summary.devices[0];
    assert_eq!((d.peak.bytes, d.peak.event), (peak as u64, peak_entry));
    assert_eq!(
        d.categories_source.as_deref(),
        Some("export_memory_timeline")
    );
    // PyTorch's order: PARAMETER, OPTIMIZER_STATE, INPUT, TEMPORARY, ACTIVATION, GRADIENT,
    // AUTOGRAD_DETAIL, unknown.
    let names = [
        "parameter",
        "optimizer_state",
        "input",
        "temporary",
        "activation",
        "gradient",
        "autograd_detail",
        "unknown",
    ];
    for (name, &bytes) in names.iter().zip(&peak_split) {
        assert_eq!(
            d.categories_at_peak.get(*name).copied().unwrap_or(0),
            bytes as u64,
            "{name}"
        );
    }
    assert_eq!(d.categories_at_peak["activation"], 2_592_465_920);
    assert_ne!(
        d.peak_phase.as_ref().map(|p| p.kind.as_str()),
        Some("optimizer")
    );
    for site in &d.peak_top_sites {
        assert!(
            !names
                .iter()
                .any(|n| site.site.to_ascii_lowercase().contains(n)),
            "a category frame became a site: {}",
            site.site
        );
    }

    // Every codec and the Chrome round trip keep the categories.
    let tmp = tempfile::tempdir().unwrap();
    let mut json = Vec::new();
    chrome::write_trace(&snapshot, &ChromeOptions::default(), &mut json).unwrap();
    let mut copies = vec![
        open_path(&write_file(tmp.path(), "back.json", &json))
            .unwrap()
            .0,
    ];
    for format in [Format::Pickle, Format::Msgpack, Format::Json] {
        let file = tmp.path().join(format!("codec.{format:?}"));
        memsnap_format::write_path(&file, &snapshot, Some(format)).unwrap();
        copies.push(memsnap_format::read_path(&file).unwrap().0);
    }
    for copy in copies {
        let again = summarize(&copy, &SummaryOptions::default()).unwrap();
        assert_eq!(again.devices[0].categories_at_peak, d.categories_at_peak);
        assert_eq!(again.devices[0].peak, d.peak);
    }
}

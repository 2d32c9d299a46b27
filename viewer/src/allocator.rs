//! The allocator view's model, free of UI: what to simulate, the work that runs
//! `memsnap-simulate` (in a background job), and the numbers the view shows (the recorded vs
//! simulated comparison, the fidelity line, the curves thinned to the plot's width).

use std::sync::Arc;

use memsnap_analysis::curve::RangeMinMax;
use memsnap_format::Snapshot;
use memsnap_recorder::{AllocatorConfig, ConfigError};
use memsnap_simulate::{
    simulate, suggest, DeviceReport, Fidelity, Options, SimulateError, Suggestions,
};

use crate::units::format_size;

/// Why a simulation gave no result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocatorError {
    /// The settings field does not parse.
    #[error("PYTORCH_CUDA_ALLOC_CONF: {source}")]
    Settings {
        #[source]
        source: ConfigError,
    },
    /// The memory-limit field is not a size above 0.
    #[error("`{text}` is not a memory limit (a size above 0, e.g. 24GiB, 512MiB, 80GB)")]
    Limit { text: String },
    #[error(transparent)]
    Simulate(#[from] SimulateError),
    #[error("device {device} was not simulated")]
    DeviceMissing { device: i64 },
}

/// What to simulate for one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub device: i64,
    /// The whole `PYTORCH_CUDA_ALLOC_CONF` of the simulated run.
    pub alloc_conf: String,
    /// Device memory; `None`: what the file implies.
    pub memory_limit: Option<u64>,
}

/// A finished simulation: the replay with the file's own settings (the fidelity and the
/// numbers the file does not record) and the one asked for.
#[derive(Debug)]
pub struct AllocatorRun {
    pub request: Request,
    /// The settings replayed, normalised (empty: PyTorch's defaults).
    pub alloc_conf: String,
    pub baseline: Arc<DeviceReport>,
    pub simulated: Arc<DeviceReport>,
    /// Min/max tables of the recorded and the simulated reserved curves, made with the run
    /// (on its worker): the plot thins each to its columns every frame by querying them,
    /// O(columns), where scanning the curves was O(n) a frame (20–27 ms at 10M entries).
    pub recorded_table: RangeMinMax,
    pub simulated_table: RangeMinMax,
}

/// The file's own settings as a `PYTORCH_CUDA_ALLOC_CONF` string, and where they came from.
pub fn file_conf(snapshot: &Snapshot) -> (String, &'static str) {
    let (config, source) = memsnap_simulate::settings::file_config(snapshot);
    (memsnap_simulate::settings::conf_string(&config), source)
}

/// Parses the memory-limit field: empty means "what the file implies".
pub fn parse_limit(text: &str) -> Result<Option<u64>, AllocatorError> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    match crate::units::parse_bytes(text) {
        Some(0) | None => Err(AllocatorError::Limit {
            text: text.to_owned(),
        }),
        Some(bytes) => Ok(Some(bytes)),
    }
}

fn replay(
    snapshot: &Snapshot,
    device: i64,
    options: Options,
) -> Result<DeviceReport, AllocatorError> {
    let sim = simulate(
        snapshot,
        &Options {
            device: Some(device),
            ..options
        },
    )?;
    sim.devices
        .into_iter()
        .find(|d| d.device == device)
        .ok_or(AllocatorError::DeviceMissing { device })
}

/// Runs `request` (in a background job). `baseline` is the replay with the file's own settings
/// when it is already known; else it is computed too.
pub fn run(
    snapshot: &Snapshot,
    request: Request,
    baseline: Option<Arc<DeviceReport>>,
) -> Result<AllocatorRun, AllocatorError> {
    let config = AllocatorConfig::parse(&request.alloc_conf)
        .map_err(|source| AllocatorError::Settings { source })?;
    let alloc_conf = memsnap_simulate::settings::conf_string(&config);
    let baseline = match baseline {
        Some(b) => b,
        None => Arc::new(replay(snapshot, request.device, Options::default())?),
    };
    let (own_conf, _) = file_conf(snapshot);
    let simulated = if alloc_conf == own_conf && request.memory_limit.is_none() {
        baseline.clone()
    } else {
        Arc::new(replay(
            snapshot,
            request.device,
            Options {
                config: Some(config),
                memory_limit: request.memory_limit,
                device: None,
            },
        )?)
    };
    Ok(AllocatorRun {
        request,
        alloc_conf,
        recorded_table: RangeMinMax::build(&baseline.recorded_reserved_curve),
        simulated_table: RangeMinMax::build(&simulated.reserved_curve),
        baseline,
        simulated,
    })
}

/// Ranks the common settings for one device (in a background job).
pub fn run_suggest(
    snapshot: &Snapshot,
    device: i64,
    memory_limit: Option<u64>,
) -> Result<Suggestions, AllocatorError> {
    Ok(suggest(snapshot, memory_limit, Some(device))?)
}

/// One row of the recorded-vs-simulated table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub label: &'static str,
    pub tooltip: &'static str,
    pub recorded: String,
    pub simulated: String,
}

fn oom_text(event: Option<usize>) -> String {
    event.map_or("no".into(), |e| format!("event {e}"))
}

/// The table: reserved and allocated peaks, fragmentation at the reserved peak, device calls
/// and the first out-of-memory. The file records reserved memory and device calls; the
/// allocated peak and the fragmentation of the "recorded" column come from the replay with the
/// file's own settings (which makes the recorded decisions when the fidelity is exact).
pub fn comparison(run: &AllocatorRun) -> Vec<Row> {
    let (b, s) = (&*run.baseline, &*run.simulated);
    vec![
        Row {
            label: "reserved peak",
            tooltip: "Highest memory held from the GPU (cudaMalloc'd segments, mapped pages)",
            recorded: format_size(b.recorded.reserved_peak_bytes),
            simulated: format_size(s.reserved_peak_bytes),
        },
        Row {
            label: "allocated peak",
            tooltip: "Highest memory in blocks handed to tensors (rounded sizes); the recorded column is the replay with the file's settings",
            recorded: format_size(b.allocated_peak_bytes),
            simulated: format_size(s.allocated_peak_bytes),
        },
        Row {
            label: "fragmentation @ reserved peak",
            tooltip: "Reserved minus allocated when reserved memory peaked; the recorded column is the replay with the file's settings",
            recorded: format_size(b.fragmentation_bytes),
            simulated: format_size(s.fragmentation_bytes),
        },
        Row {
            label: "cudaMalloc / map",
            tooltip: "Device calls that reserve memory (segment_alloc, segment_map)",
            recorded: b.recorded.device_mallocs.to_string(),
            simulated: s.device_mallocs.to_string(),
        },
        Row {
            label: "cudaFree / unmap",
            tooltip: "Device calls that give memory back (segment_free, segment_unmap)",
            recorded: b.recorded.device_frees.to_string(),
            simulated: s.device_frees.to_string(),
        },
        Row {
            label: "out of memory",
            tooltip: "The first request that failed (the simulated run stops there unless PyTorch ran out of memory there too)",
            recorded: oom_text(b.recorded.oom_event),
            simulated: oom_text(s.oom.as_ref().map(|o| o.event)),
        },
    ]
}

/// "all 289 segment decisions reproduced", or the first difference.
pub fn fidelity_line(f: &Fidelity) -> String {
    let placed = format!(
        "{}/{} allocations at the recorded address",
        f.placed_at_recorded_address, f.allocations
    );
    if f.exact() {
        return format!(
            "all {} segment decisions reproduced, {placed}",
            f.segment_decisions
        );
    }
    let mut line = format!(
        "{}/{} segment decisions reproduced ({} extra, {} steps differ), {placed}",
        f.reproduced, f.segment_decisions, f.extra, f.difference_count
    );
    if let Some(d) = f.differences.first() {
        let list = |v: &[(memsnap_simulate::SegmentAction, u64)]| -> String {
            if v.is_empty() {
                return "nothing".into();
            }
            v.iter()
                .map(|(a, bytes)| format!("{} {}", a.name(), format_size(*bytes)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        line.push_str(&format!(
            "; first difference at event {} ({}): PyTorch did {}, the replay did {}",
            d.event,
            d.step,
            list(&d.pytorch),
            list(&d.replay)
        ));
    }
    line
}

/// The vertices of `curve` as a step line in (event, bytes), thinned to about `width_px`
/// columns: each column keeps its highest value, so peaks survive at any width. `table` is
/// `curve`'s ([`RangeMinMax::build`]; [`AllocatorRun`] keeps one per curve): a column's
/// highest value is a query, so the whole line is O(columns × 256), whatever the curve's
/// length.
pub fn step_points(curve: &[u64], table: &RangeMinMax, width_px: usize) -> Vec<(f64, u64)> {
    let n = curve.len();
    if n == 0 {
        return Vec::new();
    }
    let columns = width_px.max(1);
    let mut points = Vec::new();
    if n <= columns * 2 {
        for (i, &v) in curve.iter().enumerate() {
            points.push((i as f64, v));
            points.push(((i + 1) as f64, v));
        }
        return points;
    }
    for c in 0..columns {
        let lo = c * n / columns;
        let hi = ((c + 1) * n / columns).max(lo + 1).min(n);
        let v = table.query(curve, lo, hi).map_or(0, |(_, max)| max);
        points.push((lo as f64, v));
        points.push((hi as f64, v));
    }
    points
}

/// The value of `curve` at `event` (`None` past its end: the run stopped at an OOM).
pub fn value_at(curve: &[u64], event: usize) -> Option<u64> {
    curve.get(event).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_recorder::config::MIB;
    use memsnap_recorder::{CachingAllocator, HistoryOptions, SimulatedDevice, Stream};

    /// Growing activations, each freed before the next, a small tensor kept after each: the
    /// fragmentation `expandable_segments:True` removes.
    fn growing() -> Snapshot {
        let alloc = CachingAllocator::new(SimulatedDevice::new(80 << 30));
        alloc.record_memory_history(HistoryOptions::without_stacks());
        let mut keep = Vec::new();
        for i in 0..12u64 {
            let big = alloc
                .malloc((40 + 6 * i) * MIB, Stream::DEFAULT)
                .expect("malloc");
            keep.push(alloc.malloc(3 * MIB, Stream::DEFAULT).expect("malloc"));
            alloc.free(big).expect("free");
        }
        alloc.snapshot()
    }

    #[test]
    fn the_file_settings_reproduce_the_recording_and_expandable_lowers_the_peak() {
        let snapshot = growing();
        let (own, source) = file_conf(&snapshot);
        assert_eq!(own, "");
        assert!(source.contains("allocator_settings"), "{source}");
        let request = Request {
            device: 0,
            alloc_conf: own,
            memory_limit: None,
        };
        let run_own = run(&snapshot, request.clone(), None).expect("run");
        assert!(Arc::ptr_eq(&run_own.baseline, &run_own.simulated));
        let line = fidelity_line(&run_own.baseline.fidelity);
        assert!(line.starts_with("all "), "{line}");
        assert!(line.contains("segment decisions reproduced"), "{line}");
        let rows = comparison(&run_own);
        assert_eq!(rows[0].label, "reserved peak");
        assert_eq!(rows[0].recorded, rows[0].simulated);

        let what_if = run(
            &snapshot,
            Request {
                alloc_conf: "expandable_segments:True".into(),
                ..request
            },
            Some(run_own.baseline.clone()),
        )
        .expect("run");
        assert_eq!(what_if.alloc_conf, "expandable_segments:True");
        assert!(
            what_if.simulated.reserved_peak_bytes < what_if.baseline.recorded.reserved_peak_bytes
        );
        let rows = comparison(&what_if);
        assert_ne!(rows[0].recorded, rows[0].simulated);
        assert_eq!(rows[5].recorded, "no");
    }

    #[test]
    fn a_small_limit_runs_out_of_memory_and_the_curve_stops_there() {
        let snapshot = growing();
        let run = run(
            &snapshot,
            Request {
                device: 0,
                alloc_conf: String::new(),
                memory_limit: parse_limit("100MiB").expect("size"),
            },
            None,
        )
        .expect("run");
        let oom = run.simulated.oom.as_ref().expect("out of memory");
        assert_eq!(run.simulated.reserved_curve.len(), oom.event + 1);
        assert_eq!(value_at(&run.simulated.reserved_curve, oom.event + 1), None);
        assert_eq!(
            comparison(&run)[5].simulated,
            format!("event {}", oom.event)
        );
    }

    #[test]
    fn bad_settings_and_sizes_are_errors() {
        let snapshot = growing();
        let err = run(
            &snapshot,
            Request {
                device: 0,
                alloc_conf: "no_such_key:1".into(),
                memory_limit: None,
            },
            None,
        )
        .expect_err("bad key");
        assert!(matches!(err, AllocatorError::Settings { .. }), "{err}");
        assert!(
            err.to_string().starts_with("PYTORCH_CUDA_ALLOC_CONF: "),
            "{err}"
        );
        assert_eq!(parse_limit(" ").ok(), Some(None));
        assert_eq!(parse_limit("24GiB").ok(), Some(Some(24 << 30)));
        assert!(matches!(
            parse_limit("lots"),
            Err(AllocatorError::Limit { .. })
        ));
        assert!(matches!(
            parse_limit("0"),
            Err(AllocatorError::Limit { .. })
        ));
    }

    #[test]
    fn step_points_keep_the_peaks_when_thinned() {
        let points = |curve: &[u64], width| step_points(curve, &RangeMinMax::build(curve), width);
        assert_eq!(
            points(&[1, 5], 10),
            vec![(0.0, 1), (1.0, 1), (1.0, 5), (2.0, 5)]
        );
        let mut curve = vec![0u64; 10_000];
        curve[4321] = 99;
        let thinned = points(&curve, 100);
        assert_eq!(thinned.len(), 200);
        assert_eq!(thinned.iter().map(|p| p.1).max(), Some(99));
        assert!(points(&[], 100).is_empty());
    }

    /// What broke: the plot scanned both whole curves every frame to thin them. Each column's
    /// highest value now comes from the curve's table, and it is the same as a scan's, for
    /// every width.
    #[test]
    fn step_points_from_the_table_are_those_of_a_scan() {
        let curve: Vec<u64> = (0..100_003u64).map(|i| (i * 7919) % 10_007).collect();
        let table = RangeMinMax::build(&curve);
        for width in [1, 7, 640, 1600] {
            let n = curve.len();
            let scanned: Vec<(f64, u64)> = (0..width)
                .flat_map(|c| {
                    let lo = c * n / width;
                    let hi = ((c + 1) * n / width).max(lo + 1).min(n);
                    let v = curve[lo..hi].iter().copied().max().unwrap();
                    [(lo as f64, v), (hi as f64, v)]
                })
                .collect();
            assert_eq!(step_points(&curve, &table, width), scanned, "{width}");
        }
    }
}

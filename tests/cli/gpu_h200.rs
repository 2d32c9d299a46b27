//! What the first runs on a real GPU taught, pinned on machines without one.
//!
//! `fixtures/gpu_h200_torch2.11/` holds what `scripts/gpu_check.sh` brought back from an NVIDIA
//! H200 (torch 2.11.0+cu130, driver 580.159): the same 8-block GPT training run recorded by
//! PyTorch's allocator and by memsnap's (`memsnap.torch.enable(stacks="all")`), PyTorch's run
//! once more, with expandable segments, the out-of-memory snapshots, and the run under
//! `torch.profiler` (its README says how they were made). These tests hold memsnap to what was
//! seen there.

use std::io::Read;
use std::path::{Path, PathBuf};

use memsnap_format::{Action, Snapshot};
use serde_json::Value;

use super::common::memsnap;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpu_h200_torch2.11")
}

fn fixture(name: &str) -> String {
    fixtures()
        .join(name)
        .to_str()
        .expect("utf-8 path")
        .to_owned()
}

fn results() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("results.json")).unwrap())
        .unwrap()
}

fn json_of(args: &[&str]) -> Value {
    let out = memsnap(args);
    assert!(
        out.status.success(),
        "memsnap {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn gunzip(path: &Path) -> Vec<u8> {
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut text)
        .unwrap();
    text
}

fn read(name: &str) -> Snapshot {
    memsnap_format::read_path(Path::new(&fixture(name)))
        .expect("the fixture reads")
        .0
}

const SNAPSHOTS: [&str; 5] = [
    "native",
    "native.on_oom",
    "memsnap",
    "memsnap.on_oom",
    "expandable",
];

#[test]
fn memviz_of_the_gpu_snapshots_matches_torch_2_11_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    for stem in SNAPSHOTS {
        let file = fixture(&format!("{stem}.pickle.gz"));
        for report in ["stats", "trace", "segments", "memory"] {
            let ours = if matches!(report, "stats" | "trace") {
                let out = memsnap(&["memviz", report, &file]);
                assert!(out.status.success(), "{stem} {report}");
                out.stdout
            } else {
                let path = dir.path().join(format!("{stem}.{report}"));
                let out = memsnap(&["memviz", report, &file, "-o", path.to_str().unwrap()]);
                assert!(out.status.success(), "{stem} {report}");
                std::fs::read(&path).unwrap()
            };
            let golden = match report {
                "stats" | "trace" => format!("{stem}.{report}.txt.gz"),
                _ => format!("{stem}.{report}.collapsed.txt.gz"),
            };
            let python = gunzip(&fixtures().join("golden_memory_viz_torch2.11").join(golden));
            assert!(
                ours == python,
                "memviz {report} of {stem} differs from torch 2.11's"
            );
        }
    }
}

#[test]
fn simulate_reproduces_every_segment_decision_of_the_gpu_runs() {
    for (stem, decisions) in [("native", 104), ("memsnap", 104), ("expandable", 98)] {
        let report = json_of(&["simulate", "--json", &fixture(&format!("{stem}.pickle.gz"))]);
        let device = &report["devices"][0];
        let fidelity = &device["fidelity"];
        assert_eq!(fidelity["segment_decisions"], decisions, "{stem}");
        assert_eq!(fidelity["reproduced"], decisions, "{stem}");
        assert_eq!(fidelity["extra"], 0, "{stem}");
        assert_eq!(
            fidelity["placed_at_recorded_address"], fidelity["allocations"],
            "{stem}"
        );
        if stem == "expandable" {
            // PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, read from the file's settings:
            // every decision is a map of more of the segment (nothing was unmapped).
            assert_eq!(report["alloc_conf"], "expandable_segments:True");
            let events = device["segment_events"].as_array().unwrap();
            assert!(events.iter().all(|e| e[0] == "segment_map"), "{events:?}");
            assert_eq!(events.len(), 98);
        }
    }
}

#[test]
fn summary_finds_the_six_training_steps_and_the_scripts_lines_in_both_recordings() {
    for stem in ["native", "memsnap"] {
        let summary = json_of(&["summary", "--json", &fixture(&format!("{stem}.pickle.gz"))]);
        let device = &summary["devices"][0];
        let steps = device["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 6, "{stem}");
        assert_eq!(device["step_method"], "stacks", "{stem}");
        for step in steps {
            let kinds: Vec<&str> = step["phases"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["kind"].as_str().unwrap())
                .collect();
            for kind in ["forward", "backward", "optimizer"] {
                assert!(kinds.contains(&kind), "{stem}: {kinds:?}");
            }
        }
        let sites: Vec<&str> = device["peak_top_sites"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["site"].as_str().unwrap())
            .collect();
        // The logits (GPT.forward's head) and the loss's float copy are the peak's top sites.
        assert!(
            sites[0].starts_with("gpt_workload.py:"),
            "{stem}: {sites:?}"
        );
        assert!(sites[0].ends_with(":forward"), "{stem}: {sites:?}");
        // Regression: memsnap.torch's out-of-memory shim was the site of every allocation
        // without Python frames (2,080 MiB at the peak) before its frame was trimmed.
        assert!(
            !sites.iter().any(|s| s.contains("memsnap_")),
            "{stem}: {sites:?}"
        );
        // Requested bytes: under memory_stats()'s allocated peak (8,593,483,264, block sizes
        // rounded to 512 bytes) by the rounding.
        assert_eq!(device["peak_allocated_bytes"], 8_593_473_736u64, "{stem}");
        assert_eq!(
            results()[stem]["peak_allocated"],
            8_593_483_264u64,
            "{stem}"
        );
    }
}

/// The history as (action, size), with each run of frees made by autocast's cache clear
/// (`torch.autocast.__exit__`) sorted: that cache is a hash map keyed by host pointers, so the
/// order of those frees changes from one process to the next.
fn canonical(snapshot: &Snapshot) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut run: Vec<(String, u64)> = Vec::new();
    for e in &snapshot.traces()[0] {
        let autocast_clear = matches!(e.action, Action::FreeRequested | Action::FreeCompleted)
            && e.frames.is_some_and(|id| {
                snapshot
                    .stack_frames(id)
                    .any(|f| f.name == "__exit__" && f.filename.ends_with("autocast_mode.py"))
            });
        let item = (format!("{:?}", e.action), e.size);
        if autocast_clear {
            run.push(item);
            continue;
        }
        run.sort();
        out.append(&mut run);
        out.push(item);
    }
    run.sort();
    out.extend(run);
    out
}

fn plain(snapshot: &Snapshot) -> Vec<(String, u64)> {
    snapshot.traces()[0]
        .iter()
        .map(|e| (format!("{:?}", e.action), e.size))
        .collect()
}

#[test]
fn memsnap_makes_pytorchs_requests_in_pytorchs_order_but_for_autocasts_cache() {
    let native = read("native.pickle.gz");
    let again = read("native_again.pickle.gz");
    let ours = read("memsnap.pickle.gz");
    assert_eq!(plain(&native).len(), 13_424);
    // Two runs of PyTorch itself first differ at entry 535, inside the first autocast cache
    // clear; so does memsnap's run.
    let first_difference =
        |a: &[(String, u64)], b: &[(String, u64)]| a.iter().zip(b).position(|(x, y)| x != y);
    assert_eq!(first_difference(&plain(&native), &plain(&again)), Some(535));
    assert_eq!(first_difference(&plain(&native), &plain(&ours)), Some(535));
    // With those frees taken as sets, all three are the same 13,424 requests.
    assert_eq!(canonical(&native), canonical(&again));
    assert_eq!(canonical(&native), canonical(&ours));
    // The 4 counters memory_stats() gave differently are the ones two PyTorch runs disagree on.
    let stats = &results()["memory_stats"];
    let keys = stats["native"].as_object().unwrap();
    let differ = |other: &str| -> Vec<&str> {
        keys.iter()
            .filter(|(k, v)| stats[other][k.as_str()] != **v)
            .map(|(k, _)| k.as_str())
            .collect()
    };
    assert_eq!(keys.len(), 122);
    let ours_differ = differ("memsnap");
    assert!(
        ours_differ.iter().all(|k| k.starts_with("inactive_split.")),
        "{ours_differ:?}"
    );
    assert!(ours_differ
        .iter()
        .all(|k| differ("native_again").contains(k)));
}

#[test]
fn both_out_of_memory_snapshots_hold_their_oom_entry() {
    for stem in ["native.on_oom", "memsnap.on_oom"] {
        let snapshot = read(&format!("{stem}.pickle.gz"));
        let ooms: Vec<_> = snapshot.traces()[0]
            .iter()
            .filter(|e| e.action == Action::Oom)
            .collect();
        assert_eq!(ooms.len(), 1, "{stem}");
        assert_eq!(ooms[0].size, 1 << 40, "{stem}: the 1 TiB request");
        let summary = json_of(&["summary", "--json", &fixture(&format!("{stem}.pickle.gz"))]);
        assert_eq!(
            summary["devices"][0]["oom_events"].as_array().map(Vec::len),
            Some(1),
            "{stem}"
        );
    }
    let results = results();
    assert!(results["memsnap"]["oom"].as_str().unwrap().starts_with(
        "torch.OutOfMemoryError: out of memory: tried to allocate 1099511627776 bytes"
    ));
    assert_eq!(results["memsnap"]["oom_dump_written"], true);
    assert!(results["memsnap"]["step_after_oom_loss"]
        .as_f64()
        .unwrap()
        .is_finite());
}

#[test]
fn profiler_imports_give_the_profilers_own_peaks() {
    let profiler = &results()["profiler"];
    let dir = tempfile::tempdir().unwrap();
    let imported = dir.path().join("trace.pickle");
    let out = memsnap(&[
        "import",
        &fixture("profiler.pt.trace.json.gz"),
        "-o",
        imported.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let device = &json_of(&["summary", "--json", imported.to_str().unwrap()])["devices"][0];
    // torch.cuda.max_memory_allocated()/max_memory_reserved() over the profiled steps, and the
    // trace's own largest "Total Allocated"/"Total Reserved".
    assert_eq!(device["peak_allocated_bytes"], profiler["peak_allocated"]);
    assert_eq!(device["peak_allocated_bytes"], 8_593_483_264u64);
    assert_eq!(device["peak_reserved_bytes"], profiler["peak_reserved"]);
    assert_eq!(device["reserved_known"], true);
    // The two profiled steps, by the trace's Python stacks.
    assert_eq!(device["steps"].as_array().unwrap().len(), 2);
    assert_eq!(device["step_method"], "stacks");
    for timeline in ["memory_timeline.raw.json.gz", "memory_timeline.json.gz"] {
        let imported = dir.path().join(format!("{timeline}.pickle"));
        let out = memsnap(&[
            "import",
            &fixture(timeline),
            "-o",
            imported.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{timeline}");
        let device = &json_of(&["summary", "--json", imported.to_str().unwrap()])["devices"][0];
        // The timeline's own total (the running sum of its rows; the peak of its plot data).
        // It is 68,157,440 bytes under the allocator's peak: export_memory_timeline counts
        // only the tensors the profiler attributes.
        assert_eq!(
            device["peak_allocated_bytes"], 8_525_325_824u64,
            "{timeline}"
        );
        // export_memory_timeline has no reserved memory: unknown, not 0 B.
        assert_eq!(device["reserved_known"], false, "{timeline}");
        let text =
            String::from_utf8(memsnap(&["summary", imported.to_str().unwrap()]).stdout).unwrap();
        assert!(
            text.contains("reserved peak unknown (the source records no reserved memory)"),
            "{text}"
        );
    }
    // Regression: the raw timeline's first step was taken for set-up (its first tensor, of
    // another sequence length than the next step's, matched no earlier size). Set-up is the
    // pre-existing memory (events 0..=309); the two profiled steps follow.
    let imported = dir.path().join("memory_timeline.raw.json.gz.pickle");
    let device = &json_of(&["summary", "--json", imported.to_str().unwrap()])["devices"][0];
    let steps = device["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0]["start_event"], 310);
    assert_eq!(device["peak_phase"]["step"], 0);
}

/// Regression: the plot data of the same timeline (totals per category per microsecond:
/// synthetic blocks, so no call site or size repeats) put its first step, peak included, in
/// the set-up and made a step of a bump in the valley after it ("the peak falls in the setup
/// phase"). Its first step is now found by the source's categories (its first input or
/// activation) and must hold the highest point before the next step.
#[test]
fn the_memory_timelines_plot_data_finds_both_profiled_steps() {
    let device =
        &json_of(&["summary", "--json", &fixture("memory_timeline.json.gz")])["devices"][0];
    let steps = device["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{steps:#?}");
    assert_eq!(device["peak_phase"]["step"], 0);
    assert_eq!(device["peak_phase"]["kind"], "forward");
    // The set-up is the memory from before the profile, as in the raw events: it ends where
    // the first step's forward pass starts climbing, below the peak.
    let setup_end = device["setup_phase"]["end_event"].as_u64().unwrap();
    assert!(setup_end < device["peak"]["event"].as_u64().unwrap());
    assert_eq!(steps[0]["start_event"].as_u64().unwrap(), setup_end + 1);
    // Both steps climb several GiB (the bump was 0.5 GiB).
    for step in steps {
        let climb = step["peak_bytes"].as_u64().unwrap() - step["start_bytes"].as_u64().unwrap();
        assert!(climb > 4 << 30, "{step:#?}");
    }
}

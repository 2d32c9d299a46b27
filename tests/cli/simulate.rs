//! `memsnap simulate`: the JSON contract, what-if and --suggest on generated runs whose answer
//! is known, the help, and the real snapshots (from `MEMSNAP_REAL_SNAPSHOTS`, skipped with a
//! notice when unset).

use memsnap_recorder::{CachingAllocator, HistoryOptions, SimulatedDevice, Stream};
use serde_json::Value;

use crate::common::{memsnap, real_snapshots_dir};

const MIB: u64 = 1 << 20;

/// A 100 MiB cached block split by a 30 MiB request, then another 100 MiB: fits on an 80 GB
/// device, runs out of memory at 150 MiB unless max_split_size_mb keeps the big block whole.
fn split_then_big(dir: &std::path::Path) -> String {
    let alloc = CachingAllocator::new(SimulatedDevice::new(80 << 30));
    alloc.record_memory_history(HistoryOptions::without_stacks());
    let a = alloc.malloc(100 * MIB, Stream::DEFAULT).unwrap();
    alloc.free(a).unwrap();
    let _small = alloc.malloc(30 * MIB, Stream::DEFAULT).unwrap();
    let b = alloc.malloc(100 * MIB, Stream::DEFAULT).unwrap();
    alloc.free(b).unwrap();
    alloc.empty_cache().unwrap();
    let path = dir.join("split.pickle");
    alloc.dump_snapshot(&path).unwrap();
    path.display().to_string()
}

fn json(args: &[&str]) -> Value {
    let out = memsnap(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn simulate_json_lists_the_replayed_segment_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let file = split_then_big(dir.path());
    let v = json(&["simulate", &file, "--json"]);
    let d = &v["devices"][0];
    assert_eq!(d["device"], 0);
    assert_eq!(
        d["segment_events"],
        serde_json::json!([
            ["segment_alloc", 100 * MIB],
            ["segment_alloc", 100 * MIB],
            ["segment_free", 100 * MIB]
        ])
    );
    assert_eq!(d["reserved_peak_bytes"], 200 * MIB);
    assert_eq!(d["oom"], Value::Null);
    assert_eq!(d["fidelity"]["reproduced"], 3);
    assert_eq!(d["fidelity"]["segment_decisions"], 3);
}

#[test]
fn simulate_what_if_memory_limit_and_max_split_size() {
    let dir = tempfile::tempdir().unwrap();
    let file = split_then_big(dir.path());
    let v = json(&["simulate", &file, "--memory-limit", "150MiB", "--json"]);
    assert_eq!(v["devices"][0]["oom"]["event"], 6);
    assert_eq!(v["baseline"]["devices"][0]["oom"], Value::Null);
    let v = json(&[
        "simulate",
        &file,
        "--memory-limit",
        "150MiB",
        "--alloc-conf",
        "max_split_size_mb:64",
        "--json",
    ]);
    assert_eq!(v["devices"][0]["oom"], Value::Null);
    assert_eq!(v["devices"][0]["reserved_peak_bytes"], 130 * MIB);

    let out = memsnap(&["simulate", &file, "--memory-limit", "150MiB"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("what-if"), "{text}");
    assert!(text.contains("event 6"), "{text}");
}

#[test]
fn simulate_suggest_ranks_the_setting_that_avoids_the_oom_first() {
    let dir = tempfile::tempdir().unwrap();
    let file = split_then_big(dir.path());
    let out = memsnap(&["simulate", &file, "--suggest", "--memory-limit", "150MiB"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("the OOM at event 6 (device 0) would not have happened"),
        "{text}"
    );
    let v = json(&[
        "simulate",
        &file,
        "--suggest",
        "--memory-limit",
        "150MiB",
        "--json",
    ]);
    assert!(v["candidates"][0]["change"]
        .as_str()
        .unwrap()
        .starts_with("max_split_size_mb:"));
}

#[test]
fn simulate_rejects_bad_settings_and_files_without_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let file = split_then_big(dir.path());
    let out = memsnap(&["simulate", &file, "--alloc-conf", "max_split_size_mb:5"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_split_size_mb"));
    let garbage = dir.path().join("garbage.pickle");
    std::fs::write(&garbage, b"\x80\x04not a pickle").unwrap();
    let out = memsnap(&["simulate", garbage.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn simulate_help_teaches_with_examples() {
    let out = memsnap(&["simulate", "--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--alloc-conf",
        "--memory-limit",
        "--suggest",
        "memsnap simulate run.pickle --alloc-conf expandable_segments:True",
        "segment_events",
    ] {
        assert!(text.contains(needle), "missing {needle}: {text}");
    }
}

#[test]
fn simulate_real_snapshots_reproduce_pytorch() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    for (name, decisions) in [
        ("10_maphsge4_v21era_traces_no_time_us.pickle", vec![13]),
        ("11_jaspersolt_snapshot_actions.pickle", vec![7]),
        ("12_kkaitlyn_ctx128_forward_cpp_frames.pickle", vec![289]),
        (
            "14_constructorsun_expandable_oom_4dev.pickle",
            vec![175, 46, 78],
        ),
        ("15_kkaitlyn_2p7b_compile_annotations.pickle", vec![920]),
    ] {
        let path = dir.join(name);
        let v = json(&["simulate", path.to_str().unwrap(), "--json"]);
        let got: Vec<u64> = v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["fidelity"]["segment_decisions"].as_u64().unwrap() > 0)
            .map(|d| {
                assert_eq!(
                    d["fidelity"]["reproduced"],
                    d["fidelity"]["segment_decisions"]
                );
                d["fidelity"]["reproduced"].as_u64().unwrap()
            })
            .collect();
        assert_eq!(got, decisions, "{name}");
    }
    let path = dir.join("14_constructorsun_expandable_oom_4dev.pickle");
    let v = json(&[
        "simulate",
        path.to_str().unwrap(),
        "--device",
        "1",
        "--json",
    ]);
    assert_eq!(v["devices"][0]["oom"]["event"], 421);
    assert_eq!(v["devices"][0]["oom"]["recorded"], true);
}

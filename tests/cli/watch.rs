//! `memsnap watch`: following a recorder that serves its history while it records.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memsnap_format::Frame;
use memsnap_recorder::{CachingAllocator, HistoryOptions, HostDevice, StackMode, Stream};

const MIB: u64 = 1 << 20;

fn recorder() -> Arc<CachingAllocator<HostDevice>> {
    let alloc = Arc::new(CachingAllocator::new(HostDevice::new(4 << 30)));
    alloc.use_manual_clock(1_700_000_000_000_000);
    alloc.record_memory_history(HistoryOptions {
        stacks: StackMode::None,
        ..HistoryOptions::default()
    });
    alloc
}

/// `steps` training steps: forward makes 40 activations of 1 MiB, backward a gradient of
/// 256 KiB per activation and frees it and the activation, the optimizer a temporary of
/// 2 MiB, then keeps 4 MiB (a leak: each step's peak is 4 MiB above the last one's).
fn train(alloc: &CachingAllocator<HostDevice>, steps: usize) -> Vec<u64> {
    let stack = |name: &str| {
        alloc
            .register_stack(&[Frame::new(name, "train.py", 7)])
            .unwrap()
    };
    let (fwd, bwd, opt) = (stack("forward"), stack("backward"), stack("optimizer_step"));
    let mut kept = Vec::new();
    for _ in 0..steps {
        let mut acts = Vec::new();
        for _ in 0..40 {
            acts.push(alloc.malloc_with_stack(MIB, Stream::DEFAULT, fwd).unwrap());
            alloc.advance_clock(Duration::from_micros(100));
        }
        // Backward: a gradient made and freed per activation, then the activation freed.
        for p in acts.into_iter().rev() {
            let grad = alloc
                .malloc_with_stack(MIB / 4, Stream::DEFAULT, bwd)
                .unwrap();
            alloc.advance_clock(Duration::from_micros(50));
            alloc.free_with_stack(grad, bwd).unwrap();
            alloc.free_with_stack(p, bwd).unwrap();
        }
        // The optimizer: a temporary, and 4 MiB kept.
        let tmp = alloc
            .malloc_with_stack(2 * MIB, Stream::DEFAULT, opt)
            .unwrap();
        alloc.advance_clock(Duration::from_micros(100));
        alloc.free_with_stack(tmp, opt).unwrap();
        kept.push(
            alloc
                .malloc_with_stack(4 * MIB, Stream::DEFAULT, opt)
                .unwrap(),
        );
        alloc.advance_clock(Duration::from_micros(500));
    }
    kept
}

fn watch(url: &str, extra: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .arg("watch")
        .arg(url)
        .args(["--every", "0"])
        .args(extra)
        .env_remove("MEMSNAP_LIVE_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` (at most a minute: a hung watch fails the test instead of hanging it).
fn wait(mut child: std::process::Child) -> (Option<i32>, String, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("memsnap watch did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn watch_reports_every_step_and_saves_what_it_received() {
    let alloc = recorder();
    let dir = tempfile::tempdir().unwrap();
    let server = alloc
        .serve_live(&format!("unix:{}", dir.path().join("run.sock").display()))
        .unwrap();
    let saved = dir.path().join("received.msgpack");
    let child = watch(
        &server.url(),
        &["--json", "--save", saved.to_str().unwrap()],
    );
    train(&alloc, 8);
    // Give the watch the entries, then end the stream.
    let recorded = alloc.recorded_entries();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server
        .counters()
        .entries_sent
        .load(std::sync::atomic::Ordering::Relaxed)
        < recorded
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(server);
    let (code, stdout, stderr) = wait(child);
    assert_eq!(code, Some(0), "{stderr}");
    let steps: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The analysis finds the steps from the curve here (it merges the last ones); what the
    // watch guarantees is that it reports what the analysis finds, in order.
    assert!(steps.len() >= 5, "{stdout}\n{stderr}");
    let peaks: Vec<u64> = steps
        .iter()
        .map(|s| s["peak_bytes"].as_u64().unwrap())
        .collect();
    assert!(peaks.windows(2).all(|w| w[1] > w[0]), "{peaks:?}");
    let last_drift = steps.last().unwrap()["drift_percent"].as_f64().unwrap();
    assert!(last_drift > 10.0, "{stdout}");
    // The saved snapshot's trace is the recorder's.
    let (mut received, _) = memsnap_format::read_path(&saved).unwrap();
    let mut dump = alloc.snapshot();
    // The trace must be equal. (The listener's segments follow the entries, with blocks
    // sized by their requests: the recorder's tests compare them.)
    received.segments.clear();
    dump.segments.clear();
    assert_eq!(memsnap_format::compare::diff(&received, &dump), None);
}

#[test]
fn watch_max_peak_exits_1_at_the_first_step_above_it_while_the_run_goes_on() {
    let alloc = recorder();
    let dir = tempfile::tempdir().unwrap();
    let server = alloc
        .serve_live(&format!("unix:{}", dir.path().join("run.sock").display()))
        .unwrap();
    let child = watch(&server.url(), &["--max-peak", "50MiB"]);
    train(&alloc, 12);
    // The server stays up: the watch must stop by itself.
    let (code, stdout, stderr) = wait(child);
    drop(server);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("above --max-peak"), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    let last = lines.last().expect("steps were printed");
    assert!(last.ends_with("LIMIT"), "{stdout}");
    // Step k peaks at 40 MiB of activations, 256 KiB of gradient and 4k MiB kept: the first
    // step above 50 MiB is the fourth (52.25 MiB), well before the run's last step. (An
    // early analysis, with part of the trace, may report the first steps as one.)
    assert!(lines[..lines.len() - 1]
        .iter()
        .all(|l| !l.contains("LIMIT")));
    assert!(last.contains("peak   52.2 MiB"), "{stdout}");
    assert!(lines.len() <= 4, "{stdout}");
}

#[test]
fn watch_sends_its_token_and_a_recorder_with_one_refuses_a_watch_without_it() {
    let alloc = recorder();
    let token = "a-token-of-enough-bytes";
    let server = alloc
        .serve_live_with_token("tcp:127.0.0.1:0", token)
        .unwrap();
    train(&alloc, 2);
    let url = server.url();
    let (code, _, stderr) = wait(watch(&url, &[]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("the recorder refused this listener: this recorder needs a token"),
        "{stderr}"
    );
    let (code, _, stderr) = wait(watch(&url, &["--token", "not-the-token-at-all"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("wrong token"), "{stderr}");
    // The right token: the watch follows the run until the recorder ends the stream.
    let child = watch(&url, &["--json", "--token", token]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while server
        .counters()
        .connections
        .load(std::sync::atomic::Ordering::Relaxed)
        < 3
        || server
            .counters()
            .entries_sent
            .load(std::sync::atomic::Ordering::Relaxed)
            < alloc.recorded_entries()
    {
        assert!(Instant::now() < deadline, "the watch got no entries");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(server);
    let (code, stdout, stderr) = wait(child);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stdout.is_empty(), "{stderr}");
}

//! `memsnap demo`: the simulated training run writes a valid snapshot that looks like training.

use std::process::Command;

use memsnap_format::{validate, Action, Snapshot, TraceEntry};

/// A small, fast model: the shape of the run matters here, not its size. Its activations
/// (2 x 512 tokens) outweigh its gradients, as in real training, so backward frees more than it
/// creates.
const SMALL: [&str; 8] = [
    "--layers",
    "2",
    "--batch",
    "2",
    "--seq-len",
    "512",
    "--hidden",
    "128",
];

fn demo(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .arg("demo")
        .args(SMALL)
        .args(extra)
        .current_dir(dir)
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .output()
        .expect("run memsnap demo")
}

/// `name file:line` of each frame of an entry's stack, innermost first.
fn frame_names(snapshot: &Snapshot, entry: &TraceEntry) -> Vec<String> {
    entry
        .frames
        .map(|id| {
            snapshot
                .stack_frames(id)
                .map(|f| format!("{} {}:{}", f.name, f.filename, f.line))
                .collect()
        })
        .unwrap_or_default()
}

/// The training phase an allocation belongs to, from its stack as PyTorch records it: the
/// optimizer's Python frames, the autograd engine's thread, or a module's `forward`.
fn phase(names: &[String]) -> Option<&'static str> {
    if names.iter().any(|n| n.contains("/torch/optim/")) {
        Some("optimizer")
    } else if names
        .iter()
        .any(|n| n.starts_with("torch::autograd::Engine::"))
    {
        Some("backward")
    } else if names
        .iter()
        .any(|n| n.starts_with("forward ") && n.contains("/model.py:"))
    {
        Some("forward")
    } else {
        None
    }
}

#[test]
fn demo_writes_a_valid_snapshot_with_forward_backward_optimizer_per_step() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.pickle");
    let run = demo(
        dir.path(),
        &["--no-view", "--steps", "3", "--out", out.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "memsnap demo failed:\n{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("trained 3 steps"), "{stdout}");

    let (snapshot, _) = memsnap_format::read_path(&out).expect("the demo snapshot reads back");
    assert_eq!(
        validate(&snapshot),
        vec![],
        "the demo snapshot breaks an invariant"
    );
    let trace = &snapshot.traces()[0];

    // Stacks as PyTorch records them with stacks="all": the model's Python frames, the
    // autograd engine's nodes, the optimizer, over the caching allocator's C++ frames.
    let all_names: Vec<String> = trace
        .iter()
        .flat_map(|e| frame_names(&snapshot, e))
        .collect();
    for function in [
        "forward /home/user/project/model.py",
        "forward /home/user/project/attention.py",
        "torch::autograd::generated::MmBackward0::apply",
        "torch::autograd::Engine::evaluate_function",
        "step /usr/local/lib/python3.11/site-packages/torch/optim/adam.py",
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
    ] {
        assert!(
            all_names.iter().any(|n| n.starts_with(function)),
            "no {function} frame in the trace"
        );
    }
    // ProfilerStep annotations mark the steps.
    let steps: Vec<_> = snapshot
        .external_annotations
        .iter()
        .flatten()
        .filter_map(|a| a.name())
        .filter(|n| n.starts_with("ProfilerStep#"))
        .collect();
    assert_eq!(steps.len(), 6, "START and END of 3 steps: {steps:?}");

    // Each step: forward allocations, then backward, then the optimizer.
    let mut phases: Vec<&str> = Vec::new();
    let mut live: i64 = 0;
    let mut live_at_phase_start: Vec<i64> = Vec::new();
    for entry in trace {
        match entry.action {
            Action::Alloc => {
                if let Some(p) = phase(&frame_names(&snapshot, entry)) {
                    if phases.last() != Some(&p) {
                        phases.push(p);
                        live_at_phase_start.push(live);
                    }
                }
                live += entry.size as i64;
            }
            Action::FreeCompleted => live -= entry.size as i64,
            _ => {}
        }
    }
    assert_eq!(phases, ["forward", "backward", "optimizer"].repeat(3));
    for step in 0..3 {
        let (forward, backward, optimizer) = (
            live_at_phase_start[3 * step],
            live_at_phase_start[3 * step + 1],
            live_at_phase_start[3 * step + 2],
        );
        assert!(
            backward > forward,
            "step {step}: forward kept its activations (up-slope)"
        );
        assert!(
            optimizer < backward,
            "step {step}: backward freed them (down-slope)"
        );
    }
}

#[test]
fn demo_writes_memsnap_demo_pickle_in_the_current_directory_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let run = demo(dir.path(), &["--no-view", "--steps", "1"]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let (snapshot, _) = memsnap_format::read_path(&dir.path().join("memsnap-demo.pickle")).unwrap();
    assert!(snapshot.entry_count() > 0);
}

#[test]
fn demo_oom_at_step_records_the_oom_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("oom.pickle");
    let run = demo(
        dir.path(),
        &[
            "--no-view",
            "--steps",
            "4",
            "--oom-at-step",
            "2",
            "--device-memory",
            "4GiB",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("step 2: out of memory in the forward pass"),
        "{stdout}"
    );

    let (snapshot, _) = memsnap_format::read_path(&out).unwrap();
    assert_eq!(validate(&snapshot), vec![]);
    let trace = &snapshot.traces()[0];
    let oom = trace
        .iter()
        .position(|e| e.action == Action::Oom)
        .expect("an oom entry");
    // The run stopped at the OOM: nothing is allocated after it, and the step before it
    // did run its optimizer.
    assert!(!trace[oom..].iter().any(|e| e.action == Action::Alloc));
    assert!(trace[..oom].iter().any(
        |e| e.action == Action::Alloc && phase(&frame_names(&snapshot, e)) == Some("optimizer")
    ));
}

/// Regression: `memsnap demo | head` panicked ("failed printing to stdout: Broken pipe")
/// once the reader had gone. A closed stdout ends the program quietly, with success.
#[test]
fn a_closed_stdout_ends_the_demo_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .arg("demo")
        .args(SMALL)
        .current_dir(dir.path())
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run memsnap demo");
    // Hang up before the first line, as `head -0` does (the demo's first write comes
    // milliseconds after start: the process must first start and parse its arguments).
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
}

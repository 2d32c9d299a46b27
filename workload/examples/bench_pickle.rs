//! Pickle codec benchmark, side by side with CPython in the same run.
//!
//! ```text
//! cargo run --release -p memsnap-workload --example bench_pickle -- --entries 1000000
//! ```
//!
//! Generates a synthetic training-run snapshot (`memsnap_workload`) with about N trace
//! entries and shared stacks. For each layout asked for (by default both PyTorch layouts, one
//! after the other in the same run) CPython then re-dumps it the way
//! `torch.cuda.memory._dump_snapshot()` lays it out (`--layout pytorch`: each frames list
//! shared through the memo by every entry with that stack): PyTorch builds each entry's
//! `compile_context` and `user_metadata` from a fresh `std::string`, so every `'N/A'` is its own
//! object, written in full (about 60 MB for 1M entries); our writer would share it (about 55 MB,
//! `--layout memsnap`). `--layout pytorch-fresh-frames` also gives every entry its own frames
//! list (of shared frame dicts), as most entries of real PyTorch files have (about 200 MB).
//! Then it measures on that file:
//!
//! * load: our `io::read_path` (streams the file through `pickle::read_from`) vs `pickle.load` in `python3` (gc on);
//! * peak RSS of a process that only loads the file: ours (this example re-run in child mode,
//!   `VmHWM` from `/proc/self/status`) vs Python's (`ru_maxrss`);
//! * write: our `pickle::to_vec` of the loaded snapshot vs `pickle.dumps` of the loaded object
//!   (protocol 4), and the two output sizes.
//!
//! Each ratio is reference / ours, so larger is better for us.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use memsnap_format::{io, pickle};
use memsnap_workload::{generate, TrainingRun};

const USAGE: &str = "\
usage: bench_pickle [--entries N] [--runs N] [--keep PATH] [--layout L[,L...]]

  --entries N   about N trace entries (default 1000000)
  --layout L    pytorch: the file as PyTorch writes it, frames lists shared through the memo;
                pytorch-fresh-frames: also a new frames list per entry, as in real files;
                memsnap: as our writer writes it;
                several, comma-separated, are measured one after the other in one run
                (default pytorch,pytorch-fresh-frames)
  --runs N      timed runs of our side, best kept (default 3)
  --keep PATH   write the generated pickle here instead of a temporary file (with several
                layouts, PATH.LAYOUT for each)";

const LAYOUTS: [&str; 3] = ["pytorch", "pytorch-fresh-frames", "memsnap"];

/// Re-dumps a snapshot with one fresh `compile_context` / `user_metadata` string per entry, as
/// PyTorch's exporter builds them (CPython keeps `''` and 1-character strings shared itself),
/// and with `fresh` a fresh frames list per entry.
const PYTORCH_LAYOUT: &str = r#"
import pickle, sys
with open(sys.argv[1], "rb") as f:
    snapshot = pickle.load(f)
fresh_frames = sys.argv[3] == "fresh"
for trace in snapshot.get("device_traces", []):
    for entry in trace:
        for key in ("compile_context", "user_metadata"):
            if key in entry:
                entry[key] = (entry[key] + ".")[:-1]
        if fresh_frames and "frames" in entry:
            entry["frames"] = list(entry["frames"])
with open(sys.argv[2], "wb") as f:
    pickle.dump(snapshot, f, protocol=4)
"#;

const PYTHON: &str = r#"
import json, pickle, resource, sys, time
path = sys.argv[1]
t = time.perf_counter()
with open(path, "rb") as f:
    obj = pickle.load(f)
load_s = time.perf_counter() - t
rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
out = pickle.dumps(obj, protocol=4)
dump_s = time.perf_counter() - t
print(json.dumps({"load_s": load_s, "rss_kib": rss_kib, "dump_s": dump_s, "dump_bytes": len(out)}))
"#;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("bench_pickle: {message}");
            ExitCode::from(2)
        }
    }
}

struct PythonResult {
    load_s: f64,
    rss_bytes: u64,
    dump_s: f64,
    dump_bytes: u64,
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (mut entries, mut runs, mut keep) = (1_000_000usize, 3usize, None::<PathBuf>);
    let mut layouts = vec!["pytorch".to_owned(), "pytorch-fresh-frames".to_owned()];
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{arg} needs a value\n\n{USAGE}"))
        };
        match arg.as_str() {
            "--child-load" => return child_load(Path::new(&value()?)),
            "--entries" => entries = value()?.parse().map_err(|e| format!("--entries: {e}"))?,
            "--runs" => runs = value()?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--keep" => keep = Some(PathBuf::from(value()?)),
            "--layout" => {
                layouts = value()?.split(',').map(str::to_owned).collect();
                if let Some(bad) = layouts.iter().find(|l| !LAYOUTS.contains(&l.as_str())) {
                    return Err(format!(
                        "--layout {bad}: use pytorch, pytorch-fresh-frames or memsnap"
                    ));
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other}\n\n{USAGE}")),
        }
    }
    if cfg!(debug_assertions) {
        eprintln!("warning: debug build; run with --release for meaningful numbers");
    }

    let t = Instant::now();
    let (snapshot, _) = generate(&TrainingRun {
        target_entries: Some(entries),
        ..TrainingRun::default()
    });
    let bytes = pickle::to_vec(&snapshot);
    let tmp = tempdir_path();
    let ours = tmp.join("memsnap-layout.pickle");
    io::write_atomic(&ours, &bytes).map_err(|e| e.to_string())?;
    println!(
        "snapshot: {} entries, {} stacks, {} frames (made in {:.1} s)",
        snapshot.entry_count(),
        snapshot.stacks.len(),
        snapshot.frames.len(),
        t.elapsed().as_secs_f64()
    );
    drop(snapshot);
    drop(bytes);

    let result = layouts.iter().try_for_each(|layout| {
        let path = match &keep {
            Some(keep) if layouts.len() == 1 => keep.clone(),
            Some(keep) => {
                let mut name = keep.clone().into_os_string();
                name.push(format!(".{layout}"));
                PathBuf::from(name)
            }
            None => tmp.join(format!("{layout}.pickle")),
        };
        measure_layout(layout, &ours, &path, runs)
    });
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Writes the file in `layout` (from our writer's file `ours`) to `path` and measures it.
fn measure_layout(layout: &str, ours: &Path, path: &Path, runs: usize) -> Result<(), String> {
    if layout == "memsnap" {
        std::fs::copy(ours, path).map_err(|e| e.to_string())?;
    } else {
        let status = Command::new("python3")
            .args(["-c", PYTORCH_LAYOUT])
            .arg(ours)
            .arg(path)
            .arg(if layout == "pytorch" {
                "shared"
            } else {
                "fresh"
            })
            .status()
            .map_err(|e| format!("python3 is needed for --layout pytorch: {e}"))?;
        if !status.success() {
            return Err(format!("re-dumping in PyTorch's layout failed: {status}"));
        }
    }
    // On disk before either side reads it: the kernel writing the just-made file back
    // (100-200 MB) took a core from whichever side was timed while it did.
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| e.to_string())?;
    let file_size = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    println!(
        "\n== {layout} layout: pickle {:.1} MB at {}",
        file_size as f64 / 1e6,
        path.display(),
    );

    // Ours: load (file read included) and write, best of `runs`.
    let (mut load_s, mut write_s, mut our_size) = (f64::MAX, f64::MAX, 0);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let (snap, _) = io::read_path(path).map_err(|e| e.to_string())?;
        load_s = load_s.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let out = pickle::to_vec(&snap);
        write_s = write_s.min(t.elapsed().as_secs_f64());
        our_size = out.len();
    }
    let our_rss = child_rss(path)?;

    match python_side(path)? {
        None => {
            println!("load: ours {load_s:.3} s (python3 not found: no reference)");
            println!("write: ours {write_s:.3} s, {our_size} bytes");
            println!("peak RSS (load only): ours {:.1} MB", our_rss as f64 / 1e6);
        }
        Some(py) => {
            let load_ratio = py.load_s / load_s;
            let rss_ratio = py.rss_bytes as f64 / our_rss as f64;
            let write_ratio = py.dump_s / write_s;
            let size_ratio = py.dump_bytes as f64 / our_size as f64;
            let verdict = |ok: bool| if ok { "meets" } else { "MISSES" };
            println!(
                "load: ours {load_s:.3} s, python {:.3} s, ratio {load_ratio:.1}x ({} target 15x)",
                py.load_s,
                verdict(load_ratio >= 15.0)
            );
            println!(
                "peak RSS (load only): ours {:.1} MB, python {:.1} MB, ratio {rss_ratio:.2}x ({} target 5x)",
                our_rss as f64 / 1e6,
                py.rss_bytes as f64 / 1e6,
                verdict(rss_ratio >= 5.0)
            );
            println!(
                "write: ours {write_s:.3} s, python {:.3} s, ratio {write_ratio:.1}x ({} target 5x)",
                py.dump_s,
                verdict(write_ratio >= 5.0)
            );
            println!(
                "size: ours {our_size} bytes, python {} bytes, ratio {size_ratio:.3}x ({} target >= 1x)",
                py.dump_bytes,
                verdict(size_ratio >= 1.0)
            );
        }
    }
    Ok(())
}

fn tempdir_path() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memsnap-bench-pickle-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Child mode: load the file once and print the peak RSS.
fn child_load(path: &Path) -> Result<(), String> {
    let (snap, _) = io::read_path(path).map_err(|e| e.to_string())?;
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    let hwm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("no VmHWM in /proc/self/status")?;
    println!("{} {}", hwm_kib, snap.entry_count());
    Ok(())
}

fn child_rss(path: &Path) -> Result<u64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .arg("--child-load")
        .arg(path)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "child load failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let kib: u64 = text
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("child printed {text:?}"))?;
    Ok(kib * 1024)
}

fn python_side(path: &Path) -> Result<Option<PythonResult>, String> {
    let out = match Command::new("python3")
        .arg("-c")
        .arg(PYTHON)
        .arg(path)
        .output()
    {
        Ok(out) => out,
        Err(_) => return Ok(None),
    };
    if !out.status.success() {
        return Err(format!(
            "python3 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("python3 output: {e}"))?;
    let num = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| format!("python3 output lacks {k}"))
    };
    Ok(Some(PythonResult {
        load_s: num("load_s")?,
        rss_bytes: num("rss_kib")? as u64 * 1024,
        dump_s: num("dump_s")?,
        dump_bytes: num("dump_bytes")? as u64,
    }))
}

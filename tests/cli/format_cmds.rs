//! `info`, `convert`, `validate` and `memviz` through the real binary. The real-snapshot tests
//! read `MEMSNAP_REAL_SNAPSHOTS` and skip (with a notice) when it is unset.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Output;

use memsnap_format::{Action, Block, BlockState, Segment, Snapshot, TraceEntry};

use crate::common::{memsnap, real_snapshots_dir};

const MEMVIZ_COMMANDS: [&str; 4] = ["stats", "trace", "segments", "memory"];

/// The real snapshot files (`*.pickle`, `*.pkl`), sorted by name.
fn real_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read MEMSNAP_REAL_SNAPSHOTS")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("pickle" | "pkl")
            )
        })
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        15,
        "expected the 15 real snapshots in {}",
        dir.display()
    );
    files
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .expect("utf-8 name")
        .to_string()
}

fn golden_dir(dir: &Path) -> PathBuf {
    dir.join("golden_memory_viz_torch2.15.0")
}

/// The decompressed golden output of `_memory_viz.py <cmd>` for a file stem.
fn golden(dir: &Path, stem: &str, cmd: &str) -> Vec<u8> {
    let name = match cmd {
        "stats" | "trace" => format!("{stem}.{cmd}.txt.gz"),
        _ => format!("{stem}.{cmd}.collapsed.txt.gz"),
    };
    let path = golden_dir(dir).join(name);
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut text)
        .expect("gunzip golden");
    text
}

/// The exit code `_memory_viz.py` had, from `exit_codes.txt` (`<file> <cmd> rc=<n>`).
fn golden_exit_code(dir: &Path, file_name: &str, cmd: &str) -> i32 {
    let codes =
        std::fs::read_to_string(golden_dir(dir).join("exit_codes.txt")).expect("exit_codes.txt");
    codes
        .lines()
        .find_map(|line| {
            let mut parts = line.split_whitespace();
            let (f, c, rc) = (parts.next()?, parts.next()?, parts.next()?);
            (f == file_name && c == cmd).then(|| rc.trim_start_matches("rc=").parse().ok())?
        })
        .unwrap_or_else(|| panic!("no exit code for {file_name} {cmd}"))
}

fn str_arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Where two outputs first differ, for a readable failure.
fn first_difference(ours: &[u8], python: &[u8]) -> String {
    let (o, p) = (
        String::from_utf8_lossy(ours),
        String::from_utf8_lossy(python),
    );
    for (i, (a, b)) in o.split('\n').zip(p.split('\n')).enumerate() {
        if a != b {
            return format!("line {}:\n  ours:   {a:.300}\n  python: {b:.300}", i + 1);
        }
    }
    format!(
        "lengths differ: ours {} bytes, python {} bytes",
        ours.len(),
        python.len()
    )
}

#[test]
fn memviz_matches_every_golden_file_byte_for_byte() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let mut failures = Vec::new();
    let mut compared = 0;
    for file in real_files(&dir) {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_string();
        for cmd in MEMVIZ_COMMANDS {
            let out = memsnap(&["memviz", cmd, str_arg(&file)]);
            let want_code = golden_exit_code(&dir, &name, cmd);
            let code = out.status.code().unwrap_or(-1);
            if code != want_code {
                failures.push(format!(
                    "{name} {cmd}: exit {code}, python {want_code}: {}",
                    stderr(&out)
                ));
                continue;
            }
            let want = golden(&dir, &stem(&file), cmd);
            if out.stdout != want {
                failures.push(format!(
                    "{name} {cmd}: {}",
                    first_difference(&out.stdout, &want)
                ));
            }
            compared += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 60 differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(compared, 60);
}

#[test]
fn memviz_trace_of_a_bare_segment_list_fails_like_python() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let file = dir.join("06_muduard_legacy_segment_list.pkl");
    let out = memsnap(&["memviz", "trace", str_arg(&file)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = stderr(&out);
    let python = std::fs::read_to_string(
        golden_dir(&dir).join("06_muduard_legacy_segment_list.trace.stderr.txt"),
    )
    .expect("stderr golden");
    let python_error = python.lines().last().expect("last line");
    assert!(
        err.contains(python_error),
        "{err} should quote {python_error}"
    );
    assert!(err.contains("bare segment list"), "{err}");
}

/// `stats` reads only the segments, so a file cut behind them still prints Python's text;
/// `--validate` reads every byte and refuses it with the byte offset (exit 2).
#[test]
fn memviz_validate_reads_what_stats_skips() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let bytes =
        std::fs::read(dir.join("09_magma27_v211_windows_python_frames.pickle")).expect("file 09");
    let cut = tmp.path().join("cut.pickle");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    let out = memsnap(&["memviz", "stats", str_arg(&cut)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        out.stdout,
        golden(&dir, "09_magma27_v211_windows_python_frames", "stats")
    );
    let out = memsnap(&["memviz", "stats", "--validate", str_arg(&cut)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    assert!(stderr(&out).contains("at byte"), "{}", stderr(&out));
}

#[test]
fn memviz_writes_the_collapsed_text_with_dash_o() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = dir.join("04_charran78_small_state.pickle");
    for cmd in ["segments", "memory"] {
        let out_path = tmp.path().join(format!("{cmd}.txt"));
        let out = memsnap(&["memviz", cmd, str_arg(&file), "-o", str_arg(&out_path)]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(out.stdout.is_empty());
        let written = std::fs::read(&out_path).expect("output written");
        assert_eq!(written, golden(&dir, "04_charran78_small_state", cmd));
    }
}

#[test]
fn info_summarises_every_real_file() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    for file in real_files(&dir) {
        let out = memsnap(&["info", str_arg(&file)]);
        assert!(out.status.success(), "{}: {}", file.display(), stderr(&out));
        let text = stdout(&out);
        for field in [
            "format:      pickle",
            "era:",
            "devices:",
            "segments:",
            "memory:",
            "stacks:",
        ] {
            assert!(
                text.contains(field),
                "{}: no `{field}` in\n{text}",
                file.display()
            );
        }
    }
    let info = |name: &str| stdout(&memsnap(&["info", str_arg(&dir.join(name))]));
    assert!(info("01_sunnysood80_empty_4dev.pickle").contains("era:         PyTorch 2.5–2.8"));
    assert!(info("01_sunnysood80_empty_4dev.pickle").contains("devices:     4"));
    assert!(info("06_muduard_legacy_segment_list.pkl").contains("bare segment list"));
    assert!(
        info("10_maphsge4_v21era_traces_no_time_us.pickle").contains("era:         PyTorch 2.1 ")
    );
    assert!(info("14_constructorsun_expandable_oom_4dev.pickle").contains("expandable"));
    // The README notes a free whose alloc is not in the trace.
    assert!(info("15_kkaitlyn_2p7b_compile_annotations.pickle").contains("looks truncated"));
    assert!(info("11_jaspersolt_snapshot_actions.pickle").contains("time span:"));
}

#[test]
fn validate_passes_every_real_file() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let files = real_files(&dir);
    let mut args = vec!["validate"];
    args.extend(files.iter().map(|f| str_arg(f)));
    let out = memsnap(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        stdout(&out)
            .lines()
            .filter(|l| l.contains(": ok ("))
            .count(),
        15
    );
}

/// A snapshot whose segment sums disagree with its blocks and whose trace frees the wrong size.
fn broken_snapshot() -> Snapshot {
    let mut s = Snapshot::new(1);
    let mut seg = Segment::new(0, 0x10_0000, 4096, 0);
    seg.allocated_size = Some(1024); // the blocks say 2048
    seg.active_size = Some(2048);
    seg.requested_size = Some(2000);
    let stack = s.intern_stack([]);
    seg.blocks = vec![
        Block {
            address: Some(0x10_0000),
            size: 2048,
            requested_size: Some(2000),
            state: BlockState::ActiveAllocated,
            frames: Some(stack),
            forward_frames: None,
            history: None,
            extra: Vec::new(),
            exact: Default::default(),
        },
        Block {
            address: Some(0x10_0800),
            size: 2048,
            requested_size: Some(0),
            state: BlockState::Inactive,
            frames: Some(stack),
            forward_frames: None,
            history: None,
            extra: Vec::new(),
            exact: Default::default(),
        },
    ];
    seg.frames = Some(stack);
    s.segments.push(seg);
    s.device_traces = Some(vec![vec![
        TraceEntry::new(Action::Alloc, 0x10_0000, 2000, 0),
        TraceEntry::new(Action::FreeCompleted, 0x10_0000, 1000, 0),
    ]]);
    s
}

#[test]
fn validate_reports_each_violation_with_its_place() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("broken.pickle");
    memsnap_format::write_path(&path, &broken_snapshot(), None).expect("write");
    let out = memsnap(&["validate", str_arg(&path)]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("segments[0]: allocated_size is 1024 but its blocks sum to 2048"),
        "{text}"
    );
    assert!(
        text.contains("device_traces[0][1]: frees 1000 bytes"),
        "{text}"
    );
    assert!(!text.contains(": ok ("), "{text}");
}

#[test]
fn convert_round_trips_through_every_format() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    for name in [
        "13_bcrafton_new_cpp_frames_annotations.pickle",
        "14_constructorsun_expandable_oom_4dev.pickle",
        "06_muduard_legacy_segment_list.pkl",
    ] {
        let original = dir.join(name);
        let stem = stem(&original);
        for (via, flag) in [
            ("json", None),
            ("msgpack.zst", None),
            ("json.gz", None),
            ("bin", Some("msgpack")),
        ] {
            let middle = tmp.path().join(format!("{stem}.{via}"));
            let back = tmp.path().join(format!("{stem}.from-{via}.pickle"));
            let mut args = vec!["convert", str_arg(&original), "-o", str_arg(&middle)];
            if let Some(f) = flag {
                args.extend(["--to", f]);
            }
            let out = memsnap(&args);
            assert!(out.status.success(), "{name} -> {via}: {}", stderr(&out));
            let out = memsnap(&["convert", str_arg(&middle), "-o", str_arg(&back)]);
            assert!(out.status.success(), "{via} -> pickle: {}", stderr(&out));
            // The pickle that went through another format prints exactly what Python printed.
            for cmd in ["stats", "segments"] {
                let out = memsnap(&["memviz", cmd, str_arg(&back)]);
                assert!(
                    out.stdout == golden(&dir, &stem, cmd),
                    "{name} via {via}: {cmd} differs"
                );
            }
        }
        // pickle -> pickle keeps everything `_memory_viz.py` prints, trace key order included.
        // (Byte identity with PyTorch's own pickle is the format crate's test, not this one.)
        let copy = tmp.path().join(format!("{stem}.copy.pickle"));
        let out = memsnap(&["convert", str_arg(&original), "-o", str_arg(&copy)]);
        assert!(out.status.success(), "{}", stderr(&out));
        for cmd in MEMVIZ_COMMANDS {
            let out = memsnap(&["memviz", cmd, str_arg(&copy)]);
            let want = golden(&dir, &stem, cmd);
            assert!(
                out.stdout == want,
                "{name} copy: {cmd}: {}",
                first_difference(&out.stdout, &want)
            );
        }
    }
}

#[test]
fn convert_needs_a_known_output_format() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("in.pickle");
    memsnap_format::write_path(&input, &broken_snapshot(), None).expect("write");
    let out = memsnap(&[
        "convert",
        str_arg(&input),
        "-o",
        str_arg(&tmp.path().join("out.bin")),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--to"), "{}", stderr(&out));
    assert!(!tmp.path().join("out.bin").exists());
}

#[test]
fn bad_input_exits_2_and_names_the_problem() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let garbage = tmp.path().join("garbage.pickle");
    std::fs::write(&garbage, b"this is not a snapshot\n").expect("write");
    let empty = tmp.path().join("empty.pickle");
    std::fs::write(&empty, b"").expect("write");
    let missing = tmp.path().join("missing.pickle");
    let out_path = tmp.path().join("out.json");
    let mut cases = vec![
        (garbage.clone(), "unrecognised file format"),
        (empty.clone(), "the file is empty"),
        (missing.clone(), "cannot read"),
    ];
    // A pickle cut in half must be refused, not half-read.
    let whole = tmp.path().join("whole.pickle");
    memsnap_format::write_path(&whole, &broken_snapshot(), None).expect("write");
    let bytes = std::fs::read(&whole).expect("read");
    let truncated = tmp.path().join("truncated.pickle");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    cases.push((truncated, "at byte"));
    for (path, problem) in &cases {
        let p = str_arg(path);
        for args in [
            vec!["info", p],
            vec!["validate", p],
            vec!["convert", p, "-o", str_arg(&out_path)],
            vec!["memviz", "stats", p],
            vec!["memviz", "trace", p],
            vec!["memviz", "segments", p],
        ] {
            let out = memsnap(&args);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(
                err.contains(problem),
                "{args:?}: `{err}` should mention `{problem}`"
            );
            assert!(err.contains(p), "{args:?}: `{err}` should name the file");
            assert!(!err.contains("panicked"), "{args:?}: {err}");
        }
    }
    assert!(!out_path.exists());
}

#[test]
fn help_teaches_with_examples() {
    for cmd in ["info", "convert", "validate", "memviz"] {
        let out = memsnap(&[cmd, "--help"]);
        assert!(out.status.success());
        assert!(
            stdout(&out).contains("Examples:"),
            "{cmd} --help has no examples"
        );
    }
    let memviz = stdout(&memsnap(&["memviz", "--help"]));
    assert!(
        memviz.contains("flamegraph.pl"),
        "memviz --help should say it prints collapsed text"
    );
}

/// A gzipped pickle takes the full decoding path (the plain pickles above skip the trace for
/// `stats`, `segments` and `memory`); both must print the same bytes.
#[test]
fn memviz_prints_the_same_for_a_compressed_snapshot() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    for name in [
        "14_constructorsun_expandable_oom_4dev",
        "09_magma27_v211_windows_python_frames",
    ] {
        let raw = std::fs::read(dir.join(format!("{name}.pickle"))).expect("read");
        let gz = tmp.path().join(format!("{name}.pickle.gz"));
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, &raw).expect("gzip");
        std::fs::write(&gz, enc.finish().expect("gzip")).expect("write");
        for cmd in MEMVIZ_COMMANDS {
            let out = memsnap(&["memviz", cmd, str_arg(&gz)]);
            assert!(out.status.success(), "{name} {cmd}: {}", stderr(&out));
            let want = golden(&dir, name, cmd);
            assert!(
                out.stdout == want,
                "{name}.gz {cmd}: {}",
                first_difference(&out.stdout, &want)
            );
        }
    }
}

/// Regression: content detection opened a named pipe to sniff its first bytes, and the reader
/// then found the rest of the stream only (`memsnap info <(zcat run.pickle.gz)` failed with
/// "unrecognised file format"). A pipe is read once, whole.
#[test]
fn a_snapshot_from_a_pipe_is_not_eaten_by_format_detection() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fifo = tmp.path().join("piped.pickle");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("notice: mkfifo is not available; skipping the pipe test");
        return;
    }
    let bytes = memsnap_format::pickle::to_vec(&broken_snapshot());
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            // Opening blocks until memsnap opens the pipe for reading; a reader that gives up
            // early makes the write fail, which the assertions below report.
            let _ = std::fs::write(&fifo, &bytes);
        })
    };
    // A reader that eats the stream while sniffing blocks forever reopening the pipe:
    // give it 60 s, then stop it and fail.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_memsnap"))
        .args(["info", str_arg(&fifo)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run memsnap");
    let started = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("memsnap output");
    // If memsnap never opened the pipe, the writer still waits in `open`: a non-blocking
    // reader (O_NONBLOCK, Linux's 0o4000) releases it so the test fails instead of hanging.
    let _release = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(0o4000)
            .open(&fifo)
    };
    writer.join().expect("writer");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("pickle"), "{}", stdout(&out));
}

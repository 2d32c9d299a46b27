//! `memsnap export --to flamegraph|pprof` through the real binary: the files it writes, what it
//! prints, its errors and exit codes. (The numbers themselves are checked in
//! memsnap-converters' `profiles` tests.)

use memsnap_format::{Action, Frame, Snapshot, TraceEntry};

use crate::common::{memsnap, real_snapshots_dir};

/// Two allocations of 1000 and 3000 bytes at times 100 and 110 µs, the first freed at 120.
fn small_run(dir: &std::path::Path) -> std::path::PathBuf {
    let mut s = Snapshot::new(1);
    let stack = s.intern_stack(vec![Frame::new("forward", "/home/me/model.py", 42)]);
    let trace = &mut s.device_traces.as_mut().expect("traces")[0];
    for (i, (action, addr, size)) in [
        (Action::Alloc, 0x1000, 1000),
        (Action::Alloc, 0x2000, 3000),
        (Action::FreeCompleted, 0x1000, 1000),
    ]
    .into_iter()
    .enumerate()
    {
        let mut e = TraceEntry::new(action, addr, size, 0);
        e.frames = Some(stack);
        e.set_time_us(Some(100 + 10 * i as i64));
        trace.push(e);
    }
    let path = dir.join("run.pickle");
    memsnap_format::write_path(&path, &s, None).expect("write snapshot");
    path
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn export_writes_a_flame_graph_and_a_pprof_profile() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = small_run(dir.path());
    let svg = dir.path().join("peak.svg");
    let out = memsnap(&[
        "export",
        input.to_str().expect("utf-8"),
        "--to",
        "flamegraph",
        "-o",
        svg.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("live memory at the peak (trace entry 1, t+10 µs): 3.9 KiB in 2 blocks"),
        "{stdout}"
    );
    let svg_text = std::fs::read_to_string(&svg).expect("svg written");
    assert!(svg_text.contains("all (4,000 bytes, 100%)"));
    assert!(svg_text.contains("model.py:42:forward (4,000 bytes, 100.00%)"));

    let pprof = dir.path().join("end.pb.gz");
    let out = memsnap(&[
        "export",
        input.to_str().expect("utf-8"),
        "--to",
        "pprof",
        "--at",
        "end",
        "-o",
        pprof.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bytes = std::fs::read(&pprof).expect("pprof written");
    assert_eq!(bytes[..2], [0x1f, 0x8b], "gzipped");
    let profile = memsnap_converters::pprof::decode(&bytes).expect("profile.proto");
    let inuse: i64 = profile.sample.iter().map(|s| s.value[1]).sum();
    assert_eq!(inuse, 3000, "only the 3000-byte block is live at the end");
    // Atomic write: no temporary file left beside the output.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".tmp")), "{names:?}");
}

#[test]
fn export_refuses_bad_instants_and_inputs_with_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = small_run(dir.path());
    let input = input.to_str().expect("utf-8");
    let out_path = dir.path().join("x.svg");
    let out_path = out_path.to_str().expect("utf-8");
    let run = |extra: &[&str]| {
        let mut args = vec!["export", input, "--to", "flamegraph", "-o", out_path];
        args.extend_from_slice(extra);
        memsnap(&args)
    };
    let out = run(&["--at", "event:9"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("trace entry 9 is past the end of device 0's trace (3 entries)"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["--at", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("is not an instant"));
    let out = run(&["--min-size", "12 parsecs"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        !std::path::Path::new(out_path).exists(),
        "nothing written on error"
    );

    let garbage = dir.path().join("garbage.pickle");
    std::fs::write(&garbage, b"not a snapshot").expect("write");
    let out = memsnap(&[
        "export",
        garbage.to_str().expect("utf-8"),
        "--to",
        "pprof",
        "-o",
        out_path,
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("garbage.pickle"),
        "names the file"
    );
}

#[test]
fn export_help_teaches_the_profile_options() {
    let out = memsnap(&["export", "--help"]);
    let help = text(&out.stdout);
    for needle in [
        "--at",
        "event:1234",
        "--by",
        "--min-size",
        "--device",
        "--to flamegraph",
    ] {
        assert!(help.contains(needle), "help lacks {needle}");
    }
}

#[test]
fn every_real_snapshot_exports_through_the_command() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let out_dir = tempfile::tempdir().expect("tempdir");
    // The largest real file, and one without a trace (state only).
    for name in [
        "15_kkaitlyn_2p7b_compile_annotations.pickle",
        "07_muduard_v22_state_2dev.pickle",
    ] {
        let input = dir.join(name);
        for (to, file) in [("flamegraph", "out.svg"), ("pprof", "out.pb.gz")] {
            let output = out_dir.path().join(file);
            let out = memsnap(&[
                "export",
                input.to_str().expect("utf-8"),
                "--to",
                to,
                "-o",
                output.to_str().expect("utf-8"),
            ]);
            assert!(out.status.success(), "{name} {to}: {}", text(&out.stderr));
            assert!(output.metadata().expect("written").len() > 0);
        }
    }
}

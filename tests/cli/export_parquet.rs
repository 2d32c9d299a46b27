//! `memsnap export --to parquet`: the command around `memsnap_converters::parquet` (the tables
//! themselves are checked in the converters' tests).

use crate::common::memsnap;
use memsnap_workload::{generate, TrainingRun};

fn path_arg(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

#[test]
fn export_to_parquet_writes_a_folder_per_table_and_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (snapshot, _) = generate(&TrainingRun {
        steps: 2,
        ..TrainingRun::default()
    });
    let inputs = [
        tmp.path().join("rank0.pickle"),
        tmp.path().join("rank1.pickle"),
    ];
    for f in &inputs {
        memsnap_format::write_path(f, &snapshot, None).expect("write");
    }
    let out = tmp.path().join("tables");
    let args = |extra: &[&'static str]| {
        let mut a = vec!["export", path_arg(&inputs[0]), path_arg(&inputs[1])];
        a.extend(["--to", "parquet", "-o", path_arg(&out)]);
        a.extend(extra);
        a
    };

    let run = memsnap(&args(&[]));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("2 inputs"), "{stdout}");
    for table in [
        "snapshots",
        "devices",
        "allocations",
        "steps",
        "segments",
        "frames",
        "stacks",
    ] {
        for rank in ["rank-00000.parquet", "rank-00001.parquet"] {
            assert!(out.join(table).join(rank).is_file(), "{table}/{rank}");
        }
    }

    // Again: refused, with the way out named; with --force, replaced.
    let run = memsnap(&args(&[]));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(stderr.contains("--force"), "{stderr}");
    let run = memsnap(&args(&["--force"]));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

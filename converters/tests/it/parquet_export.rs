//! Parquet export: the tables read back with arrow-rs and checked against numbers counted
//! from the snapshot itself (trace entries, final blocks) and the workload's ground truth.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, RecordBatch};
use memsnap_converters::parquet::{
    export_files, ranks_from_names, Export, ExportOptions, Input, ParquetError, MANIFEST, TABLES,
};
use memsnap_converters::ConvertError;
use memsnap_format::{Action, BlockState, Snapshot};
use memsnap_workload::{generate, Role, TrainingRun};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::common::{real_snapshots_dir, snapshot_files};

/// Every batch of every file of a table, files in name order.
pub(super) fn read_table(dir: &Path, table: &str) -> Vec<RecordBatch> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join(table))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mut batches = Vec::new();
    for f in files {
        assert_eq!(f.extension().unwrap(), "parquet", "{}", f.display());
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&f).unwrap())
            .unwrap()
            .build()
            .unwrap();
        batches.extend(reader.map(|b| b.unwrap()));
    }
    batches
}

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

/// A column's values as `Option<i64>` (Int64 and timestamp columns).
pub(super) fn ints(batches: &[RecordBatch], column: &str) -> Vec<Option<i64>> {
    let mut out = Vec::new();
    for b in batches {
        let c = b
            .column_by_name(column)
            .unwrap_or_else(|| panic!("no column {column}"));
        let c = arrow_cast_i64(c.as_ref());
        out.extend((0..c.len()).map(|i| c.is_valid(i).then(|| c.value(i))));
    }
    out
}

fn arrow_cast_i64(c: &dyn Array) -> arrow_array::PrimitiveArray<Int64Type> {
    match c.data_type() {
        arrow_schema::DataType::Int64 => c.as_primitive::<Int64Type>().clone(),
        arrow_schema::DataType::Timestamp(..) => {
            let t = c.as_primitive::<arrow_array::types::TimestampMicrosecondType>();
            t.iter().collect()
        }
        other => panic!("not an integer column: {other}"),
    }
}

fn strs(batches: &[RecordBatch], column: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for b in batches {
        let c = b.column_by_name(column).unwrap().as_string::<i32>();
        out.extend(c.iter().map(|v| v.map(str::to_string)));
    }
    out
}

fn bools(batches: &[RecordBatch], column: &str) -> Vec<bool> {
    let mut out = Vec::new();
    for b in batches {
        out.extend(
            b.column_by_name(column)
                .unwrap()
                .as_boolean()
                .iter()
                .map(|v| v.unwrap()),
        );
    }
    out
}

/// Per device: (number of `alloc` entries, their summed sizes), counted from the trace.
fn alloc_entries(snapshot: &Snapshot) -> BTreeMap<i64, (usize, i64)> {
    let mut out = BTreeMap::new();
    for (d, trace) in snapshot.traces().iter().enumerate() {
        for e in trace.iter().filter(|e| e.action == Action::Alloc) {
            let slot = out.entry(d as i64).or_insert((0, 0));
            slot.0 += 1;
            slot.1 += e.size as i64;
        }
    }
    out
}

fn export(dir: &Path, snapshots: &[(i64, &Snapshot)]) -> PathBuf {
    let out = dir.join("tables");
    let export = Export::create(&out, &ExportOptions::default()).unwrap();
    for (rank, s) in snapshots {
        let input = Input {
            rank: *rank,
            file: format!("rank{rank}.pickle"),
            encoding: "pickle".into(),
        };
        export.add(&input, s).unwrap();
    }
    let summary = export.finish().unwrap();
    assert_eq!(summary.path, out);
    out
}

fn small_run(devices: usize, seed: u64) -> (Snapshot, memsnap_workload::GroundTruth) {
    generate(&TrainingRun {
        devices,
        steps: 3,
        seed,
        leak_bytes_per_step: 1 << 20,
        ..TrainingRun::default()
    })
}

#[test]
fn allocations_match_the_trace_and_the_final_blocks() {
    let (snapshot, truth) = small_run(2, 1);
    let dir = tempfile::tempdir().unwrap();
    let out = export(dir.path(), &[(0, &snapshot)]);
    let allocs = read_table(&out, "allocations");

    // Rows and bytes per device equal the trace's alloc entries (the run has no memory
    // from before its window).
    let expected = alloc_entries(&snapshot);
    let devices = ints(&allocs, "device");
    let sizes = ints(&allocs, "size");
    let mut got: BTreeMap<i64, (usize, i64)> = BTreeMap::new();
    for (d, s) in devices.iter().zip(&sizes) {
        let slot = got.entry(d.unwrap()).or_insert((0, 0));
        slot.0 += 1;
        slot.1 += s.unwrap();
    }
    assert_eq!(got, expected);
    assert_eq!(expected.len(), 2);
    assert!(strs(&allocs, "origin")
        .iter()
        .all(|o| o.as_deref() == Some("traced")));

    // What is alive at the end is what the final segments hold: requested bytes and block
    // sizes of the active blocks.
    let alive = bools(&allocs, "alive_at_end");
    let blocks = ints(&allocs, "block_size");
    let (mut alive_bytes, mut alive_blocks) = (0i64, 0i64);
    for i in 0..alive.len() {
        if alive[i] {
            alive_bytes += sizes[i].unwrap();
            alive_blocks += blocks[i].expect("a live allocation's block is in the segments");
        } else {
            assert_eq!(blocks[i], None);
        }
    }
    let active = snapshot
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated);
    let (requested, block): (i64, i64) = active.fold((0, 0), |(r, b), x| {
        (r + x.requested_size.unwrap() as i64, b + x.size as i64)
    });
    assert_eq!((alive_bytes, alive_blocks), (requested, block));
    assert!(alive_bytes > 0);

    // Times are the entries' own; a free comes after its alloc.
    let alloc_t = ints(&allocs, "alloc_time");
    let free_t = ints(&allocs, "free_completed_time");
    assert!(alloc_t.iter().all(Option::is_some));
    for (a, f) in alloc_t.iter().zip(&free_t) {
        if let Some(f) = f {
            assert!(a.unwrap() <= *f);
        }
    }

    // Categories: the workload's roles, counted per device.
    let categories = strs(&allocs, "category");
    for (d, dev) in truth.devices.iter().enumerate() {
        let mut want: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, role) in &dev.roles {
            *want.entry(role.name()).or_default() += 1;
        }
        let mut have: BTreeMap<&str, usize> = BTreeMap::new();
        for (c, dd) in categories.iter().zip(&devices) {
            if *dd == Some(d as i64) {
                *have.entry(c.as_deref().unwrap()).or_default() += 1;
            }
        }
        // Complete steps only are in the truth's roles; compare the categories it names.
        assert_eq!(
            have.get(Role::Parameter.name()),
            want.get(Role::Parameter.name()),
            "device {d}"
        );
        assert_eq!(
            have.get(Role::OptimizerState.name()),
            want.get(Role::OptimizerState.name()),
            "device {d}"
        );
    }

    // Every allocation has a site, and phases are the four names.
    assert!(strs(&allocs, "site")
        .iter()
        .all(|s| s.as_deref().is_some_and(|s| !s.is_empty())));
    let phases: BTreeSet<String> = strs(&allocs, "phase").into_iter().flatten().collect();
    assert_eq!(
        phases,
        ["backward", "forward", "optimizer", "setup"]
            .map(String::from)
            .into()
    );
}

#[test]
fn steps_devices_and_snapshots_match_the_ground_truth() {
    let (snapshot, truth) = small_run(2, 2);
    let dir = tempfile::tempdir().unwrap();
    let out = export(dir.path(), &[(7, &snapshot)]);

    let steps = read_table(&out, "steps");
    let want: usize = truth.devices.iter().map(|d| d.steps.len()).sum();
    assert_eq!(rows(&steps), want);
    let peaks = ints(&steps, "peak_bytes");
    let devices = ints(&steps, "device");
    for (d, dev) in truth.devices.iter().enumerate() {
        let have: Vec<i64> = peaks
            .iter()
            .zip(&devices)
            .filter(|(_, dd)| **dd == Some(d as i64))
            .map(|(p, _)| p.unwrap())
            .collect();
        let want: Vec<i64> = dev.steps.iter().map(|s| s.peak_bytes as i64).collect();
        assert_eq!(have, want, "device {d}");
    }
    assert!(ints(&steps, "backward_start_event")
        .iter()
        .all(Option::is_some));

    let devs = read_table(&out, "devices");
    assert_eq!(ints(&devs, "device"), vec![Some(0), Some(1)]);
    assert_eq!(ints(&devs, "rank"), vec![Some(7), Some(7)]);
    let entries: Vec<Option<i64>> = snapshot
        .traces()
        .iter()
        .map(|t| Some(t.len() as i64))
        .collect();
    assert_eq!(ints(&devs, "entries"), entries);

    // The live condition the README's query uses, at each device's peak event, adds up to
    // the highest step peak of the ground truth.
    let allocs = read_table(&out, "allocations");
    let (a_dev, a_size) = (ints(&allocs, "device"), ints(&allocs, "size"));
    let (a_start, a_end) = (
        ints(&allocs, "alloc_event"),
        ints(&allocs, "free_completed_event"),
    );
    let peak_events = ints(&devs, "peak_event");
    let peak_bytes = ints(&devs, "peak_bytes");
    for (d, dev) in truth.devices.iter().enumerate() {
        let e = peak_events[d].unwrap();
        let live: i64 = (0..a_dev.len())
            .filter(|&i| a_dev[i] == Some(d as i64))
            .filter(|&i| a_start[i].unwrap_or(0) <= e && a_end[i].is_none_or(|f| e < f))
            .map(|i| a_size[i].unwrap())
            .sum();
        let truth_peak = dev.steps.iter().map(|s| s.peak_bytes).max().unwrap() as i64;
        assert_eq!(
            (live, peak_bytes[d].unwrap()),
            (truth_peak, truth_peak),
            "device {d}"
        );
    }

    let snaps = read_table(&out, "snapshots");
    assert_eq!(rows(&snaps), 1);
    assert_eq!(strs(&snaps, "file"), vec![Some("rank7.pickle".to_string())]);
    assert_eq!(
        ints(&snaps, "entries"),
        vec![Some(snapshot.entry_count() as i64)]
    );

    let segs = read_table(&out, "segments");
    assert_eq!(rows(&segs), snapshot.segments.len());
    let total: i64 = ints(&segs, "total_size").iter().map(|v| v.unwrap()).sum();
    let want: i64 = snapshot.segments.iter().map(|s| s.total_size as i64).sum();
    assert_eq!(total, want);

    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(MANIFEST)).unwrap()).unwrap();
    assert_eq!(manifest["tables"]["steps"], want_steps(&truth));
}

fn want_steps(truth: &memsnap_workload::GroundTruth) -> serde_json::Value {
    truth
        .devices
        .iter()
        .map(|d| d.steps.len())
        .sum::<usize>()
        .into()
}

#[test]
fn frames_and_stacks_are_written_once_and_resolve_every_stack() {
    let (a, _) = small_run(1, 3);
    let (b, _) = small_run(1, 4);
    let dir = tempfile::tempdir().unwrap();
    let out = export(dir.path(), &[(0, &a), (1, &b)]);

    // Distinct frames over both files, by content.
    let mut distinct: HashSet<(String, String, i64)> = HashSet::new();
    for s in [&a, &b] {
        for f in s.frames.iter() {
            distinct.insert((f.filename.clone(), f.name.clone(), f.line.as_i64().unwrap()));
        }
    }
    let frames = read_table(&out, "frames");
    assert_eq!(rows(&frames), distinct.len());
    let frame_ids: HashSet<i64> = ints(&frames, "frame_id").into_iter().flatten().collect();
    assert_eq!(frame_ids.len(), distinct.len());

    // Every allocation's stack is in the stacks table, with as many frames as its stack, and
    // its frames are in the frames table.
    let stacks = read_table(&out, "stacks");
    let mut depth_of: BTreeMap<i64, usize> = BTreeMap::new();
    for (s, f) in ints(&stacks, "stack_id")
        .iter()
        .zip(ints(&stacks, "frame_id"))
    {
        *depth_of.entry(s.unwrap()).or_default() += 1;
        assert!(frame_ids.contains(&f.unwrap()));
    }
    let allocs = read_table(&out, "allocations");
    let ranks = ints(&allocs, "rank");
    let stack_ids = ints(&allocs, "stack_id");
    let mut checked = 0;
    for stack in &stack_ids {
        let stack = stack.expect("the workload records a stack for every allocation");
        assert!(depth_of.contains_key(&stack));
        checked += 1;
    }
    assert_eq!(checked, rows(&allocs));

    // The same call site has the same id at both ranks: the two runs share their stacks.
    let by_rank = |r: i64| -> HashSet<i64> {
        ranks
            .iter()
            .zip(&stack_ids)
            .filter(|(rr, _)| **rr == Some(r))
            .map(|(_, s)| s.unwrap())
            .collect()
    };
    assert!(!by_rank(0).is_disjoint(&by_rank(1)));

    // Two inputs, two ranks, and each rank's rows are its own file's.
    let expected: i64 = alloc_entries(&a).values().map(|v| v.0 as i64).sum();
    assert_eq!(
        ranks.iter().filter(|r| **r == Some(0)).count() as i64,
        expected
    );
    let expected: i64 = alloc_entries(&b).values().map(|v| v.0 as i64).sum();
    assert_eq!(
        ranks.iter().filter(|r| **r == Some(1)).count() as i64,
        expected
    );
    for table in TABLES {
        assert!(out.join(table).join("rank-00000.parquet").is_file());
        assert!(out.join(table).join("rank-00001.parquet").is_file());
    }
}

#[test]
fn ranks_come_from_the_names_when_each_has_a_distinct_one() {
    let paths = |names: &[&str]| names.iter().map(PathBuf::from).collect::<Vec<_>>();
    assert_eq!(
        ranks_from_names(&paths(&["run/rank3.pickle", "run/snapshot_rank_12.pickle"])),
        vec![3, 12]
    );
    assert_eq!(
        ranks_from_names(&paths(&["job/RANK-5/mem.pickle", "job/rank=6.pkl"])),
        vec![5, 6]
    );
    // A missing or repeated rank: the input order.
    assert_eq!(
        ranks_from_names(&paths(&["a/rank0.pickle", "b/rank0.pickle"])),
        vec![0, 1]
    );
    assert_eq!(
        ranks_from_names(&paths(&["rank4.pickle", "other.pickle"])),
        vec![0, 1]
    );
    assert_eq!(ranks_from_names(&paths(&["ranking.pickle"])), vec![0]);
}

fn write_pickle(path: &Path, snapshot: &Snapshot) {
    std::fs::write(path, memsnap_format::pickle::to_vec(snapshot)).unwrap();
}

#[test]
fn files_on_disk_export_with_ranks_from_their_names() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = small_run(1, 5);
    let files = [
        dir.path().join("rank2.pickle"),
        dir.path().join("rank9.pickle"),
    ];
    for f in &files {
        write_pickle(f, &a);
    }
    let out = dir.path().join("out");
    let summary = export_files(&files, &out, &ExportOptions::default().jobs(2)).unwrap();
    assert_eq!(
        summary.inputs.iter().map(|i| i.rank).collect::<Vec<_>>(),
        [2, 9]
    );
    let per_file: usize = alloc_entries(&a).values().map(|v| v.0).sum();
    assert_eq!(summary.rows("allocations"), 2 * per_file as u64);
    assert!(summary.bytes > 0);
    let snaps = read_table(&out, "snapshots");
    assert_eq!(ints(&snaps, "rank"), vec![Some(2), Some(9)]);
    assert_eq!(
        strs(&snaps, "encoding"),
        vec![Some("pickle".into()), Some("pickle".into())]
    );
}

#[test]
fn an_existing_destination_is_kept_unless_forced_and_a_foreign_folder_always() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = small_run(1, 6);
    let file = dir.path().join("rank0.pickle");
    write_pickle(&file, &a);
    let files = [file];

    // A folder with someone's files: refused, forced or not, and left as it was.
    let foreign = dir.path().join("mine");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "keep me").unwrap();
    let err = export_files(&files, &foreign, &ExportOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            ConvertError::Parquet(ParquetError::OutputExists { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--force"), "{err}");
    let err = export_files(&files, &foreign, &ExportOptions::default().force(true)).unwrap_err();
    assert!(
        matches!(err, ConvertError::Parquet(ParquetError::NotAnExport { .. })),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(foreign.join("notes.txt")).unwrap(),
        "keep me"
    );

    // An empty folder is written into; an earlier export is replaced only with force.
    let out = dir.path().join("empty");
    std::fs::create_dir(&out).unwrap();
    export_files(&files, &out, &ExportOptions::default()).unwrap();
    assert!(out.join(MANIFEST).is_file());
    let err = export_files(&files, &out, &ExportOptions::default()).unwrap_err();
    assert!(matches!(
        err,
        ConvertError::Parquet(ParquetError::OutputExists { .. })
    ));
    export_files(&files, &out, &ExportOptions::default().force(true)).unwrap();
    assert_eq!(rows(&read_table(&out, "snapshots")), 1);

    // Nothing but what we made is left beside the outputs.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["empty", "mine", "rank0.pickle"]);
}

#[test]
fn a_bad_input_names_the_file_and_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = small_run(1, 7);
    let good = dir.path().join("rank0.pickle");
    write_pickle(&good, &a);
    let bad = dir.path().join("rank1.pickle");
    std::fs::write(&bad, b"\x80\x04not a pickle at all").unwrap();
    let out = dir.path().join("out");
    let err = export_files(&[good, bad.clone()], &out, &ExportOptions::default()).unwrap_err();
    assert!(err.to_string().contains("rank1.pickle"), "{err}");
    assert!(!out.exists());
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 2, "only the two inputs remain");
}

#[test]
fn every_real_snapshot_exports_and_reads_back() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let files = snapshot_files(&dir);
    assert!(!files.is_empty());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("real");
    let summary = export_files(&files, &out, &ExportOptions::default()).unwrap();
    assert_eq!(summary.inputs.len(), files.len());

    let allocs = read_table(&out, "allocations");
    let ranks = ints(&allocs, "rank");
    let devices = ints(&allocs, "device");
    let sizes = ints(&allocs, "size");
    let origins = strs(&allocs, "origin");
    let mut segments = 0;
    for (rank, file) in files.iter().enumerate() {
        let (snapshot, _) = memsnap_format::io::read_path(file).unwrap();
        segments += snapshot.segments.len();
        // Traced rows and bytes per device equal the file's alloc entries.
        let mut got: BTreeMap<i64, (usize, i64)> = BTreeMap::new();
        for i in 0..ranks.len() {
            if ranks[i] == Some(rank as i64) && origins[i].as_deref() == Some("traced") {
                let slot = got.entry(devices[i].unwrap()).or_insert((0, 0));
                slot.0 += 1;
                slot.1 += sizes[i].unwrap();
            }
        }
        assert_eq!(got, alloc_entries(&snapshot), "{}", file.display());
    }
    assert_eq!(rows(&read_table(&out, "segments")), segments);
    assert_eq!(rows(&read_table(&out, "snapshots")), files.len());
}

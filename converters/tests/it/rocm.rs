//! `rocm`: rocprofv3 CSV/JSON and rocpd SQLite imports.
//!
//! Every input below holds the same process (written out by hand in each format's own
//! spelling), so one expectation, [`check_standard`], written from the mapping rules and not
//! from the code, checks them all entry by entry:
//!
//! | # | call | agent | address | size | start ns | end ns |
//! |---|---|---|---|---|---|---|
//! | 1 | alloc | GPU 0 | A = 0x7f3a40000000 | 2 MiB | 512_000_100 | 512_000_900 |
//! | 2 | alloc | CPU | H = 0x7f0000001000 | 4096 | 512_400_000 | 512_500_000 |
//! | 3 | alloc | GPU 1 | B = 0x7f3b00000000 | 1 MiB | 513_000_000 | 513_200_000 |
//! | 4 | free | - | A | 0 | 514_000_000 | 514_000_400 |
//! | 5 | free | - | H | 0 | 514_100_000 | 514_100_400 |
//! | 6 | free | - | 0 | 0 | 514_200_000 | 514_200_400 |
//! | 7 | free | - | U = 0x7f9900000000 | 0 | 514_300_000 | 514_300_400 |
//!
//! Expected: device 0 gets A's segment_alloc + alloc at 512000 µs (the alloc call's end) and
//! its free_requested + free_completed + segment_free at 514000 µs (the free call's start),
//! 2 MiB each; device 1 gets B's segment_alloc + alloc at 513200 µs and B stays live (the one
//! segment); the CPU allocation, its free and the null free vanish; the free of U is
//! skipped with a warning.

use std::path::Path;

use memsnap_converters::rocm::{self, RocmError, RocmFormat, Warning};
use memsnap_converters::{open_path, ConvertError, Source};
use memsnap_format::{Action, BlockState, Snapshot};
use rusqlite::Connection;

use super::common::{real_snapshots_dir, snapshot_files, write_file};

const A: u64 = 0x7f3a_4000_0000;
const H: u64 = 0x7f00_0000_1000;
const B: u64 = 0x7f3b_0000_0000;
const U: u64 = 0x7f99_0000_0000;
const MIB: u64 = 1 << 20;

#[derive(Clone, Copy, PartialEq)]
enum Who {
    Gpu(i64),
    Cpu,
    Nobody,
}

struct Call {
    alloc: bool,
    who: Who,
    address: u64,
    size: u64,
    start: i64,
    end: i64,
}

fn standard_calls() -> Vec<Call> {
    let c = |alloc, who, address, size, start, end| Call {
        alloc,
        who,
        address,
        size,
        start,
        end,
    };
    vec![
        c(true, Who::Gpu(0), A, 2 * MIB, 512_000_100, 512_000_900),
        c(true, Who::Cpu, H, 4096, 512_400_000, 512_500_000),
        c(true, Who::Gpu(1), B, MIB, 513_000_000, 513_200_000),
        c(false, Who::Nobody, A, 0, 514_000_000, 514_000_400),
        c(false, Who::Nobody, H, 0, 514_100_000, 514_100_400),
        c(false, Who::Nobody, 0, 0, 514_200_000, 514_200_400),
        c(false, Who::Nobody, U, 0, 514_300_000, 514_300_400),
    ]
}

/// (action, addr, size, time_us) of every entry of a device.
fn entries(snapshot: &Snapshot, device: usize) -> Vec<(Action, u64, u64, i64)> {
    snapshot.traces()[device]
        .iter()
        .map(|e| (e.action, e.addr, e.size, e.time_us().unwrap_or(-1)))
        .collect()
}

fn check_standard(snapshot: &Snapshot) {
    use Action::*;
    assert_eq!(snapshot.traces().len(), 2, "two GPUs");
    assert_eq!(
        entries(snapshot, 0),
        vec![
            (SegmentAlloc, A, 2 * MIB, 512_000),
            (Alloc, A, 2 * MIB, 512_000),
            (FreeRequested, A, 2 * MIB, 514_000),
            (FreeCompleted, A, 2 * MIB, 514_000),
            (SegmentFree, A, 2 * MIB, 514_000),
        ]
    );
    assert_eq!(
        entries(snapshot, 1),
        vec![(SegmentAlloc, B, MIB, 513_200), (Alloc, B, MIB, 513_200)]
    );
    assert_eq!(snapshot.segments.len(), 1);
    let seg = &snapshot.segments[0];
    assert_eq!((seg.device, seg.address, seg.total_size), (1, B, MIB));
    assert_eq!(seg.allocated_size, Some(MIB));
    assert_eq!(seg.blocks.len(), 1);
    assert_eq!(seg.blocks[0].state, BlockState::ActiveAllocated);
    assert_eq!((seg.blocks[0].address, seg.blocks[0].size), (Some(B), MIB));
    assert!(memsnap_format::validate(snapshot).is_empty());
    let producer = &snapshot.recorder_info.as_ref().unwrap().producer;
    assert!(producer.contains("CLOCK_BOOTTIME"), "{producer}");
}

fn check_unmatched_warning(warnings: &[Warning]) {
    let unmatched: Vec<_> = warnings
        .iter()
        .filter_map(|w| match w {
            Warning::UnmatchedFrees {
                count,
                first_address,
                ..
            } => Some((*count, *first_address)),
            _ => None,
        })
        .collect();
    assert_eq!(unmatched, vec![(1, U)], "{warnings:?}");
}

// ---------------------------------------------------------------------------------------
// CSV

const HEADER: &str = r#""Kind","Operation","Agent_Id","Allocation_Size","Address","Correlation_Id","Start_Timestamp","End_Timestamp""#;

/// CPU agents 0 and 1 come first; the GPUs are logical nodes 2 and 3 but nodes 4 and 5, so
/// `Agent N` (logical) and bare node ids resolve through different columns.
const AGENT_INFO: &str =
    "\"Node_Id\",\"Logical_Node_Id\",\"Agent_Type\",\"Cpu_Cores_Count\",\"Name\"\n\
0,0,\"CPU\",64,\"AMD EPYC 9654\"\n\
1,1,\"CPU\",64,\"AMD EPYC 9654\"\n\
4,2,\"GPU\",0,\"gfx942\"\n\
5,3,\"GPU\",0,\"gfx942\"\n";

fn op(call: &Call) -> &'static str {
    if call.alloc {
        "MEMORY_ALLOCATION_ALLOCATE"
    } else {
        "MEMORY_ALLOCATION_FREE"
    }
}

fn agent_relative(who: Who) -> String {
    match who {
        Who::Gpu(n) => format!("Agent {}", n + 2),
        Who::Cpu => "Agent 0".into(),
        Who::Nobody => String::new(),
    }
}

/// Today's form: quoted strings, bare numbers, padded hex.
fn csv_current(calls: &[Call]) -> String {
    let mut s = format!("{HEADER}\n");
    for (i, c) in calls.iter().enumerate() {
        s += &format!(
            "\"MEMORY_ALLOCATION\",\"{}\",\"{}\",{},\"0x{:016x}\",{},{},{}\n",
            op(c),
            agent_relative(c.who),
            c.size,
            c.address,
            i + 14,
            c.start,
            c.end
        );
    }
    s
}

#[test]
fn csv_current_form_with_agent_info() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = write_file(
        tmp.path(),
        "1234_memory_allocation_trace.csv",
        &csv_current(&standard_calls()),
    );
    write_file(tmp.path(), "1234_agent_info.csv", AGENT_INFO);
    let import = rocm::import_paths(&[&trace]).unwrap();
    assert_eq!(import.format, RocmFormat::Csv);
    assert_eq!(import.ranks.len(), 1);
    assert_eq!(import.ranks[0].label, "pid 1234");
    assert_eq!(import.ranks[0].devices, vec![0, 1]);
    check_standard(&import.ranks[0].snapshot);
    check_unmatched_warning(&import.warnings);
    assert_eq!(import.warnings.len(), 1, "{:?}", import.warnings);
    let line = import.warnings[0].to_string();
    assert!(
        line.contains("line 8") && line.contains("0x7f9900000000"),
        "{line}"
    );
}

#[test]
fn csv_without_agent_info_takes_agent_n_as_device_n_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let calls = [Call {
        alloc: true,
        who: Who::Gpu(0), // written `Agent 2`
        address: A,
        size: 4096,
        start: 1_000,
        end: 2_000,
    }];
    let trace = write_file(
        tmp.path(),
        "77_memory_allocation_trace.csv",
        &csv_current(&calls),
    );
    let import = rocm::import_paths(&[&trace]).unwrap();
    let snapshot = &import.ranks[0].snapshot;
    assert_eq!(snapshot.traces().len(), 3);
    assert_eq!(entries(snapshot, 2).len(), 2);
    assert!(matches!(
        &import.warnings[..],
        [Warning::NoAgentInfo { expected, .. }] if expected.ends_with("77_agent_info.csv")
    ));
}

#[test]
fn csv_type_relative_agents_need_no_agent_info() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = format!("{HEADER}\n");
    for c in standard_calls() {
        let agent = match c.who {
            Who::Gpu(n) => format!("GPU {n}"),
            Who::Cpu => "CPU 0".into(),
            Who::Nobody => String::new(),
        };
        s += &format!(
            "\"MEMORY_ALLOCATION\",\"{}\",\"{agent}\",{},\"0x{:016x}\",1,{},{}\n",
            op(&c),
            c.size,
            c.address,
            c.start,
            c.end
        );
    }
    let trace = write_file(tmp.path(), "9_memory_allocation_trace.csv", &s);
    let import = rocm::import_paths(&[&trace]).unwrap();
    check_standard(&import.ranks[0].snapshot);
    check_unmatched_warning(&import.warnings);
    assert_eq!(import.warnings.len(), 1);
}

#[test]
fn csv_2024_11_starting_address_decimal_node_ids_no_frees() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = String::from("\"Kind\",\"Operation\",\"Agent_Id\",\"Allocation_Size\",\"Starting_Address\",\"Correlation_Id\",\"Start_Timestamp\",\"End_Timestamp\"\n");
    for c in standard_calls().iter().filter(|c| c.alloc) {
        let node = match c.who {
            Who::Gpu(n) => n + 4,
            _ => 0,
        };
        s += &format!(
            "\"MEMORY_ALLOCATION\",\"MEMORY_ALLOCATION_ALLOCATE\",{node},{},{},1,{},{}\n",
            c.size, c.address, c.start, c.end
        );
    }
    let trace = write_file(tmp.path(), "5_memory_allocation_trace.csv", &s);
    write_file(tmp.path(), "5_agent_info.csv", AGENT_INFO);
    let import = rocm::import_paths(&[&trace]).unwrap();
    let snap = &import.ranks[0].snapshot;
    use Action::*;
    assert_eq!(
        entries(snap, 0),
        vec![
            (SegmentAlloc, A, 2 * MIB, 512_000),
            (Alloc, A, 2 * MIB, 512_000)
        ]
    );
    assert_eq!(
        entries(snap, 1),
        vec![(SegmentAlloc, B, MIB, 513_200), (Alloc, B, MIB, 513_200)]
    );
    assert_eq!(snap.segments.len(), 2);
    assert!(import.warnings.is_empty(), "{:?}", import.warnings);
}

#[test]
fn csv_2025_integer_agents_with_zero_on_frees() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = format!("{HEADER}\n");
    for c in standard_calls() {
        let node = match c.who {
            Who::Gpu(n) => n + 4,
            _ => 0,
        };
        s += &format!(
            "\"MEMORY_ALLOCATION\",\"{}\",{node},{},\"0x{:016x}\",1,{},{}\n",
            op(&c),
            c.size,
            c.address,
            c.start,
            c.end
        );
    }
    let trace = write_file(tmp.path(), "5_memory_allocation_trace.csv", &s);
    write_file(tmp.path(), "5_agent_info.csv", AGENT_INFO);
    let import = rocm::import_paths(&[&trace]).unwrap();
    check_standard(&import.ranks[0].snapshot);
}

#[test]
fn csv_2025_07_header_with_size_last_while_rows_keep_it_fourth() {
    let tmp = tempfile::tempdir().unwrap();
    let header = r#""Kind","Operation","Agent_Id","Address","Correlation_Id","Start_Timestamp","End_Timestamp","Allocation_Size""#;
    let body = csv_current(&standard_calls());
    let rows = body.split_once('\n').unwrap().1;
    let trace = write_file(
        tmp.path(),
        "3_memory_allocation_trace.csv",
        &format!("{header}\n{rows}"),
    );
    write_file(tmp.path(), "3_agent_info.csv", AGENT_INFO);
    let import = rocm::import_paths(&[&trace]).unwrap();
    check_standard(&import.ranks[0].snapshot);
}

#[test]
fn csv_size_last_in_header_and_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = String::from(
        r#""Kind","Operation","Agent_Id","Address","Correlation_Id","Start_Timestamp","End_Timestamp","Allocation_Size""#,
    );
    s.push('\n');
    for c in standard_calls() {
        s += &format!(
            "\"MEMORY_ALLOCATION\",\"{}\",\"{}\",\"0x{:016x}\",1,{},{},{}\n",
            op(&c),
            agent_relative(c.who),
            c.address,
            c.start,
            c.end,
            c.size
        );
    }
    let trace = write_file(tmp.path(), "3_memory_allocation_trace.csv", &s);
    write_file(tmp.path(), "3_agent_info.csv", AGENT_INFO);
    check_standard(&rocm::import_paths(&[&trace]).unwrap().ranks[0].snapshot);
}

#[test]
fn csv_docs_form_bare_unpadded_and_swapped_columns() {
    let tmp = tempfile::tempdir().unwrap();
    // Bare values, unpadded hex, and a header that names the size and address columns in
    // the other order than the rows hold them.
    let mut s = String::from(
        "Kind,Operation,Agent_Id,Address,Allocation_Size,Correlation_Id,Start_Timestamp,End_Timestamp,Extra\n",
    );
    for c in standard_calls() {
        s += &format!(
            "MEMORY_ALLOCATION,{},{},{},{:#x},1,{},{},x\n",
            op(&c),
            agent_relative(c.who),
            c.size,
            c.address,
            c.start,
            c.end
        );
    }
    let trace = write_file(tmp.path(), "3_memory_allocation_trace.csv", &s);
    write_file(tmp.path(), "3_agent_info.csv", AGENT_INFO);
    check_standard(&rocm::import_paths(&[&trace]).unwrap().ranks[0].snapshot);
}

#[test]
fn csv_from_rocpd_convert_with_guid_uppercase_hex_and_stray_quote_agents() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = format!("\"Guid\",{HEADER}\n");
    for c in standard_calls() {
        // Python's csv writes a lone `"` as `""""`.
        let agent = if c.alloc {
            format!("\"{}\"", agent_relative(c.who))
        } else {
            "\"\"\"\"".to_string()
        };
        s += &format!(
            "\"0195f5d6-1111-7000-8000-000000000001\",\"MEMORY_ALLOCATION\",\"{}\",{agent},{},\"0x{:016X}\",1,{},{}\n",
            op(&c),
            c.size,
            c.address,
            c.start,
            c.end
        );
    }
    let trace = write_file(tmp.path(), "out_memory_allocation_trace.csv", &s);
    write_file(tmp.path(), "out_agent_info.csv", AGENT_INFO);
    let import = rocm::import_paths(&[&trace]).unwrap();
    assert_eq!(import.ranks.len(), 1);
    check_standard(&import.ranks[0].snapshot);
}

#[test]
fn truncated_csv_names_the_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let full = csv_current(&standard_calls());
    // Cut inside the 7th row (line 8), after its fourth field.
    let cut = full.trim_end().rfind(",\"0x").unwrap();
    let trace = write_file(tmp.path(), "1_memory_allocation_trace.csv", &full[..cut]);
    let err = rocm::import_paths(&[&trace]).unwrap_err();
    assert!(matches!(err, RocmError::Csv { line: 8, .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("1_memory_allocation_trace.csv: line 8: 4 fields, header has 8"),
        "{text}"
    );
}

#[test]
fn csv_with_a_bad_value_names_line_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    let full = csv_current(&standard_calls()).replacen(",2097152,", ",2MiB,", 1);
    let trace = write_file(tmp.path(), "1_memory_allocation_trace.csv", &full);
    let text = rocm::import_paths(&[&trace]).unwrap_err().to_string();
    assert!(
        text.contains("line 2: Allocation_Size \"2MiB\" is not a byte count"),
        "{text}"
    );
}

#[test]
fn csv_with_an_absurd_gpu_ordinal_skips_it_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let text = format!(
        "{HEADER}\n\"MEMORY_ALLOCATION\",\"MEMORY_ALLOCATION_ALLOCATE\",\"GPU 4000000000\",64,\"0x10\",1,1,2\n\
         \"MEMORY_ALLOCATION\",\"MEMORY_ALLOCATION_ALLOCATE\",\"GPU 1\",64,\"0x20\",1,1,2000\n"
    );
    let trace = write_file(tmp.path(), "1_memory_allocation_trace.csv", &text);
    let import = rocm::import_paths(&[&trace]).unwrap();
    assert_eq!(import.ranks[0].snapshot.traces().len(), 2);
    assert!(matches!(
        &import.warnings[..],
        [Warning::UnknownAgent { count: 1, first_place, .. }] if first_place == "line 2"
    ));
}

#[test]
fn csv_with_only_a_header_says_how_to_record() {
    let tmp = tempfile::tempdir().unwrap();
    let trace = write_file(tmp.path(), "1_memory_allocation_trace.csv", HEADER);
    let text = rocm::import_paths(&[&trace]).unwrap_err().to_string();
    assert!(text.contains("--memory-allocation-trace"), "{text}");
}

// ---------------------------------------------------------------------------------------
// JSON

fn json_process(pid: u64, calls: &[Call]) -> serde_json::Value {
    use serde_json::json;
    // Handles are opaque; CPU first as in the real files.
    let handle = |who: Who| match who {
        Who::Gpu(0) => 37946,
        Who::Gpu(_) => 37947,
        Who::Cpu => 37900,
        Who::Nobody => 0,
    };
    let records: Vec<_> = calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "size": 88, "kind": 16, "operation": if c.alloc { 1 } else { 3 },
                "thread_id": 4242,
                "correlation_id": {"internal": i + 1, "external": 0, "ancestor": 0},
                "start_timestamp": c.start, "end_timestamp": c.end,
                "agent_id": {"handle": handle(c.who)},
                "address": format!("0x{:016x}", c.address),
                "allocation_size": c.size, "stream_id": {"handle": 0}
            })
        })
        .collect();
    let mut kinds: Vec<_> = (0..16)
        .map(|k| json!({"kind": format!("KIND_{k}"), "operations": []}))
        .collect();
    kinds.push(json!({"kind": "MEMORY_ALLOCATION", "operations": [
        "MEMORY_ALLOCATION_NONE", "MEMORY_ALLOCATION_ALLOCATE", "MEMORY_ALLOCATION_VMEM_ALLOCATE",
        "MEMORY_ALLOCATION_FREE", "MEMORY_ALLOCATION_VMEM_FREE"]}));
    json!({
        "metadata": {"pid": pid, "init_time": 1, "fini_time": 2, "node": {"hostname": "host-a"},
                     "command": ["python", "train.py"]},
        "agents": [
            {"id": {"handle": 37900}, "type": 1, "node_id": 0, "logical_node_id": 0,
             "logical_node_type_id": 0, "name": "AMD EPYC"},
            {"id": {"handle": 37947}, "type": 2, "node_id": 5, "logical_node_id": 3,
             "logical_node_type_id": 1, "gpu_index": 1, "name": "gfx942"},
            {"id": {"handle": 37946}, "type": 2, "node_id": 4, "logical_node_id": 2,
             "logical_node_type_id": 0, "gpu_index": 0, "name": "gfx942"}
        ],
        "counters": [], "strings": {"buffer_records": kinds},
        "buffer_records": {"kernel_dispatch": [], "memory_allocation": records}
    })
}

#[test]
fn json_with_two_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let second = [Call {
        alloc: true,
        who: Who::Gpu(1),
        address: A,
        size: 512,
        start: 10_000,
        end: 12_500,
    }];
    let doc = serde_json::json!({"rocprofiler-sdk-tool": [
        json_process(1300, &second),
        json_process(1234, &standard_calls()),
    ]});
    let path = write_file(tmp.path(), "1234_results.json", &doc.to_string());
    let import = rocm::import_paths(&[&path]).unwrap();
    assert_eq!(import.format, RocmFormat::Json);
    let labels: Vec<&str> = import.ranks.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, ["host-a/1234", "host-a/1300"]);
    check_standard(&import.ranks[0].snapshot);
    check_unmatched_warning(&import.warnings);
    let other = &import.ranks[1].snapshot;
    assert_eq!(
        entries(other, 1),
        vec![
            (Action::SegmentAlloc, A, 512, 12),
            (Action::Alloc, A, 512, 12)
        ]
    );

    // One snapshot for the readers: (rank, GPU) pairs become devices 0, 1, 2.
    let (merged, source) = open_path(&path).unwrap();
    assert_eq!(source, Source::Rocm(RocmFormat::Json));
    assert_eq!(merged.traces().len(), 3);
    assert_eq!(merged.traces()[0].len(), 5); // host-a/1234 GPU 0
    assert_eq!(merged.traces()[1].len(), 2); // host-a/1234 GPU 1
    assert_eq!(merged.traces()[2].len(), 2); // host-a/1300 GPU 1
    let producer = &merged.recorder_info.as_ref().unwrap().producer;
    assert!(producer.contains("2 = host-a/1300 GPU 1"), "{producer}");
}

#[test]
fn json_without_memory_records_says_how_to_record() {
    let tmp = tempfile::tempdir().unwrap();
    let doc = serde_json::json!({"rocprofiler-sdk-tool": [json_process(1, &[])]});
    let path = write_file(tmp.path(), "1_results.json", &doc.to_string());
    let text = rocm::import_paths(&[&path]).unwrap_err().to_string();
    assert!(
        text.contains("1_results.json") && text.contains("--memory-allocation-trace"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------
// rocpd SQLite

const UUID: &str = "_0195f5d6_1111_7000_8000_000000000001";
const GUID: &str = "0195f5d6-1111-7000-8000-000000000001";

/// The tables every layout shares (rocpd_tables.sql), with `{s}` the run suffix and `{g}`
/// the run guid.
const COMMON_DDL: &str = r#"
CREATE TABLE "rocpd_metadata{s}" ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "tag" TEXT NOT NULL, "value" TEXT NOT NULL);
CREATE TABLE `rocpd_string{s}` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT "{g}" NOT NULL, "string" TEXT NOT NULL UNIQUE ON CONFLICT ABORT);
CREATE TABLE `rocpd_info_node{s}` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT "{g}" NOT NULL, "hash" BIGINT NOT NULL UNIQUE, "machine_id" TEXT NOT NULL UNIQUE, "system_name" TEXT, "hostname" TEXT, "release" TEXT, "version" TEXT, "hardware_name" TEXT, "domain_name" TEXT);
CREATE TABLE `rocpd_info_process{s}` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT "{g}" NOT NULL, "nid" INTEGER NOT NULL, "ppid" INTEGER, "pid" INTEGER NOT NULL, "init" BIGINT, "fini" BIGINT, "start" BIGINT, "end" BIGINT, "command" TEXT, "environment" JSONB DEFAULT "{}" NOT NULL, "extdata" JSONB DEFAULT "{}" NOT NULL);
CREATE TABLE `rocpd_info_thread{s}` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT "{g}" NOT NULL, "nid" INTEGER NOT NULL, "ppid" INTEGER, "pid" INTEGER NOT NULL, "tid" INTEGER NOT NULL, "name" TEXT, "start" BIGINT, "end" BIGINT, "extdata" JSONB DEFAULT "{}" NOT NULL);
CREATE TABLE `rocpd_info_agent{s}` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT "{g}" NOT NULL, "nid" INTEGER NOT NULL, "pid" INTEGER NOT NULL, "type" TEXT CHECK ("type" IN ('CPU', 'GPU', 'NIC')), "absolute_index" INTEGER, "logical_index" INTEGER, "type_index" INTEGER, "uuid" INTEGER, "name" TEXT, "model_name" TEXT, "vendor_name" TEXT, "product_name" TEXT, "user_name" TEXT, "extdata" JSONB DEFAULT "{}" NOT NULL);
CREATE VIEW `rocpd_metadata` AS SELECT * FROM `rocpd_metadata{s}`;
CREATE VIEW `rocpd_string` AS SELECT * FROM `rocpd_string{s}`;
CREATE VIEW `rocpd_info_node` AS SELECT * FROM `rocpd_info_node{s}`;
CREATE VIEW `rocpd_info_process` AS SELECT * FROM `rocpd_info_process{s}`;
CREATE VIEW `rocpd_info_thread` AS SELECT * FROM `rocpd_info_thread{s}`;
CREATE VIEW `rocpd_info_agent` AS SELECT * FROM `rocpd_info_agent{s}`;
CREATE VIEW `rocpd_memory_allocate` AS SELECT * FROM `rocpd_memory_allocate{s}`;
"#;

/// Layout A: what rocprofv3 writes (schema 3).
const LAYOUT_A_DDL: &str = r#"
CREATE TABLE `rocpd_memory_allocate{s}` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT "{g}" NOT NULL, "nid" INTEGER NOT NULL, "pid" INTEGER NOT NULL, "tid" INTEGER, "agent_id" INTEGER, "type" TEXT CHECK ("type" IN ('ALLOC', 'FREE', 'REALLOC', 'RECLAIM')), "level" TEXT CHECK ("level" IN ('REAL', 'VIRTUAL', 'SCRATCH')), "start" BIGINT NOT NULL, "end" BIGINT NOT NULL, "address" INTEGER, "size" INTEGER NOT NULL, "queue_id" INTEGER, "stream_id" INTEGER, "event_id" INTEGER, "extdata" JSONB DEFAULT "{}" NOT NULL);
"#;

/// Layout B: schema 4.1, a track per (process, thread, agent, queue, stream).
const LAYOUT_B_DDL: &str = r#"
CREATE TABLE `rocpd_track{s}` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT "{g}" NOT NULL, "nid" INTEGER NOT NULL, "ppid" INTEGER, "pid" INTEGER, "tid" INTEGER, "agent_id" INTEGER, "queue_id" INTEGER, "stream_id" INTEGER, "name_id" INTEGER, "extdata" JSONB DEFAULT "{}" NOT NULL);
CREATE VIEW `rocpd_track` AS SELECT * FROM `rocpd_track{s}`;
CREATE TABLE `rocpd_memory_allocate{s}` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT "{g}" NOT NULL, "track_id" INTEGER NOT NULL, "type" TEXT CHECK ("type" IN ('ALLOC', 'FREE', 'REALLOC', 'RECLAIM')), "level" TEXT CHECK ("level" IN ('REAL', 'VIRTUAL', 'SCRATCH')), "start" BIGINT NOT NULL, "end" BIGINT NOT NULL, "name_id" INTEGER NOT NULL, "address" INTEGER, "size" INTEGER NOT NULL, "region_name_id" INTEGER, "event_id" INTEGER, "extdata" JSONB DEFAULT "{}" NOT NULL);
"#;

/// Layout C: the early-2025 draft, times through `rocpd_timestamp`.
const LAYOUT_C_DDL: &str = r#"
CREATE TABLE `rocpd_track{s}` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT "{g}" NOT NULL, "nid" INTEGER NOT NULL, "ppid" INTEGER, "pid" INTEGER, "tid" INTEGER, "agent_id" INTEGER, "queue_id" INTEGER, "stream_id" INTEGER, "name_id" INTEGER, "extdata" JSONB DEFAULT "{}" NOT NULL);
CREATE VIEW `rocpd_track` AS SELECT * FROM `rocpd_track{s}`;
CREATE TABLE `rocpd_timestamp{s}` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT "{g}" NOT NULL, "value" BIGINT NOT NULL);
CREATE VIEW `rocpd_timestamp` AS SELECT * FROM `rocpd_timestamp{s}`;
CREATE TABLE `rocpd_memory_allocate{s}` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT "{g}" NOT NULL, "track_id" INTEGER NOT NULL, "type" TEXT CHECK ("type" IN ('ALLOC', 'FREE', 'REALLOC', 'RECLAIM')), "level" TEXT CHECK ("level" IN ('REAL', 'VIRTUAL', 'SCRATCH')), "start_id" INTEGER NOT NULL, "end_id" INTEGER NOT NULL, "name_id" INTEGER NOT NULL, "address" INTEGER, "size" INTEGER NOT NULL, "event_id" INTEGER, "extdata" JSONB DEFAULT "{}" NOT NULL);
"#;

/// (type, level, agent row id, start, end, address, size) of a memory row.
type Row<'a> = (&'a str, &'a str, Option<i64>, i64, i64, u64, u64);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Layout {
    A,
    B,
    C,
}

/// A fresh database of the given layout (suffixed tables, unsuffixed views) with one
/// process per `(hostname, OS pid, calls)`, each with a CPU and two GPU agents and, besides
/// its calls, a SCRATCH row that must be skipped.
fn rocpd_db(path: &Path, layout: Layout, processes: &[(&str, i64, &[Call])]) {
    let conn = Connection::open(path).unwrap();
    // One transaction: one sync instead of one per row.
    conn.execute_batch("BEGIN").unwrap();
    let ddl = |t: &str| t.replace("{s}", UUID).replace("{g}", GUID);
    conn.execute_batch(&ddl(COMMON_DDL)).unwrap();
    conn.execute_batch(&ddl(match layout {
        Layout::A => LAYOUT_A_DDL,
        Layout::B => LAYOUT_B_DDL,
        Layout::C => LAYOUT_C_DDL,
    }))
    .unwrap();
    let t = |name: &str| format!("\"{name}{UUID}\"");
    conn.execute(
        &format!(
            "INSERT INTO {} (tag, value) VALUES ('schema_version', '3')",
            t("rocpd_metadata")
        ),
        [],
    )
    .unwrap();
    conn.execute(
        &format!(
            "INSERT INTO {} (string) VALUES ('MEMORY_ALLOCATION_ALLOCATE')",
            t("rocpd_string")
        ),
        [],
    )
    .unwrap();
    for (n, (host, pid, calls)) in processes.iter().enumerate() {
        let nid = n as i64 + 1;
        conn.execute(
            &format!(
                "INSERT INTO {} (id, hash, machine_id, hostname) VALUES (?1, ?1, ?2, ?3)",
                t("rocpd_info_node")
            ),
            rusqlite::params![nid, format!("machine-{nid}"), host],
        )
        .unwrap();
        conn.execute(
            &format!(
                "INSERT INTO {} (id, nid, pid, command) VALUES (?1, ?1, ?2, 'python train.py')",
                t("rocpd_info_process")
            ),
            rusqlite::params![nid, pid],
        )
        .unwrap();
        // Agents: CPU first; GPU row ids deliberately not in ordinal order.
        let agent_base = nid * 10;
        for (off, kind, type_index) in [(0, "CPU", 0), (1, "GPU", 1), (2, "GPU", 0)] {
            conn.execute(
                &format!("INSERT INTO {} (id, nid, pid, type, absolute_index, logical_index, type_index, name) VALUES (?1, ?2, ?2, ?3, ?4, ?4, ?5, 'x')", t("rocpd_info_agent")),
                rusqlite::params![agent_base + off, nid, kind, off, type_index],
            )
            .unwrap();
        }
        let agent_id = |who: Who| match who {
            Who::Gpu(0) => Some(agent_base + 2),
            Who::Gpu(_) => Some(agent_base + 1),
            Who::Cpu => Some(agent_base),
            Who::Nobody => None,
        };
        let mut rows: Vec<Row> = calls
            .iter()
            .map(|c| {
                (
                    if c.alloc { "ALLOC" } else { "FREE" },
                    "REAL",
                    agent_id(c.who),
                    c.start,
                    c.end,
                    c.address,
                    c.size,
                )
            })
            .collect();
        // A scratch allocation on GPU 0 at an address the trace uses: must not show.
        rows.push((
            "ALLOC",
            "SCRATCH",
            agent_id(Who::Gpu(0)),
            513_500_000,
            513_500_100,
            B,
            64,
        ));
        for (kind, level, agent, start, end, address, size) in rows {
            // Addresses go in as SQLite's signed integers, as rocprofv3 binds them.
            let address = address as i64;
            match layout {
                Layout::A => {
                    conn.execute(
                        &format!("INSERT INTO {} (nid, pid, tid, agent_id, type, level, start, \"end\", address, size, stream_id) VALUES (?1, ?1, 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0)", t("rocpd_memory_allocate")),
                        rusqlite::params![nid, agent, kind, level, start, end, address, size as i64],
                    )
                    .unwrap();
                }
                Layout::B | Layout::C => {
                    conn.execute(
                        &format!("INSERT INTO {} (nid, pid, tid, agent_id, stream_id) VALUES (?1, ?1, 1, ?2, 0)", t("rocpd_track")),
                        rusqlite::params![nid, agent],
                    )
                    .unwrap();
                    let track = conn.last_insert_rowid();
                    if layout == Layout::B {
                        conn.execute(
                            &format!("INSERT INTO {} (track_id, type, level, start, \"end\", name_id, address, size) VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7)", t("rocpd_memory_allocate")),
                            rusqlite::params![track, kind, level, start, end, address, size as i64],
                        )
                        .unwrap();
                    } else {
                        let ts =
                            format!("INSERT INTO {} (value) VALUES (?1)", t("rocpd_timestamp"));
                        conn.execute(&ts, [start]).unwrap();
                        let start_id = conn.last_insert_rowid();
                        conn.execute(&ts, [end]).unwrap();
                        let end_id = conn.last_insert_rowid();
                        conn.execute(
                            &format!("INSERT INTO {} (track_id, type, level, start_id, end_id, name_id, address, size) VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7)", t("rocpd_memory_allocate")),
                            rusqlite::params![track, kind, level, start_id, end_id, address, size as i64],
                        )
                        .unwrap();
                    }
                }
            }
        }
    }
    conn.execute_batch("COMMIT").unwrap();
}

fn check_rocpd_layout(layout: Layout) {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("1234_results.db");
    let second = [Call {
        alloc: true,
        who: Who::Gpu(0),
        address: A,
        size: 4096,
        start: 100_000,
        end: 101_000,
    }];
    rocpd_db(
        &db,
        layout,
        &[
            ("node-b", 999, &second),
            ("node-a", 1234, &standard_calls()),
        ],
    );
    let import = rocm::import_paths(&[&db]).unwrap();
    assert_eq!(import.format, RocmFormat::Rocpd);
    let labels: Vec<&str> = import.ranks.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, ["node-a/1234", "node-b/999"], "{layout:?}");
    check_standard(&import.ranks[0].snapshot);
    assert_eq!(
        entries(&import.ranks[1].snapshot, 0),
        vec![
            (Action::SegmentAlloc, A, 4096, 101),
            (Action::Alloc, A, 4096, 101)
        ]
    );
    check_unmatched_warning(&import.warnings);
    assert!(import.warnings.contains(&Warning::SkippedScratch {
        path: db.clone(),
        rows: 2
    }));
}

#[test]
fn rocpd_layout_a() {
    check_rocpd_layout(Layout::A);
}

#[test]
fn rocpd_layout_b() {
    check_rocpd_layout(Layout::B);
}

#[test]
fn rocpd_layout_c() {
    check_rocpd_layout(Layout::C);
}

#[test]
fn rocpd_keeps_virtual_rows_and_reads_high_addresses() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("1_results.db");
    rocpd_db(&db, Layout::A, &[("h", 1, &[])]);
    let conn = Connection::open(&db).unwrap();
    let high: u64 = 0xffff_8000_0000_0000; // beyond i64: stored negative
    let insert = format!("INSERT INTO \"rocpd_memory_allocate{UUID}\" (nid, pid, agent_id, type, level, start, \"end\", address, size) VALUES (1, 1, ?1, ?2, 'VIRTUAL', ?3, ?3, ?4, ?5)");
    conn.execute(
        &insert,
        rusqlite::params![12, "ALLOC", 5_000, high as i64, 8192],
    )
    .unwrap();
    conn.execute(
        &insert,
        rusqlite::params![None::<i64>, "FREE", 7_000, high as i64, 0],
    )
    .unwrap();
    drop(conn);
    let import = rocm::import_paths(&[&db]).unwrap();
    use Action::*;
    assert_eq!(
        entries(&import.ranks[0].snapshot, 0),
        vec![
            (SegmentAlloc, high, 8192, 5),
            (Alloc, high, 8192, 5),
            (FreeRequested, high, 8192, 7),
            (FreeCompleted, high, 8192, 7),
            (SegmentFree, high, 8192, 7),
        ]
    );
}

#[test]
fn rocpd_scratch_rows_are_kept_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("1_results.db");
    rocpd_db(&db, Layout::A, &[("h", 1, &[])]); // only the scratch row: 64 B at B on GPU 0
    let err = rocm::import_paths(&[&db]).unwrap_err();
    assert!(matches!(err, RocmError::NoRecords { .. }), "{err:?}");
    let mut options = rocm::Options::default();
    options.keep_scratch = true;
    let import = rocm::import_paths_with(&[&db], options).unwrap();
    assert_eq!(
        entries(&import.ranks[0].snapshot, 0),
        vec![
            (Action::SegmentAlloc, B, 64, 513_500),
            (Action::Alloc, B, 64, 513_500)
        ]
    );
    assert!(import.warnings.is_empty(), "{:?}", import.warnings);
}

#[test]
fn several_databases_become_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("node1/11_results.db");
    let two = tmp.path().join("node2/22_results.db");
    std::fs::create_dir_all(one.parent().unwrap()).unwrap();
    std::fs::create_dir_all(two.parent().unwrap()).unwrap();
    rocpd_db(&one, Layout::A, &[("node1", 11, &standard_calls())]);
    rocpd_db(&two, Layout::B, &[("node2", 22, &standard_calls())]);
    let import = rocm::import_paths(&[&two, &one]).unwrap();
    let labels: Vec<&str> = import.ranks.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, ["node1/11", "node2/22"]);
    for rank in &import.ranks {
        check_standard(&rank.snapshot);
    }

    // Pids sort as numbers across files; a time offset moves every entry.
    let three = tmp.path().join("node1/9_results.db");
    rocpd_db(&three, Layout::A, &[("node1", 9, &standard_calls())]);
    let mut options = rocm::Options::default();
    options.time_offset_us = 1_700_000_000_000_000;
    let import = rocm::import_paths_with(&[&one, &three], options).unwrap();
    let labels: Vec<&str> = import.ranks.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, ["node1/9", "node1/11"]);
    let first = &import.ranks[0].snapshot.traces()[0][0];
    assert_eq!(first.time_us(), Some(1_700_000_000_000_000 + 512_000));
}

#[test]
fn database_without_the_tables_names_the_file_and_the_table() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("other.db");
    Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE t (x INTEGER);")
        .unwrap();
    let err = rocm::import_paths(&[&db]).unwrap_err();
    assert!(
        matches!(&err, RocmError::MissingTable { table, .. } if table == "rocpd_memory_allocate"),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("other.db: no rocpd_memory_allocate table"),
        "{text}"
    );
    // Through the readers' entry point too.
    let text = open_path(&db).unwrap_err().to_string();
    assert!(text.contains("no rocpd_memory_allocate table"), "{text}");
}

#[test]
fn truncated_database_fails_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("1_results.db");
    rocpd_db(&db, Layout::A, &[("h", 1, &standard_calls())]);
    let bytes = std::fs::read(&db).unwrap();
    for cut in [100, 4096, bytes.len() / 2] {
        std::fs::write(&db, &bytes[..cut]).unwrap();
        let text = rocm::import_paths(&[&db]).unwrap_err().to_string();
        assert!(
            text.contains("1_results.db: SQLite: database disk image is malformed"),
            "cut at {cut}: {text}"
        );
    }
}

#[test]
fn old_rpd_database_is_refused_as_such() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("trace.rpd");
    Connection::open(&db)
        .unwrap()
        .execute_batch(
            "CREATE TABLE rocpd_api (id INTEGER PRIMARY KEY, pid INTEGER, tid INTEGER, start INTEGER, end INTEGER, apiName_id INTEGER, args_id INTEGER);
             CREATE TABLE rocpd_op (id INTEGER PRIMARY KEY, gpuId INTEGER, queueId INTEGER, sequenceId INTEGER, start INTEGER, end INTEGER, description_id INTEGER, opType_id INTEGER);",
        )
        .unwrap();
    let err = rocm::import_paths(&[&db]).unwrap_err();
    assert!(matches!(err, RocmError::OldRpd { .. }), "{err:?}");
    assert!(err.to_string().contains("RPD"), "{err}");
}

#[test]
fn database_is_opened_read_only() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("1_results.db");
    rocpd_db(&db, Layout::A, &[("h", 1, &standard_calls())]);
    let before = std::fs::read(&db).unwrap();
    let mut perms = std::fs::metadata(&db).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&db, perms).unwrap();
    rocm::import_paths(&[&db]).unwrap();
    assert_eq!(std::fs::read(&db).unwrap(), before);
    assert!(!tmp.path().join("1_results.db-journal").exists());
}

#[test]
fn every_rocm_format_opens_by_content() {
    let tmp = tempfile::tempdir().unwrap();
    // Names that say nothing: detection is by content.
    let csv = write_file(tmp.path(), "a.bin", &csv_current(&standard_calls()));
    let json = write_file(
        tmp.path(),
        "b.bin",
        &serde_json::json!({"rocprofiler-sdk-tool": [json_process(1, &standard_calls())]})
            .to_string(),
    );
    let db = tmp.path().join("c.bin");
    rocpd_db(&db, Layout::A, &[("h", 1, &standard_calls())]);
    for (path, format) in [
        (&csv, RocmFormat::Csv),
        (&json, RocmFormat::Json),
        (&db, RocmFormat::Rocpd),
    ] {
        let (snapshot, source) = open_path(path).unwrap();
        assert_eq!(source, Source::Rocm(format));
        // Without an agent_info.csv the CSV's CPU allocation (`Agent 0`) counts as GPU 0.
        let expected = if format == RocmFormat::Csv { 12 } else { 7 };
        assert_eq!(snapshot.entry_count(), expected, "{format:?}");
    }
    // A database cannot come as bytes.
    let bytes = std::fs::read(&db).unwrap();
    let err = memsnap_converters::OpenOptions::new()
        .open_bytes(&bytes, &db)
        .unwrap_err();
    assert!(matches!(
        err,
        ConvertError::Rocm(RocmError::DatabaseFromBytes { .. })
    ));
}

// ---------------------------------------------------------------------------------------
// Real snapshots: their segment history, written the way rocprofv3 would have seen it.

/// Each real snapshot's `segment_alloc`/`segment_free` events (what `hipMalloc`/`hipFree`
/// do under PyTorch) written as a rocprofv3 CSV must import to the same segment history:
/// same addresses, sizes, devices and µs times, frees of segments allocated before the
/// trace window dropped (and counted in the warning).
#[test]
fn real_snapshots_segment_history_survives_a_rocprofv3_csv() {
    let Some(dir) = real_snapshots_dir() else {
        return;
    };
    let files = snapshot_files(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for file in files {
        let (snapshot, _) = open_path(&file).unwrap();
        let mut csv = format!("{HEADER}\n");
        // Expected per device: (action, addr, size, time_us), and the unmatched frees.
        let mut expected: Vec<Vec<(Action, u64, u64, i64)>> = Vec::new();
        let mut unmatched = 0u64;
        for (device, trace) in snapshot.traces().iter().enumerate() {
            let mut live = std::collections::HashMap::new();
            let mut want = Vec::new();
            for (i, e) in trace.iter().enumerate() {
                // Files without time_us: the entry index stands in for the time.
                let us = e.time_us().unwrap_or(i as i64);
                let ns = us * 1000;
                match e.action {
                    Action::SegmentAlloc => {
                        csv += &format!(
                            "\"MEMORY_ALLOCATION\",\"MEMORY_ALLOCATION_ALLOCATE\",\"GPU {device}\",{},\"0x{:016x}\",1,{},{ns}\n",
                            e.size, e.addr, ns - 500
                        );
                        live.insert(e.addr, e.size);
                        want.push((Action::SegmentAlloc, e.addr, e.size, us));
                        want.push((Action::Alloc, e.addr, e.size, us));
                    }
                    Action::SegmentFree => {
                        csv += &format!(
                            "\"MEMORY_ALLOCATION\",\"MEMORY_ALLOCATION_FREE\",\"\",0,\"0x{:016x}\",1,{ns},{}\n",
                            e.addr,
                            ns + 300
                        );
                        match live.remove(&e.addr) {
                            Some(size) => {
                                want.push((Action::FreeRequested, e.addr, size, us));
                                want.push((Action::FreeCompleted, e.addr, size, us));
                                want.push((Action::SegmentFree, e.addr, size, us));
                            }
                            None => unmatched += 1,
                        }
                    }
                    _ => {}
                }
            }
            expected.push(want);
        }
        while expected.last().is_some_and(Vec::is_empty) {
            expected.pop();
        }
        if expected.is_empty() {
            continue; // no segment events (a bare segment list, or an empty trace)
        }
        let name = file.file_name().unwrap().to_string_lossy();
        let trace = write_file(tmp.path(), "1_memory_allocation_trace.csv", &csv);
        let import = rocm::import_paths(&[&trace]).unwrap();
        let got = &import.ranks[0].snapshot;
        assert_eq!(got.traces().len(), expected.len(), "{name}");
        for (device, want) in expected.iter().enumerate() {
            assert_eq!(&entries(got, device), want, "{name} device {device}");
        }
        let warned: u64 = import
            .warnings
            .iter()
            .map(|w| match w {
                Warning::UnmatchedFrees { count, .. } => *count,
                _ => 0,
            })
            .sum();
        assert_eq!(warned, unmatched, "{name}");
        checked += 1;
    }
    // 4 of the 15 files hold segment events.
    assert!(checked >= 4, "only {checked} real files had segment events");
}

#[test]
fn sniff_tells_the_formats_apart() {
    let json_second_key = b"{\n  \"schema\": 1,\n  \"rocprofiler-sdk-tool\": []}";
    assert_eq!(rocm::sniff(json_second_key), Some(RocmFormat::Json));
    let bom_csv = format!("\u{feff}{HEADER}\n");
    assert_eq!(rocm::sniff(bom_csv.as_bytes()), Some(RocmFormat::Csv));
    let guid_csv = b"Guid,Kind,Operation,Agent_Id\n";
    assert_eq!(rocm::sniff(guid_csv), Some(RocmFormat::Csv));
    assert_eq!(
        rocm::sniff(b"SQLite format 3\0rest"),
        Some(RocmFormat::Rocpd)
    );
    // Other CSVs, a Chrome trace, memsnap's own JSON and pickle are not ROCm.
    assert_eq!(rocm::sniff(b"\"Kind\",\"Operation\",\"Direction\"\n"), None);
    assert_eq!(rocm::sniff(b"{\"traceEvents\": []}"), None);
    assert_eq!(
        rocm::sniff(b"{\"segments\": [], \"device_traces\": []}"),
        None
    );
    assert_eq!(rocm::sniff(b"\x80\x04\x95"), None);
}

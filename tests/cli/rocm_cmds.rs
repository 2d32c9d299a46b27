//! ROCm inputs (rocprofv3 CSV, rocpd SQLite) through the real binary: every reader opens them
//! by content. The imports themselves are tested entry by entry in the converters' tests.

use std::path::Path;

use crate::common::memsnap;

const CSV: &str = r#""Kind","Operation","Agent_Id","Allocation_Size","Address","Correlation_Id","Start_Timestamp","End_Timestamp"
"MEMORY_ALLOCATION","MEMORY_ALLOCATION_ALLOCATE","GPU 0",2097152,"0x00007f3a40000000",14,512000100,512000900
"MEMORY_ALLOCATION","MEMORY_ALLOCATION_ALLOCATE","GPU 0",1048576,"0x00007f3a40200000",15,513000000,513200000
"MEMORY_ALLOCATION","MEMORY_ALLOCATION_FREE","",0,"0x00007f3a40000000",16,514000000,514000400
"#;

/// A layout-A rocpd database (the columns rocprofv3 writes; suffixed table behind a view)
/// with one process on `host-1`: the same three calls as [`CSV`].
fn rocpd(path: &Path) {
    let conn = rusqlite::Connection::open(path).expect("create db");
    conn.execute_batch(
        r#"
        BEGIN;
        CREATE TABLE `rocpd_info_node_01` ("id" INTEGER PRIMARY KEY, "guid" TEXT NOT NULL DEFAULT 'g', "hostname" TEXT);
        CREATE TABLE `rocpd_info_process_01` ("id" INTEGER PRIMARY KEY, "guid" TEXT NOT NULL DEFAULT 'g', "nid" INTEGER NOT NULL, "pid" INTEGER NOT NULL);
        CREATE TABLE `rocpd_info_agent_01` ("id" INTEGER PRIMARY KEY, "guid" TEXT NOT NULL DEFAULT 'g', "nid" INTEGER NOT NULL, "pid" INTEGER NOT NULL, "type" TEXT, "absolute_index" INTEGER, "logical_index" INTEGER, "type_index" INTEGER);
        CREATE TABLE `rocpd_memory_allocate_01` ("id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, "guid" TEXT DEFAULT 'g' NOT NULL, "nid" INTEGER NOT NULL, "pid" INTEGER NOT NULL, "tid" INTEGER, "agent_id" INTEGER, "type" TEXT, "level" TEXT, "start" BIGINT NOT NULL, "end" BIGINT NOT NULL, "address" INTEGER, "size" INTEGER NOT NULL, "queue_id" INTEGER, "stream_id" INTEGER, "event_id" INTEGER, "extdata" JSONB DEFAULT "{}" NOT NULL);
        CREATE VIEW `rocpd_memory_allocate` AS SELECT * FROM `rocpd_memory_allocate_01`;
        INSERT INTO rocpd_info_node_01 (id, hostname) VALUES (1, 'host-1');
        INSERT INTO rocpd_info_process_01 (id, nid, pid) VALUES (1, 1, 4242);
        INSERT INTO rocpd_info_agent_01 (id, nid, pid, type, type_index) VALUES (1, 1, 1, 'CPU', 0), (2, 1, 1, 'GPU', 0);
        INSERT INTO rocpd_memory_allocate_01 (nid, pid, agent_id, type, level, start, "end", address, size) VALUES
            (1, 1, 2, 'ALLOC', 'REAL', 512000100, 512000900, 139888158572544, 2097152),
            (1, 1, 2, 'ALLOC', 'REAL', 513000000, 513200000, 139888160669696, 1048576),
            (1, 1, NULL, 'FREE', 'REAL', 514000000, 514000400, 139888158572544, 0);
        COMMIT;
        "#,
    )
    .expect("fill db");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn info_opens_rocprofv3_csv_and_rocpd_databases_by_content() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let csv = tmp.path().join("4242_memory_allocation_trace.csv");
    std::fs::write(&csv, CSV).expect("write");
    let db = tmp.path().join("4242_results.db");
    rocpd(&db);
    for (path, format) in [(&csv, "rocprofv3 CSV"), (&db, "rocpd SQLite")] {
        let out = memsnap(&["info", path.to_str().expect("utf-8 path")]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{format}: {}", text(&out.stderr));
        assert!(
            stdout.contains(&format!("format:      {format}")),
            "{stdout}"
        );
        // 2 segment_alloc + 2 alloc + free_requested + free_completed + segment_free.
        assert!(stdout.contains("entries:     7"), "{stdout}");
        assert!(stdout.contains("segments:    1"), "{stdout}");
        assert!(stdout.contains("1.0 MiB reserved"), "{stdout}");
        assert!(stdout.contains("CLOCK_BOOTTIME"), "{stdout}");
        // Boot-relative times are no dates.
        assert!(
            stdout.contains("time span:   0.512 s – 0.514 s from the clock's origin"),
            "{stdout}"
        );
    }
    let out = memsnap(&["validate", db.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn a_database_without_the_tables_exits_2_naming_file_and_table() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let db = tmp.path().join("other.db");
    rusqlite::Connection::open(&db)
        .expect("create db")
        .execute_batch("CREATE TABLE t (x INTEGER);")
        .expect("fill db");
    let out = memsnap(&["info", db.to_str().expect("utf-8 path")]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("other.db: no rocpd_memory_allocate table"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn import_writes_a_snapshot_and_prints_what_it_skipped() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // `Agent 2` without the agent_info.csv: taken as GPU 2, with a note.
    let csv = tmp.path().join("7_memory_allocation_trace.csv");
    std::fs::write(&csv, CSV.replace("\"GPU 0\"", "\"Agent 2\"")).expect("write");
    let out_path = tmp.path().join("rocm.pickle");
    let out = memsnap(&[
        "import",
        csv.to_str().expect("utf-8 path"),
        "-o",
        out_path.to_str().expect("utf-8 path"),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("(rocprofv3 CSV) ->"), "{stdout}");
    assert!(
        stdout.contains("device 2: 7 trace entries: 2 allocs (0 with a stack), 1 frees"),
        "{stdout}"
    );
    assert!(
        stdout.contains("note: ") && stdout.contains("no 7_agent_info.csv beside it"),
        "{stdout}"
    );
    let (snapshot, _) = memsnap_format::read_path(&out_path).expect("read back");
    assert_eq!(snapshot.traces()[2].len(), 7);
}

#[test]
fn summary_of_a_rocm_trace_calls_its_peak_reserved_and_the_allocated_bytes_unknown() {
    // rocprofv3 records hipMalloc and kin: under PyTorch those are the caching allocator's
    // segments. The summary used to print them as the allocated peak.
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("memory_allocation_trace.csv");
    std::fs::write(&csv, CSV).unwrap();
    let out = memsnap(&["summary", csv.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("reserved peak 3.0 MiB at event"),
        "{stdout}"
    );
    assert!(
        stdout.contains("allocated unknown (the source records the driver's allocations only"),
        "{stdout}"
    );
    let out = memsnap(&["summary", "--json", csv.to_str().unwrap()]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let device = &json["devices"][0];
    assert_eq!(device["allocated_known"], false);
    assert_eq!(device["reserved_known"], true);
    assert_eq!(device["peak_reserved_bytes"], 3 << 20);
}

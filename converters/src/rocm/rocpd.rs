//! rocpd SQLite databases (`<pid>_results.db`). See the [module docs](super#rocpd).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags};

use super::mapping::{self, Agent, Event, Op, Process, Warning};
use super::{Import, RocmError, RocmFormat};

/// The memory table's name without its per-run suffix.
pub const MEMORY_TABLE: &str = "rocpd_memory_allocate";

/// How the memory table stores the process, agent and times of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// `nid`, `pid`, `agent_id`, `start`, `end` on the row (what rocprofv3 writes, schema 3).
    A,
    /// `track_id` → `rocpd_track(nid, pid, agent_id, stream_id)`, `start`/`end` on the row
    /// (schema 4.1).
    B,
    /// Like B, with `start_id`/`end_id` → `rocpd_timestamp(value)` (an early-2025 draft).
    C,
}

/// Whether the file is a SQLite database with a rocpd memory table (or view).
pub fn is_rocpd(path: &Path) -> bool {
    open(path)
        .and_then(|c| objects(&c, path))
        .is_ok_and(|o| o.iter().any(|(name, _)| is_memory_object(name)))
}

fn open(path: &Path) -> Result<Connection, RocmError> {
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| sqlite(path, source))
}

fn sqlite(path: &Path, source: rusqlite::Error) -> RocmError {
    RocmError::Sqlite {
        path: path.to_path_buf(),
        source,
    }
}

/// Tables and views: (name, is a table).
fn objects(conn: &Connection, path: &Path) -> Result<Vec<(String, bool)>, RocmError> {
    let mut stmt = conn
        .prepare("SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')")
        .map_err(|e| sqlite(path, e))?;
    let rows = stmt
        .query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)? == "table"))
        })
        .map_err(|e| sqlite(path, e))?;
    rows.collect::<Result<_, _>>().map_err(|e| sqlite(path, e))
}

fn is_memory_object(name: &str) -> bool {
    name == MEMORY_TABLE || name.starts_with("rocpd_memory_allocate_")
}

/// The memory table's layout, from its columns.
pub fn layout_of(columns: &HashSet<String>) -> Option<Layout> {
    let has = |c: &str| columns.contains(c);
    if !has("type") || !has("address") || !has("size") {
        return None;
    }
    if has("track_id") {
        if has("start_id") && has("end_id") {
            return Some(Layout::C);
        }
        if has("start") && has("end") {
            return Some(Layout::B);
        }
        return None;
    }
    (has("pid") && has("agent_id") && has("start") && has("end")).then_some(Layout::A)
}

/// Imports every process of one database.
pub fn import_path(path: &Path) -> Result<Import, RocmError> {
    let conn = open(path)?;
    let objects = objects(&conn, path)?;
    let names: HashSet<&str> = objects.iter().map(|(n, _)| n.as_str()).collect();

    // Each run's suffixed table; the unsuffixed view only when there is none (it shows one
    // run, and newer schemas wrap a column in a function this SQLite lacks).
    let mut sources: Vec<(String, String)> = objects
        .iter()
        .filter(|(name, is_table)| *is_table && name.starts_with("rocpd_memory_allocate_"))
        .map(|(name, _)| {
            let suffix = name[MEMORY_TABLE.len()..].to_string();
            (name.clone(), suffix)
        })
        .collect();
    sources.sort();
    if sources.is_empty() && names.contains(MEMORY_TABLE) {
        sources.push((MEMORY_TABLE.to_string(), String::new()));
    }
    if sources.is_empty() {
        if names.contains("rocpd_api") || names.contains("rocpd_op") {
            return Err(RocmError::OldRpd {
                path: path.to_path_buf(),
            });
        }
        let hint = if names.iter().any(|n| n.starts_with("rocpd_")) {
            " (a rocpd database without memory tables: too old a rocprofv3?)"
        } else {
            " (not a rocpd database)"
        };
        return Err(RocmError::MissingTable {
            path: path.to_path_buf(),
            table: MEMORY_TABLE.to_string(),
            hint,
        });
    }

    let mut ranks: BTreeMap<RankKey, Process> = BTreeMap::new();
    let mut scratch_rows = 0;
    for (table, suffix) in &sources {
        read_table(
            &conn,
            path,
            table,
            suffix,
            &names,
            &mut ranks,
            &mut scratch_rows,
        )?;
    }
    if ranks.values().all(|p| p.events.is_empty()) {
        return Err(RocmError::NoRecords {
            path: path.to_path_buf(),
            hint: "the rocpd_memory_allocate table is empty: record with rocprofv3 \
                   --memory-allocation-trace",
        });
    }

    // `hostname/pid`, with the run's guid where two runs share it.
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for key in ranks.keys() {
        *seen.entry(key.label()).or_default() += 1;
    }
    let processes = ranks
        .into_iter()
        .map(|(key, mut p)| {
            let label = key.label();
            p.label = if seen.get(&label).copied().unwrap_or(0) > 1 {
                format!("{label} (run {})", key.guid)
            } else {
                label
            };
            p
        })
        .collect();
    let mut warnings = Vec::new();
    if scratch_rows > 0 {
        warnings.push(Warning::SkippedScratch {
            path: path.to_path_buf(),
            rows: scratch_rows,
        });
    }
    Ok(mapping::build(
        RocmFormat::Rocpd,
        path,
        "row id",
        processes,
        warnings,
    ))
}

/// A process: its host and OS pid (or the row ids standing for them), and the run.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RankKey {
    host: Option<String>,
    nid: Option<i64>,
    os_pid: Option<i64>,
    pid_row: Option<i64>,
    guid: String,
}

impl RankKey {
    fn label(&self) -> String {
        let host = match (&self.host, self.nid) {
            (Some(h), _) => h.clone(),
            (None, Some(n)) => format!("node {n}"),
            (None, None) => "node ?".to_string(),
        };
        match (self.os_pid, self.pid_row) {
            (Some(p), _) => format!("{host}/{p}"),
            (None, Some(r)) => format!("{host}/process row {r}"),
            (None, None) => format!("{host}/?"),
        }
    }
}

fn columns_of(conn: &Connection, path: &Path, table: &str) -> Result<HashSet<String>, RocmError> {
    let mut stmt = conn
        .prepare(&format!("PRAGMA table_info({})", quote(table)))
        .map_err(|e| sqlite(path, e))?;
    let rows = stmt
        .query_map([], |r| r.get::<_, String>(1))
        .map_err(|e| sqlite(path, e))?;
    rows.collect::<Result<_, _>>().map_err(|e| sqlite(path, e))
}

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[allow(clippy::too_many_arguments)]
fn read_table(
    conn: &Connection,
    path: &Path,
    table: &str,
    suffix: &str,
    names: &HashSet<&str>,
    ranks: &mut BTreeMap<RankKey, Process>,
    scratch_rows: &mut u64,
) -> Result<(), RocmError> {
    let columns = columns_of(conn, path, table)?;
    let layout = layout_of(&columns).ok_or_else(|| {
        let mut cols: Vec<&str> = columns.iter().map(String::as_str).collect();
        cols.sort_unstable();
        RocmError::UnknownLayout {
            path: path.to_path_buf(),
            table: table.to_string(),
            columns: cols.join(", "),
        }
    })?;
    // This run's table, else the unsuffixed view, else none (NULLs).
    let aux = |base: &str| -> Result<Option<(String, bool)>, RocmError> {
        let suffixed = format!("{base}{suffix}");
        let name = if names.contains(suffixed.as_str()) {
            suffixed
        } else if names.contains(base) {
            base.to_string()
        } else {
            return Ok(None);
        };
        let has_guid = columns_of(conn, path, &name)?.contains("guid");
        Ok(Some((name, has_guid)))
    };
    let m_guid = columns.contains("guid");
    // A LEFT JOIN on `alias.id = key` (and the same run), or NULL columns without the table.
    let join = |aux: &Option<(String, bool)>, alias: &str, key: &str| -> String {
        match aux {
            Some((name, has_guid)) => {
                let guid = if *has_guid && m_guid {
                    format!(" AND {alias}.guid = m.guid")
                } else {
                    String::new()
                };
                format!(
                    " LEFT JOIN {} {alias} ON {alias}.id = {key}{guid}",
                    quote(name)
                )
            }
            None => String::new(),
        }
    };
    let col = |aux: &Option<(String, bool)>, expr: &str| -> String {
        if aux.is_some() {
            expr.to_string()
        } else {
            "NULL".to_string()
        }
    };
    let agent = aux("rocpd_info_agent")?;
    let process = aux("rocpd_info_process")?;
    let node = aux("rocpd_info_node")?;
    let guid = if m_guid { "m.guid" } else { "''" };
    let level = if columns.contains("level") {
        "m.level"
    } else {
        "NULL"
    };

    let (owner, start, end, stream, joins) = match layout {
        Layout::A => (
            "m",
            "m.start".to_string(),
            "m.\"end\"".to_string(),
            if columns.contains("stream_id") {
                "m.stream_id"
            } else {
                "NULL"
            }
            .to_string(),
            String::new(),
        ),
        Layout::B | Layout::C => {
            let track = aux("rocpd_track")?.ok_or_else(|| RocmError::MissingTable {
                path: path.to_path_buf(),
                table: format!("rocpd_track{suffix}"),
                hint: " (the memory table's track_id points into it)",
            })?;
            let mut joins = join(&Some(track), "t", "m.track_id");
            let (start, end) = if layout == Layout::C {
                let ts = aux("rocpd_timestamp")?.ok_or_else(|| RocmError::MissingTable {
                    path: path.to_path_buf(),
                    table: format!("rocpd_timestamp{suffix}"),
                    hint: " (the memory table's start_id/end_id point into it)",
                })?;
                joins.push_str(&join(&Some(ts.clone()), "ts", "m.start_id"));
                joins.push_str(&join(&Some(ts), "te", "m.end_id"));
                ("ts.value".to_string(), "te.value".to_string())
            } else {
                ("m.start".to_string(), "m.\"end\"".to_string())
            };
            ("t", start, end, "t.stream_id".to_string(), joins)
        }
    };
    let sql = format!(
        "SELECT m.id, m.type, {level}, {start}, {end}, m.address, m.size, {stream}, \
                {agent_type}, {type_index}, {os_pid}, {host}, {owner}.pid, {owner}.nid, {guid} \
         FROM {table} m{joins}{agent_join}{process_join}{node_join} \
         ORDER BY {guid}, {start}, m.id",
        agent_type = col(&agent, "a.type"),
        type_index = col(&agent, "a.type_index"),
        os_pid = col(&process, "p.pid"),
        host = col(&node, "n.hostname"),
        table = quote(table),
        agent_join = join(&agent, "a", &format!("{owner}.agent_id")),
        process_join = join(&process, "p", &format!("{owner}.pid")),
        node_join = join(&node, "n", &format!("{owner}.nid")),
    );
    let mut stmt = conn.prepare(&sql).map_err(|e| sqlite(path, e))?;
    let mut rows = stmt.query([]).map_err(|e| sqlite(path, e))?;
    while let Some(row) = rows.next().map_err(|e| sqlite(path, e))? {
        let get = |i: usize| row.get::<_, Value>(i).map_err(|e| sqlite(path, e));
        let id = as_int(&get(0)?).unwrap_or(0);
        let bad = |what: String| RocmError::BadValue {
            path: path.to_path_buf(),
            place: format!("{table} row id {id}"),
            what,
        };
        let kind = as_text(&get(1)?);
        let op = match kind.as_deref() {
            Some("ALLOC") | Some("REALLOC") => Op::Alloc,
            Some("FREE") | Some("RECLAIM") => Op::Free,
            other => return Err(bad(format!("type {other:?} is none of ALLOC, FREE"))),
        };
        if as_text(&get(2)?).as_deref() == Some("SCRATCH") {
            *scratch_rows += 1;
            continue;
        }
        let time = |v: Value, name: &str| {
            as_int(&v).ok_or_else(|| bad(format!("{name} is {}", describe(&v))))
        };
        let (start, end) = (time(get(3)?, "start")?, time(get(4)?, "end")?);
        let address = match get(5)? {
            Value::Null => 0,
            v => as_address(&v).ok_or_else(|| bad(format!("address is {}", describe(&v))))?,
        };
        let size_value = get(6)?;
        let size = as_int(&size_value)
            .and_then(|s| u64::try_from(s).ok())
            .ok_or_else(|| bad(format!("size is {}", describe(&size_value))))?;
        let stream = as_int(&get(7)?).unwrap_or(0);
        let agent = match (as_text(&get(8)?).as_deref(), as_int(&get(9)?)) {
            (Some("GPU"), Some(ordinal)) => Agent::Gpu(ordinal),
            (Some("CPU"), _) => Agent::Cpu,
            _ => Agent::Unknown,
        };
        let key = RankKey {
            os_pid: as_int(&get(10)?),
            host: as_text(&get(11)?),
            pid_row: as_int(&get(12)?),
            nid: as_int(&get(13)?),
            guid: as_text(&get(14)?).unwrap_or_default(),
        };
        ranks.entry(key).or_default().events.push(Event {
            op,
            address,
            size,
            agent,
            time_ns: if op == Op::Alloc { end } else { start },
            stream,
            place: u64::try_from(id).unwrap_or(0),
        });
    }
    Ok(())
}

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(i) => Some(*i),
        Value::Real(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Some(*f as i64),
        Value::Text(t) => t.trim().parse().ok(),
        _ => None,
    }
}

/// SQLite integers are signed: addresses of 2^63 and above come back negative.
fn as_address(v: &Value) -> Option<u64> {
    match v {
        Value::Integer(i) => Some(*i as u64),
        Value::Text(t) => {
            let t = t.trim();
            match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => t.parse().ok(),
            }
        }
        _ => None,
    }
}

fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::Text(t) => Some(t.clone()),
        Value::Integer(i) => Some(i.to_string()),
        _ => None,
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "NULL".to_string(),
        Value::Integer(i) => i.to_string(),
        Value::Real(f) => f.to_string(),
        Value::Text(t) => format!("{t:?}"),
        Value::Blob(b) => format!("a {}-byte blob", b.len()),
    }
}

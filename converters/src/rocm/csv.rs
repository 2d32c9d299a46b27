//! rocprofv3 `<pid>_memory_allocation_trace.csv` (every header variant) and the
//! `<pid>_agent_info.csv` beside it. See the [module docs](super#csv).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::mapping::{self, Agent, Event, Op, Process, Warning};
use super::{Import, RocmError, RocmFormat};

/// The columns of today's trace, in the order rocprofv3 writes row values (also when a 2025-07
/// header listed `Allocation_Size` last).
const ROW_ORDER: [&str; 8] = [
    "Kind",
    "Operation",
    "Agent_Id",
    "Allocation_Size",
    "Address",
    "Correlation_Id",
    "Start_Timestamp",
    "End_Timestamp",
];

/// Whether text starts with a memory-allocation-trace header (quoted or bare).
pub fn is_rocprof_header(text: &[u8]) -> bool {
    let line = text.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let names: Vec<String> = line
        .split(|&b| b == b',')
        .take(3)
        .map(|f| unquote(&String::from_utf8_lossy(f)).to_string())
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    matches!(
        names.as_slice(),
        ["Kind", "Operation", "Agent_Id"] | ["Guid", "Kind", "Operation"]
    )
}

/// Imports a trace file, with `<pid>_agent_info.csv` from the same folder when it is there.
pub fn import_path(path: &Path) -> Result<Import, RocmError> {
    let bytes = std::fs::read(path).map_err(|source| RocmError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let agent_info = match agent_info_path(path) {
        Some(info) if info.is_file() => {
            let info_bytes = std::fs::read(&info).map_err(|source| RocmError::Io {
                path: info.clone(),
                source,
            })?;
            AgentInfo::Read(AgentTable::parse(&info_bytes, &info)?)
        }
        Some(info) => AgentInfo::Missing(info),
        None => AgentInfo::Missing(path.with_file_name("<pid>_agent_info.csv")),
    };
    import_with(&bytes, path, agent_info)
}

/// Imports a trace from bytes, with the agent table's bytes when the caller has them
/// (`agent_info`: the bytes and the file they came from).
pub fn import_bytes(
    bytes: &[u8],
    path: &Path,
    agent_info: Option<(&[u8], &Path)>,
) -> Result<Import, RocmError> {
    let agent_info = match agent_info {
        Some((info, info_path)) => AgentInfo::Read(AgentTable::parse(info, info_path)?),
        None => AgentInfo::Missing(
            agent_info_path(path).unwrap_or_else(|| path.with_file_name("<pid>_agent_info.csv")),
        ),
    };
    import_with(bytes, path, agent_info)
}

/// `<dir>/<pid>_agent_info.csv` for `<dir>/<pid>_memory_allocation_trace.csv`.
pub fn agent_info_path(trace: &Path) -> Option<PathBuf> {
    let name = trace.file_name()?.to_str()?;
    let prefix = name.strip_suffix("memory_allocation_trace.csv")?;
    Some(trace.with_file_name(format!("{prefix}agent_info.csv")))
}

enum AgentInfo {
    Read(AgentTable),
    /// Where the table would have been.
    Missing(PathBuf),
}

/// `<pid>_agent_info.csv`: which node ids are GPUs, and each GPU's ordinal.
#[derive(Debug, Default)]
struct AgentTable {
    /// Logical node id → agent.
    by_logical: BTreeMap<i64, Agent>,
    /// Node id → agent.
    by_node: BTreeMap<i64, Agent>,
}

impl AgentTable {
    fn parse(bytes: &[u8], path: &Path) -> Result<AgentTable, RocmError> {
        let mut reader = reader(bytes);
        let mut records = reader.records();
        let header = match records.next() {
            Some(r) => r.map_err(|e| csv_error(path, e))?,
            None => return Ok(AgentTable::default()),
        };
        let col = |name: &str| header.iter().position(|h| h == name);
        let missing = |name: &str| RocmError::Csv {
            path: path.to_path_buf(),
            line: 1,
            what: format!(
                "no {name} column (an agent_info.csv has Node_Id, Logical_Node_Id, Agent_Type)"
            ),
        };
        let node = col("Node_Id").ok_or_else(|| missing("Node_Id"))?;
        let logical = col("Logical_Node_Id");
        let kind = col("Agent_Type").ok_or_else(|| missing("Agent_Type"))?;
        let type_index = col("Logical_Node_Type_Id");
        // (logical or node id, node id, is GPU, type index)
        let mut rows = Vec::new();
        for record in records {
            let record = record.map_err(|e| csv_error(path, e))?;
            let line = line_of(&record);
            check_width(&record, header.len(), path, line)?;
            let int = |i: usize, name: &str| -> Result<i64, RocmError> {
                let v = record.get(i).map(unquote).unwrap_or("");
                v.parse().map_err(|_| RocmError::Csv {
                    path: path.to_path_buf(),
                    line,
                    what: format!("{name} {v:?} is not an integer"),
                })
            };
            let node_id = int(node, "Node_Id")?;
            let logical_id = match logical {
                Some(l) => int(l, "Logical_Node_Id")?,
                None => node_id,
            };
            let is_gpu = record.get(kind).map(unquote) == Some("GPU");
            let ordinal = match type_index {
                Some(t) if is_gpu => Some(int(t, "Logical_Node_Type_Id")?),
                _ => None,
            };
            rows.push((logical_id, node_id, is_gpu, ordinal));
        }
        // GPU ordinals: the n-th GPU by logical node id, unless the table says.
        rows.sort_by_key(|r| r.0);
        let mut table = AgentTable::default();
        let mut next_gpu = 0;
        for (logical_id, node_id, is_gpu, ordinal) in rows {
            let agent = if is_gpu {
                let o = ordinal.unwrap_or(next_gpu);
                next_gpu += 1;
                Agent::Gpu(o)
            } else {
                Agent::Cpu
            };
            table.by_logical.insert(logical_id, agent);
            table.by_node.insert(node_id, agent);
        }
        Ok(table)
    }
}

/// An `Agent_Id` as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AgentRef {
    /// `Agent N`: logical node id (or node id with `--agent-index absolute`).
    Agent(i64),
    /// A bare integer (2024-11..2025-03): node id.
    Node(i64),
    Gpu(i64),
    Cpu,
    None,
}

fn parse_agent(text: &str) -> Option<AgentRef> {
    let t = text.trim_matches(|c: char| c == '"' || c.is_whitespace());
    if t.is_empty() {
        return Some(AgentRef::None);
    }
    let number = |rest: &str| rest.trim().parse::<i64>().ok();
    if let Some(rest) = t.strip_prefix("Agent ") {
        return number(rest).map(AgentRef::Agent);
    }
    if let Some(rest) = t.strip_prefix("GPU ") {
        return number(rest).map(AgentRef::Gpu);
    }
    if t.starts_with("CPU ") {
        return Some(AgentRef::Cpu);
    }
    number(t).map(AgentRef::Node)
}

/// Where the fields of a row are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Columns {
    guid: Option<usize>,
    operation: usize,
    agent: usize,
    size: usize,
    address: usize,
    start: usize,
    end: usize,
}

impl Columns {
    fn from_names(names: &[&str]) -> Result<Columns, String> {
        let find = |name: &str| names.iter().position(|n| n.eq_ignore_ascii_case(name));
        let need = |name: &str| find(name).ok_or_else(|| format!("no {name} column"));
        Ok(Columns {
            guid: find("Guid"),
            operation: need("Operation")?,
            agent: need("Agent_Id")?,
            size: need("Allocation_Size")?,
            address: find("Address")
                .or_else(|| find("Starting_Address"))
                .ok_or("no Address (or Starting_Address) column")?,
            start: need("Start_Timestamp")?,
            end: need("End_Timestamp")?,
        })
    }

    fn swapped(self) -> Columns {
        Columns {
            size: self.address,
            address: self.size,
            ..self
        }
    }
}

fn import_with(bytes: &[u8], path: &Path, agent_info: AgentInfo) -> Result<Import, RocmError> {
    let mut reader = reader(bytes);
    let mut records = reader.records();
    let header = match records.next() {
        Some(r) => r.map_err(|e| csv_error(path, e))?,
        None => {
            return Err(RocmError::NoRecords {
                path: path.to_path_buf(),
                hint: "empty file",
            })
        }
    };
    let names: Vec<&str> = header.iter().map(unquote).collect();
    let by_name = Columns::from_names(&names).map_err(|what| RocmError::Csv {
        path: path.to_path_buf(),
        line: 1,
        what,
    })?;
    // The order rows are written in, for headers that list the columns otherwise.
    let offset = usize::from(by_name.guid == Some(0));
    let row_order = {
        let mut names: Vec<&str> = Vec::new();
        if offset == 1 {
            names.push("Guid");
        }
        names.extend(ROW_ORDER);
        Columns::from_names(&names).ok()
    }
    .filter(|c| *c != by_name && header.len() == ROW_ORDER.len() + offset);

    let label = file_label(path);
    let mut processes: BTreeMap<String, Process> = BTreeMap::new();
    let mut agent_numbers_guessed = false;
    for record in records {
        let record = record.map_err(|e| csv_error(path, e))?;
        let line = line_of(&record);
        check_width(&record, header.len(), path, line)?;
        let field = |i: usize| record.get(i).map(unquote).unwrap_or("");
        let cols = pick_columns(by_name, row_order, &field);
        let bad = |what: String| RocmError::Csv {
            path: path.to_path_buf(),
            line,
            what,
        };
        let op = match field(cols.operation) {
            "MEMORY_ALLOCATION_ALLOCATE" | "MEMORY_ALLOCATION_VMEM_ALLOCATE" => Op::Alloc,
            "MEMORY_ALLOCATION_FREE" | "MEMORY_ALLOCATION_VMEM_FREE" => Op::Free,
            other => return Err(bad(format!("unknown Operation {other:?}"))),
        };
        let address = parse_address(field(cols.address)).ok_or_else(|| {
            bad(format!(
                "Address {:?} is not an address",
                field(cols.address)
            ))
        })?;
        let size = parse_u64(field(cols.size)).ok_or_else(|| {
            bad(format!(
                "Allocation_Size {:?} is not a byte count",
                field(cols.size)
            ))
        })?;
        let time = |i: usize, name: &str| {
            parse_u64(field(i))
                .and_then(|t| i64::try_from(t).ok())
                .ok_or_else(|| bad(format!("{name} {:?} is not a timestamp", field(i))))
        };
        let (start, end) = (
            time(cols.start, "Start_Timestamp")?,
            time(cols.end, "End_Timestamp")?,
        );
        let agent_ref = parse_agent(field(cols.agent))
            .ok_or_else(|| bad(format!("Agent_Id {:?} is not an agent", field(cols.agent))))?;
        let agent = match (&agent_info, agent_ref) {
            (_, AgentRef::Gpu(n)) => Agent::Gpu(n),
            (_, AgentRef::Cpu) => Agent::Cpu,
            (_, AgentRef::None) => Agent::Unknown,
            (AgentInfo::Read(table), AgentRef::Agent(n)) => table
                .by_logical
                .get(&n)
                .or_else(|| table.by_node.get(&n))
                .copied()
                .unwrap_or(Agent::Unknown),
            (AgentInfo::Read(table), AgentRef::Node(n)) => table
                .by_node
                .get(&n)
                .or_else(|| table.by_logical.get(&n))
                .copied()
                .unwrap_or(Agent::Unknown),
            (AgentInfo::Missing(_), AgentRef::Agent(n) | AgentRef::Node(n)) => {
                if op == Op::Alloc {
                    agent_numbers_guessed = true;
                }
                Agent::Gpu(n)
            }
        };
        let rank = match cols.guid {
            Some(g) if !field(g).is_empty() => field(g).to_string(),
            _ => String::new(),
        };
        processes.entry(rank).or_default().events.push(Event {
            op,
            address,
            size,
            agent,
            time_ns: if op == Op::Alloc { end } else { start },
            stream: 0,
            place: line,
        });
    }
    if processes.values().all(|p| p.events.is_empty()) {
        return Err(RocmError::NoRecords {
            path: path.to_path_buf(),
            hint: "the header has no rows: record with rocprofv3 --memory-allocation-trace",
        });
    }
    let several = processes.len() > 1;
    let processes = processes
        .into_iter()
        .map(|(guid, mut p)| {
            p.label = if several {
                format!("{label} run {guid}")
            } else {
                label.clone()
            };
            p
        })
        .collect();
    let mut warnings = Vec::new();
    if let (true, AgentInfo::Missing(expected)) = (agent_numbers_guessed, &agent_info) {
        warnings.push(Warning::NoAgentInfo {
            path: path.to_path_buf(),
            expected: expected.clone(),
        });
    }
    Ok(mapping::build(
        RocmFormat::Csv,
        path,
        "line",
        processes,
        warnings,
    ))
}

/// The header's columns, unless the row's values say otherwise: the 2025-07 header listed
/// `Allocation_Size` last while rows kept today's order, and docs show the two swapped.
fn pick_columns<'a>(
    by_name: Columns,
    row_order: Option<Columns>,
    field: &impl Fn(usize) -> &'a str,
) -> Columns {
    let is_pointer = |i: usize| {
        let f = field(i);
        f.starts_with("0x") || f.starts_with("0X")
    };
    if is_pointer(by_name.address) {
        return by_name;
    }
    if let Some(order) = row_order {
        if is_pointer(order.address) && !is_pointer(order.size) {
            return order;
        }
    }
    if is_pointer(by_name.size) {
        return by_name.swapped();
    }
    by_name
}

/// `pid 1234` for `1234_memory_allocation_trace.csv`, else the file name.
fn file_label(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let digits: String = name.chars().take_while(char::is_ascii_digit).collect();
    if !digits.is_empty() && name[digits.len()..].starts_with('_') {
        format!("pid {digits}")
    } else {
        name
    }
}

fn reader(bytes: &[u8]) -> ::csv::Reader<&[u8]> {
    ::csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(::csv::Trim::All)
        .from_reader(bytes)
}

fn line_of(record: &::csv::StringRecord) -> u64 {
    record.position().map_or(0, |p| p.line())
}

fn check_width(
    record: &::csv::StringRecord,
    width: usize,
    path: &Path,
    line: u64,
) -> Result<(), RocmError> {
    if record.len() != width {
        return Err(RocmError::Csv {
            path: path.to_path_buf(),
            line,
            what: format!(
                "{} fields, header has {width} (a truncated or damaged file?)",
                record.len()
            ),
        });
    }
    Ok(())
}

fn csv_error(path: &Path, error: ::csv::Error) -> RocmError {
    let line = error.position().map_or(0, |p| p.line());
    let what = match error.kind() {
        ::csv::ErrorKind::Utf8 { err, .. } => format!("not UTF-8 text ({err})"),
        _ => error.to_string(),
    };
    RocmError::Csv {
        path: path.to_path_buf(),
        line,
        what,
    }
}

/// Strips the quotes a value may keep (a doubled quote inside a bare field).
fn unquote(s: &str) -> &str {
    s.trim().trim_matches('"').trim()
}

/// `0x00007f3a40000000`, `0x7F3A40000000` or decimal.
fn parse_address(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() => u64::from_str_radix(hex, 16).ok(),
        Some(_) => None,
        None => s.parse().ok(),
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    s.parse().ok()
}

//! rocprofv3 `<pid>_results.json` (`--output-format json`). See the [module docs](super#json).

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use super::mapping::{self, Agent, Event, Op, Process};
use super::{Import, RocmError, RocmFormat};

/// The top-level key of a rocprofv3 JSON file.
pub const TOOL_KEY: &str = "rocprofiler-sdk-tool";

/// Whether text (without leading space) is a JSON object whose first key is
/// [`TOOL_KEY`], the shape rocprofv3 writes.
pub fn looks_like_rocprof_json(text: &[u8]) -> bool {
    let Some(rest) = text.strip_prefix(b"{") else {
        return false;
    };
    let start = rest
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(rest.len());
    rest[start..].starts_with(b"\"rocprofiler-sdk-tool\"")
}

/// Imports a results file.
pub fn import_path(path: &Path) -> Result<Import, RocmError> {
    let bytes = std::fs::read(path).map_err(|source| RocmError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    import_bytes(&bytes, path)
}

#[derive(Deserialize)]
struct Root {
    /// One element per process.
    #[serde(rename = "rocprofiler-sdk-tool")]
    tool: Vec<Tool>,
}

/// One process.
#[derive(Deserialize)]
struct Tool {
    #[serde(default)]
    metadata: Option<Metadata>,
    #[serde(default)]
    agents: Vec<JsonAgent>,
    #[serde(default)]
    strings: Option<Strings>,
    #[serde(default)]
    buffer_records: Option<BufferRecords>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    pid: Option<u64>,
    /// A hostname, or an object with one.
    #[serde(default)]
    node: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Handle {
    handle: u64,
}

#[derive(Deserialize)]
struct JsonAgent {
    id: Handle,
    /// 1 CPU, 2 GPU (or the name).
    #[serde(rename = "type", default)]
    kind: Option<serde_json::Value>,
    #[serde(default)]
    logical_node_type_id: Option<i64>,
    #[serde(default)]
    gpu_index: Option<i64>,
    #[serde(default)]
    logical_node_id: Option<i64>,
}

#[derive(Deserialize)]
struct Strings {
    #[serde(default)]
    buffer_records: Vec<KindNames>,
}

#[derive(Deserialize)]
struct KindNames {
    kind: String,
    #[serde(default)]
    operations: Vec<String>,
}

#[derive(Deserialize)]
struct BufferRecords {
    #[serde(default)]
    memory_allocation: Vec<Record>,
}

#[derive(Deserialize)]
struct Record {
    kind: u64,
    operation: u64,
    start_timestamp: u64,
    end_timestamp: u64,
    #[serde(default)]
    agent_id: Option<Handle>,
    address: Address,
    #[serde(default)]
    allocation_size: u64,
    #[serde(default)]
    stream_id: Option<Handle>,
}

/// `"0x00007f3a40000000"` or a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum Address {
    Number(u64),
    Text(String),
}

/// The `MEMORY_ALLOCATION` operations by enum value, when `strings` does not list them
/// (`rocprofiler_memory_allocation_operation_t`).
const DEFAULT_OPERATIONS: [&str; 5] = [
    "MEMORY_ALLOCATION_NONE",
    "MEMORY_ALLOCATION_ALLOCATE",
    "MEMORY_ALLOCATION_VMEM_ALLOCATE",
    "MEMORY_ALLOCATION_FREE",
    "MEMORY_ALLOCATION_VMEM_FREE",
];

/// Imports a results file from bytes (`path` names it in errors).
pub fn import_bytes(bytes: &[u8], path: &Path) -> Result<Import, RocmError> {
    let root: Root = serde_json::from_slice(bytes).map_err(|e| RocmError::Json {
        path: path.to_path_buf(),
        what: e.to_string(),
    })?;
    let tools = root.tool;
    let several = tools.len() > 1;
    let mut processes = Vec::new();
    for (index, tool) in tools.into_iter().enumerate() {
        processes.push(process(tool, index, several, path)?);
    }
    if processes.iter().all(|p| p.events.is_empty()) {
        return Err(RocmError::NoRecords {
            path: path.to_path_buf(),
            hint: "buffer_records.memory_allocation is empty: record with rocprofv3 \
                   --memory-allocation-trace",
        });
    }
    Ok(mapping::build(
        RocmFormat::Json,
        path,
        "memory_allocation record",
        processes,
        Vec::new(),
    ))
}

fn process(tool: Tool, index: usize, several: bool, path: &Path) -> Result<Process, RocmError> {
    let label = label(tool.metadata.as_ref(), index, several);
    let bad = |place: String, what: String| RocmError::BadValue {
        path: path.to_path_buf(),
        place: format!("{label}: {place}"),
        what,
    };

    // Agents by handle; GPU ordinal = logical_node_type_id (else gpu_index, else the n-th GPU).
    let mut agents: HashMap<u64, Agent> = HashMap::new();
    let mut gpus: Vec<&JsonAgent> = tool.agents.iter().filter(|a| is_gpu(a)).collect();
    gpus.sort_by_key(|a| a.logical_node_id);
    for (n, a) in gpus.iter().enumerate() {
        let ordinal = a.logical_node_type_id.or(a.gpu_index).unwrap_or(n as i64);
        agents.insert(a.id.handle, Agent::Gpu(ordinal));
    }
    for a in tool.agents.iter().filter(|a| !is_gpu(a)) {
        agents.insert(a.id.handle, Agent::Cpu);
    }

    // kind → operation names, from strings.buffer_records (index = enum value).
    let names = tool.strings.map(|s| s.buffer_records).unwrap_or_default();
    let memory_kind = names.iter().position(|k| k.kind == "MEMORY_ALLOCATION");
    let operations: Vec<&str> = match memory_kind {
        Some(k) => names[k].operations.iter().map(String::as_str).collect(),
        None => DEFAULT_OPERATIONS.to_vec(),
    };

    let records = tool
        .buffer_records
        .map(|b| b.memory_allocation)
        .unwrap_or_default();
    let mut events = Vec::with_capacity(records.len());
    for (i, r) in records.into_iter().enumerate() {
        let place = || format!("buffer_records.memory_allocation[{i}]");
        if let Some(k) = memory_kind {
            if r.kind as usize != k {
                let kind = names.get(r.kind as usize).map_or("?", |n| n.kind.as_str());
                return Err(bad(
                    place(),
                    format!("kind {} ({kind}) is not MEMORY_ALLOCATION ({k})", r.kind),
                ));
            }
        }
        let op_name = operations.get(r.operation as usize).copied().unwrap_or("");
        let op = match op_name {
            "MEMORY_ALLOCATION_ALLOCATE" | "MEMORY_ALLOCATION_VMEM_ALLOCATE" => Op::Alloc,
            "MEMORY_ALLOCATION_FREE" | "MEMORY_ALLOCATION_VMEM_FREE" => Op::Free,
            _ => {
                return Err(bad(
                    place(),
                    format!(
                        "operation {} ({op_name:?}) is no allocation or free",
                        r.operation
                    ),
                ))
            }
        };
        let address = match &r.address {
            Address::Number(n) => Some(*n),
            Address::Text(t) => parse_address(t),
        }
        .ok_or_else(|| bad(place(), "address is not an address".to_string()))?;
        let agent = match r.agent_id.as_ref().map(|h| h.handle) {
            None | Some(0) => Agent::Unknown,
            Some(h) => agents.get(&h).copied().unwrap_or(Agent::Unknown),
        };
        let time = if op == Op::Alloc {
            r.end_timestamp
        } else {
            r.start_timestamp
        };
        events.push(Event {
            op,
            address,
            size: r.allocation_size,
            agent,
            time_ns: i64::try_from(time)
                .map_err(|_| bad(place(), format!("timestamp {time} beyond 2^63")))?,
            stream: r
                .stream_id
                .map_or(0, |s| i64::try_from(s.handle).unwrap_or(i64::MAX)),
            place: i as u64,
        });
    }
    Ok(Process { label, events })
}

fn is_gpu(agent: &JsonAgent) -> bool {
    match &agent.kind {
        Some(serde_json::Value::Number(n)) => n.as_u64() == Some(2),
        Some(serde_json::Value::String(s)) => s.contains("GPU"),
        _ => false,
    }
}

/// `hostname/pid`, `pid N`, or `process N` (the index in the file).
fn label(metadata: Option<&Metadata>, index: usize, several: bool) -> String {
    let host = metadata
        .and_then(|m| m.node.as_ref())
        .and_then(|n| match n {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Object(o) => ["hostname", "nodename", "name"]
                .iter()
                .find_map(|k| o.get(*k).and_then(|v| v.as_str()).map(str::to_string)),
            _ => None,
        });
    match (host, metadata.and_then(|m| m.pid)) {
        (Some(h), Some(pid)) => format!("{h}/{pid}"),
        (None, Some(pid)) => format!("pid {pid}"),
        _ if several => format!("process {index}"),
        _ => "process".to_string(),
    }
}

fn parse_address(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() => u64::from_str_radix(hex, 16).ok(),
        Some(_) => None,
        None => s.parse().ok(),
    }
}

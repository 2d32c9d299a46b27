//! Configuration of the C ABI from the environment (`MEMSNAP_*`), for zero-code use.
//!
//! Parsing is pure (it takes a lookup function), so every rule is unit-tested without touching
//! the process environment.

use std::path::PathBuf;

use recorder::history::{ContextMode, HistoryMode};

/// The device memory of a simulated or host backend when `MEMSNAP_DEVICE_MEMORY` is unset.
pub const DEFAULT_DEVICE_MEMORY: u64 = 80 << 30;
/// Ring-buffer size per device when `MEMSNAP_MAX_ENTRIES` is unset (PyTorch's default is
/// unbounded; a million entries is about the largest file its viewer still opens).
pub const DEFAULT_MAX_ENTRIES: usize = 1_000_000;

/// A `MEMSNAP_*` variable holds a value we do not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?} is not valid: expected {expected}")]
pub struct ConfigError {
    pub variable: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// Which device the allocator draws memory from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cuda,
    Hip,
    /// Real host memory (`malloc`): the allocator runs on any machine.
    Host,
    /// Fake addresses, no memory behind them: for demos and tests.
    Simulated,
}

impl BackendKind {
    pub const EXPECTED: &'static str = "cuda, hip, host or simulated";

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text.trim().to_ascii_lowercase().as_str() {
            "cuda" => BackendKind::Cuda,
            "hip" | "rocm" => BackendKind::Hip,
            "host" | "cpu" => BackendKind::Host,
            "simulated" | "sim" => BackendKind::Simulated,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Hip => "hip",
            BackendKind::Host => "host",
            BackendKind::Simulated => "simulated",
        }
    }
}

/// Parses `enabled` of `_record_memory_history`: `off`, `state` or `all`.
pub fn parse_history_mode(text: &str) -> Option<HistoryMode> {
    Some(match text.trim().to_ascii_lowercase().as_str() {
        "off" | "none" | "0" | "false" => HistoryMode::Off,
        "state" => HistoryMode::State,
        "all" | "1" | "true" | "on" => HistoryMode::All,
        _ => return None,
    })
}

pub const HISTORY_EXPECTED: &str = "off, state or all";

/// Parses `context` of `_record_memory_history`: `never`, `state`, `alloc` or `all`.
pub fn parse_context_mode(text: &str) -> Option<ContextMode> {
    Some(match text.trim().to_ascii_lowercase().as_str() {
        "never" | "none" | "off" => ContextMode::Never,
        "state" => ContextMode::State,
        "alloc" => ContextMode::Alloc,
        "all" => ContextMode::All,
        _ => return None,
    })
}

pub const CONTEXT_EXPECTED: &str = "never, state, alloc or all";

/// Which frames a stack holds (the core allocator's [`recorder::StackMode`] plus Python frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackSelection {
    None,
    /// Native (Rust/C/C++) frames.
    Native,
    /// CPython frames only (when running inside a Python interpreter).
    Python,
    /// Native frames with the Python frames spliced in, as PyTorch's `stacks="all"`.
    All,
}

impl StackSelection {
    pub const EXPECTED: &'static str = "none, native, python or all";

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text.trim().to_ascii_lowercase().as_str() {
            "none" | "off" => StackSelection::None,
            "native" | "cpp" => StackSelection::Native,
            "python" => StackSelection::Python,
            "all" => StackSelection::All,
            _ => return None,
        })
    }

    pub fn wants_native(self) -> bool {
        matches!(self, StackSelection::Native | StackSelection::All)
    }

    pub fn wants_python(self) -> bool {
        matches!(self, StackSelection::Python | StackSelection::All)
    }
}

/// Everything the environment configures.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvConfig {
    pub backend: BackendKind,
    /// Capacity of each simulated or host device.
    pub device_memory: u64,
    pub history: HistoryMode,
    pub context: ContextMode,
    pub stacks: StackSelection,
    pub max_entries: usize,
    /// Written at exit and on out-of-memory.
    pub dump_path: Option<PathBuf>,
    pub dump_on_sigusr1: bool,
    /// `PYTORCH_CUDA_ALLOC_CONF` syntax.
    pub alloc_conf: Option<String>,
    /// Whether Python frames are read only when the allocating thread already holds the GIL.
    pub python_gil: PythonGil,
    /// `MEMSNAP_LIVE`: where each allocator publishes its history as it records (the
    /// address as `memsnap watch` takes it: `1`, `unix:/path.sock`, `tcp:127.0.0.1:PORT`).
    /// Kept as text: an address that does not parse or bind is said on stderr when the
    /// allocator is created and the run goes on without live publishing, never an error that
    /// would fail the allocations.
    pub live: Option<String>,
    /// `MEMSNAP_LIVE_TOKEN`: the token every live listener must send first; with it, a
    /// non-loopback TCP address may be served (`tcp:0.0.0.0:PORT`).
    pub live_token: Option<String>,
}

/// How Python frames are read when the allocating thread does not hold the GIL
/// (`MEMSNAP_PYTHON_GIL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonGil {
    /// Take the GIL for the read, as PyTorch's own recorder does (`_record_memory_history`
    /// with Python stacks). PyTorch releases the GIL inside its operators, so without this
    /// almost no allocation of a training step has Python frames.
    Acquire,
    /// Never wait for the GIL: only allocations made while the thread holds it get frames.
    HeldOnly,
}

pub const PYTHON_GIL_EXPECTED: &str = "acquire or held";

pub fn parse_python_gil(text: &str) -> Option<PythonGil> {
    match text.trim().to_ascii_lowercase().as_str() {
        "acquire" => Some(PythonGil::Acquire),
        "held" => Some(PythonGil::HeldOnly),
        _ => None,
    }
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            backend: BackendKind::Cuda,
            device_memory: DEFAULT_DEVICE_MEMORY,
            history: HistoryMode::Off,
            context: ContextMode::All,
            stacks: StackSelection::Native,
            max_entries: DEFAULT_MAX_ENTRIES,
            dump_path: None,
            dump_on_sigusr1: false,
            alloc_conf: None,
            python_gil: PythonGil::Acquire,
            live: None,
            live_token: None,
        }
    }
}

impl EnvConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `lookup` (empty values count as unset).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let mut config = EnvConfig::default();
        if let Some(v) = get("MEMSNAP_BACKEND") {
            config.backend = parse_with(
                "MEMSNAP_BACKEND",
                &v,
                BackendKind::EXPECTED,
                BackendKind::parse,
            )?;
        }
        if let Some(v) = get("MEMSNAP_DEVICE_MEMORY") {
            config.device_memory = parse_with(
                "MEMSNAP_DEVICE_MEMORY",
                &v,
                "a size such as 80GiB, 512MiB or 1073741824",
                parse_size,
            )?;
        }
        config.dump_path = get("MEMSNAP_DUMP").map(PathBuf::from);
        // `0`/`off`/`false` say "no", as for the other switches.
        config.live = get("MEMSNAP_LIVE")
            .map(|v| v.trim().to_owned())
            .filter(|v| parse_bool(v) != Some(false));
        // Asking for a dump file or a live endpoint without naming a history mode means
        // "record everything" (either is empty without history).
        config.history = match get("MEMSNAP_HISTORY") {
            Some(v) => parse_with("MEMSNAP_HISTORY", &v, HISTORY_EXPECTED, parse_history_mode)?,
            None if config.dump_path.is_some() || config.live.is_some() => HistoryMode::All,
            None => HistoryMode::Off,
        };
        if let Some(v) = get("MEMSNAP_CONTEXT") {
            config.context =
                parse_with("MEMSNAP_CONTEXT", &v, CONTEXT_EXPECTED, parse_context_mode)?;
        }
        if let Some(v) = get("MEMSNAP_STACKS") {
            config.stacks = parse_with(
                "MEMSNAP_STACKS",
                &v,
                StackSelection::EXPECTED,
                StackSelection::parse,
            )?;
        }
        if let Some(v) = get("MEMSNAP_MAX_ENTRIES") {
            config.max_entries =
                parse_with("MEMSNAP_MAX_ENTRIES", &v, "a positive integer", |t| {
                    t.trim()
                        .replace('_', "")
                        .parse::<usize>()
                        .ok()
                        .filter(|n| *n > 0)
                })?;
        }
        if let Some(v) = get("MEMSNAP_DUMP_ON_SIGUSR1") {
            config.dump_on_sigusr1 = parse_with(
                "MEMSNAP_DUMP_ON_SIGUSR1",
                &v,
                "1, 0, true or false",
                parse_bool,
            )?;
        }
        config.alloc_conf = get("MEMSNAP_ALLOC_CONF").or_else(|| get("PYTORCH_CUDA_ALLOC_CONF"));
        if let Some(v) = get("MEMSNAP_PYTHON_GIL") {
            config.python_gil = parse_with(
                "MEMSNAP_PYTHON_GIL",
                &v,
                PYTHON_GIL_EXPECTED,
                parse_python_gil,
            )?;
        }
        // Not trimmed: a token is taken as given.
        config.live_token = get("MEMSNAP_LIVE_TOKEN");
        Ok(config)
    }
}

fn parse_with<T>(
    variable: &'static str,
    value: &str,
    expected: &'static str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T, ConfigError> {
    parse(value).ok_or_else(|| ConfigError {
        variable,
        value: value.to_owned(),
        expected,
    })
}

fn parse_bool(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// `4096`, `512MiB`, `1.5GiB`, `80GiB`, `2GB` (powers of 1000), `3g` (= GiB): the sizes
/// every memsnap tool accepts (`memsnap-units`).
pub fn parse_size(text: &str) -> Option<u64> {
    memsnap_units::parse_size(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<EnvConfig, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EnvConfig::from_lookup(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn empty_environment_gives_cuda_with_history_off() {
        let c = config(&[]).unwrap();
        assert_eq!(c, EnvConfig::default());
        assert_eq!(c.backend, BackendKind::Cuda);
        assert_eq!(c.history, HistoryMode::Off);
    }

    #[test]
    fn dump_path_alone_turns_full_history_on() {
        let c = config(&[("MEMSNAP_DUMP", "/tmp/x.pickle")]).unwrap();
        assert_eq!(c.history, HistoryMode::All);
        assert_eq!(c.dump_path, Some(PathBuf::from("/tmp/x.pickle")));
        let c = config(&[("MEMSNAP_DUMP", "x.pickle"), ("MEMSNAP_HISTORY", "state")]).unwrap();
        assert_eq!(c.history, HistoryMode::State);
    }

    #[test]
    fn every_variable_is_read() {
        let c = config(&[
            ("MEMSNAP_BACKEND", "Simulated"),
            ("MEMSNAP_DEVICE_MEMORY", "2GiB"),
            ("MEMSNAP_HISTORY", "all"),
            ("MEMSNAP_CONTEXT", "alloc"),
            ("MEMSNAP_STACKS", "python"),
            ("MEMSNAP_MAX_ENTRIES", "10_000"),
            ("MEMSNAP_DUMP_ON_SIGUSR1", "1"),
            ("MEMSNAP_ALLOC_CONF", "expandable_segments:True"),
            ("MEMSNAP_PYTHON_GIL", "held"),
        ])
        .unwrap();
        assert_eq!(c.python_gil, PythonGil::HeldOnly);
        assert_eq!(c.backend, BackendKind::Simulated);
        assert_eq!(c.device_memory, 2 << 30);
        assert_eq!(c.context, ContextMode::Alloc);
        assert_eq!(c.stacks, StackSelection::Python);
        assert_eq!(c.max_entries, 10_000);
        assert!(c.dump_on_sigusr1);
        assert_eq!(c.alloc_conf.as_deref(), Some("expandable_segments:True"));
    }

    #[test]
    fn python_frames_take_the_gil_unless_told_not_to() {
        assert_eq!(config(&[]).unwrap().python_gil, PythonGil::Acquire);
        let c = config(&[("MEMSNAP_PYTHON_GIL", "Acquire")]).unwrap();
        assert_eq!(c.python_gil, PythonGil::Acquire);
        let err = config(&[("MEMSNAP_PYTHON_GIL", "sometimes")]).unwrap_err();
        assert_eq!(err.variable, "MEMSNAP_PYTHON_GIL");
    }

    #[test]
    fn pytorch_alloc_conf_is_the_fallback() {
        let c = config(&[("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")]).unwrap();
        assert_eq!(c.alloc_conf.as_deref(), Some("max_split_size_mb:128"));
        let c = config(&[
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128"),
            ("MEMSNAP_ALLOC_CONF", "expandable_segments:True"),
        ])
        .unwrap();
        assert_eq!(c.alloc_conf.as_deref(), Some("expandable_segments:True"));
    }

    #[test]
    fn bad_values_name_the_variable_and_the_choices() {
        let err = config(&[("MEMSNAP_BACKEND", "tpu")]).unwrap_err();
        assert_eq!(err.variable, "MEMSNAP_BACKEND");
        assert!(
            err.to_string().contains("cuda, hip, host or simulated"),
            "{err}"
        );
        assert!(config(&[("MEMSNAP_MAX_ENTRIES", "0")]).is_err());
        assert!(config(&[("MEMSNAP_MAX_ENTRIES", "-5")]).is_err());
        assert!(config(&[("MEMSNAP_STACKS", "cpp++")]).is_err());
        assert!(config(&[("MEMSNAP_DEVICE_MEMORY", "lots")]).is_err());
        assert!(config(&[("MEMSNAP_DUMP_ON_SIGUSR1", "maybe")]).is_err());
    }

    #[test]
    fn live_addresses_are_kept_as_given_and_off_values_mean_no_live() {
        assert_eq!(config(&[]).unwrap().live, None);
        for (value, live) in [
            ("1", Some("1")),
            (" unix:/run/x.sock ", Some("unix:/run/x.sock")),
            ("tcp:127.0.0.1:7000", Some("tcp:127.0.0.1:7000")),
            // Checked when the allocator is created (a warning, not an error here).
            ("tcp:8.8.8.8:1", Some("tcp:8.8.8.8:1")),
            ("0", None),
            ("off", None),
            ("", None),
        ] {
            let c = config(&[("MEMSNAP_LIVE", value)]).unwrap();
            assert_eq!(c.live.as_deref(), live, "MEMSNAP_LIVE={value:?}");
        }
        // Publishing needs a history: on unless MEMSNAP_HISTORY says otherwise.
        assert_eq!(
            config(&[("MEMSNAP_LIVE", "1")]).unwrap().history,
            HistoryMode::All
        );
        let c = config(&[("MEMSNAP_LIVE", "1"), ("MEMSNAP_HISTORY", "state")]).unwrap();
        assert_eq!(c.history, HistoryMode::State);
        assert_eq!(
            config(&[("MEMSNAP_LIVE", "off")]).unwrap().history,
            HistoryMode::Off
        );
        let c = config(&[("MEMSNAP_LIVE_TOKEN", "s3cret-s3cret-s3cret")]).unwrap();
        assert_eq!(c.live_token.as_deref(), Some("s3cret-s3cret-s3cret"));
    }

    #[test]
    fn empty_values_count_as_unset() {
        assert_eq!(
            config(&[("MEMSNAP_BACKEND", "  ")]).unwrap().backend,
            BackendKind::Cuda
        );
    }

    #[test]
    fn sizes_parse_as_everywhere_else_and_overflow_is_refused() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1,024"), Some(1024));
        assert_eq!(parse_size("80GiB"), Some(80 << 30));
        assert_eq!(parse_size("2GB"), Some(2_000_000_000));
        assert_eq!(parse_size("99999999999T"), None);
        // The same rules as the CLI and the viewer (it used to take integers only).
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("lots"), None);
    }
}

//! The names of the C ABI's exported functions, apart from the functions themselves.
//!
//! `abi` defines the functions and calls into `runtime`; `runtime` needs only their names (to
//! trim the ABI's own frames from a recorded stack). Keeping the list here, below both, lets
//! each of them use it without `runtime` having to reach back up into `abi`.

/// The names of the exported functions (what memsnap.h declares).
pub const EXPORTED: [&str; 20] = [
    "memsnap_alloc",
    "memsnap_alloc_checked",
    "memsnap_free",
    "memsnap_init_hook",
    "memsnap_reset_hook",
    "memsnap_memory_fraction_hook",
    "memsnap_record_stream_hook",
    "memsnap_init",
    "memsnap_record_history",
    "memsnap_dump_snapshot",
    "memsnap_set_oom_dump_path",
    "memsnap_empty_cache",
    "memsnap_set_memory_fraction",
    "memsnap_record_stream",
    "memsnap_get_stats",
    "memsnap_stats_json",
    "memsnap_serve_live",
    "memsnap_live_address",
    "memsnap_annotate",
    "memsnap_last_error",
];

#[cfg(test)]
mod tests {
    use super::EXPORTED;

    #[test]
    fn the_exported_names_are_the_functions_of_the_header() {
        let header = include_str!("../include/memsnap.h");
        let mut declared: Vec<&str> = header
            .match_indices("memsnap_")
            .filter_map(|(start, _)| {
                let rest = &header[start..];
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
                rest[end..].starts_with('(').then(|| &rest[..end])
            })
            .collect();
        declared.sort_unstable();
        declared.dedup();
        let mut exported = EXPORTED.to_vec();
        exported.sort_unstable();
        assert_eq!(declared, exported);
    }
}

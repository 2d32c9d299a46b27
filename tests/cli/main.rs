//! Integration tests of the `memsnap` command line, one binary. Shared helpers live in `common`.

mod advise;
mod analysis_cmds;
mod common;
mod demo;
mod export_import;
mod export_parquet;
mod export_profiles;
mod format_cmds;
mod gpu_h200;
mod numbers;
mod plot_cmd;
mod rocm_cmds;
mod simulate;
mod watch;

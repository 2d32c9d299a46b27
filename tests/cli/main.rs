//! Integration tests of the `memsnap` command line, one binary. Shared helpers live in `common`.

mod analysis_cmds;
mod common;
mod format_cmds;
mod plot_cmd;
mod demo;

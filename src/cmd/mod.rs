//! One module per subcommand; each has `Args` (clap) and `run(args) -> Result<ExitCode>`.
//!
//! Exit codes: 0 success, 1 a check failed (invalid snapshot, over budget), 2 bad input or
//! usage.

pub mod advise;
pub mod check;
pub mod common;
pub mod convert;
pub mod demo;
pub mod diff;
pub mod export;
pub mod import;
pub mod info;
pub mod memviz;
pub mod plot;
pub mod ranks;
pub mod simulate;
pub mod summary;
pub mod top;
pub mod validate;
pub mod view;
pub mod watch;

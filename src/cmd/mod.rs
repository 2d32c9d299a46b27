//! One module per subcommand; each has `Args` (clap) and `run(args) -> Result<ExitCode>`.
//!
//! Exit codes: 0 success, 1 a check failed (invalid snapshot, over budget), 2 bad input or
//! usage.

pub mod common;
pub mod convert;
pub mod info;
pub mod memviz;
pub mod validate;

//! `memsnap export --to` chrome formats.

use std::process::ExitCode;

use anyhow::{bail, Result};

use super::Args;

pub fn run(args: &Args) -> Result<ExitCode> {
    bail!("--to {:?} is not available yet", args.to)
}

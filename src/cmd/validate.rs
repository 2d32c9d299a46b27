//! `memsnap validate`: check the invariants PyTorch's exporter guarantees.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use super::common;

/// Check snapshots for broken invariants.
///
/// Checks that blocks tile their segment, that each segment's allocated/active/requested sums
/// match its blocks, that segments of a device do not overlap, that trace times never go
/// backwards and that each free matches the size of the allocation it frees. Prints one line
/// per problem, with where it is (`segments[3].blocks[2]`, `device_traces[0][17]`), or `ok`.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  memsnap validate snapshot.pickle
  memsnap validate runs/*.pickle

Exit codes: 0 every file is sound; 1 a file breaks an invariant; 2 a file cannot be read.")]
pub struct Args {
    /// Snapshot files to check (`-` reads stdin).
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (mut invalid, mut unreadable) = (false, false);
    for path in &args.files {
        let snapshot = match common::load(path) {
            Ok((snapshot, _)) => snapshot,
            Err(err) => {
                eprintln!("memsnap: error: {err:#}");
                unreadable = true;
                continue;
            }
        };
        let violations = memsnap_format::validate(&snapshot);
        if violations.is_empty() {
            outln!(
                "{}: ok ({} segments, {} trace entries)",
                path.display(),
                snapshot.segments.len(),
                snapshot.entry_count()
            );
        } else {
            invalid = true;
            for v in &violations {
                outln!("{}: {v}", path.display());
            }
            outln!("{}: {} problems", path.display(), violations.len());
        }
    }
    Ok(if unreadable {
        ExitCode::from(2)
    } else if invalid {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

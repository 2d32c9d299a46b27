//! JSON read benchmark: generates a synthetic run of about N trace entries, writes it as JSON
//! and times `json::read` on it (best of `--runs`).
//!
//! ```text
//! cargo run --release -p memsnap-workload --example bench_json -- --entries 1000000
//! ```

use std::process::ExitCode;
use std::time::Instant;

use memsnap_format::json;
use memsnap_workload::{generate, TrainingRun};

fn main() -> ExitCode {
    let mut entries = 1_000_000usize;
    let mut runs = 3usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().and_then(|v| v.parse().ok());
        match (arg.as_str(), value) {
            ("--entries", Some(n)) => entries = n,
            ("--runs", Some(n)) => runs = n.max(1),
            _ => {
                eprintln!("usage: bench_json [--entries N] [--runs N]");
                return ExitCode::from(2);
            }
        }
    }
    let (snapshot, _) = generate(&TrainingRun {
        target_entries: Some(entries),
        ..TrainingRun::default()
    });
    let bytes = match json::to_vec(&snapshot) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("bench_json: {e}");
            return ExitCode::from(2);
        }
    };
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        let t = Instant::now();
        let read = json::read(&bytes);
        best = best.min(t.elapsed().as_secs_f64());
        if let Err(e) = read {
            eprintln!("bench_json: {e}");
            return ExitCode::from(2);
        }
    }
    println!(
        "json read: {:.1} MB, best of {runs}: {best:.3} s",
        bytes.len() as f64 / 1e6
    );
    ExitCode::SUCCESS
}

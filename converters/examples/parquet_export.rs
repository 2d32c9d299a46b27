//! Times a Parquet export: `cargo run --release -p memsnap-converters --example parquet_export
//! -- [--jobs N] OUT FILE...` prints the wall time, the rows per table and the bytes written.
//! OUT is replaced if it is an earlier export.

use std::path::PathBuf;
use std::time::Instant;

use memsnap_converters::parquet::{export_files, ExportOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut jobs = 0;
    if args.first().is_some_and(|a| a == "--jobs") && args.len() > 1 {
        jobs = args[1].parse()?;
        args.drain(..2);
    }
    let Some((out, files)) = args.split_first() else {
        return Err("usage: parquet_export [--jobs N] OUT FILE...".into());
    };
    let files: Vec<PathBuf> = files.iter().map(PathBuf::from).collect();
    let input_bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
        .sum();
    let started = Instant::now();
    let options = ExportOptions::default().force(true).jobs(jobs);
    let summary = export_files(&files, out.as_ref(), &options)?;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{} input(s), {} bytes -> {} bytes in {seconds:.3} s (jobs {jobs}, 0 = cores)",
        files.len(),
        input_bytes,
        summary.bytes
    );
    for (table, rows) in &summary.tables {
        println!("  {table}: {rows} rows");
    }
    Ok(())
}

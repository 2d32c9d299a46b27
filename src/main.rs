//! `memsnap`: record, convert, analyse and view GPU memory allocation histories.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `println!` for a command's output. A closed stdout (`memsnap demo | head`) ends the program
/// quietly with success, as SIGPIPE ends a C tool, instead of `println!`'s panic.
macro_rules! outln {
    () => {
        $crate::write_stdout(::std::format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::write_stdout(::std::format_args!("{}\n", ::std::format_args!($($arg)*)))
    };
}

/// `print!` for a command's output; see [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_stdout(::std::format_args!($($arg)*))
    };
}

mod cmd;

/// Writes a command's output; a closed pipe ends the program with success, any other write
/// error with a message and status 2.
fn write_stdout(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(err) = std::io::stdout().lock().write_fmt(text) {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("memsnap: error: cannot write the output: {err}");
        std::process::exit(2);
    }
}

/// Writes a value as pretty JSON and a newline to standard output, streamed (the summary of a
/// run of 300,000 steps is 1.1 GB of JSON: built as one string first it raised the peak
/// memory by as much); write errors as [`write_stdout`]'s.
fn write_json_stdout<T: serde::Serialize + ?Sized>(value: &T) {
    use std::io::Write;
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let written = serde_json::to_writer_pretty(&mut out, value)
        .map_err(std::io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(err) = written {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("memsnap: error: cannot write the output: {err}");
        std::process::exit(2);
    }
}

/// Record, convert, analyse and view GPU memory snapshots.
///
/// memsnap reads PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot()` pickles of every
/// release from 2.1 to 2.15, the bare `memory_snapshot()` segment list), memsnap's own msgpack
/// and JSON, optionally gzip- or zstd-compressed. The format is detected from the content.
///
/// Start with `memsnap demo`, which simulates a training run and opens its snapshot.
#[derive(Parser)]
#[command(name = "memsnap", version, about, long_about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Demo(cmd::demo::Args),
    Info(cmd::info::Args),
    Convert(cmd::convert::Args),
    Validate(cmd::validate::Args),
    Memviz(cmd::memviz::Args),
    View(cmd::view::Args),
    Plot(cmd::plot::Args),
    Summary(cmd::summary::Args),
    Top(cmd::top::Args),
    Check(cmd::check::Args),
    Diff(cmd::diff::Args),
    Ranks(cmd::ranks::Args),
    Simulate(cmd::simulate::Args),
    Advise(cmd::advise::Args),
    Export(cmd::export::Args),
    Import(cmd::import::Args),
    Watch(cmd::watch::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => cmd::demo::run(args),
        Command::Info(args) => cmd::info::run(args),
        Command::Convert(args) => cmd::convert::run(args),
        Command::Validate(args) => cmd::validate::run(args),
        Command::Memviz(args) => cmd::memviz::run(args),
        Command::View(args) => cmd::view::run(args),
        Command::Plot(args) => cmd::plot::run(args),
        Command::Summary(args) => cmd::summary::run(args),
        Command::Top(args) => cmd::top::run(args),
        Command::Check(args) => cmd::check::run(args),
        Command::Diff(args) => cmd::diff::run(args),
        Command::Ranks(args) => cmd::ranks::run(args),
        Command::Simulate(args) => cmd::simulate::run(args),
        Command::Advise(args) => cmd::advise::run(args),
        Command::Export(args) => cmd::export::run(args),
        Command::Import(args) => cmd::import::run(args),
        Command::Watch(args) => cmd::watch::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("memsnap: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

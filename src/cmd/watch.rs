//! `memsnap watch ADDR`: follow a recording while it runs (issue 26), one line per finished
//! training step, and fail when memory crosses a limit.

use std::io::Read;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use memsnap_analysis::summary::{DeviceSummary, SummaryOptions};
use memsnap_analysis::{PhaseKind, Step, StepOptions};
use memsnap_format::live::{Applied, FrameReader, LiveSnapshot};

use crate::cmd::common::format_size;

/// Follow a live recording: connect to a recorder serving its history (`MEMSNAP_LIVE`,
/// `CachingAllocator::serve_live`), rebuild the snapshot as entries arrive, and print one
/// line per finished training step: its peak, the forward, backward and optimizer rates,
/// and the drift so far.
///
/// Drift so far is the growth of the step floor (the bytes a step returns to at its end)
/// from the first step to this one, as a percentage of the highest step peak so far.
///
/// A step is finished once the next one has begun; when the recorder closes the connection
/// the last step is reported too. Steps are found as `memsnap summary` finds them, over the
/// whole snapshot received so far (O(n log n) for n entries), when entries arrived since the
/// last time and at most once per `--every` or per four times the last analysis's duration,
/// whichever is longer: the analyses take at most about a fifth of the watch's time, and a
/// step is reported a few analysis durations after it ends.
///
/// Exit status: 0 when the recorder ends the stream, 1 as soon as a finished step crosses
/// `--max-peak` or `--max-drift` (so a CI smoke run fails on a memory regression while it
/// runs), 2 on an error (a refused stream says what was wrong).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  MEMSNAP_LIVE=unix:/tmp/run.sock python train.py &\n  memsnap watch unix:/tmp/run.sock\n  memsnap watch tcp:127.0.0.1:7077 --max-peak 20GiB --max-drift 2\n  memsnap watch unix:/tmp/run.sock --json --save run.msgpack\n  MEMSNAP_LIVE=tcp:0.0.0.0:7077 MEMSNAP_LIVE_TOKEN=$T python train.py   # on gpu-host\n  memsnap watch tcp:gpu-host:7077 --token $T"
)]
pub struct Args {
    /// `unix:/path.sock`, `tcp:HOST:PORT`, or a socket path.
    pub addr: String,
    /// Print one JSON object per step instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit 1 when a step's peak is above this size (`20GiB`, `512MB`).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_peak: Option<u64>,
    /// Exit 1 when the drift so far is above this percentage.
    #[arg(long, value_name = "PCT")]
    pub max_drift: Option<f64>,
    /// Write what was received as a snapshot when the watch ends (format by extension).
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Least time between two step analyses, in milliseconds.
    #[arg(long, default_value_t = 500, value_name = "MS")]
    pub every: u64,
    /// The recorder's token, when it has one (`MEMSNAP_LIVE_TOKEN` of the recorded process;
    /// needed for a recorder listening on a non-loopback address). Defaults to the
    /// `MEMSNAP_LIVE_TOKEN` variable of this shell.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
}

fn parse_size(text: &str) -> std::result::Result<u64, String> {
    memsnap_units::parse_size(text).map_err(|e| e.to_string())
}

enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    fn open(addr: &str) -> Result<Conn> {
        let conn = if let Some(tcp) = addr.strip_prefix("tcp:") {
            Conn::Tcp(TcpStream::connect(tcp).with_context(|| format!("cannot connect to {tcp}"))?)
        } else {
            let path = addr.strip_prefix("unix:").unwrap_or(addr);
            Conn::Unix(
                UnixStream::connect(path).with_context(|| format!("cannot connect to {path}"))?,
            )
        };
        let timeout = Some(Duration::from_millis(100));
        match &conn {
            Conn::Unix(s) => s.set_read_timeout(timeout)?,
            Conn::Tcp(s) => s.set_read_timeout(timeout)?,
        }
        Ok(conn)
    }

    /// Sends the listener's one frame, its token (empty when none): a recorder with a token
    /// reads it, one without never does (protocol version 2).
    fn send_token(&mut self, token: &str) -> Result<()> {
        match self {
            Conn::Unix(s) => memsnap_format::live::send_token(s, token),
            Conn::Tcp(s) => memsnap_format::live::send_token(s, token),
        }
        .context("sending the token to the recorder")
    }

    /// Bytes read; `None` when nothing came within the timeout; `Some(0)` at the end.
    fn read(&mut self, buf: &mut [u8]) -> Result<Option<usize>> {
        let r = match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        };
        match r {
            Ok(n) => Ok(Some(n)),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e).context("reading from the recorder"),
        }
    }
}

/// What has been reported so far.
struct Watch {
    args: Args,
    printed: usize,
    /// The last event of the last step reported.
    reported_through: Option<u32>,
    first_floor: Option<u64>,
    highest_peak: u64,
    analysed_len: usize,
    /// When the last analysis began and how long it took.
    last_analysis: Option<(Instant, Duration)>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let mut conn = Conn::open(&args.addr)?;
    let token = args
        .token
        .clone()
        .or_else(|| std::env::var("MEMSNAP_LIVE_TOKEN").ok())
        .unwrap_or_default();
    conn.send_token(&token)?;
    let mut reader = FrameReader::new();
    let mut live = LiveSnapshot::new();
    let mut watch = Watch {
        args,
        printed: 0,
        reported_through: None,
        first_floor: None,
        highest_peak: 0,
        analysed_len: 0,
        last_analysis: None,
    };
    let mut buf = vec![0; 1 << 16];
    let mut ended = false;
    let crossed = loop {
        while let Some(message) = reader.next_message().context("the stream is refused")? {
            if let Applied::Dropped { missed } =
                live.apply(message).context("the stream is refused")?
            {
                eprintln!("memsnap watch: the recorder dropped {missed} entries (this listener fell behind)");
            }
        }
        if !ended {
            match conn.read(&mut buf)? {
                Some(0) => ended = true,
                Some(n) => reader.push(&buf[..n]),
                None => {}
            }
        }
        if let Some(crossed) = watch.analyse(&mut live, ended)? {
            break Some(crossed);
        }
        if ended {
            break None;
        }
    };
    if let (Some(path), Some(snapshot)) = (&watch.args.save, live.snapshot()) {
        memsnap_format::io::write_path(path, snapshot, None)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if live.snapshot().is_none() {
        bail!("the recorder closed the connection before sending its state");
    }
    match crossed {
        Some(what) => {
            eprintln!("memsnap watch: {what}");
            Ok(ExitCode::from(1))
        }
        None => Ok(ExitCode::SUCCESS),
    }
}

impl Watch {
    /// Finds the steps when it is time and prints the newly finished ones; returns the limit
    /// a step crossed, if one did.
    fn analyse(&mut self, live: &mut LiveSnapshot, ended: bool) -> Result<Option<String>> {
        if !live.has_state() {
            return Ok(None);
        }
        let len = live.trace().len();
        // An analysis is O(n log n) over everything received; waiting four times as long as
        // the last one took keeps it under a fifth of the watch's time on a long run.
        let due = self.last_analysis.is_none_or(|(at, took)| {
            at.elapsed() >= Duration::from_millis(self.args.every).max(took * 4)
        });
        if !(ended || due && len > self.analysed_len) {
            return Ok(None);
        }
        self.analysed_len = len;
        let started = Instant::now();
        // Writes the segments the entries changed (O(blocks)), only when analysing.
        let Some(snapshot) = live.snapshot() else {
            return Ok(None);
        };
        let options = SummaryOptions {
            steps: StepOptions::default(),
            top_sites: 0,
            ..SummaryOptions::default()
        };
        let summary = memsnap_analysis::summarize(snapshot, &options)
            .context("cannot analyse what was received")?;
        self.last_analysis = Some((started, started.elapsed()));
        let Some(device) = summary.devices.iter().find(|d| d.device == live.device()) else {
            return Ok(None);
        };
        let steps = device.steps.steps();
        let finished = if ended {
            steps.len()
        } else {
            steps.len().saturating_sub(1)
        };
        // Steps already reported are not reported again, though a later analysis (with more
        // of the trace) may cut the run differently: a step is reported once it ends after
        // the last one reported, numbered in the order reported.
        for step in &steps[..finished] {
            if self
                .reported_through
                .is_some_and(|end| step.start_event <= end)
            {
                continue;
            }
            self.reported_through = Some(step.end_event);
            let number = self.printed;
            self.printed += 1;
            if let Some(crossed) = self.report(device, step, number) {
                return Ok(Some(crossed));
            }
        }
        Ok(None)
    }

    fn report(&mut self, device: &DeviceSummary, step: &Step, number: usize) -> Option<String> {
        let floor = *self.first_floor.get_or_insert(step.end_bytes);
        self.highest_peak = self.highest_peak.max(step.peak_bytes);
        let drift = if self.highest_peak == 0 {
            0.0
        } else {
            (step.end_bytes as f64 - floor as f64) / self.highest_peak as f64 * 100.0
        };
        let rate = |kind: PhaseKind| {
            step.phases
                .iter()
                .find(|p| p.kind == kind)
                .map(|p| p.slope())
        };
        let (fwd, bwd, opt) = (
            rate(PhaseKind::Forward),
            rate(PhaseKind::Backward),
            rate(PhaseKind::Optimizer),
        );
        let crossed = match (self.args.max_peak, self.args.max_drift) {
            (Some(max), _) if step.peak_bytes > max => Some(format!(
                "step {}: peak {} is above --max-peak {}",
                number,
                format_size(step.peak_bytes),
                format_size(max)
            )),
            (_, Some(max)) if drift > max => Some(format!(
                "step {}: drift {drift:.2}% is above --max-drift {max}%",
                number
            )),
            _ => None,
        };
        if self.args.json {
            let per_s =
                |s: &Option<memsnap_analysis::Slope>| s.as_ref().and_then(|s| s.bytes_per_s);
            let line = serde_json::json!({
                "schema": "memsnap.watch/1",
                "device": device.device,
                "step": number,
                "start_event": step.start_event,
                "end_event": step.end_event,
                "start_time_us": step.start_time_us,
                "end_time_us": step.end_time_us,
                "peak_bytes": step.peak_bytes,
                "end_bytes": step.end_bytes,
                "forward_bytes_per_s": per_s(&fwd),
                "backward_bytes_per_s": per_s(&bwd),
                "optimizer_bytes_per_s": per_s(&opt),
                "drift_percent": drift,
                "limit_crossed": crossed,
            });
            outln!("{line}");
        } else {
            let show = |name: &str, s: &Option<memsnap_analysis::Slope>| match s {
                Some(s) => format!(
                    " {name} {}",
                    match s.bytes_per_s {
                        Some(r) => memsnap_units::format_rate_signed(r),
                        None => memsnap_units::format_per_event_signed(s.bytes_per_event),
                    }
                ),
                None => String::new(),
            };
            outln!(
                "step {:>4}  peak {:>10}  end {:>10}{}{}{}  drift {:+.2}%{}",
                number,
                format_size(step.peak_bytes),
                format_size(step.end_bytes),
                show("fwd", &fwd),
                show("bwd", &bwd),
                show("opt", &opt),
                drift,
                if crossed.is_some() { "  LIMIT" } else { "" }
            );
        }
        crossed
    }
}

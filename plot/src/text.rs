//! The words and numbers written into pictures: durations on a time axis, a slope's signed
//! rate, a phase's name. Shared with the viewer's tables so both say the same thing.

use memsnap_analysis::{format_size as format_bytes, PhaseKind, Slope};

/// Formats a duration in microseconds with a unit that fits: `850 µs`, `12.3 ms`, `4.20 s`.
pub fn format_duration_us(us: i64) -> String {
    let abs = us.unsigned_abs();
    let sign = if us < 0 { "-" } else { "" };
    if abs < 1_000 {
        format!("{sign}{abs} µs")
    } else if abs < 1_000_000 {
        format!("{sign}{:.1} ms", abs as f64 / 1e3)
    } else if abs < 600_000_000 {
        format!("{sign}{:.2} s", abs as f64 / 1e6)
    } else {
        format!("{sign}{:.1} min", abs as f64 / 6e7)
    }
}

/// Formats a rate in bytes per second: `1.2 GiB/s`.
pub fn format_rate(bytes_per_s: f64) -> String {
    if !bytes_per_s.is_finite() {
        return "–".to_owned();
    }
    let sign = if bytes_per_s < 0.0 { "-" } else { "" };
    format!("{sign}{}/s", format_bytes(bytes_per_s.abs().round() as u64))
}

/// Formats a rate with an explicit sign: `+1.2 GiB/s`, `-800.0 MiB/s`, `0 B/s`.
pub fn format_rate_signed(bytes_per_s: f64) -> String {
    format_signed_per(bytes_per_s, "s")
}

/// Formats bytes per trace event with an explicit sign: `+12.3 MiB/event`.
pub fn format_per_event_signed(bytes_per_event: f64) -> String {
    format_signed_per(bytes_per_event, "event")
}

fn format_signed_per(value: f64, unit: &str) -> String {
    if !value.is_finite() {
        return "–".to_owned();
    }
    let magnitude = value.abs().round() as u64;
    let sign = match value {
        _ if magnitude == 0 => "",
        v if v < 0.0 => "-",
        _ => "+",
    };
    format!("{sign}{}/{unit}", format_bytes(magnitude))
}

/// A slope's signed rate: per second when the trace has times (`+1.2 GiB/s`), else per event
/// (`-12.3 MiB/event`).
pub fn slope_rate_text(slope: &Slope) -> String {
    match slope.bytes_per_s {
        Some(rate) => format_rate_signed(rate),
        None => format_per_event_signed(slope.bytes_per_event),
    }
}

/// A phase kind as written in legends and tables.
pub fn phase_label(kind: PhaseKind) -> &'static str {
    match kind {
        PhaseKind::Setup => "set-up",
        PhaseKind::Forward => "forward",
        PhaseKind::Backward => "backward",
        PhaseKind::Optimizer => "optimizer",
    }
}

//! The words and numbers written into pictures: durations on a time axis, a slope's signed
//! rate, a phase's name. Shared with the viewer's tables so both say the same thing.

use memsnap_analysis::{PhaseKind, Slope};

/// The numbers themselves come from the one units crate.
pub use memsnap_units::{
    format_duration_us, format_per_event_signed, format_rate, format_rate_signed,
};

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

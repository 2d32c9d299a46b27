//! Instants of a device's history: the one way every command (`--at`) and view names a moment.
//!
//! An instant is written as:
//!
//! | text | instant |
//! |---|---|
//! | `peak` | the first trace entry at which the device's live bytes (active curve) peak |
//! | `end` | after the last trace entry |
//! | `event:1234` or `#1234` | after trace entry 1234 (its index in the device's trace) |
//! | `1700000000123456us` | after the last entry at or before this `time_us` (as the snapshot has it) |
//! | `+2.5s`, `+150ms`, `+300us` | that long after the device's first trace entry |
//!
//! A bare number is refused: `memsnap top` once read `1234` as a trace entry and `memsnap
//! export` as a `time_us`, so the error says which spelling to use now.
//!
//! [`DeviceTimeline::resolve`](crate::DeviceTimeline::resolve) turns an instant into a trace
//! entry, clamping to the trace; [`DeviceTimeline::resolve_exact`](crate::DeviceTimeline::resolve_exact)
//! refuses what the trace cannot answer (an entry past its end, a time before its first entry,
//! any time when its entries have none).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// A moment of one device's history (see the [module docs](self) for how it is written).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum Instant {
    /// The first event at which the active curve (the summary's peak) peaks.
    #[default]
    Peak,
    /// After the last event.
    End,
    /// After this event (a trace entry index of the device).
    Event(u32),
    /// After the last event at or before this `time_us`.
    TimeUs(i64),
    /// This many microseconds after the device's first event.
    AfterStartUs(i64),
}

/// Why a text is not an instant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InstantParseError {
    /// Neither a keyword, an event, a time nor a time after the start.
    #[error(
        "`{text}` is not an instant: use `peak`, `end`, a trace entry (`event:1234` or `#1234`), a time_us as the snapshot has it (`1700000000123456us`), or a time after the first entry (`+2.5s`, `+150ms`)"
    )]
    Unknown { text: String },
    /// A bare number: an event to some readers, a time to others.
    #[error(
        "`{text}` is ambiguous: write `event:{text}` for trace entry {text} or `{text}us` for time_us {text} (a bare number used to be an event in `memsnap top` and a time_us in `memsnap export`)"
    )]
    BareNumber { text: String },
    /// A time too large for microseconds in an `i64`, or negative after the start.
    #[error("`{text}` is out of range")]
    OutOfRange { text: String },
}

impl FromStr for Instant {
    type Err = InstantParseError;

    fn from_str(text: &str) -> Result<Instant, InstantParseError> {
        let t = text.trim();
        let unknown = || InstantParseError::Unknown {
            text: text.to_owned(),
        };
        if t.eq_ignore_ascii_case("peak") {
            return Ok(Instant::Peak);
        }
        if t.eq_ignore_ascii_case("end") {
            return Ok(Instant::End);
        }
        if let Some(index) = t.strip_prefix('#').or_else(|| t.strip_prefix("event:")) {
            return index
                .trim()
                .parse::<u32>()
                .map(Instant::Event)
                .map_err(|_| unknown());
        }
        if !t.starts_with('+') && t.parse::<i128>().is_ok() {
            return Err(InstantParseError::BareNumber { text: t.to_owned() });
        }
        if let Some(after) = t.strip_prefix('+') {
            let (number, scale) = if let Some(n) = after.strip_suffix("us") {
                (n, 1.0)
            } else if let Some(n) = after.strip_suffix("ms") {
                (n, 1e3)
            } else if let Some(n) = after.strip_suffix('s') {
                (n, 1e6)
            } else {
                return Err(unknown());
            };
            let us = number.trim().parse::<f64>().map_err(|_| unknown())? * scale;
            if !us.is_finite() || us < 0.0 || us > i64::MAX as f64 {
                return Err(InstantParseError::OutOfRange {
                    text: text.to_owned(),
                });
            }
            return Ok(Instant::AfterStartUs(us.round() as i64));
        }
        let number = t.strip_suffix("us").ok_or_else(unknown)?.trim();
        number.parse::<i64>().map(Instant::TimeUs).map_err(|_| {
            if number.parse::<i128>().is_ok() {
                InstantParseError::OutOfRange {
                    text: text.to_owned(),
                }
            } else {
                unknown()
            }
        })
    }
}

impl fmt::Display for Instant {
    /// The text [`Instant::from_str`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Instant::Peak => write!(f, "peak"),
            Instant::End => write!(f, "end"),
            Instant::Event(e) => write!(f, "event:{e}"),
            Instant::TimeUs(t) => write!(f, "{t}us"),
            Instant::AfterStartUs(dt) => write!(f, "+{dt}us"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_reads_back_as_written() {
        for (text, instant) in [
            ("peak", Instant::Peak),
            ("PEAK", Instant::Peak),
            ("end", Instant::End),
            ("event:12", Instant::Event(12)),
            ("#12", Instant::Event(12)),
            (" event: 7 ", Instant::Event(7)),
            ("1700000000123456us", Instant::TimeUs(1_700_000_000_123_456)),
            ("-5us", Instant::TimeUs(-5)),
            ("+2.5s", Instant::AfterStartUs(2_500_000)),
            ("+150ms", Instant::AfterStartUs(150_000)),
            ("+300us", Instant::AfterStartUs(300)),
        ] {
            assert_eq!(text.parse::<Instant>(), Ok(instant), "{text}");
            assert_eq!(instant.to_string().parse::<Instant>(), Ok(instant));
        }
    }

    #[test]
    fn a_bare_number_says_which_spelling_to_use() {
        // `memsnap top --at 1234` meant an event, `memsnap export --at 1234` a time_us.
        let err = "1234".parse::<Instant>().unwrap_err();
        assert_eq!(
            err,
            InstantParseError::BareNumber {
                text: "1234".into()
            }
        );
        let message = err.to_string();
        assert!(
            message.contains("event:1234") && message.contains("1234us"),
            "{message}"
        );
    }

    #[test]
    fn nonsense_and_overflow_are_errors() {
        for text in [
            "yesterday",
            "event:-1",
            "#x",
            "+soon",
            "+5",
            "",
            "us",
            "event:",
        ] {
            assert!(
                matches!(
                    text.parse::<Instant>(),
                    Err(InstantParseError::Unknown { .. })
                ),
                "{text}"
            );
        }
        for text in ["+1e300s", "+-1s", "99999999999999999999us"] {
            assert!(
                matches!(
                    text.parse::<Instant>(),
                    Err(InstantParseError::OutOfRange { .. })
                ),
                "{text}"
            );
        }
    }
}

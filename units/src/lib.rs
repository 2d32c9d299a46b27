//! # memsnap-units
//!
//! Parsing and formatting of the human units memsnap shows: byte sizes, signed byte deltas,
//! durations and rates. One rule set for the CLI, the viewer, the plots and the recorder's
//! environment variables.
//!
//! * Sizes are **binary** unless spelled in decimal units: `KiB`, `Ki`, `K`, `k` are 1024 bytes;
//!   `KB` is 1000 (as PyTorch and `nvidia-smi` users write them). Formatting always uses binary
//!   units with one decimal, as PyTorch's memory viewer does.
//! * Durations are microseconds (PyTorch's `time_us`), shown in the largest unit that keeps
//!   them readable.
//!
//! ```
//! use memsnap_units::{format_size, parse_size};
//! assert_eq!(parse_size("1.5 GiB"), Ok(1_610_612_736));
//! assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
//! assert_eq!(format_size(1536), "1.5 KiB");
//! ```

/// Why a size did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SizeError {
    #[error("`{text}` is not a size (examples: 4096, 512MiB, 1.5GiB, 2GB)")]
    NotANumber { text: String },
    #[error(
        "unknown size unit `{unit}` in `{text}` (use B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB)"
    )]
    UnknownUnit { text: String, unit: String },
    #[error("`{text}` is larger than {max} bytes", max = u64::MAX)]
    TooLarge { text: String },
}

/// The multiplier of a size unit (case-insensitive), `None` for an unknown one.
fn unit_multiplier(unit: &str) -> Option<u128> {
    Some(match unit.to_ascii_lowercase().as_str() {
        "" | "b" | "byte" | "bytes" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "p" | "pi" | "pib" => 1 << 50,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        _ => return None,
    })
}

/// Parses a size: `4096`, `1,024`, `512KiB`, `1.5 GiB`, `3g`, `2GB`, `100 bytes`.
///
/// Integers are exact up to `u64::MAX`; a decimal fraction is rounded to the nearest byte.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '_' | ',')))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let not_a_number = || SizeError::NotANumber {
        text: text.to_owned(),
    };
    let digits: String = number.chars().filter(|c| !matches!(c, '_' | ',')).collect();
    let (whole, fraction) = match digits.split_once('.') {
        Some((w, f)) => (w, f),
        None => (digits.as_str(), ""),
    };
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(not_a_number());
    }
    let multiplier = unit_multiplier(unit.trim()).ok_or_else(|| SizeError::UnknownUnit {
        text: text.to_owned(),
        unit: unit.trim().to_owned(),
    })?;
    let too_large = || SizeError::TooLarge {
        text: text.to_owned(),
    };
    // value = (whole + fraction / 10^len) * multiplier, in exact integer arithmetic.
    let fraction = &fraction[..fraction.len().min(18)];
    let scale = 10u128.pow(fraction.len() as u32);
    let parse = |s: &str| -> Result<u128, SizeError> {
        if s.is_empty() {
            Ok(0)
        } else {
            s.parse::<u128>().map_err(|_| not_a_number())
        }
    };
    let scaled = parse(whole)?
        .checked_mul(scale)
        .and_then(|w| w.checked_add(parse(fraction).ok()?))
        .ok_or_else(too_large)?;
    let bytes = scaled
        .checked_mul(multiplier)
        .map(|v| (v + scale / 2) / scale)
        .ok_or_else(too_large)?;
    u64::try_from(bytes).map_err(|_| too_large())
}

/// Bytes in binary units with one decimal, as PyTorch's viewer shows them: `1.5 GiB`,
/// `512 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = "B";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    format!("{value:.1} {unit}")
}

/// A size with its exact byte count: `1.5 KiB (1,536 bytes)`; below 1 KiB just `512 B`.
pub fn format_size_exact(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    format!("{} ({} bytes)", format_size(bytes), group_thousands(bytes))
}

/// `1234567` -> `1,234,567`.
pub fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A signed byte delta: `+1.5 GiB`, `-512 B`, `0 B`.
pub fn format_delta(delta: i64) -> String {
    match delta {
        0 => "0 B".to_owned(),
        d if d > 0 => format!("+{}", format_size(d.unsigned_abs())),
        d => format!("-{}", format_size(d.unsigned_abs())),
    }
}

/// A duration in microseconds: `850 µs`, `12.3 ms`, `4.20 s`, `12.5 min`.
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

/// A rate in bytes per second, with a minus for a release: `1.2 GiB/s`, `-800.0 MiB/s`;
/// `–` when not finite.
pub fn format_rate(bytes_per_s: f64) -> String {
    if !bytes_per_s.is_finite() {
        return "–".to_owned();
    }
    let sign = if bytes_per_s < 0.0 { "-" } else { "" };
    format!("{sign}{}/s", format_size(bytes_per_s.abs().round() as u64))
}

/// A rate with an explicit sign: `+1.2 GiB/s`, `-800.0 MiB/s`, `0 B/s`.
pub fn format_rate_signed(bytes_per_s: f64) -> String {
    format_signed_per(bytes_per_s, "s")
}

/// Bytes per trace event with an explicit sign: `+12.3 MiB/event`.
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
    format!("{sign}{}/{unit}", format_size(magnitude))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        for (text, bytes) in [
            ("4096", 4096),
            ("1,024", 1024),
            ("1_000", 1000),
            ("512KiB", 512 << 10),
            ("512 kib", 512 << 10),
            ("1.5GiB", 3 << 29),
            ("1.5 GiB", 3 << 29),
            ("3g", 3 << 30),
            ("2GB", 2_000_000_000),
            ("100 bytes", 100),
            ("1 B", 1),
            (".5 KiB", 512),
            ("0.1 KB", 100),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn bad_sizes_say_why() {
        assert!(matches!(
            parse_size("lots"),
            Err(SizeError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_size("1.2.3"),
            Err(SizeError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_size("3 parsecs"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("18446744073709551616"),
            Err(SizeError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_size("17000PiB"),
            Err(SizeError::TooLarge { .. })
        ));
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999999999999999999999999999").is_err());
    }

    #[test]
    fn sizes_format_with_one_decimal() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(80 << 30), "80.0 GiB");
        assert_eq!(format_size(u64::MAX), "16.0 EiB");
        assert_eq!(format_size_exact(1536), "1.5 KiB (1,536 bytes)");
        assert_eq!(group_thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn formatted_sizes_parse_back_close() {
        for bytes in [0u64, 1, 1023, 1536, 3 << 29, 80 << 30] {
            let back = parse_size(&format_size(bytes)).unwrap();
            assert!(back.abs_diff(bytes) <= bytes / 20 + 1, "{bytes}");
        }
    }

    #[test]
    fn deltas_durations_and_rates() {
        assert_eq!(format_delta(0), "0 B");
        assert_eq!(format_delta(4 << 20), "+4.0 MiB");
        assert_eq!(format_delta(-512), "-512 B");
        assert_eq!(format_delta(i64::MIN), "-8.0 EiB");
        assert_eq!(format_duration_us(850), "850 µs");
        assert_eq!(format_duration_us(12_345), "12.3 ms");
        assert_eq!(format_duration_us(4_200_000), "4.20 s");
        assert_eq!(format_duration_us(-12_345), "-12.3 ms");
        assert_eq!(format_duration_us(750_000_000), "12.5 min");
        assert_eq!(format_rate(1.5 * 1024.0 * 1024.0), "1.5 MiB/s");
        assert_eq!(format_rate(-2048.0), "-2.0 KiB/s");
        assert_eq!(format_rate(f64::NAN), "–");
        assert_eq!(format_rate_signed(3.0 * 1024.0), "+3.0 KiB/s");
        assert_eq!(format_rate_signed(0.2), "0 B/s");
        assert_eq!(format_per_event_signed(-1024.0), "-1.0 KiB/event");
    }
}

//! Human-readable numbers: byte sizes, durations, and the log-scale byte slider's mapping.

/// Formats bytes in binary units with one decimal, as PyTorch's viewer does: `1.5 GiB`.
pub use memsnap_analysis::format_size as format_bytes;

/// Formats a signed byte delta with an explicit sign: `+1.5 GiB`, `-512 B`, `0 B`.
pub fn format_bytes_signed(delta: i64) -> String {
    match delta {
        0 => "0 B".to_owned(),
        d if d > 0 => format!("+{}", format_bytes(d.unsigned_abs())),
        d => format!("-{}", format_bytes(d.unsigned_abs())),
    }
}

/// Formats bytes with the exact count too: `1.5 KiB (1,536 bytes)`.
pub fn format_bytes_exact(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    format!("{} ({} bytes)", format_bytes(bytes), group_thousands(bytes))
}

/// `1234567` → `1,234,567`.
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

/// Parses a byte size typed by the user: `4096`, `512KiB`, `1.5 GiB`, `2MB`, `3g` (= GiB).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_' || c == ','))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num.replace(['_', ','], "").parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" | "bytes" => 1.0,
        "k" | "kib" | "ki" => 1024.0,
        "m" | "mib" | "mi" => 1024.0 * 1024.0,
        "g" | "gib" | "gi" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" | "ti" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    let bytes = num * mult;
    (bytes.is_finite() && bytes >= 0.0 && bytes <= u64::MAX as f64).then(|| bytes.round() as u64)
}

pub use memsnap_plot::text::{
    format_duration_us, format_per_event_signed, format_rate, format_rate_signed,
};

/// The byte slider works on a log2 scale: position `p` in `0..=LOG_SLIDER_MAX` means
/// `2^p` bytes, and position 0 means "no filter" (0 bytes).
pub const LOG_SLIDER_MAX: f64 = 40.0;

/// Slider position → byte threshold (0 at the far left, then powers of two up to 1 TiB).
pub fn slider_to_bytes(position: f64) -> u64 {
    if position <= 0.0 {
        0
    } else {
        2f64.powf(position.min(LOG_SLIDER_MAX)).round() as u64
    }
}

/// Byte threshold → slider position, the inverse of [`slider_to_bytes`].
pub fn bytes_to_slider(bytes: u64) -> f64 {
    if bytes <= 1 {
        0.0
    } else {
        (bytes as f64).log2().min(LOG_SLIDER_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_format_in_binary_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(80 << 30), "80.0 GiB");
        assert_eq!(format_bytes_signed(-2048), "-2.0 KiB");
        assert_eq!(format_bytes_signed(2048), "+2.0 KiB");
        assert_eq!(format_bytes_exact(1536), "1.5 KiB (1,536 bytes)");
        assert_eq!(group_thousands(1234567), "1,234,567");
        assert_eq!(group_thousands(123), "123");
    }

    #[test]
    fn typed_sizes_parse() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("1.5 GiB"), Some(1610612736));
        assert_eq!(parse_bytes("2MB"), Some(2_000_000));
        assert_eq!(parse_bytes("1,024"), Some(1024));
        assert_eq!(parse_bytes("twelve"), None);
        assert_eq!(parse_bytes("3 parsecs"), None);
    }

    #[test]
    fn log_slider_round_trips_powers_of_two() {
        assert_eq!(slider_to_bytes(0.0), 0);
        assert_eq!(slider_to_bytes(20.0), 1 << 20);
        for bytes in [2u64, 1024, 1 << 20, 3 << 30] {
            let back = slider_to_bytes(bytes_to_slider(bytes));
            assert!(back.abs_diff(bytes) <= bytes / 1000, "{bytes} -> {back}");
        }
    }

    #[test]
    fn durations_pick_a_fitting_unit() {
        assert_eq!(format_duration_us(850), "850 µs");
        assert_eq!(format_duration_us(12_345), "12.3 ms");
        assert_eq!(format_duration_us(4_200_000), "4.20 s");
        assert_eq!(format_rate(1024.0 * 1024.0), "1.0 MiB/s");
        assert_eq!(
            format_rate_signed(1.2 * 1024.0 * 1024.0 * 1024.0),
            "+1.2 GiB/s"
        );
        assert_eq!(format_rate_signed(-800.0 * 1024.0 * 1024.0), "-800.0 MiB/s");
        assert_eq!(format_rate_signed(0.2), "0 B/s");
        assert_eq!(format_rate_signed(f64::NAN), "–");
        assert_eq!(
            format_per_event_signed(12.3 * 1024.0 * 1024.0),
            "+12.3 MiB/event"
        );
    }
}

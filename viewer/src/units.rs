//! Human-readable numbers: byte sizes, durations, and the log-scale byte slider's mapping.

/// Byte sizes, deltas, durations and rates: the one rule set (`memsnap-units`) the CLI and
/// the plots use too.
pub use memsnap_units::{
    format_delta, format_duration_us, format_per_event_signed, format_rate, format_rate_signed,
    format_size, format_size_exact, group_thousands,
};

/// Parses a byte size typed by the user: `4096`, `1,024`, `512KiB`, `1.5 GiB`, `2MB`, `3g`.
pub fn parse_bytes(text: &str) -> Option<u64> {
    memsnap_units::parse_size(text).ok()
}

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
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(80 << 30), "80.0 GiB");
        assert_eq!(format_delta(-2048), "-2.0 KiB");
        assert_eq!(format_delta(2048), "+2.0 KiB");
        assert_eq!(format_size_exact(1536), "1.5 KiB (1,536 bytes)");
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

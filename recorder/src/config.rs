//! Allocator settings, parsed from a `PYTORCH_CUDA_ALLOC_CONF`-style string, and the size
//! computations that depend on them (`round_size`, `get_allocation_size`).

use crate::error::ConfigError;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;
/// Every block size is a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest rounded size served by the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = MIB;
/// Size of a small-pool segment (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Requests below this get a `large_segment_size` segment (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Larger segments are rounded to this (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 * MIB;
/// Number of `roundup_power2_divisions` buckets (1 MiB .. 32 GiB and up).
pub const ROUNDUP_BUCKETS: usize = 16;

const KNOWN_KEYS: &str = "backend, max_split_size_mb, max_non_split_rounding_mb, \
garbage_collection_threshold, roundup_power2_divisions, expandable_segments, \
release_lock_on_cudamalloc, release_lock_on_hipmalloc, large_segment_size_mb, \
graph_capture_record_stream_reuse, per_process_memory_fraction, pinned_num_register_threads, \
pinned_use_cuda_host_register, pinned_use_hip_host_register, pinned_use_background_threads, \
pinned_reserve_segment_size_mb";

/// The caching allocator's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// The string the settings were parsed from (written into snapshots).
    pub conf_string: String,
    /// Blocks of at least this size are never split; `u64::MAX` means unlimited.
    pub max_split_size: u64,
    /// How much bigger than an oversize request a reused oversize block may be.
    pub max_non_split_rounding_size: u64,
    /// Size of mid-size segments and of large-pool expandable pages (`kLargeBuffer`).
    pub large_segment_size: u64,
    /// `0.0` disables the garbage collector.
    pub garbage_collection_threshold: f64,
    /// Divisions per power-of-two bucket; 0 or 1 means plain 512-byte rounding.
    pub roundup_power2_divisions: [u64; ROUNDUP_BUCKETS],
    pub expandable_segments: bool,
    pub release_lock_on_malloc: bool,
    pub graph_capture_record_stream_reuse: bool,
    /// `per_process_memory_fraction`, applied when the allocator is created.
    pub per_process_memory_fraction: Option<f64>,
    pub pinned_num_register_threads: i64,
    pub pinned_use_host_register: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            conf_string: String::new(),
            max_split_size: u64::MAX,
            max_non_split_rounding_size: 20 * MIB,
            large_segment_size: 20 * MIB,
            garbage_collection_threshold: 0.0,
            roundup_power2_divisions: [0; ROUNDUP_BUCKETS],
            expandable_segments: false,
            release_lock_on_malloc: false,
            graph_capture_record_stream_reuse: false,
            per_process_memory_fraction: None,
            pinned_num_register_threads: 1,
            pinned_use_host_register: false,
        }
    }
}

impl AllocatorConfig {
    /// Parses `key:value,key:value` the way PyTorch does: the tokens are `,` `:` `[` `]`,
    /// spaces are ignored, and unknown keys or bad values are errors.
    pub fn parse(conf: &str) -> Result<Self, ConfigError> {
        let mut config = AllocatorConfig {
            conf_string: conf.to_owned(),
            ..Default::default()
        };
        let tokens = lex(conf);
        let mut p = Parser { tokens, pos: 0 };
        while p.pos < p.tokens.len() {
            let key = p.next_token("a key")?;
            p.expect(":")?;
            config.apply(&key, &mut p)?;
            if p.pos < p.tokens.len() {
                p.expect(",")?;
            }
        }
        Ok(config)
    }

    /// Reads the configuration from `PYTORCH_CUDA_ALLOC_CONF` (or `PYTORCH_ALLOC_CONF`, or
    /// `PYTORCH_HIP_ALLOC_CONF`); defaults when none is set.
    pub fn from_env() -> Result<Self, ConfigError> {
        for var in [
            "PYTORCH_CUDA_ALLOC_CONF",
            "PYTORCH_ALLOC_CONF",
            "PYTORCH_HIP_ALLOC_CONF",
        ] {
            if let Ok(value) = std::env::var(var) {
                return Self::parse(&value);
            }
        }
        Ok(Self::default())
    }

    fn apply(&mut self, key: &str, p: &mut Parser) -> Result<(), ConfigError> {
        match key {
            "backend" => {
                let value = p.next_token("a backend name")?;
                if value != "native" {
                    return Err(bad(key, &value, "only the 'native' backend is implemented"));
                }
            }
            "max_split_size_mb" => {
                let (value, mb) = p.number(key)?;
                if mb < 20.0 {
                    return Err(bad(key, &value, "must be >= 20"));
                }
                self.max_split_size = mb_to_bytes(mb);
            }
            "max_non_split_rounding_mb" => {
                let (value, mb) = p.number(key)?;
                if mb < 20.0 {
                    return Err(bad(key, &value, "must be >= 20"));
                }
                self.max_non_split_rounding_size = mb_to_bytes(mb);
            }
            "large_segment_size_mb" => {
                let (value, mb) = p.number(key)?;
                if mb < 2.0 || mb.fract() != 0.0 || !(mb as u64).is_multiple_of(2) {
                    return Err(bad(key, &value, "must be an even number of MB, at least 2"));
                }
                self.large_segment_size = mb_to_bytes(mb);
            }
            "garbage_collection_threshold" => {
                let (value, t) = p.number(key)?;
                if !(t > 0.0 && t < 1.0) {
                    return Err(bad(key, &value, "must be between 0.0 and 1.0, exclusive"));
                }
                self.garbage_collection_threshold = t;
            }
            "per_process_memory_fraction" => {
                let (value, f) = p.number(key)?;
                if !(0.0..=1.0).contains(&f) {
                    return Err(bad(key, &value, "must be between 0.0 and 1.0"));
                }
                self.per_process_memory_fraction = Some(f);
            }
            "roundup_power2_divisions" => self.parse_divisions(p)?,
            "expandable_segments" => self.expandable_segments = p.boolean(key)?,
            "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                self.release_lock_on_malloc = p.boolean(key)?
            }
            "graph_capture_record_stream_reuse" => {
                self.graph_capture_record_stream_reuse = p.boolean(key)?
            }
            "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                self.pinned_use_host_register = p.boolean(key)?
            }
            "pinned_use_background_threads" => {
                p.boolean(key)?;
            }
            "pinned_num_register_threads" => {
                let (value, n) = p.number(key)?;
                if n < 1.0 || n.fract() != 0.0 || !(n as u64).is_power_of_two() {
                    return Err(bad(key, &value, "must be a positive power of two"));
                }
                self.pinned_num_register_threads = n as i64;
            }
            "pinned_reserve_segment_size_mb" => {
                p.number(key)?;
            }
            _ => {
                return Err(ConfigError::UnknownKey {
                    key: key.to_owned(),
                    known: KNOWN_KEYS,
                })
            }
        }
        Ok(())
    }

    fn parse_divisions(&mut self, p: &mut Parser) -> Result<(), ConfigError> {
        const KEY: &str = "roundup_power2_divisions";
        if p.peek() != Some("[") {
            let (value, n) = p.number(KEY)?;
            let n = whole_power_of_two(n).ok_or_else(|| {
                bad(
                    KEY,
                    &value,
                    "the number of divisions must be a power of two",
                )
            })?;
            self.roundup_power2_divisions = [n; ROUNDUP_BUCKETS];
            return Ok(());
        }
        p.expect("[")?;
        let mut first = true;
        let mut last_index = 0usize;
        loop {
            let size_token = p.next_token("a size in MB or '>'")?;
            p.expect(":")?;
            let (value, n) = p.number(KEY)?;
            let divisions = whole_power_of_two(n).ok_or_else(|| {
                bad(
                    KEY,
                    &value,
                    "the number of divisions must be a power of two",
                )
            })?;
            if size_token == ">" {
                for slot in self
                    .roundup_power2_divisions
                    .iter_mut()
                    .skip(last_index + 1)
                {
                    *slot = divisions;
                }
            } else {
                let mb: f64 = size_token
                    .parse()
                    .map_err(|_| bad(KEY, &size_token, "sizes must be numbers of MB or '>'"))?;
                let mb = whole_power_of_two(mb)
                    .ok_or_else(|| bad(KEY, &size_token, "sizes must be powers of two (MB)"))?;
                let index = (mb.ilog2() as usize).min(ROUNDUP_BUCKETS - 1);
                if first {
                    for slot in &mut self.roundup_power2_divisions[..index] {
                        *slot = divisions;
                    }
                    first = false;
                }
                self.roundup_power2_divisions[index] = divisions;
                last_index = index;
            }
            match p.next_token("',' or ']'")?.as_str() {
                "," => continue,
                "]" => break,
                other => {
                    return Err(ConfigError::Syntax {
                        position: p.pos - 1,
                        expected: "',' or ']'",
                        found: other.to_owned(),
                    })
                }
            }
        }
        Ok(())
    }

    /// Divisions for a size (bucket `clamp(floor(log2(size)) - 20, 0, 15)`).
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.max(1).leading_zeros() as i64;
        let index = (log - 20).clamp(0, ROUNDUP_BUCKETS as i64 - 1) as usize;
        self.roundup_power2_divisions[index]
    }

    /// `round_size`: the block size actually used for a request of `size` bytes.
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        let divisions = self.divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK_SIZE.saturating_mul(divisions) {
            roundup_power2_next_division(size, divisions)
        } else {
            size.div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE)
        }
    }

    /// `get_allocation_size`: the size of a new segment for an already rounded size.
    pub fn allocation_size(&self, rounded: u64) -> u64 {
        if rounded <= SMALL_SIZE {
            SMALL_BUFFER
        } else if rounded < MIN_LARGE_ALLOC {
            self.large_segment_size
        } else {
            rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
        }
    }

    /// `max_split_size` as snapshots write it: `-1` for unlimited.
    pub fn max_split_size_for_snapshot(&self) -> i64 {
        if self.max_split_size == u64::MAX {
            -1
        } else {
            self.max_split_size as i64
        }
    }
}

/// Rounds `size` up to the next of `divisions` equal steps between two powers of two.
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> divisions.max(1).trailing_zeros();
    if step == 0 {
        return floor << 1;
    }
    let rounded_down = size & !(step - 1);
    if rounded_down == size {
        size
    } else {
        rounded_down + step
    }
}

fn mb_to_bytes(mb: f64) -> u64 {
    let bytes = mb * MIB as f64;
    if bytes >= u64::MAX as f64 {
        u64::MAX
    } else {
        bytes as u64
    }
}

fn whole_power_of_two(n: f64) -> Option<u64> {
    (n >= 1.0 && n.fract() == 0.0 && n < u64::MAX as f64 && (n as u64).is_power_of_two())
        .then_some(n as u64)
}

fn bad(key: &str, value: &str, reason: &'static str) -> ConfigError {
    ConfigError::BadValue {
        key: key.to_owned(),
        value: value.to_owned(),
        reason,
    }
}

fn lex(conf: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut current = String::new();
    for c in conf.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !current.is_empty() {
                    tokens.push(std::mem::take(&mut current));
                }
                tokens.push(c.to_string());
            }
            ' ' => {}
            _ => current.push(c),
        }
    }
    if !current.is_empty() {
        tokens.push(current);
    }
    tokens
}

struct Parser {
    tokens: Vec<String>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.pos).map(String::as_str)
    }

    fn next_token(&mut self, expected: &'static str) -> Result<String, ConfigError> {
        match self.tokens.get(self.pos) {
            Some(t) => {
                self.pos += 1;
                Ok(t.clone())
            }
            None => Err(ConfigError::Syntax {
                position: self.pos,
                expected,
                found: "end of string".into(),
            }),
        }
    }

    fn expect(&mut self, token: &'static str) -> Result<(), ConfigError> {
        let position = self.pos;
        let found = self.next_token(token)?;
        if found == token {
            Ok(())
        } else {
            Err(ConfigError::Syntax {
                position,
                expected: token,
                found,
            })
        }
    }

    fn number(&mut self, key: &str) -> Result<(String, f64), ConfigError> {
        let value = self.next_token("a number")?;
        let n: f64 = value
            .parse()
            .map_err(|_| bad(key, &value, "expected a number"))?;
        if !n.is_finite() {
            return Err(bad(key, &value, "expected a finite number"));
        }
        Ok((value, n))
    }

    fn boolean(&mut self, key: &str) -> Result<bool, ConfigError> {
        let value = self.next_token("True or False")?;
        match value.as_str() {
            "True" => Ok(true),
            "False" => Ok(false),
            _ => Err(bad(key, &value, "expected True or False")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_divisions(d: u64) -> AllocatorConfig {
        AllocatorConfig {
            roundup_power2_divisions: [d; ROUNDUP_BUCKETS],
            ..Default::default()
        }
    }

    #[test]
    fn round_size_plain_512_rounding() {
        let c = AllocatorConfig::default();
        assert_eq!(c.round_size(0), 512);
        assert_eq!(c.round_size(1), 512);
        assert_eq!(c.round_size(512), 512);
        assert_eq!(c.round_size(513), 1024);
        assert_eq!(c.round_size(MIB + 1), MIB + 512);
    }

    #[test]
    fn round_size_1200_with_4_divisions_is_1536_not_1280() {
        // PyTorch's comment example (1200 -> 1280) is roundup_power2_next_division alone;
        // round_size only applies it when n > 512 * divisions.
        let c = with_divisions(4);
        assert_eq!(c.round_size(1200), 1536);
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
    }

    #[test]
    fn round_size_power2_divisions_eligible_cases() {
        assert_eq!(with_divisions(4).round_size(5000), 5120);
        assert_eq!(with_divisions(2).round_size(3 * MIB + 1), 4 * MIB);
        // A power of two is kept.
        assert_eq!(with_divisions(4).round_size(8192), 8192);
        // Divisions 1 means plain rounding.
        assert_eq!(with_divisions(1).round_size(5000), 5120);
        assert_eq!(with_divisions(1).round_size(4500), 4608);
        assert_eq!(with_divisions(8).round_size(4500), 4608);
        assert_eq!(with_divisions(2).round_size(5000), 6144);
    }

    #[test]
    fn allocation_size_boundaries() {
        let c = AllocatorConfig::default();
        assert_eq!(c.allocation_size(MIB), 2 * MIB);
        assert_eq!(c.allocation_size(MIB + 512), 20 * MIB);
        assert_eq!(c.allocation_size(10 * MIB - 512), 20 * MIB);
        assert_eq!(c.allocation_size(10 * MIB), 10 * MIB);
        assert_eq!(c.allocation_size(11 * MIB + 512), 12 * MIB);
    }

    #[test]
    fn parse_full_config() {
        let c = AllocatorConfig::parse(
            "max_split_size_mb:64, garbage_collection_threshold:0.6,expandable_segments:True,\
             roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 64 * MIB);
        assert_eq!(c.garbage_collection_threshold, 0.6);
        assert!(c.expandable_segments);
        // 256 MB is bucket 8: the first entry also fills the smaller buckets.
        assert_eq!(&c.roundup_power2_divisions[..9], &[1; 9]);
        assert_eq!(c.roundup_power2_divisions[9], 2);
        assert_eq!(c.roundup_power2_divisions[10], 4);
        assert_eq!(&c.roundup_power2_divisions[11..], &[8; 5]);
        assert_eq!(c.max_split_size_for_snapshot(), 64 * MIB as i64);
    }

    #[test]
    fn parse_single_divisions_value() {
        let c = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(c.roundup_power2_divisions, [4; ROUNDUP_BUCKETS]);
        assert_eq!(c.round_size(5000), 5120);
    }

    #[test]
    fn parse_errors_name_the_key_and_value() {
        let e = AllocatorConfig::parse("max_split_size_mb:10").unwrap_err();
        assert!(
            matches!(e, ConfigError::BadValue { ref key, ref value, .. } if key == "max_split_size_mb" && value == "10")
        );
        let e = AllocatorConfig::parse("no_such_key:1").unwrap_err();
        assert!(matches!(e, ConfigError::UnknownKey { ref key, .. } if key == "no_such_key"));
        assert!(e.to_string().contains("no_such_key"));
        let e = AllocatorConfig::parse("expandable_segments:true").unwrap_err();
        assert!(e.to_string().contains("True or False"), "{e}");
        let e = AllocatorConfig::parse("garbage_collection_threshold:1.5").unwrap_err();
        assert!(matches!(e, ConfigError::BadValue { .. }));
        let e = AllocatorConfig::parse("roundup_power2_divisions:3").unwrap_err();
        assert!(matches!(e, ConfigError::BadValue { .. }));
        let e = AllocatorConfig::parse("max_split_size_mb").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }));
        let e = AllocatorConfig::parse("backend:cudaMallocAsync").unwrap_err();
        assert!(matches!(e, ConfigError::BadValue { .. }));
    }

    #[test]
    fn empty_config_is_default() {
        let c = AllocatorConfig::parse("").unwrap();
        assert_eq!(c, AllocatorConfig::default());
        assert_eq!(c.max_split_size_for_snapshot(), -1);
    }
}

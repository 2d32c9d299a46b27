//! The allocator settings a file was recorded with, and settings written back as a
//! `PYTORCH_CUDA_ALLOC_CONF` string.

use memsnap_format::{Action, Snapshot};
use memsnap_recorder::config::{MIB, ROUNDUP_BUCKETS};
use memsnap_recorder::AllocatorConfig;

/// Values at or above this in `max_split_size` mean "unlimited" (PyTorch writes `SIZE_MAX`
/// on some versions, `-1` on others).
const UNLIMITED: i64 = 1 << 60;

/// The settings the file was recorded with: `allocator_settings` when present (2.3+), else the
/// defaults of the file's era, with expandable segments on when its segments are expandable.
/// The second value says where they came from.
pub fn file_config(snapshot: &Snapshot) -> (AllocatorConfig, &'static str) {
    let expandable_seen = snapshot
        .segments
        .iter()
        .any(|s| s.is_expandable == Some(true))
        || snapshot
            .traces()
            .iter()
            .flatten()
            .any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap));
    let Some(settings) = &snapshot.allocator_settings else {
        let config = AllocatorConfig {
            expandable_segments: expandable_seen,
            ..Default::default()
        };
        let source = if expandable_seen {
            "PyTorch defaults with expandable segments (the file has no allocator_settings; its segments are expandable)"
        } else {
            "PyTorch defaults (the file has no allocator_settings)"
        };
        return (config, source);
    };
    let mut config = settings
        .alloc_conf
        .as_deref()
        .and_then(|c| AllocatorConfig::parse(c).ok())
        .unwrap_or_default();
    // The typed values are what the allocator used (settings can change at run time).
    if let Some(m) = settings.max_split_size.as_ref() {
        // -1 (SIZE_MAX as int64) and values beyond i64 mean unlimited.
        let m = m.as_i64().unwrap_or(UNLIMITED);
        config.max_split_size = if m <= 0 || m >= UNLIMITED {
            u64::MAX
        } else {
            m as u64
        };
    }
    if let Some(t) = settings.garbage_collection_threshold {
        if t.is_finite() && (0.0..1.0).contains(&t) {
            config.garbage_collection_threshold = t;
        }
    }
    if let Some(e) = settings.expandable_segments {
        config.expandable_segments = e;
    }
    if let Some(divisions) = &settings.roundup_power2_divisions {
        for (key, n) in divisions {
            let Ok(mb) = key.parse::<u64>() else { continue };
            let Some(n) = n.as_u64() else { continue };
            if !mb.is_power_of_two() {
                continue;
            }
            let index = (mb.ilog2() as usize).min(ROUNDUP_BUCKETS - 1);
            config.roundup_power2_divisions[index] = n;
        }
    }
    (config, "the file's allocator_settings")
}

/// The settings as a `PYTORCH_CUDA_ALLOC_CONF` string (only what differs from the defaults;
/// empty for the defaults).
pub fn conf_string(config: &AllocatorConfig) -> String {
    let d = AllocatorConfig::default();
    let mut parts = Vec::new();
    if config.expandable_segments {
        parts.push("expandable_segments:True".to_string());
    }
    if config.max_split_size != d.max_split_size {
        parts.push(format!(
            "max_split_size_mb:{}",
            config.max_split_size.div_ceil(MIB)
        ));
    }
    if config.max_non_split_rounding_size != d.max_non_split_rounding_size {
        parts.push(format!(
            "max_non_split_rounding_mb:{}",
            config.max_non_split_rounding_size.div_ceil(MIB)
        ));
    }
    if config.garbage_collection_threshold > 0.0 {
        parts.push(format!(
            "garbage_collection_threshold:{}",
            config.garbage_collection_threshold
        ));
    }
    let div = &config.roundup_power2_divisions;
    if div.iter().any(|&n| n > 1) {
        if div.iter().all(|&n| n == div[0]) {
            parts.push(format!("roundup_power2_divisions:{}", div[0]));
        } else {
            let list: Vec<String> = div
                .iter()
                .enumerate()
                .map(|(i, n)| format!("{}:{n}", 1u64 << i))
                .collect();
            parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
        }
    }
    if config.large_segment_size != d.large_segment_size {
        parts.push(format!(
            "large_segment_size_mb:{}",
            config.large_segment_size / MIB
        ));
    }
    if let Some(f) = config.per_process_memory_fraction {
        parts.push(format!("per_process_memory_fraction:{f}"));
    }
    parts.join(",")
}

/// `base` with the keys of `overlay` applied on top (`overlay`'s values win).
pub fn overlay(
    base: &AllocatorConfig,
    overlay: &str,
) -> Result<AllocatorConfig, memsnap_recorder::ConfigError> {
    let base_conf = conf_string(base);
    let combined = match (base_conf.is_empty(), overlay.trim().is_empty()) {
        (true, _) => overlay.to_string(),
        (false, true) => base_conf,
        (false, false) => format!("{base_conf},{overlay}"),
    };
    AllocatorConfig::parse(&combined)
}

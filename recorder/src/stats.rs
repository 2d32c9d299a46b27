//! Allocator statistics with PyTorch's names and semantics (`torch.cuda.memory_stats()`).

/// One statistic: current value, its running peak, and the sums of all increases and decreases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    pub fn increase(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.allocated += amount;
    }

    pub fn decrease(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current -= amount;
        self.freed += amount;
    }

    /// Applies a signed net change.
    pub fn update(&mut self, delta: i64) {
        if delta >= 0 {
            self.increase(delta as u64)
        } else {
            self.decrease(delta.unsigned_abs())
        }
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which pool a statistic covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatType {
    All = 0,
    SmallPool = 1,
    LargePool = 2,
}

impl StatType {
    pub const ALL: [StatType; 3] = [StatType::All, StatType::SmallPool, StatType::LargePool];

    /// PyTorch's key component: `all`, `small_pool`, `large_pool`.
    pub fn name(self) -> &'static str {
        match self {
            StatType::All => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }
}

/// A statistic for all pools, the small pool and the large pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    pub fn get(&self, t: StatType) -> &Stat {
        &self.0[t as usize]
    }

    /// Updates "all" and the pool's own entry.
    pub(crate) fn update(&mut self, small: bool, delta: i64) {
        self.0[0].update(delta);
        self.0[if small { 1 } else { 2 }].update(delta);
    }

    pub(crate) fn increase(&mut self, small: bool, amount: u64) {
        self.0[0].increase(amount);
        self.0[if small { 1 } else { 2 }].increase(amount);
    }

    pub(crate) fn decrease(&mut self, small: bool, amount: u64) {
        self.0[0].decrease(amount);
        self.0[if small { 1 } else { 2 }].decrease(amount);
    }
}

/// `DeviceStats` of PyTorch's caching allocator.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Allocated blocks (`allocation`).
    pub allocation: StatArray,
    /// Device segments from `malloc` (`segment`).
    pub segment: StatArray,
    /// Allocated or pending-free blocks (`active`).
    pub active: StatArray,
    /// Free fragments of split segments (`inactive_split`).
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    /// Sum of the callers' unrounded requests of active blocks.
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_sync_all_streams: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    /// `max_split_size` in bytes, `-1`… as PyTorch: `SIZE_MAX` when unlimited.
    pub max_split_size: u64,
}

impl DeviceStats {
    /// `reset_peak_memory_stats`.
    pub fn reset_peak(&mut self) {
        for array in self.arrays_mut() {
            for stat in &mut array.0 {
                stat.reset_peak();
            }
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `reset_accumulated_memory_stats`.
    pub fn reset_accumulated(&mut self) {
        for array in self.arrays_mut() {
            for stat in &mut array.0 {
                stat.reset_accumulated();
            }
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    /// The flat dict `torch.cuda.memory_stats()` returns: `allocated_bytes.all.current`,
    /// `oversize_allocations.peak`, `num_ooms`, ...
    pub fn to_flat(&self) -> Vec<(String, i64)> {
        let mut out = Vec::with_capacity(120);
        for (name, array) in self.arrays() {
            for t in StatType::ALL {
                push_stat(&mut out, &format!("{name}.{}", t.name()), array.get(t));
            }
        }
        push_stat(&mut out, "oversize_allocations", &self.oversize_allocations);
        push_stat(&mut out, "oversize_segments", &self.oversize_segments);
        for (name, value) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
        ] {
            out.push((name.to_owned(), value as i64));
        }
        out.push(("max_split_size".to_owned(), self.max_split_size as i64));
        out
    }

    /// `memory_allocated()`.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated_bytes.get(StatType::All).current as u64
    }

    /// `memory_reserved()`.
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved_bytes.get(StatType::All).current as u64
    }
}

fn push_stat(out: &mut Vec<(String, i64)>, prefix: &str, stat: &Stat) {
    for (suffix, value) in [
        ("current", stat.current),
        ("peak", stat.peak),
        ("allocated", stat.allocated),
        ("freed", stat.freed),
    ] {
        out.push((format!("{prefix}.{suffix}"), value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_tracks_peak_and_sums() {
        let mut s = Stat::default();
        s.increase(10);
        s.increase(5);
        s.decrease(12);
        s.update(-1);
        s.update(4);
        assert_eq!(
            s,
            Stat {
                current: 6,
                peak: 15,
                allocated: 19,
                freed: 13
            }
        );
    }

    #[test]
    fn flat_names_match_pytorch() {
        let stats = DeviceStats::default();
        let flat = stats.to_flat();
        let names: Vec<&str> = flat.iter().map(|(k, _)| k.as_str()).collect();
        for key in [
            "allocated_bytes.all.current",
            "reserved_bytes.large_pool.peak",
            "active_bytes.small_pool.freed",
            "inactive_split_bytes.all.allocated",
            "requested_bytes.all.current",
            "oversize_allocations.current",
            "num_alloc_retries",
            "num_ooms",
            "num_sync_all_streams",
            "num_device_alloc",
            "num_device_free",
            "max_split_size",
        ] {
            assert!(names.contains(&key), "missing {key}");
        }
    }
}

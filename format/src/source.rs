//! What an imported trace's source knew about a device beside its blocks.
//!
//! A torch.profiler trace counts memory it cannot attribute to any block (`Total Allocated`
//! includes what was live before the profile started and never freed in it) and has a reserved
//! series with no addresses (`Total Reserved`); `export_memory_timeline` gives each tensor a
//! category; a ROCm driver trace sees reserved memory (segments) and nothing of the blocks in
//! them. None of that fits PyTorch's snapshot keys, and dropping it makes every view disagree
//! with the source, so the imports keep it here, one [`SourceInfo`] per device.
//!
//! **Where it is stored.** Under the `"memsnap"` top-level dict ([`crate::RecorderInfo`]), key
//! `"sources"`, as a plain value (a list of dicts of ints, strings and int lists): PyTorch's
//! `_memory_viz.py` and MemoryViz.js never read that dict, and every codec (pickle, JSON,
//! msgpack) already carries the dict's unknown keys unchanged, so the information survives
//! every conversion without a codec change. [`RecorderInfo::sources`] and
//! [`RecorderInfo::set_sources`] are the typed view of it.
//!
//! **Axes.** Series are indexed like the analysis' event axis: entry `i` of the device's
//! trace. A [`Steps`] value holds `before` (the value before entry 0) and the value after each
//! listed entry until the next listed one.

use serde::{Deserialize, Serialize};

use crate::model::RecorderInfo;
use crate::value::Value;

/// The `"memsnap"` dict's key holding the list of [`SourceInfo`]s.
pub const SOURCES_KEY: &str = "sources";

/// A step function over a device's trace entries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Steps {
    /// The value before entry 0.
    pub before: u64,
    /// `(entry, value)`: the value after `entry` until the next listed entry; entries
    /// ascending.
    pub after: Vec<(u32, u64)>,
}

impl Steps {
    /// A constant series.
    pub fn constant(value: u64) -> Steps {
        Steps {
            before: value,
            after: Vec::new(),
        }
    }

    /// The value after entry `entry` (`before` when no listed entry is at or before it).
    pub fn at(&self, entry: u32) -> u64 {
        let i = self.after.partition_point(|&(e, _)| e <= entry);
        if i == 0 {
            self.before
        } else {
            self.after[i - 1].1
        }
    }

    /// The largest value, `before` included.
    pub fn max(&self) -> u64 {
        self.after.iter().fold(self.before, |m, &(_, v)| m.max(v))
    }
}

/// Categories the source gave the allocations of a device's trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryCategories {
    /// The source's category names, in its order (`PARAMETER`, `OPTIMIZER_STATE`, ...).
    pub names: Vec<String>,
    /// `(entry, index into names)` for each `alloc` entry that has a category; entries
    /// ascending.
    pub of_allocs: Vec<(u32, u32)>,
}

impl EntryCategories {
    /// The category name of the `alloc` at `entry`, if the source gave one.
    pub fn of(&self, entry: u32) -> Option<&str> {
        let i = self
            .of_allocs
            .binary_search_by_key(&entry, |&(e, _)| e)
            .ok()?;
        self.names
            .get(self.of_allocs[i].1 as usize)
            .map(String::as_str)
    }
}

/// What an import's source knew about one device beyond the blocks of its trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceInfo {
    pub device: i64,
    /// Which tool counted these numbers (`torch.profiler`, `export_memory_timeline`,
    /// `rocprofv3`): views say where a number came from.
    pub source: String,
    /// Allocated bytes the source counted that no block of the trace accounts for: memory
    /// live before the window and never freed in it, and any later change of that baseline.
    pub unattributed: Option<Steps>,
    /// The source's reserved bytes (torch.profiler's `Total Reserved`), when it has them and
    /// the trace has no segment events.
    pub reserved: Option<Steps>,
    /// `false` when the source sees only reserved (driver) memory and nothing of the blocks
    /// in it: allocated bytes are unknown, not zero.
    pub allocated_known: bool,
    /// Categories of the allocations, from the source.
    pub categories: Option<EntryCategories>,
}

impl SourceInfo {
    /// A device's entry with nothing known beyond the blocks.
    pub fn new(device: i64, source: impl Into<String>) -> SourceInfo {
        SourceInfo {
            device,
            source: source.into(),
            allocated_known: true,
            ..SourceInfo::default()
        }
    }

    fn to_value(&self) -> Value {
        let mut items = vec![
            (key("device"), Value::Int(self.device)),
            (key("source"), Value::Str(self.source.clone())),
            (key("allocated_known"), Value::Bool(self.allocated_known)),
        ];
        if let Some(s) = &self.unattributed {
            items.push((key("unattributed"), steps_value(s)));
        }
        if let Some(s) = &self.reserved {
            items.push((key("reserved"), steps_value(s)));
        }
        if let Some(c) = &self.categories {
            items.push((
                key("categories"),
                Value::Dict(vec![
                    (
                        key("names"),
                        Value::List(c.names.iter().cloned().map(Value::Str).collect()),
                    ),
                    (
                        key("entries"),
                        ints(c.of_allocs.iter().map(|&(e, _)| u64::from(e))),
                    ),
                    (
                        key("indices"),
                        ints(c.of_allocs.iter().map(|&(_, i)| u64::from(i))),
                    ),
                ]),
            ));
        }
        Value::Dict(items)
    }

    fn from_value(v: &Value) -> Option<SourceInfo> {
        let device = v.get("device")?.as_i64()?;
        let source = v.get("source")?.as_str()?.to_string();
        let allocated_known = match v.get("allocated_known") {
            Some(Value::Bool(b)) => *b,
            None => true,
            Some(_) => return None,
        };
        let unattributed = match v.get("unattributed") {
            Some(s) => Some(steps_of(s)?),
            None => None,
        };
        let reserved = match v.get("reserved") {
            Some(s) => Some(steps_of(s)?),
            None => None,
        };
        let categories = match v.get("categories") {
            None => None,
            Some(c) => {
                let names = match c.get("names")? {
                    Value::List(l) => l
                        .iter()
                        .map(|n| n.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()?,
                    _ => return None,
                };
                let entries = u32s(c.get("entries")?)?;
                let indices = u32s(c.get("indices")?)?;
                if entries.len() != indices.len()
                    || !entries.windows(2).all(|w| w[0] < w[1])
                    || indices.iter().any(|&i| i as usize >= names.len())
                {
                    return None;
                }
                Some(EntryCategories {
                    names,
                    of_allocs: entries.into_iter().zip(indices).collect(),
                })
            }
        };
        Some(SourceInfo {
            device,
            source,
            unattributed,
            reserved,
            allocated_known,
            categories,
        })
    }
}

fn key(k: &str) -> Value {
    Value::Str(k.to_string())
}

fn ints(values: impl Iterator<Item = u64>) -> Value {
    Value::List(
        values
            .map(|v| Value::Int(i64::try_from(v).unwrap_or(i64::MAX)))
            .collect(),
    )
}

fn steps_value(s: &Steps) -> Value {
    Value::Dict(vec![
        (key("before"), ints(std::iter::once(s.before))),
        (
            key("entries"),
            ints(s.after.iter().map(|&(e, _)| u64::from(e))),
        ),
        (key("values"), ints(s.after.iter().map(|&(_, v)| v))),
    ])
}

fn u64s(v: &Value) -> Option<Vec<u64>> {
    match v {
        Value::List(l) => l
            .iter()
            .map(|x| x.as_i64().and_then(|i| u64::try_from(i).ok()))
            .collect(),
        _ => None,
    }
}

fn u32s(v: &Value) -> Option<Vec<u32>> {
    u64s(v)?
        .into_iter()
        .map(|x| u32::try_from(x).ok())
        .collect()
}

fn steps_of(v: &Value) -> Option<Steps> {
    let before = *u64s(v.get("before")?)?.first()?;
    let entries = u32s(v.get("entries")?)?;
    let values = u64s(v.get("values")?)?;
    if entries.len() != values.len() || !entries.windows(2).all(|w| w[0] < w[1]) {
        return None;
    }
    Some(Steps {
        before,
        after: entries.into_iter().zip(values).collect(),
    })
}

impl RecorderInfo {
    /// What the sources of an import knew per device (see the [module docs](crate::source)).
    /// Empty for snapshots that are not imports, and for an entry that does not parse (a
    /// damaged or foreign `"sources"` key is kept as written, never trusted).
    pub fn sources(&self) -> Vec<SourceInfo> {
        match self.extra.iter().find(|(k, _)| k == SOURCES_KEY) {
            Some((_, Value::List(list))) => {
                list.iter().filter_map(SourceInfo::from_value).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Replaces the sources (none removes the key).
    pub fn set_sources(&mut self, sources: &[SourceInfo]) {
        self.extra.retain(|(k, _)| k != SOURCES_KEY);
        if !sources.is_empty() {
            self.extra.push((
                SOURCES_KEY.to_string(),
                Value::List(sources.iter().map(SourceInfo::to_value).collect()),
            ));
        }
    }

    /// The source of `device`, if any. Parses that device's entry alone: a many-device import
    /// built per device must not parse every device's series each time (O(devices²)).
    pub fn source_of(&self, device: i64) -> Option<SourceInfo> {
        match self.extra.iter().find(|(k, _)| k == SOURCES_KEY) {
            Some((_, Value::List(list))) => list
                .iter()
                .filter(|v| v.get("device").and_then(Value::as_i64) == Some(device))
                .find_map(SourceInfo::from_value),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_read_back_as_they_were_set_and_damaged_ones_are_skipped() {
        let mut info = RecorderInfo::default();
        let s = SourceInfo {
            device: 1,
            source: "torch.profiler".into(),
            unattributed: Some(Steps {
                before: 91_360_768,
                after: vec![(3, 1000)],
            }),
            reserved: Some(Steps {
                before: 5,
                after: vec![(0, 7), (9, 3)],
            }),
            allocated_known: true,
            categories: Some(EntryCategories {
                names: vec!["A".into(), "B".into()],
                of_allocs: vec![(0, 1), (4, 0)],
            }),
        };
        info.set_sources(&[s.clone(), SourceInfo::new(0, "x")]);
        assert_eq!(info.sources(), vec![s.clone(), SourceInfo::new(0, "x")]);
        assert_eq!(
            info.source_of(1).unwrap().categories.unwrap().of(4),
            Some("A")
        );
        let r = s.reserved.unwrap();
        assert_eq!((r.at(0), r.at(8), r.at(9), r.max()), (7, 7, 3, 7));
        // A damaged entry (entries not ascending) is not trusted.
        if let Some((_, Value::List(l))) = info.extra.last_mut() {
            if let Value::Dict(items) = &mut l[0] {
                items.retain(|(k, _)| k.as_str() != Some("device"));
            }
        }
        assert_eq!(info.sources(), vec![SourceInfo::new(0, "x")]);
        info.set_sources(&[]);
        assert!(info.extra.is_empty());
    }
}

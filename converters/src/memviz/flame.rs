//! `segments` and `memory`: the collapsed-stack text `_memory_viz.py` pipes to flamegraph.pl.

use std::fmt::Write;

use memsnap_format::{IntField, Snapshot};

use super::blocks::{block_extra, StackFormatter};
use super::{checked, wide, MemvizError};

/// One line per block (`prefix;state;frames bytes`) plus a `<gaps>` line for the bytes the
/// request did not use. `with_segment` adds the `seg_<address>` level (`segments`).
pub(crate) fn collapsed(snapshot: &Snapshot, with_segment: bool) -> Result<String, MemvizError> {
    let mut out = String::new();
    let mut stacks = StackFormatter::new(snapshot);
    let mut prefix = String::new();
    for (si, seg) in snapshot.segments.iter().enumerate() {
        prefix.clear();
        let int = |field| seg.exact_int(field).unwrap_or_default();
        let _ = write!(prefix, "stream_{}", int(IntField::Stream));
        if with_segment {
            let _ = write!(prefix, ";seg_{}", int(IntField::Address));
        }
        for (bi, block) in seg.blocks.iter().enumerate() {
            let state = block.state.name(&snapshot.strings);
            let place = || format!("segments[{si}].blocks[{bi}]");
            let accounted: i128 = match &block.history {
                None => {
                    let (frames, size) = block_extra(block, &place())?;
                    let _ = writeln!(out, "{prefix};{state};{} {size}", stacks.fragment(frames));
                    size
                }
                Some(history) => {
                    let mut accounted = 0i128;
                    for item in history {
                        let real_size = item.exact_int(IntField::RealSize).unwrap_or_default();
                        accounted =
                            checked(accounted.checked_add(wide(&real_size, &place)?), &place)?;
                        match item.frames {
                            Some(frames) => {
                                let fragment = stacks.fragment(Some(frames));
                                let _ = writeln!(out, "{prefix};{state};{fragment} {real_size}");
                            }
                            None => {
                                let _ = writeln!(out, "{prefix};{state};<no-context> {real_size}");
                            }
                        }
                    }
                    accounted
                }
            };
            let size = wide(&block.exact_int(IntField::Size).unwrap_or_default(), &place)?;
            let gaps = checked(size.checked_sub(accounted), &place)?;
            if gaps != 0 {
                let _ = writeln!(out, "{prefix};{state};<gaps> {gaps}");
            }
        }
    }
    Ok(out)
}

//! `segments` and `memory`: the collapsed-stack text `_memory_viz.py` pipes to flamegraph.pl.

use std::fmt::Write;

use memsnap_format::Snapshot;

use super::blocks::{block_extra, StackFormatter};
use super::ReferenceFailure;

/// One line per block (`prefix;state;frames bytes`) plus a `<gaps>` line for the bytes the
/// request did not use. `with_segment` adds the `seg_<address>` level (`segments`).
pub fn collapsed(snapshot: &Snapshot, with_segment: bool) -> Result<String, ReferenceFailure> {
    let mut out = String::new();
    let mut stacks = StackFormatter::new(snapshot);
    let mut prefix = String::new();
    for (si, seg) in snapshot.segments.iter().enumerate() {
        prefix.clear();
        let _ = write!(prefix, "stream_{}", seg.stream);
        if with_segment {
            let _ = write!(prefix, ";seg_{}", seg.address);
        }
        for (bi, block) in seg.blocks.iter().enumerate() {
            let state = block.state.name(&snapshot.strings);
            let accounted: i128 = match &block.history {
                None => {
                    let place = format!("segments[{si}].blocks[{bi}]");
                    let (frames, size) = block_extra(block, &place)?;
                    let _ = writeln!(out, "{prefix};{state};{} {size}", stacks.fragment(frames));
                    i128::from(size)
                }
                Some(history) => {
                    let mut accounted = 0i128;
                    for item in history {
                        accounted += i128::from(item.real_size);
                        match item.frames {
                            Some(frames) => {
                                let fragment = stacks.fragment(Some(frames));
                                let _ =
                                    writeln!(out, "{prefix};{state};{fragment} {}", item.real_size);
                            }
                            None => {
                                let _ = writeln!(
                                    out,
                                    "{prefix};{state};<no-context> {}",
                                    item.real_size
                                );
                            }
                        }
                    }
                    accounted
                }
            };
            let gaps = i128::from(block.size) - accounted;
            if gaps != 0 {
                let _ = writeln!(out, "{prefix};{state};<gaps> {gaps}");
            }
        }
    }
    Ok(out)
}

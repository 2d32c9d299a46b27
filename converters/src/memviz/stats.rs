//! `stats`: `segsum()`, the page map of every segment of at least 20 MiB and the totals.

use std::fmt::Write;

use memsnap_format::{BlockState, IntField, Snapshot};

use super::blocks::block_extra;
use super::pyfmt::{format_size, size};
use super::{checked, wide, MemvizError};

/// One character of the page map stands for this many bytes.
const PAGE_SIZE: i128 = 20 * 1024 * 1024;

/// Most pages we map (2^32 pages is 80 PiB, far beyond any GPU).
const MAX_PAGES: i128 = 1 << 32;

/// The text `print(segsum(data))` writes, final newline included.
pub(crate) fn stats(snapshot: &Snapshot) -> Result<String, MemvizError> {
    let mut out = String::new();
    let _ = writeln!(out, "Summary of segments >= {} in size", size(PAGE_SIZE));

    // Exact sizes: per segment `total_size`, and per block `size`.
    let mut keys: Vec<(i128, i128)> = Vec::with_capacity(snapshot.segments.len());
    let mut sizes: Vec<Vec<i128>> = Vec::with_capacity(snapshot.segments.len());
    for (si, seg) in snapshot.segments.iter().enumerate() {
        let place = || format!("segments[{si}]");
        let total = wide(
            &seg.exact_int(IntField::TotalSize).unwrap_or_default(),
            &place,
        )?;
        let mut active = 0i128;
        let mut block_sizes = Vec::with_capacity(seg.blocks.len());
        for block in &seg.blocks {
            let size = wide(&block.exact_int(IntField::Size).unwrap_or_default(), &place)?;
            if block.state == BlockState::ActiveAllocated {
                active = checked(active.checked_add(size), &place)?;
            }
            block_sizes.push(size);
        }
        keys.push((total, active));
        sizes.push(block_sizes);
    }
    // Python's `sorted` is stable, like `sort_by_key`.
    let mut order: Vec<usize> = (0..snapshot.segments.len()).collect();
    order.sort_by_key(|&i| keys[i]);

    let (mut total_reserved, mut total_allocated) = (0i128, 0i128);
    let (mut free_external, mut free_internal) = (0i128, 0i128);
    for si in order {
        let seg = &snapshot.segments[si];
        let place = || format!("segments[{si}]");
        let add = |a: i128, b: i128| checked(a.checked_add(b), &place);
        let total_size = keys[si].0;
        total_reserved = add(total_reserved, total_size)?;

        let (mut seg_free_external, mut seg_free_internal, mut seg_allocated) =
            (0i128, 0i128, 0i128);
        // (offset, requested bytes) of each allocated block.
        let mut ranges: Vec<(i128, i128)> = Vec::new();
        let mut offset = 0i128;
        for (bi, (block, &size)) in seg.blocks.iter().zip(&sizes[si]).enumerate() {
            if block.state == BlockState::ActiveAllocated {
                let (_, requested) = block_extra(block, &format!("segments[{si}].blocks[{bi}]"))?;
                ranges.push((offset, requested));
                seg_allocated = add(seg_allocated, requested)?;
                let internal = checked(size.checked_sub(requested), &place)?;
                seg_free_internal = add(seg_free_internal, internal)?;
            } else {
                seg_free_external = add(seg_free_external, size)?;
            }
            offset = add(offset, size)?;
        }
        total_allocated = add(total_allocated, seg_allocated)?;
        free_external = add(free_external, seg_free_external)?;
        free_internal = add(free_internal, seg_free_internal)?;

        if total_size.saturating_sub(1).div_euclid(PAGE_SIZE) >= MAX_PAGES {
            // Python builds a list of one item per page and runs out of memory.
            return Err(MemvizError::python(
                "MemoryError",
                format!(
                    "segments[{si}]: total_size {total_size} is too large to map in 20 MiB pages"
                ),
            ));
        }
        let body = page_map(total_size, &ranges).map_err(|what| {
            MemvizError::python(
                "IndexError: list index out of range",
                format!("segments[{si}]: {what}"),
            )
        })?;
        let seg_sum = add(add(seg_free_external, seg_free_internal)?, seg_allocated)?;
        if seg_sum != total_size {
            return Err(MemvizError::python(
                format!(
                    "AssertionError: Segment size mismatch: {seg_free_external} + {seg_free_internal} + {seg_allocated} != {total_size}"
                ),
                format!("segments[{si}]: its blocks do not add up to total_size"),
            ));
        }
        if total_size >= PAGE_SIZE {
            out.push('[');
            out.push_str(&body);
            out.push_str("] ");
            format_size(&mut out, total_size);
            out.push_str(" allocated, ");
            report_free(&mut out, seg_free_external, seg_free_internal);
            out.push_str(" free");
            let stream = seg.exact_int(IntField::Stream).unwrap_or_default();
            if stream != 0 {
                let _ = write!(out, " stream_{stream}");
            }
            out.push('\n');
        }
    }
    let _ = writeln!(out, "segments: {}", snapshot.segments.len());
    let _ = writeln!(out, "total_reserved: {}", size(total_reserved));
    let _ = writeln!(out, "total_allocated: {}", size(total_allocated));
    out.push_str("total_free: ");
    report_free(&mut out, free_external, free_internal);
    out.push('\n');
    write_legend(&mut out);
    let place = || "segments".to_string();
    let sum = checked(
        free_internal
            .checked_add(free_external)
            .and_then(|s| s.checked_add(total_allocated)),
        &place,
    )?;
    if sum != total_reserved {
        return Err(MemvizError::python(
            format!(
                "AssertionError: Memory accounting error: {free_internal} + {free_external} + {total_allocated} != {total_reserved}"
            ),
            "the segments' blocks do not add up to the reserved bytes".to_string(),
        ));
    }
    // `print` adds the final newline.
    out.push('\n');
    Ok(out)
}

/// One character per 20 MiB page: the letter of the single allocation in it, a digit for the
/// tenths filled by several, `*` when full, space when empty. The fractions are summed in
/// floating point in Python's order, so the digits match.
fn page_map(total_size: i128, ranges: &[(i128, i128)]) -> Result<String, String> {
    let pages = total_size.saturating_sub(1).div_euclid(PAGE_SIZE) + 1;
    let pages = usize::try_from(pages).unwrap_or(0);
    let mut occupied = vec![b' '; pages];
    let mut frac = vec![0.0f64; pages];
    for (i, &(start_, size)) in ranges.iter().enumerate() {
        let overflow = || "an allocation's range overflows 128 bits".to_string();
        let finish_ = start_.checked_add(size).ok_or_else(overflow)?;
        let start = start_.div_euclid(PAGE_SIZE);
        let finish = finish_
            .checked_sub(1)
            .ok_or_else(overflow)?
            .div_euclid(PAGE_SIZE)
            + 1;
        let letter = b'a' + (i % 26) as u8;
        for j in start..finish {
            let page = usize::try_from(j)
                .ok()
                .filter(|&p| p < pages)
                .ok_or_else(|| {
                    format!("an allocation reaches page {j} of a {pages}-page segment")
                })?;
            let s = start_.max(j * PAGE_SIZE);
            let e = finish_.min((j + 1) * PAGE_SIZE);
            frac[page] += (e - s) as f64 / PAGE_SIZE as f64;
            if occupied[page] != b' ' {
                let tenths = (frac[page] * 10.0) as i64;
                occupied[page] = *b"0123456789*"
                    .get(
                        usize::try_from(tenths)
                            .map_err(|_| "a page is filled below zero".to_string())?,
                    )
                    .ok_or_else(|| "a page is filled past 110%".to_string())?;
            } else {
                occupied[page] = letter;
            }
        }
    }
    Ok(occupied.into_iter().map(char::from).collect())
}

/// `_report_free`: `X` or `X (Y% internal)` when anything is free.
fn report_free(out: &mut String, free_external: i128, free_internal: i128) {
    let total = free_external + free_internal;
    format_size(out, total);
    if total != 0 {
        let pct = (free_internal as f64 / total as f64) * 100.0;
        let _ = write!(out, " ({pct:.1}% internal)");
    }
}

fn write_legend(out: &mut String) {
    out.push_str("\nLegend:\n    [a     ] - a segment in the allocator\n");
    let _ = writeln!(
        out,
        "     ^-- a page {} of memory in the segment",
        size(PAGE_SIZE)
    );
    out.push_str(concat!(
        "    a-z: pages filled with a single block's content\n",
        "    ' ': page is completely free\n",
        "    *: page if completely full with multiple blocks\n",
        "    0-9: page is partially full with tensors of multiple blocks (9 == 90% full)\n",
        "    (X% internal) - of the free memory, X% is free because we rounded the size of the allocation.\n",
    ));
}

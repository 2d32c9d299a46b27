//! What `_memory_viz.py` reads from a block, and how it prints a stack, shared by `stats`,
//! `segments` and `memory`.

use std::fmt::Write;

use memsnap_format::{Block, Frame, FrameId, IntField, Snapshot, StackId};

use super::{wide, MemvizError};

/// `_block_extra(b)`: the block's frames and the bytes it accounts for.
///
/// Current blocks (with a `frames` key) give `frames` and `requested_size`. Legacy blocks
/// (no `frames` key) give the first history item's frames and `real_size`, or no frames and
/// `requested_size` (falling back to `size`).
pub fn block_extra(block: &Block, place: &str) -> Result<(Option<StackId>, i128), MemvizError> {
    let at = || place.to_string();
    let int = |field| block.exact_int(field).map(|v| wide(&v, &at)).transpose();
    if block.frames.is_some() {
        let requested = int(IntField::RequestedSize)?.ok_or_else(|| {
            MemvizError::key_error(
                "requested_size",
                format!("{place} has frames but no requested_size"),
            )
        })?;
        return Ok((block.frames, requested));
    }
    match &block.history {
        Some(history) => {
            let first = history.first().ok_or_else(|| {
                MemvizError::python(
                    "IndexError: list index out of range",
                    format!("{place} has an empty legacy history"),
                )
            })?;
            let real_size = first.exact_int(IntField::RealSize).unwrap_or_default();
            Ok((first.frames, wide(&real_size, &at)?))
        }
        None => match int(IntField::RequestedSize)? {
            Some(requested) => Ok((None, requested)),
            None => Ok((None, int(IntField::Size)?.unwrap_or_default())),
        },
    }
}

/// `_frame_filter`: frames of the unwinder, the interpreter and the dispatcher are hidden.
pub fn frame_is_shown(frame: &Frame) -> bool {
    !memsnap_analysis::sites::is_filtered_frame(frame)
}

/// Formats stacks as `_write_blocks` does, caching per stack and per frame: a real snapshot
/// has thousands of blocks but few distinct stacks.
pub struct StackFormatter<'s> {
    snapshot: &'s Snapshot,
    frames: Vec<Option<Option<String>>>,
    stacks: Vec<Option<String>>,
}

impl<'s> StackFormatter<'s> {
    pub fn new(snapshot: &'s Snapshot) -> Self {
        StackFormatter {
            snapshot,
            frames: vec![None; snapshot.frames.len()],
            stacks: vec![None; snapshot.stacks.len()],
        }
    }

    /// `frames_fragment(frames)`: `<non-python>` for no frames, else the shown frames
    /// outermost first as `basename:line:name`, joined by `;` (empty when all are hidden).
    pub fn fragment(&mut self, stack: Option<StackId>) -> &str {
        let Some(stack) = stack else {
            return "<non-python>";
        };
        let i = stack.index();
        if self.stacks[i].is_none() {
            let ids = self.snapshot.stacks.get(stack);
            let text = if ids.is_empty() {
                "<non-python>".to_string()
            } else {
                let mut text = String::new();
                for &id in ids.iter().rev() {
                    if let Some(frame) = self.frame(id) {
                        if !text.is_empty() {
                            text.push(';');
                        }
                        text.push_str(frame);
                    }
                }
                text
            };
            self.stacks[i] = Some(text);
        }
        self.stacks[i].as_deref().unwrap_or_default()
    }

    /// `_frame_fmt(f)` when the frame passes the filter. Only `/` separates directories here,
    /// so Windows paths print whole, as in Python.
    fn frame(&mut self, id: FrameId) -> Option<&str> {
        let slot = &mut self.frames[id.index()];
        if slot.is_none() {
            let frame = self.snapshot.frames.get(id);
            *slot = Some(frame_is_shown(frame).then(|| {
                let base = frame.filename.rsplit('/').next().unwrap_or(&frame.filename);
                let mut s = String::new();
                let _ = write!(s, "{base}:{}:{}", frame.line, frame.name);
                s
            }));
        }
        slot.as_ref().and_then(|f| f.as_deref())
    }
}

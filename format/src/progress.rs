//! The progress callback the readers take.
//!
//! Its own module, below [`crate::io`] (which picks a codec and reads through it) and the
//! codecs (which report their progress): defined in `io`, it made the pickle reader import
//! `io` while `io` imports the pickle reader.

/// Progress callback: `(bytes done, bytes total)`; return `false` to cancel the read.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64) -> bool;

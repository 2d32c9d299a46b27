//! Content ids of frames and stacks, equal at every rank and in every export.
//!
//! A frame's id hashes its file, line and function; a stack's id hashes its frames' ids,
//! innermost first. Ids are xxHash64 (a published, stable algorithm), so the same call site
//! has the same id in every file, every export and every memsnap version, and workers can
//! number frames without talking to each other. A second hash with another seed travels with
//! each id: two different frames with the same id (odds about n²/2⁶⁵) are reported, never
//! merged silently.

use std::hash::Hasher;

use memsnap_format::{Frame, Snapshot};
use twox_hash::XxHash64;

/// Seeds of the id and of its check hash.
const ID_SEED: u64 = 0x6d65_6d73_6e61_7031; // "memsnap1"
const CHECK_SEED: u64 = 0x6368_6563_6b69_6431; // "checkid1"

/// An id and its check hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hashed {
    pub id: i64,
    pub check: u64,
}

fn hash_with(seed: u64, write: impl Fn(&mut XxHash64)) -> u64 {
    let mut h = XxHash64::with_seed(seed);
    write(&mut h);
    h.finish()
}

fn hashed(write: impl Fn(&mut XxHash64)) -> Hashed {
    Hashed {
        // The bits as they are: ids are opaque keys, and Int64 is what every engine joins on.
        id: hash_with(ID_SEED, &write) as i64,
        check: hash_with(CHECK_SEED, &write),
    }
}

/// Length-prefixed, so `("ab", "c")` and `("a", "bc")` differ.
fn field(h: &mut XxHash64, bytes: &[u8]) {
    h.write(&(bytes.len() as u64).to_le_bytes());
    h.write(bytes);
}

pub(crate) fn frame_id(frame: &Frame) -> Hashed {
    hashed(|h| {
        field(h, frame.filename.as_bytes());
        field(h, &frame.line.to_le_bytes());
        field(h, frame.name.as_bytes());
    })
}

/// The ids of every frame and every stack of a snapshot, indexed by `FrameId` and `StackId`.
pub(crate) struct SnapshotIds {
    pub frames: Vec<Hashed>,
    pub stacks: Vec<Hashed>,
}

impl SnapshotIds {
    pub fn of(snapshot: &Snapshot) -> SnapshotIds {
        let frames: Vec<Hashed> = snapshot.frames.iter().map(frame_id).collect();
        let stacks = snapshot
            .stacks
            .iter()
            .map(|(_, ids)| {
                hashed(|h| {
                    h.write(&(ids.len() as u64).to_le_bytes());
                    for f in ids {
                        // A dangling frame index hashes as itself (the stacks table skips it).
                        let id = frames
                            .get(f.index())
                            .map_or(f.index() as u64, |x| x.id as u64);
                        h.write(&id.to_le_bytes());
                    }
                })
            })
            .collect();
        SnapshotIds { frames, stacks }
    }
}

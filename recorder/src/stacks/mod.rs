//! Native stacks: raw instruction pointers captured at allocation time, interned per device
//! (a stack seen before costs a hash lookup and no allocation), symbolised lazily at snapshot
//! time through a process-wide cache keyed by instruction pointer.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use memsnap_format::Frame;
use parking_lot::Mutex;

#[cfg(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_os = "linux"
))]
mod frame_pointers;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod dwarf;

/// Index of a stack in a device's table of interned stacks (`StackInterner`).
pub type RawStackId = u32;
/// "No stack".
pub const NO_STACK: RawStackId = u32::MAX;
/// Frames kept per stack (innermost first); deeper frames are cut.
pub const MAX_FRAMES: usize = 64;
/// Set in the ids of [`GivenStack`]s, clear in those of captured native stacks.
pub(crate) const GIVEN_BIT: RawStackId = 1 << 31;

/// A stack the caller gives as frames instead of one the allocator captures: what a language
/// binding knows about its own frames (Python's, as PyTorch's `stacks="python"` records them),
/// or the made-up frames of a simulated workload. Register it once with
/// [`crate::CachingAllocator::register_stack`], then pass it to
/// [`crate::CachingAllocator::malloc_with_stack`] and
/// [`crate::CachingAllocator::free_with_stack`]. Valid for the allocator that registered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GivenStack(pub(crate) RawStackId);

/// What makes two frames the same frame in [`GivenStacks`]: name, file, line and any extra
/// keys (rendered, since their values may be floats).
type FrameKey = (String, String, memsnap_format::PyInt, String);

/// The stacks registered as frames, one table per device.
#[derive(Debug, Default)]
pub(crate) struct GivenStacks {
    stacks: Vec<Arc<[Frame]>>,
    index: HashMap<Vec<FrameKey>, RawStackId>,
}

impl GivenStacks {
    /// The id of an equal stack registered before, or a new one; `None` when the table is
    /// full.
    pub fn register(&mut self, frames: &[Frame]) -> Option<RawStackId> {
        let key: Vec<FrameKey> = frames
            .iter()
            .map(|f| {
                let extra = if f.extra.is_empty() {
                    String::new()
                } else {
                    format!("{:?}", f.extra)
                };
                (f.name.clone(), f.filename.clone(), f.line.clone(), extra)
            })
            .collect();
        if let Some(&id) = self.index.get(&key) {
            return Some(id);
        }
        let id = RawStackId::try_from(self.stacks.len())
            .ok()
            .filter(|&i| i < GIVEN_BIT - 1)?
            | GIVEN_BIT;
        self.stacks.push(frames.into());
        self.index.insert(key, id);
        Some(id)
    }

    /// The frames of a registered stack (innermost first).
    pub fn get(&self, id: RawStackId) -> Option<&Arc<[Frame]>> {
        if id == NO_STACK || id & GIVEN_BIT == 0 {
            return None;
        }
        self.stacks.get((id & !GIVEN_BIT) as usize)
    }
}

/// How native stacks are walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unwinder {
    /// DWARF unwinding: on x86-64 Linux with the rule of each return address cached per
    /// thread (`stacks::dwarf`, about as cheap as a frame-pointer walk once the addresses are
    /// known), else (and for frames it cannot do) through the `backtrace` crate, about 4 µs
    /// for 30 frames.
    Backtrace,
    /// Follows the frame-pointer chain (x86-64 and AArch64 Linux): about 30x cheaper, but only
    /// complete when everything on the stack keeps frame pointers, i.e. the program is built
    /// with `-C force-frame-pointers=yes` (this workspace's `.cargo/config.toml` does that)
    /// and its C/C++ code with `-fno-omit-frame-pointer`. Every pointer is checked against the
    /// current thread's stack bounds, so a missing frame pointer ends the walk early instead of
    /// reading wild memory. Falls back to [`Unwinder::Backtrace`] on other platforms or when
    /// the walk finds fewer than four frames. The first capture of the process compares one
    /// walk with a DWARF unwind (see [`check_frame_pointers`]): when the walk misses frames
    /// (the program lacks frame pointers), it warns once on stderr and every capture of the
    /// process unwinds with DWARF instead, so stacks stay complete.
    FramePointers,
    /// DWARF unwinding through the `backtrace` crate (libgcc) for every frame of every
    /// capture, with no cache: the reference the cached unwinder is tested and measured
    /// against, and a way around it should a program need one.
    Libgcc,
}

impl Default for Unwinder {
    /// [`Unwinder::FramePointers`] on x86-64 and AArch64 Linux, else [`Unwinder::Backtrace`].
    fn default() -> Self {
        if FRAME_POINTER_WALK_SUPPORTED {
            Unwinder::FramePointers
        } else {
            Unwinder::Backtrace
        }
    }
}

/// Whether [`Unwinder::FramePointers`] walks frame pointers on this platform (elsewhere it is
/// DWARF unwinding).
pub const FRAME_POINTER_WALK_SUPPORTED: bool = cfg!(all(
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_os = "linux"
));

/// One frame-pointer walk compared with a DWARF unwind from the same function
/// ([`check_frame_pointers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FramePointerCheck {
    /// Return addresses the frame-pointer walk found.
    pub walked: usize,
    /// Frames DWARF unwinding found, from the first frame both found outwards.
    pub unwound: usize,
    /// Of those, the frames the walk did not find: callers of functions without frame
    /// pointers (skipped), and everything beyond the point where the walk stopped.
    pub missed: usize,
}

/// DWARF frames a walk may miss before the warning: std is prebuilt without frame pointers,
/// so the walk of a program built with them misses the frames that called into std's
/// non-generic start-up code (`main`'s `lang_start_internal` and the C start-up below it, or a
/// spawned thread's `thread_start` and `clone`) — measured 2 to 5 on x86-64 Linux.
pub const FRAME_POINTER_MISS_ALLOWANCE: usize = 6;

impl FramePointerCheck {
    /// Whether the walk misses more than std's own start-up frames: the program (or a library
    /// between it and the recorder) is built without frame pointers.
    pub fn host_lacks_frame_pointers(&self) -> bool {
        self.walked < MIN_FRAME_POINTER_FRAMES || self.missed > FRAME_POINTER_MISS_ALLOWANCE
    }

    /// Compares a walk (innermost first) with a DWARF unwind (innermost first) taken in the
    /// same function. The unwinder's own frames before the first common frame are not counted.
    pub fn compare(walked: &[usize], unwound: &[usize]) -> Self {
        let start = walked
            .iter()
            .find_map(|ip| unwound.iter().position(|u| u == ip));
        let Some(start) = start else {
            return FramePointerCheck {
                walked: walked.len(),
                unwound: unwound.len(),
                missed: unwound.len(),
            };
        };
        let unwound = &unwound[start..];
        let found = unwound.iter().filter(|u| walked.contains(u)).count();
        FramePointerCheck {
            walked: walked.len(),
            unwound: unwound.len(),
            missed: unwound.len() - found,
        }
    }
}

/// Walks the caller's stack once by frame pointers and once by DWARF unwinding and compares
/// them (`None` where the frame-pointer walk is not supported).
#[inline(never)]
pub fn check_frame_pointers() -> Option<FramePointerCheck> {
    if !FRAME_POINTER_WALK_SUPPORTED {
        return None;
    }
    let mut walked = [0usize; MAX_FRAMES];
    let walked_len = walk_frame_pointers(&mut walked);
    let mut unwound = [0usize; MAX_FRAMES];
    let mut unwound_len = 0;
    backtrace::trace(|frame| {
        if let Some(slot) = unwound.get_mut(unwound_len) {
            *slot = frame.ip() as usize;
            unwound_len += 1;
        }
        unwound_len < MAX_FRAMES
    });
    Some(FramePointerCheck::compare(
        &walked[..walked_len],
        &unwound[..unwound_len],
    ))
}

/// The result of the process's first frame-pointer capture's check, once it ran.
static FIRST_CHECK: OnceLock<Option<FramePointerCheck>> = OnceLock::new();

/// What the check at the process's first frame-pointer capture found (`None` before that
/// capture, or where the walk is not supported).
pub fn first_capture_check() -> Option<FramePointerCheck> {
    FIRST_CHECK.get().copied().flatten()
}

/// Whether frame-pointer walks are used: 0 not decided yet, 1 yes, 2 no (the first capture's
/// check found the program without frame pointers; captures unwind with DWARF instead).
static FRAME_POINTERS_USABLE: AtomicU8 = AtomicU8::new(0);

/// Whether [`Unwinder::FramePointers`] captures walk frame pointers in this process. The first
/// call runs [`check_frame_pointers`] and, when the program lacks frame pointers, warns once
/// on stderr and answers no from then on. Later calls cost one atomic load.
#[inline]
fn frame_pointers_usable() -> bool {
    match FRAME_POINTERS_USABLE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => decide_frame_pointers(),
    }
}

#[cold]
#[inline(never)]
fn decide_frame_pointers() -> bool {
    let mut first = false;
    let check = *FIRST_CHECK.get_or_init(|| {
        first = true;
        check_frame_pointers()
    });
    let usable = check.is_some_and(|c| !c.host_lacks_frame_pointers());
    FRAME_POINTERS_USABLE.store(if usable { 1 } else { 2 }, Ordering::Relaxed);
    if let (true, Some(check)) = (first, check) {
        if !usable {
            eprintln!("{}", frame_pointer_warning(&check));
        }
    }
    usable
}

/// The one-time warning for a program without frame pointers.
pub fn frame_pointer_warning(check: &FramePointerCheck) -> String {
    format!(
        "memsnap: note: this program lacks frame pointers: the frame-pointer stack walk \
         missed {} of the {} frames DWARF unwinding finds, so native stacks are unwound with \
         DWARF instead (complete; on x86-64 Linux each return address's unwind rule is \
         computed once and cached, elsewhere about 4 µs a stack). For the frame-pointer walk, \
         build Rust code with RUSTFLAGS=\"-C force-frame-pointers=yes\" and C/C++ code with \
         -fno-omit-frame-pointer (see memsnap-recorder's README, \"Native stacks and frame \
         pointers\").",
        check.missed, check.unwound
    )
}

/// A frame-pointer walk that finds fewer frames than this is taken as a build without frame
/// pointers (a stray register can look like one or two frame records) and redone with DWARF.
const MIN_FRAME_POINTER_FRAMES: usize = 4;

/// A stack captured into a fixed buffer (no heap allocation).
pub struct CapturedStack {
    ips: [usize; MAX_FRAMES],
    len: usize,
}

impl Default for CapturedStack {
    fn default() -> Self {
        CapturedStack {
            ips: [0; MAX_FRAMES],
            len: 0,
        }
    }
}

impl CapturedStack {
    pub fn as_slice(&self) -> &[usize] {
        &self.ips[..self.len]
    }

    /// Captures the caller's stack, innermost frame first.
    #[inline(never)]
    pub fn capture(unwinder: Unwinder) -> Self {
        let mut stack = CapturedStack::default();
        if unwinder == Unwinder::FramePointers {
            #[cfg(all(
                any(target_arch = "x86_64", target_arch = "aarch64"),
                target_os = "linux"
            ))]
            if frame_pointers_usable() {
                stack.len = frame_pointers::walk(&mut stack.ips);
                if stack.len >= MIN_FRAME_POINTER_FRAMES {
                    return stack;
                }
                stack.len = 0;
            }
        }
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if unwinder != Unwinder::Libgcc {
            let (pc, sp, bp) = dwarf::registers();
            if let Some(len) = dwarf::walk(pc, sp, bp, &mut stack.ips) {
                if len >= MIN_FRAME_POINTER_FRAMES {
                    stack.len = len;
                    return stack;
                }
            }
        }
        stack.len = backtrace_capture(&mut stack.ips);
        stack
    }
}

/// Unwinds with the `backtrace` crate (libgcc's DWARF unwinder) into `ips`, innermost first.
#[inline(never)]
fn backtrace_capture(ips: &mut [usize; MAX_FRAMES]) -> usize {
    {
        let mut len = 0;
        backtrace::trace(|frame| {
            if let Some(slot) = ips.get_mut(len) {
                *slot = frame.ip() as usize;
                len += 1;
            }
            len < MAX_FRAMES
        });
        len
    }
}

/// Walks the frame-pointer chain only (no DWARF fallback) into `out`, innermost first;
/// returns the number of frames found (0 where the walk is not supported). Useful to check
/// whether a build keeps frame pointers.
#[inline(never)]
pub fn walk_frame_pointers(out: &mut [usize]) -> usize {
    #[cfg(all(
        any(target_arch = "x86_64", target_arch = "aarch64"),
        target_os = "linux"
    ))]
    {
        frame_pointers::walk(out)
    }
    #[cfg(not(all(
        any(target_arch = "x86_64", target_arch = "aarch64"),
        target_os = "linux"
    )))]
    {
        let _ = out;
        0
    }
}

/// A word-at-a-time multiplicative hasher for interning stacks: SipHash over ~30 return
/// addresses costs more than the frame-pointer walk that captured them. Collisions only cost
/// a slice comparison (the table compares whole stacks), and the keys are not attacker-chosen.
#[derive(Default)]
struct StackHasher(u64);

impl Hasher for StackHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // Mix the high bits down: hashbrown takes its control byte from the top bits and the
        // bucket from the low ones.
        let h = self.0;
        (h ^ (h >> 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (h >> 29)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_ne_bytes(w));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
}

impl StackHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// The distinct stacks of one device, stored flat.
#[derive(Debug, Default)]
pub(crate) struct StackInterner {
    index: HashMap<Box<[usize]>, RawStackId, BuildHasherDefault<StackHasher>>,
    offsets: Vec<u32>,
    ips: Vec<usize>,
}

impl StackInterner {
    /// The id of an equal stack already interned, or a new one. Returns [`NO_STACK`] when the
    /// table is full or host memory is short (the event is then recorded without a stack).
    pub fn intern(&mut self, ips: &[usize]) -> RawStackId {
        if let Some(&id) = self.index.get(ips) {
            return id;
        }
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        let id = (self.offsets.len() - 1) as RawStackId;
        // Ids with the high bit set belong to given stacks.
        if id >= GIVEN_BIT
            || self.ips.try_reserve(ips.len()).is_err()
            || self.offsets.try_reserve(1).is_err()
            || self.index.try_reserve(1).is_err()
        {
            return NO_STACK;
        }
        self.ips.extend_from_slice(ips);
        self.offsets.push(self.ips.len() as u32);
        self.index.insert(ips.into(), id);
        id
    }

    pub fn get(&self, id: RawStackId) -> &[usize] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&start), Some(&end)) => self.ips.get(start as usize..end as usize).unwrap_or(&[]),
            _ => &[],
        }
    }

    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }
}

/// Symbolises instruction pointers (innermost first) into frames, inlined frames expanded, and
/// trims the recorder's own frames from the top of the stack.
pub fn symbolize(ips: &[usize]) -> Vec<Frame> {
    static CACHE: OnceLock<Mutex<HashMap<usize, Arc<[Frame]>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut frames = Vec::with_capacity(ips.len());
    let mut cache = cache.lock();
    for &ip in ips {
        let resolved = cache
            .entry(ip)
            .or_insert_with(|| resolve_ip(ip).into())
            .clone();
        frames.extend(resolved.iter().cloned());
    }
    drop(cache);
    // Recorder frames form a prefix of at most a few frames (API entry, capture, unwinder;
    // inlined unwinder frames carry short names), so everything up to the last recorder frame
    // near the top goes.
    let internal = frames
        .iter()
        .take(TRIM_WINDOW)
        .rposition(is_recorder_internal)
        .map_or(0, |i| i + 1);
    frames.drain(..internal);
    frames
}

fn resolve_ip(ip: usize) -> Vec<Frame> {
    let mut out = Vec::new();
    backtrace::resolve(ip as *mut std::ffi::c_void, |symbol| {
        let name = symbol
            .name()
            .map(|n| symbol_display_name(&n))
            .unwrap_or_else(|| format!("{ip:#x}"));
        let filename = symbol
            .filename()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "??".to_owned());
        let line = symbol.lineno().map(i64::from).unwrap_or(0);
        out.push(Frame::new(name, filename, line));
    });
    if out.is_empty() {
        out.push(Frame::new(format!("{ip:#x}"), "??", 0));
    }
    out
}

/// A symbol as people read it: Rust and C++ (Itanium ABI) names demangled, as PyTorch shows
/// libtorch's frames (`at::detail::empty_cuda(...)`, not `_ZN2at6detail10empty_cuda...`).
fn symbol_display_name(name: &backtrace::SymbolName<'_>) -> String {
    format!("{name:#}")
}

/// How far from the top of a stack recorder frames are looked for.
const TRIM_WINDOW: usize = 24;

/// Frames of the recorder itself and of the unwinder, trimmed from the top of every stack.
/// Inlined frames carry short names (`malloc<...>`, `trace`), so the source file decides too.
fn is_recorder_internal(frame: &Frame) -> bool {
    const RECORDER_SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/");
    let name = frame.name.trim_start_matches('<');
    if name.contains("::tests::") {
        return false;
    }
    let file = frame.filename.as_str();
    name.starts_with("memsnap_recorder::")
        || name.starts_with("backtrace::")
        || file.starts_with(RECORDER_SRC)
        || file.starts_with("recorder/src/")
        || file.contains("/backtrace-0.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpp_frames_are_demangled_as_pytorch_shows_them() {
        // What a libtorch frame looked like in a snapshot recorded under torch 2.11 before
        // backtrace's C++ demangler was turned on.
        let mangled = backtrace::SymbolName::new(
            b"_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator8allocateEm",
        );
        assert_eq!(
            symbol_display_name(&mangled),
            "torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator::allocate(unsigned long)"
        );
        let rust = backtrace::SymbolName::new(b"_ZN4core3ptr13drop_in_place17h0123456789abcdefE");
        assert_eq!(symbol_display_name(&rust), "core::ptr::drop_in_place");
        assert_eq!(
            symbol_display_name(&backtrace::SymbolName::new(b"plain_c_function")),
            "plain_c_function"
        );
    }

    #[inline(never)]
    fn recurse(depth: usize, unwinder: Unwinder) -> CapturedStack {
        if depth == 0 {
            CapturedStack::capture(unwinder)
        } else {
            let s = recurse(depth - 1, unwinder);
            std::hint::black_box(depth);
            s
        }
    }

    #[test]
    fn interning_a_seen_stack_returns_the_same_id() {
        let mut t = StackInterner::default();
        let a = t.intern(&[1, 2, 3]);
        let b = t.intern(&[4, 5]);
        assert_eq!(t.intern(&[1, 2, 3]), a);
        assert_ne!(a, b);
        assert_eq!(t.get(b), &[4, 5]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(NO_STACK), &[] as &[usize]);
    }

    #[test]
    fn symbolize_trims_unwinder_and_recorder_frames() {
        // (That the innermost frame is then the caller is checked by the integration test
        // `snapshot::recorded_run_validates_and_has_symbolized_stacks`: here the caller itself
        // lives in the recorder's sources and is trimmed too.)
        let stack = recurse(3, Unwinder::Backtrace);
        assert!(stack.as_slice().len() >= 4);
        let frames = symbolize(stack.as_slice());
        assert!(!frames.is_empty());
        assert!(!is_recorder_internal(&frames[0]), "{:?}", frames[0]);
        assert!(!frames.iter().any(|f| f.name.starts_with("backtrace::")));
    }

    #[test]
    fn a_complete_walk_misses_nothing() {
        // DWARF sees two unwinder frames (100, 101) and the capture site (102) first.
        let unwound = [100, 101, 102, 1, 2, 3, 4, 5, 6];
        let check = FramePointerCheck::compare(&[7, 1, 2, 3, 4, 5, 6], &unwound);
        assert_eq!(
            check,
            FramePointerCheck {
                walked: 7,
                unwound: 6,
                missed: 0
            }
        );
        assert!(!check.host_lacks_frame_pointers());
    }

    #[test]
    fn a_walk_that_stops_early_misses_the_rest() {
        let unwound: Vec<usize> = (1..=20).collect();
        let check = FramePointerCheck::compare(&[1, 2, 3, 4, 5], &unwound);
        assert_eq!((check.unwound, check.missed), (20, 15));
        assert!(check.host_lacks_frame_pointers());
    }

    #[test]
    fn skipped_callers_count_as_missed() {
        // Frames 3 and 5 called into code without frame pointers; std's start-up frames
        // (19, 20) are beyond the walk: 4 missed, within the allowance.
        let unwound: Vec<usize> = (1..=20).collect();
        let walked: Vec<usize> = (1..=18).filter(|i| *i != 3 && *i != 5).collect();
        let check = FramePointerCheck::compare(&walked, &unwound);
        assert_eq!(check.missed, 4);
        assert!(!check.host_lacks_frame_pointers());
    }

    #[test]
    fn a_walk_with_no_frame_in_common_misses_everything() {
        let check = FramePointerCheck::compare(&[0xdead], &[1, 2, 3]);
        assert_eq!((check.walked, check.unwound, check.missed), (1, 3, 3));
        assert!(check.host_lacks_frame_pointers());
        let message = frame_pointer_warning(&check);
        assert!(message.contains("missed 3 of the 3 frames"), "{message}");
        assert!(message.contains("-fno-omit-frame-pointer"), "{message}");
    }

    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn cached_dwarf_unwinding_finds_the_return_addresses_the_backtrace_crate_finds() {
        #[inline(never)]
        fn both(depth: usize) -> (Vec<usize>, Vec<usize>) {
            if depth > 0 {
                let r = both(depth - 1);
                std::hint::black_box(depth);
                return r;
            }
            let mut ours = [0usize; MAX_FRAMES];
            let (pc, sp, bp) = dwarf::registers();
            let n = dwarf::walk(pc, sp, bp, &mut ours).expect("the cached walk did every frame");
            let mut theirs = [0usize; MAX_FRAMES];
            let m = backtrace_capture(&mut theirs);
            (ours[..n].to_vec(), theirs[..m].to_vec())
        }
        for _ in 0..3 {
            // Twice from the cache: the cached rules must give what computing them gave.
            let (ours, mut theirs) = both(6);
            // libgcc ends with the outermost frame's zero return address; the walk stops there.
            while theirs.last() == Some(&0) {
                theirs.pop();
            }
            // ours[0] is inside `both`; from its callers outwards both walks must agree.
            assert!(ours.len() >= 8, "{ours:x?}");
            assert!(
                theirs.ends_with(&ours[1..]),
                "cached: {ours:x?}\nbacktrace: {theirs:x?}"
            );
        }
        // A capture through the public path uses it too, and finds the recursion.
        let stack = recurse(5, Unwinder::Backtrace);
        assert!(stack.as_slice().len() >= 7);
    }

    #[test]
    fn frame_pointer_capture_never_crashes_and_falls_back() {
        // Without -C force-frame-pointers the walk may stop early; the capture then falls
        // back to DWARF unwinding and still finds the recursion.
        let stack = recurse(5, Unwinder::FramePointers);
        assert!(stack.as_slice().len() >= 2);
    }
}

//! DWARF unwinding with a rule cache per return address (x86-64 Linux): how a training
//! process without frame pointers (CPython, libtorch) gets complete native stacks at about
//! the cost of a frame-pointer walk.
//!
//! Unwinding a frame means finding where the caller's frame is: its canonical frame address
//! (CFA, the stack pointer before the call), its return address (at CFA − 8 on x86-64) and the
//! saved frame pointer. The `.eh_frame` call-frame information of the object that holds the
//! address says how, as a small program to evaluate. The `backtrace` crate (libgcc's
//! `_Unwind_Backtrace`) looks the object up, searches its FDE table and evaluates the program
//! for every frame of every capture: about 150 ns a frame, 5–10 µs for the 30–60 frames under
//! a PyTorch allocation. Here that work is done once per distinct address, and its result, a
//! [`Rule`] of three numbers, is kept in a per-thread table: a capture then costs a hash lookup
//! and two stack reads a frame, as PyTorch's own unwinder does.
//!
//! The loaded objects come from `dl_iterate_phdr`; their `.eh_frame_hdr`/`.eh_frame` are read
//! in place. The table is rebuilt whenever the loader's counts of loaded and unloaded objects
//! change (checked at every capture), so a library that `dlclose` removed is never read. Every
//! stack read is bounded by the thread's stack. A frame whose rule is not one of the simple
//! forms (a DWARF expression, a signal frame) ends the walk with `None`: the caller then
//! unwinds that capture with the `backtrace` crate, so stacks stay complete.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EndianSlice, LittleEndian, ParsedEhFrameHdr,
    RegisterRule, UnwindContext, UnwindSection, X86_64,
};
use parking_lot::RwLock;
use rustc_hash::FxHashMap;

use super::frame_pointers::thread_stack_top;

type Slice = EndianSlice<'static, LittleEndian>;

/// Addresses whose rule a thread remembers; past it the table starts over.
const MAX_CACHED_RULES: usize = 1 << 20;

/// How to find the caller's frame from a frame at a given address: CFA = (rsp or rbp) +
/// `cfa_offset`; the return address at CFA − 8; rbp restored from CFA + `rbp_offset` when set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rule {
    cfa_from_rbp: bool,
    cfa_offset: i32,
    rbp_offset: Option<i32>,
}

/// A rule lookup's outcome: a rule, the end of the stack, or a frame this unwinder cannot do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Rule(Rule),
    Outermost,
    Unsupported,
}

/// One loaded object's executable range and call-frame information.
struct Module {
    start: u64,
    end: u64,
    hdr: ParsedEhFrameHdr<Slice>,
    eh_frame: EhFrame<Slice>,
    bases: BaseAddresses,
}

/// The loaded objects, sorted by address, and the loader counts they were read at.
struct Modules {
    generation: u64,
    adds: u64,
    subs: u64,
    modules: Vec<Module>,
}

static MODULES: RwLock<Option<Arc<Modules>>> = RwLock::new(None);
static GENERATION: AtomicU64 = AtomicU64::new(1);

struct ThreadCache {
    generation: u64,
    rules: FxHashMap<u64, Step>,
    context: UnwindContext<usize>,
}

thread_local! {
    static CACHE: RefCell<ThreadCache> = RefCell::new(ThreadCache {
        generation: 0,
        rules: FxHashMap::default(),
        context: UnwindContext::new(),
    });
}

/// The loader's counts of objects loaded and unloaded so far.
fn loader_counts() -> (u64, u64) {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid `info` of `size` bytes; `data` is our tuple.
        unsafe {
            let out = &mut *data.cast::<(u64, u64)>();
            if size >= std::mem::size_of::<libc::dl_phdr_info>() {
                *out = ((*info).dlpi_adds, (*info).dlpi_subs);
            }
        }
        1 // stop after the first object: the counts are the same in every callback
    }
    let mut counts = (0u64, 0u64);
    // SAFETY: `first` only reads `info` and writes `counts`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut counts as *mut (u64, u64)).cast()) };
    counts
}

/// Reads every loaded object's executable range and `.eh_frame_hdr`.
fn read_modules(adds: u64, subs: u64) -> Modules {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid `info` whose program headers are mapped while the
        // callback runs; `data` is our Vec.
        unsafe {
            let modules = &mut *data.cast::<Vec<Module>>();
            if let Some(module) = module_of(&*info) {
                modules.push(module);
            }
        }
        0
    }
    let mut modules: Vec<Module> = Vec::new();
    // SAFETY: `each` reads the loader's structures and pushes to `modules`, which outlives
    // the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut modules as *mut Vec<Module>).cast()) };
    modules.sort_by_key(|m| m.start);
    Modules {
        generation: GENERATION.fetch_add(1, Ordering::Relaxed) + 1,
        adds,
        subs,
        modules,
    }
}

/// The module of one loaded object, when it has executable code and an `.eh_frame_hdr`.
///
/// # Safety
/// `info` is what `dl_iterate_phdr` passed: its program headers describe mapped memory.
unsafe fn module_of(info: &libc::dl_phdr_info) -> Option<Module> {
    if info.dlpi_phdr.is_null() || info.dlpi_phnum == 0 {
        return None;
    }
    // SAFETY: the loader's program header table of `dlpi_phnum` entries.
    let headers =
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let base = info.dlpi_addr;
    let mut text: Option<(u64, u64)> = None;
    let mut hdr_range: Option<(u64, u64)> = None;
    for h in headers {
        let start = base.wrapping_add(h.p_vaddr);
        let end = start.wrapping_add(h.p_memsz);
        match h.p_type {
            libc::PT_LOAD if h.p_flags & libc::PF_X != 0 => {
                text = Some(match text {
                    Some((s, e)) => (s.min(start), e.max(end)),
                    None => (start, end),
                })
            }
            libc::PT_GNU_EH_FRAME => hdr_range = Some((start, end)),
            _ => {}
        }
    }
    let ((start, end), (hdr_start, hdr_end)) = (text?, hdr_range?);
    // SAFETY: PT_GNU_EH_FRAME describes the mapped `.eh_frame_hdr` of this object.
    let hdr_bytes: &'static [u8] = unsafe {
        std::slice::from_raw_parts(hdr_start as *const u8, (hdr_end - hdr_start) as usize)
    };
    let bases = BaseAddresses::default()
        .set_eh_frame_hdr(hdr_start)
        .set_text(start);
    let hdr = EhFrameHdr::new(hdr_bytes, LittleEndian)
        .parse(&bases, 8)
        .ok()?;
    let eh_frame_start = match hdr.eh_frame_ptr() {
        gimli::Pointer::Direct(address) => address,
        gimli::Pointer::Indirect(_) => return None,
    };
    // `.eh_frame` ends with the loadable segment that holds it; the FDE table gives offsets
    // into it, so reading to the segment's end only makes the slice longer than needed.
    let segment_end = headers
        .iter()
        .filter(|h| h.p_type == libc::PT_LOAD)
        .map(|h| {
            let s = base.wrapping_add(h.p_vaddr);
            (s, s.wrapping_add(h.p_filesz.min(h.p_memsz)))
        })
        .find(|&(s, e)| s <= eh_frame_start && eh_frame_start < e)?
        .1;
    // SAFETY: [eh_frame_start, segment_end) lies inside a mapped loadable segment of the
    // object.
    let eh_frame_bytes: &'static [u8] = unsafe {
        std::slice::from_raw_parts(
            eh_frame_start as *const u8,
            (segment_end - eh_frame_start) as usize,
        )
    };
    let bases = bases.set_eh_frame(eh_frame_start);
    Some(Module {
        start,
        end,
        hdr,
        eh_frame: EhFrame::new(eh_frame_bytes, LittleEndian),
        bases,
    })
}

/// The current module table, rebuilt when the loader's counts changed since it was read.
fn modules() -> Arc<Modules> {
    let (adds, subs) = loader_counts();
    if let Some(current) = MODULES.read().as_ref() {
        if current.adds == adds && current.subs == subs {
            return Arc::clone(current);
        }
    }
    let mut slot = MODULES.write();
    if let Some(current) = slot.as_ref() {
        if current.adds == adds && current.subs == subs {
            return Arc::clone(current);
        }
    }
    let fresh = Arc::new(read_modules(adds, subs));
    *slot = Some(Arc::clone(&fresh));
    fresh
}

/// The rule for the frame at `address` (a return address minus one, or the first frame's
/// instruction address), from its module's call-frame information.
fn compute_rule(modules: &Modules, context: &mut UnwindContext<usize>, address: u64) -> Step {
    let i = modules.modules.partition_point(|m| m.start <= address);
    let Some(module) = i.checked_sub(1).map(|i| &modules.modules[i]) else {
        return Step::Unsupported;
    };
    if address >= module.end {
        return Step::Unsupported;
    }
    let Some(table) = module.hdr.table() else {
        return Step::Unsupported;
    };
    let row = match table.unwind_info_for_address(
        &module.eh_frame,
        &module.bases,
        context,
        address,
        EhFrame::cie_from_offset,
    ) {
        Ok(row) => row,
        Err(_) => return Step::Unsupported,
    };
    let (cfa_from_rbp, cfa_offset) = match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RSP => {
            (false, offset)
        }
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RBP => {
            (true, offset)
        }
        _ => return Step::Unsupported,
    };
    match row.register(X86_64::RA) {
        Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) => return Step::Outermost,
        _ => return Step::Unsupported,
    }
    let rbp_offset = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) | Some(RegisterRule::Undefined) => None,
        Some(RegisterRule::Offset(offset)) => match i32::try_from(offset) {
            Ok(offset) => Some(offset),
            Err(_) => return Step::Unsupported,
        },
        _ => return Step::Unsupported,
    };
    match i32::try_from(cfa_offset) {
        Ok(cfa_offset) => Step::Rule(Rule {
            cfa_from_rbp,
            cfa_offset,
            rbp_offset,
        }),
        Err(_) => Step::Unsupported,
    }
}

/// The current instruction address, stack pointer and frame pointer; inlined, so they are the
/// caller's.
#[inline(always)]
pub(super) fn registers() -> (u64, u64, u64) {
    let (pc, sp, bp): (u64, u64, u64);
    // SAFETY: copies three registers (and the address of this instruction); no memory is
    // touched.
    unsafe {
        std::arch::asm!(
            "lea {pc}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            pc = out(reg) pc,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    (pc, sp, bp)
}

/// Unwinds the stack from the given registers (the first frame's instruction address, stack
/// and frame pointers) into `out`, innermost first. `Some(frames)` when it reached the end of
/// the stack or filled `out`; `None` when a frame needs more than this unwinder does (the
/// caller unwinds with the `backtrace` crate instead).
pub(super) fn walk(pc: u64, sp: u64, bp: u64, out: &mut [usize]) -> Option<usize> {
    let top = thread_stack_top()? as u64;
    let modules = modules();
    CACHE
        .try_with(|cache| {
            let mut cache = cache.try_borrow_mut().ok()?;
            let cache = &mut *cache;
            if cache.generation != modules.generation || cache.rules.len() >= MAX_CACHED_RULES {
                cache.rules.clear();
                cache.generation = modules.generation;
            }
            let low = sp;
            let read = |address: u64| -> Option<u64> {
                if address < low || address.checked_add(8)? > top || !address.is_multiple_of(8) {
                    return None;
                }
                // SAFETY: `address` is 8-aligned and inside this thread's stack, between our
                // own frame and the stack's top, which is mapped for the thread's life.
                Some(unsafe { (address as *const u64).read() })
            };
            let (mut pc, mut sp, mut bp) = (pc, sp, bp);
            let mut n = 0;
            let mut first = true;
            while n < out.len() {
                out[n] = pc as usize;
                n += 1;
                // A return address points after the call; the call itself (one byte before)
                // is in the calling function, also when the call was its last instruction.
                let lookup = if first { pc } else { pc - 1 };
                first = false;
                let step = match cache.rules.get(&lookup) {
                    Some(&step) => step,
                    None => {
                        let step = compute_rule(&modules, &mut cache.context, lookup);
                        cache.rules.insert(lookup, step);
                        step
                    }
                };
                let rule = match step {
                    Step::Rule(rule) => rule,
                    Step::Outermost => return Some(n),
                    Step::Unsupported => return None,
                };
                let base = if rule.cfa_from_rbp { bp } else { sp };
                let cfa = base.checked_add_signed(i64::from(rule.cfa_offset))?;
                let return_address = read(cfa.checked_sub(8)?)?;
                if let Some(offset) = rule.rbp_offset {
                    bp = read(cfa.checked_add_signed(i64::from(offset))?)?;
                }
                if return_address == 0 {
                    return Some(n);
                }
                if cfa <= sp {
                    return None; // the stack must grow towards its top as we go out
                }
                sp = cfa;
                pc = return_address;
            }
            Some(n)
        })
        .ok()
        .flatten()
}

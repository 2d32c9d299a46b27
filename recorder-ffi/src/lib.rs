//! # memsnap-recorder-ffi: `libmemsnap_recorder.so` / `.a`
//!
//! The C ABI of memsnap's recorder, for C and C++ programs (`include/memsnap.h`), for Python
//! through ctypes and for PyTorch's `CUDAPluggableAllocator` (`python/memsnap_torch.py`). The
//! allocator, its history, stacks, devices and snapshots are the `memsnap-recorder` library;
//! this crate only adapts it to a process that loads a shared library:
//!
//! * [`abi`]: the exported `memsnap_*` functions (the pluggable-allocator pair and its hooks,
//!   history, dumps, statistics, `memsnap_last_error`).
//! * `error`: status codes, the thread's last error, and the guard every exported function
//!   runs in: a failure or a panic becomes a status and a message, never an unwind into C.
//! * `runtime`: the process-wide state (one allocator per device, created on first use), the
//!   dumps at exit, on out-of-memory and on `SIGUSR1` (`signal`).
//! * `exported`: the names of the exported functions, checked against `memsnap.h`; `runtime`
//!   reads them to trim the ABI's frames, so they sit below both `abi` and `runtime`.
//! * `env`: the `MEMSNAP_*` variables; `backend`: the device chosen at run time.
//! * `python`, `python_stacks`: Python frames of the calling thread (CPython's C API looked up
//!   at run time, never linked) and their log, spliced into the snapshot's native stacks.
//!
//! The library files keep the recorder's name, so this crate's library is called
//! `memsnap_recorder` and it depends on `memsnap-recorder` under the name `recorder`. It
//! builds no rlib: Rust programs use `memsnap-recorder` directly. See `README.md` for how to
//! build and link it and the environment it reads.

pub mod abi;
mod backend;
mod env;
mod error;
mod exported;
mod python;
mod python_stacks;
mod runtime;
mod signal;

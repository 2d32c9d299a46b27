//! Dump on `SIGUSR1` (`MEMSNAP_DUMP_ON_SIGUSR1=1`).
//!
//! A signal handler may only call async-signal-safe functions, and taking a snapshot locks and
//! allocates. So the handler writes one byte to a pipe, and a helper thread blocked on the
//! other end does the dump.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

/// Write end of the wake-up pipe; -1 until installed.
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_sigusr1(_signal: c_int) {
    let fd = WAKE_FD.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    // SAFETY: errno is thread-local; we restore it so the interrupted code sees no change.
    // write() on a non-blocking pipe is async-signal-safe; a full pipe (a dump is already
    // pending) just drops this byte.
    unsafe {
        let errno = *libc::__errno_location();
        let byte = 1u8;
        libc::write(fd, (&byte as *const u8).cast::<c_void>(), 1);
        *libc::__errno_location() = errno;
    }
}

/// Installs the handler and starts the helper thread that calls `dump` on every `SIGUSR1`.
/// Only the first call installs anything; later calls return its result.
///
/// Refuses when the process already handles `SIGUSR1`, so we never steal a host's handler.
pub fn install(dump: impl Fn() + Send + 'static) -> Result<(), String> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    let mut dump = Some(dump);
    INSTALLED
        .get_or_init(|| install_once(dump.take().expect("first call")))
        .clone()
}

fn install_once(dump: impl Fn() + Send + 'static) -> Result<(), String> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!(
            "cannot create a pipe: {}",
            std::io::Error::last_os_error()
        ));
    }
    let [read_fd, write_fd] = fds;
    // SAFETY: F_SETFL on a descriptor we own; the handler must never block on a full pipe.
    unsafe { libc::fcntl(write_fd, libc::F_SETFL, libc::O_NONBLOCK) };

    // SAFETY: a zeroed sigaction is a valid "no handler" value to be filled in below and by
    // sigaction(NULL, &old) for the query.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: querying the current disposition only.
    unsafe { libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut previous) };
    if previous.sa_sigaction != libc::SIG_DFL {
        // SAFETY: closing the descriptors we just created.
        unsafe {
            libc::close(read_fd);
            libc::close(write_fd);
        }
        return Err("SIGUSR1 already has a handler in this process; not replacing it".into());
    }

    WAKE_FD.store(write_fd, Ordering::Relaxed);
    std::thread::Builder::new()
        .name("memsnap-sigusr1".into())
        .spawn(move || loop {
            let mut byte = 0u8;
            // SAFETY: reads one byte into a local buffer from our own pipe.
            let n = unsafe { libc::read(read_fd, (&mut byte as *mut u8).cast::<c_void>(), 1) };
            match n {
                1 => {
                    // A failing dump must not end the helper thread (nor the process).
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&dump));
                }
                -1 if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {
                }
                _ => return,
            }
        })
        .map_err(|e| format!("cannot start the SIGUSR1 helper thread: {e}"))?;

    // SAFETY: a zeroed sigaction with our handler and an empty mask is a valid argument;
    // `on_sigusr1` only does async-signal-safe work.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigusr1 as extern "C" fn(c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()) != 0 {
            return Err(format!(
                "cannot install the SIGUSR1 handler: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

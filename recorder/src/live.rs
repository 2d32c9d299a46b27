//! Publishing the history while it is recorded (issue 26): [`CachingAllocator::serve_live`]
//! listens on a unix socket or a loopback TCP port and sends each listener the allocator's
//! state at connect, then the trace entries as they are recorded, in the protocol of
//! [`memsnap_format::live`] (length-prefixed msgpack, frames and stacks sent once per
//! connection).
//!
//! ## The allocator never waits for a listener
//!
//! Nothing is added to the allocation path: entries go into the history ring as they always
//! do, and each listener has a thread of its own that takes the device lock only to copy the
//! entries it has not sent yet (at most [`MAX_BATCH`] at a time) and the raw stacks they use,
//! then releases it, symbolises, encodes and writes. No lock is held across a socket write.
//! A listener that reads slowly only slows its own thread; when the ring (bounded by
//! `max_entries`) overwrote entries it had not sent, it gets a `Dropped` message with their
//! number and resumes at the oldest entry the ring still holds. With no listener the cost is
//! nothing at all; with one, one lock acquisition per poll ([`POLL`]) or per full batch (a
//! listener that caught up waits a poll before it looks again).
//! Annotations recorded since the last poll are copied under the same lock and sent first,
//! as an `Annotations` message. Entry and annotation numbers never restart (a
//! `clear_history` continues them), so a clear shows as entries `Dropped`, never as a
//! listener that stops receiving.
//!
//! ## Stacks kept beside the allocator
//!
//! A caller that records stacks of its own beside the allocator (the C ABI's Python stacks)
//! serves with [`serve_with_stacks`] and a [`LiveStacks`]: listeners then get the frames its
//! dump has. The state at connect goes through [`LiveStacks::state`], each batch's entries
//! through [`LiveStacks::extra`] (by their live numbers, outside the allocator's lock), and a
//! listener's stacks are keyed by (native stack, extra stack).
//!
//! ## The end of a run
//!
//! Dropping the [`LiveServer`] closes every connection within about 100 ms; what a listener
//! was not sent by then is lost to it. [`LiveServer::catch_up`] first waits, within a bound,
//! until every connected listener has been sent what was recorded (the C ABI does at exit).
//!
//! ## Safety of the endpoint
//!
//! A unix socket is created with mode 0600 and, by default ([`LiveAddr::parse`] of `"1"`), in
//! a private directory (mode 0700) under `$XDG_RUNTIME_DIR` or `/tmp` named after the pid.
//! TCP binds loopback addresses only, unless the endpoint has a token ([`serve_with_token`],
//! `MEMSNAP_LIVE_TOKEN` in the C ABI library): then any address may be bound, and each
//! listener must send the token first (the protocol's `Token` frame, compared in constant
//! time; a missing or wrong one gets `Refused` and the connection closed before any state).
//! Without a token, what listeners write is never read. A listener that goes away ends its
//! thread (writes use `MSG_NOSIGNAL`, so it gives an error, never a `SIGPIPE` to the host
//! process).

use std::collections::{HashMap, HashSet};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Deref;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memsnap_format::live::{
    self, EntryBatch, FrameReader, LiveAnnotation, LiveEntry, Message, MAX_TOKEN_FRAME_BYTES,
    PROTOCOL_VERSION,
};
use memsnap_format::{Action, Frame, PyInt};
use parking_lot::Mutex;

use crate::allocator::CachingAllocator;
pub use crate::allocator::LiveState;
use crate::device::Device;
use crate::stacks::{RawStackId, NO_STACK};

/// Most entries copied out of the ring per lock acquisition (and sent in one frame, about
/// 30 bytes each: well under [`live::MAX_FRAME_BYTES`]).
pub const MAX_BATCH: usize = 1 << 16;

/// How long a listener's thread sleeps when it has sent everything.
pub const POLL: Duration = Duration::from_millis(5);

/// Most listeners served at once (their threads); a connection over it is closed at once
/// and counted in [`LiveCounters::refused`].
pub const MAX_LISTENERS: usize = 64;

/// How long a listener has to send its token, when the endpoint has one.
pub const TOKEN_WAIT: Duration = Duration::from_secs(5);

/// What a listener without a token is told by an endpoint that has one.
const NEEDS_TOKEN: &str =
    "this recorder needs a token (memsnap watch --token, or MEMSNAP_LIVE_TOKEN)";

/// The shortest token accepted: a token is what keeps a network out of the endpoint.
pub const MIN_TOKEN_LEN: usize = 16;

/// What the layer that calls the allocator records beside it, for listeners to receive what
/// that layer's own dump holds. The C ABI keeps the Python stack of each of its calls in a log
/// of its own and splices it into the native frames when it writes a snapshot (and trims its
/// own frames off them); through this, listeners get the same frames.
///
/// Called from listeners' threads, never with the allocator's lock held.
pub trait LiveStacks: Send + Sync {
    /// The state a listener starts from. `take` builds it under the allocator's lock; the
    /// implementation calls it while holding what keeps its own records in step with the
    /// allocator's trace, then edits the snapshot as its dump would.
    fn state(&self, take: &mut dyn FnMut() -> LiveState) -> LiveState;

    /// For each of `entries` (action and address, numbered from `first_seq` as the live
    /// stream numbers them), the id of the stack it recorded beside the allocator, if any.
    fn extra(&self, device: i64, first_seq: u64, entries: &[(Action, u64)]) -> Vec<Option<u32>>;

    /// The frames a listener gets for native frames `native` and the stack `extra` of
    /// [`LiveStacks::extra`].
    fn frames(&self, native: Vec<Frame>, extra: Option<u32>) -> Vec<Frame>;
}

/// Where to listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveAddr {
    /// A unix socket at this path; `private_dir` is the directory memsnap made for it (and
    /// removes with it).
    Unix {
        path: PathBuf,
        private_dir: Option<PathBuf>,
    },
    /// A TCP address (port 0 picks a free one); not loopback only with a token.
    Tcp(SocketAddr),
}

/// Why the live endpoint could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error("live address {addr:?}: {what} (expected unix:/path.sock, tcp:127.0.0.1:PORT or 1)")]
    Address { addr: String, what: String },
    #[error("live endpoint {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl LiveAddr {
    /// Parses `unix:/path.sock`, `tcp:IP:PORT` or `1` (a unix socket `live.sock` in a new
    /// private directory `memsnap-live-<pid>` under `$XDG_RUNTIME_DIR`, else `/tmp`). A TCP
    /// address that is not loopback is served only with a token ([`serve_with_token`]).
    pub fn parse(addr: &str) -> Result<Self, ServeError> {
        let bad = |what: &str| ServeError::Address {
            addr: addr.to_owned(),
            what: what.to_owned(),
        };
        if addr == "1" {
            let base = std::env::var_os("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .filter(|p| p.is_dir())
                .unwrap_or_else(|| PathBuf::from("/tmp"));
            let dir = base.join(format!("memsnap-live-{}", std::process::id()));
            return Ok(LiveAddr::Unix {
                path: dir.join("live.sock"),
                private_dir: Some(dir),
            });
        }
        if let Some(path) = addr.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(bad("empty socket path"));
            }
            return Ok(LiveAddr::Unix {
                path: PathBuf::from(path),
                private_dir: None,
            });
        }
        if let Some(tcp) = addr.strip_prefix("tcp:") {
            let sa: SocketAddr = tcp.parse().map_err(|_| bad("not an IP address and port"))?;
            return Ok(LiveAddr::Tcp(sa));
        }
        Err(bad("unknown scheme"))
    }

    /// The address as `memsnap watch` takes it (`unix:/path` or `tcp:IP:PORT`).
    pub fn url(&self) -> String {
        match self {
            LiveAddr::Unix { path, .. } => format!("unix:{}", path.display()),
            LiveAddr::Tcp(sa) => format!("tcp:{sa}"),
        }
    }

    /// The address of device `device`'s endpoint when one address names all of a process's
    /// (`MEMSNAP_LIVE` in a process that uses several devices; the protocol carries one
    /// device per connection): device 0 gets this address, device `d` gets a socket
    /// `<path>.d`, a private directory `memsnap-live-<pid>-<d>` for the default, or TCP port
    /// `PORT + d` (port 0 stays 0: a free port for each). `None` when the port would overflow.
    pub fn for_device(&self, device: usize) -> Option<LiveAddr> {
        if device == 0 {
            return Some(self.clone());
        }
        match self {
            LiveAddr::Unix {
                path,
                private_dir: Some(dir),
            } => {
                let mut name = dir.file_name()?.to_owned();
                name.push(format!("-{device}"));
                let dir = dir.with_file_name(name);
                Some(LiveAddr::Unix {
                    path: dir.join(path.file_name()?),
                    private_dir: Some(dir),
                })
            }
            LiveAddr::Unix {
                path,
                private_dir: None,
            } => {
                let mut name = path.clone().into_os_string();
                name.push(format!(".{device}"));
                Some(LiveAddr::Unix {
                    path: PathBuf::from(name),
                    private_dir: None,
                })
            }
            LiveAddr::Tcp(sa) => {
                let mut sa = *sa;
                if sa.port() != 0 {
                    sa.set_port(u16::try_from(usize::from(sa.port()) + device).ok()?);
                }
                Some(LiveAddr::Tcp(sa))
            }
        }
    }
}

enum AnyListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

enum AnyStream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl AnyStream {
    fn set_write_timeout(&self, t: Duration) -> std::io::Result<()> {
        match self {
            AnyStream::Unix(s) => s.set_write_timeout(Some(t)),
            AnyStream::Tcp(s) => s.set_write_timeout(Some(t)),
        }
    }
    fn set_read_timeout(&self, t: Duration) -> std::io::Result<()> {
        match self {
            AnyStream::Unix(s) => s.set_read_timeout(Some(t)),
            AnyStream::Tcp(s) => s.set_read_timeout(Some(t)),
        }
    }
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::io::Read;
        match self {
            AnyStream::Unix(s) => s.read(buf),
            AnyStream::Tcp(s) => s.read(buf),
        }
    }
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match self {
            AnyStream::Unix(s) => s.set_nonblocking(on),
            AnyStream::Tcp(s) => s.set_nonblocking(on),
        }
    }
    /// Writes with `MSG_NOSIGNAL`: a listener that went away must give `EPIPE`, not the
    /// `SIGPIPE` that kills a host process that did not ignore it (a C or C++ program using
    /// the C ABI library; Rust and Python programs ignore it already). The one `unsafe` call
    /// of this module.
    #[allow(unsafe_code)]
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        let fd = match self {
            AnyStream::Unix(s) => s.as_raw_fd(),
            AnyStream::Tcp(s) => s.as_raw_fd(),
        };
        // SAFETY: `fd` is the open socket this stream owns for the whole call, and the
        // pointer and length are those of a live slice that `send` only reads.
        let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

/// Counters of a live endpoint (all listeners together).
#[derive(Debug, Default)]
pub struct LiveCounters {
    /// Listeners accepted.
    pub connections: AtomicU64,
    /// Entries sent (in a state's trace or in batches).
    pub entries_sent: AtomicU64,
    /// Entries reported dropped to slow listeners.
    pub entries_dropped: AtomicU64,
    /// Listeners refused: a missing or wrong token, or [`MAX_LISTENERS`] served already.
    pub refused: AtomicU64,
}

/// The listeners' threads, each with the number of the next entry it will send.
type Listeners = Arc<Mutex<Vec<(JoinHandle<()>, Arc<AtomicU64>)>>>;

/// A running live endpoint; dropping it stops accepting, ends every listener's thread
/// (within about 100 ms) and removes the socket (and the private directory memsnap made).
/// What a listener has not been sent by then is lost to it: [`LiveServer::catch_up`] first
/// lets it have the end of the run.
pub struct LiveServer {
    addr: LiveAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    threads: Listeners,
    counters: Arc<LiveCounters>,
    /// The live number of the allocator's next entry.
    recorded: Box<dyn Fn() -> u64 + Send + Sync>,
}

impl LiveServer {
    /// The address served (with the port chosen when port 0 was asked).
    pub fn addr(&self) -> &LiveAddr {
        &self.addr
    }

    /// The address as `memsnap watch` takes it (`unix:/path` or `tcp:127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        self.addr.url()
    }

    pub fn counters(&self) -> &LiveCounters {
        &self.counters
    }

    /// Waits until every connected listener has been sent the entries recorded by now, or
    /// `within` has passed; returns whether they all were. For the end of a run (the C ABI
    /// calls it at exit, at most 2 s): dropping the server without it loses what listeners
    /// were not sent yet (up to a poll's entries, more for one that fell behind). The
    /// allocator goes on meanwhile; a listener that stopped reading costs the whole `within`.
    pub fn catch_up(&self, within: Duration) -> bool {
        let target = (self.recorded)();
        let deadline = Instant::now() + within;
        loop {
            let behind = self
                .threads
                .lock()
                .iter()
                .any(|(t, next)| !t.is_finished() && next.load(Ordering::Relaxed) < target);
            if !behind {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for LiveServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        for (t, _) in std::mem::take(&mut *self.threads.lock()) {
            let _ = t.join();
        }
        if let LiveAddr::Unix { path, private_dir } = &self.addr {
            let _ = std::fs::remove_file(path);
            if let Some(dir) = private_dir {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

impl<D: Device> CachingAllocator<D> {
    /// Publishes this allocator's history at `addr` (see [`LiveAddr::parse`]) until the
    /// returned server is dropped. History must be on for entries to flow.
    pub fn serve_live(self: &Arc<Self>, addr: &str) -> Result<LiveServer, ServeError> {
        serve(self.clone(), LiveAddr::parse(addr)?)
    }

    /// [`CachingAllocator::serve_live`] where each listener must send `token` first (see
    /// [`serve_with_token`]); any TCP address may then be bound.
    pub fn serve_live_with_token(
        self: &Arc<Self>,
        addr: &str,
        token: &str,
    ) -> Result<LiveServer, ServeError> {
        serve_with_token(self.clone(), LiveAddr::parse(addr)?, Some(token.to_owned()))
    }
}

/// [`CachingAllocator::serve_live`] for any owner of the allocator (an `Arc`, or a
/// `&'static` one from a `OnceLock`). Loopback TCP addresses only.
pub fn serve<A, D>(alloc: A, addr: LiveAddr) -> Result<LiveServer, ServeError>
where
    A: Deref<Target = CachingAllocator<D>> + Clone + Send + 'static,
    D: Device,
{
    serve_with_token(alloc, addr, None)
}

/// [`serve`], with a token each listener must send first (at least [`MIN_TOKEN_LEN`]
/// bytes; compared in constant time; a listener without it gets `Refused`). A TCP address
/// that is not loopback is refused without a token: the token is the explicit opt-in to
/// publishing the history to a network.
pub fn serve_with_token<A, D>(
    alloc: A,
    addr: LiveAddr,
    token: Option<String>,
) -> Result<LiveServer, ServeError>
where
    A: Deref<Target = CachingAllocator<D>> + Clone + Send + 'static,
    D: Device,
{
    serve_with_stacks(alloc, addr, token, None)
}

/// [`serve_with_token`], with the frames of `stacks` spliced into what listeners receive
/// (the C ABI's Python frames; see [`LiveStacks`]).
pub fn serve_with_stacks<A, D>(
    alloc: A,
    addr: LiveAddr,
    token: Option<String>,
    stacks: Option<Arc<dyn LiveStacks>>,
) -> Result<LiveServer, ServeError>
where
    A: Deref<Target = CachingAllocator<D>> + Clone + Send + 'static,
    D: Device,
{
    if let LiveAddr::Tcp(sa) = &addr {
        if token.is_none() && !sa.ip().is_loopback() {
            return Err(ServeError::Address {
                addr: addr.url(),
                what: "a non-loopback address is served only with a token (MEMSNAP_LIVE_TOKEN)"
                    .into(),
            });
        }
    }
    if let Some(t) = &token {
        if t.len() < MIN_TOKEN_LEN {
            return Err(ServeError::Address {
                addr: addr.url(),
                what: format!(
                    "the token has {} bytes; at least {MIN_TOKEN_LEN} are needed",
                    t.len()
                ),
            });
        }
    }
    let token: Option<Arc<str>> = token.map(Arc::from);
    let io = |what: String| move |source| ServeError::Io { what, source };
    let (listener, addr) = match addr {
        LiveAddr::Unix { path, private_dir } => {
            if let Some(dir) = &private_dir {
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(dir)
                    .map_err(io(format!("creating {}", dir.display())))?;
            }
            // The socket is made 0600 right after the bind; in the default private
            // directory (0700) nobody else can reach it even in between.
            let bound = UnixListener::bind(&path);
            let l = bound.map_err(io(format!("binding {}", path.display())))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(io(format!("chmod {}", path.display())))?;
            (AnyListener::Unix(l), LiveAddr::Unix { path, private_dir })
        }
        LiveAddr::Tcp(sa) => {
            let l = TcpListener::bind(sa).map_err(io(format!("binding {sa}")))?;
            let local = l.local_addr().map_err(io("local address".into()))?;
            (AnyListener::Tcp(l), LiveAddr::Tcp(local))
        }
    };
    match &listener {
        AnyListener::Unix(l) => l.set_nonblocking(true),
        AnyListener::Tcp(l) => l.set_nonblocking(true),
    }
    .map_err(io("set_nonblocking".into()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Listeners = Arc::default();
    let counters: Arc<LiveCounters> = Arc::default();
    let recorded: Box<dyn Fn() -> u64 + Send + Sync> = {
        // In a mutex: the owner is `Send` but need not be `Sync`.
        let alloc = Mutex::new(alloc.clone());
        Box::new(move || alloc.lock().live_entries())
    };
    let accept = {
        let (stop, threads, counters) = (stop.clone(), threads.clone(), counters.clone());
        std::thread::Builder::new()
            .name("memsnap-live".into())
            .spawn(move || accept_loop(alloc, listener, stop, threads, counters, token, stacks))
            .map_err(io("starting its thread".into()))?
    };
    Ok(LiveServer {
        addr,
        stop,
        accept: Some(accept),
        threads,
        counters,
        recorded,
    })
}

fn accept_loop<A, D>(
    alloc: A,
    listener: AnyListener,
    stop: Arc<AtomicBool>,
    threads: Listeners,
    counters: Arc<LiveCounters>,
    token: Option<Arc<str>>,
    stacks: Option<Arc<dyn LiveStacks>>,
) where
    A: Deref<Target = CachingAllocator<D>> + Clone + Send + 'static,
    D: Device,
{
    while !stop.load(Ordering::Relaxed) {
        let accepted = match &listener {
            AnyListener::Unix(l) => l.accept().map(|(s, _)| AnyStream::Unix(s)),
            AnyListener::Tcp(l) => l.accept().map(|(s, _)| AnyStream::Tcp(s)),
        };
        match accepted {
            Ok(stream) => {
                counters.connections.fetch_add(1, Ordering::Relaxed);
                {
                    // A bound on the threads: an endpoint open to a network could otherwise
                    // be made to start one per connection attempt (each waits for a token
                    // up to TOKEN_WAIT). Over it, the connection is closed at once.
                    let mut threads = threads.lock();
                    threads.retain(|(t, _)| !t.is_finished());
                    if threads.len() >= MAX_LISTENERS {
                        counters.refused.fetch_add(1, Ordering::Relaxed);
                        drop(stream);
                        continue;
                    }
                }
                let (alloc, stop, counters) = (alloc.clone(), stop.clone(), counters.clone());
                let (token, stacks) = (token.clone(), stacks.clone());
                let next = Arc::new(AtomicU64::new(0));
                let progress = next.clone();
                let spawned = std::thread::Builder::new()
                    .name("memsnap-live-listener".into())
                    .spawn(move || {
                        // A listener's failure (it went away) ends its thread only.
                        let listener = Listener::new(stream, stop, counters, stacks, progress);
                        let _ = listener.run(&*alloc, token);
                    });
                if let Ok(handle) = spawned {
                    let mut threads = threads.lock();
                    threads.retain(|(t, _)| !t.is_finished());
                    threads.push((handle, next));
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL * 4),
            Err(_) => std::thread::sleep(POLL * 4),
        }
    }
}

/// One listener's connection: what it has been sent.
struct Listener {
    stream: AnyStream,
    stop: Arc<AtomicBool>,
    counters: Arc<LiveCounters>,
    /// What the caller records beside the allocator (see [`LiveStacks`]).
    extra: Option<Arc<dyn LiveStacks>>,
    /// (raw stack, extra stack) → wire id.
    stacks: HashMap<(RawStackId, Option<u32>), u32>,
    /// The raw stacks symbolised already (never again for this listener).
    symbolised: HashSet<RawStackId>,
    /// Their frames: kept only with `extra`, where a raw stack may be sent again beside
    /// another extra stack; without it each is sent in the batch that brought it, and the
    /// frames are dropped after it.
    native: HashMap<RawStackId, Arc<[Frame]>>,
    /// The extra stack of each `free_requested` not completed yet, by address: its
    /// `free_completed` gets it too (as in the C ABI's dump).
    freeing: HashMap<u64, u32>,
    /// The number of the next entry to send, for [`LiveServer::catch_up`].
    progress: Arc<AtomicU64>,
    /// Frame → wire id (frames with extra keys are not shared: they are rare, and `Value`
    /// has no `Hash`).
    frames: HashMap<(String, String, PyInt), u32>,
    frames_sent: u32,
    buf: Vec<u8>,
}

impl Listener {
    fn new(
        stream: AnyStream,
        stop: Arc<AtomicBool>,
        counters: Arc<LiveCounters>,
        extra: Option<Arc<dyn LiveStacks>>,
        progress: Arc<AtomicU64>,
    ) -> Self {
        Listener {
            stream,
            stop,
            counters,
            extra,
            stacks: HashMap::new(),
            symbolised: HashSet::new(),
            native: HashMap::new(),
            freeing: HashMap::new(),
            progress,
            frames: HashMap::new(),
            frames_sent: 0,
            buf: Vec::new(),
        }
    }

    fn run<D: Device>(
        mut self,
        alloc: &CachingAllocator<D>,
        token: Option<Arc<str>>,
    ) -> std::io::Result<()> {
        self.stream.set_nonblocking(false)?;
        // Writes wake up now and then to see whether the server is being dropped.
        self.stream.set_write_timeout(Duration::from_millis(100))?;
        // Hello first in any case: a reader of another version stops there, naming it.
        self.send(&Message::Hello {
            protocol: PROTOCOL_VERSION,
            producer: concat!("memsnap-recorder ", env!("CARGO_PKG_VERSION")).to_owned(),
            device: alloc.device_index(),
        })?;
        if let Some(expected) = token {
            if let Err(reason) = self.read_token(&expected)? {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                self.send(&Message::Refused {
                    reason: reason.to_owned(),
                })?;
                return Ok(());
            }
        }
        let mut take = || alloc.live_state();
        let LiveState {
            snapshot: state,
            next_seq: mut seq,
            next_annotation: mut annotation_seq,
        } = match &self.extra {
            Some(extra) => extra.state(&mut take),
            None => take(),
        };
        let in_state = state
            .traces()
            .get(usize::try_from(alloc.device_index()).unwrap_or(0))
            .map_or(0, Vec::len) as u64;
        let bytes = memsnap_format::msgpack::to_vec(&state).map_err(std::io::Error::other)?;
        drop(state);
        self.send(&Message::State {
            snapshot: live::Bytes(bytes),
            next_seq: seq,
        })?;
        self.counters
            .entries_sent
            .fetch_add(in_state, Ordering::Relaxed);
        self.progress.store(seq, Ordering::Relaxed);
        while !self.stop.load(Ordering::Relaxed) {
            let mut tail = alloc.live_tail(seq, annotation_seq, MAX_BATCH, &self.symbolised);
            if !tail.annotations.is_empty() || tail.first_annotation_seq > annotation_seq {
                let missed = tail.first_annotation_seq - annotation_seq;
                let annotations = tail
                    .annotations
                    .iter()
                    .map(|a| LiveAnnotation {
                        time_us: tail.time_us(a.time_ns),
                        metadata: a.metadata.clone(),
                    })
                    .collect::<Vec<_>>();
                annotation_seq = tail.first_annotation_seq + annotations.len() as u64;
                self.send(&Message::Annotations {
                    missed,
                    annotations,
                })?;
            }
            if tail.first_seq > seq {
                let missed = tail.first_seq - seq;
                self.counters
                    .entries_dropped
                    .fetch_add(missed, Ordering::Relaxed);
                self.send(&Message::Dropped {
                    missed,
                    resume_seq: tail.first_seq,
                })?;
                seq = tail.first_seq;
                self.progress.store(seq, Ordering::Relaxed);
            }
            if tail.entries.is_empty() {
                self.drain();
                std::thread::sleep(POLL);
                continue;
            }
            let mut batch = EntryBatch {
                first_seq: seq,
                ..Default::default()
            };
            for (raw, frames) in std::mem::take(&mut tail.new_stacks) {
                self.symbolised.insert(raw);
                self.native.insert(raw, frames.into());
            }
            let extras = match &self.extra {
                Some(extra) => {
                    let keys: Vec<(Action, u64)> =
                        tail.entries.iter().map(|e| (e.action, e.addr)).collect();
                    let mut extras = extra.extra(alloc.device_index(), seq, &keys);
                    extras.resize(keys.len(), None);
                    for (e, x) in tail.entries.iter().zip(&mut extras) {
                        match e.action {
                            Action::FreeRequested => match *x {
                                Some(id) => self.freeing.insert(e.addr, id),
                                None => self.freeing.remove(&e.addr),
                            },
                            Action::FreeCompleted => {
                                *x = self.freeing.remove(&e.addr);
                                None
                            }
                            _ => None,
                        };
                    }
                    extras
                }
                None => vec![None; tail.entries.len()],
            };
            let entries = tail
                .entries
                .iter()
                .zip(extras)
                .map(|(e, extra)| LiveEntry {
                    action: live::action_tag(e.action).unwrap_or(0),
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream,
                    time_us: tail.time_us(e.time_ns),
                    stack: self.stack_id(e.stack, extra, &mut batch),
                })
                .collect();
            batch.entries = entries;
            if self.extra.is_none() {
                // Every stack this batch brought was sent in it, under its one key.
                self.native.clear();
            }
            let n = batch.entries.len() as u64;
            self.send(&Message::Entries(batch))?;
            self.counters.entries_sent.fetch_add(n, Ordering::Relaxed);
            seq += n;
            self.progress.store(seq, Ordering::Relaxed);
            if n < MAX_BATCH as u64 {
                // Caught up: wait for more rather than take the locks again for a few
                // entries (a busy allocator would otherwise meet this thread at its lock
                // after every handful of entries; batches of one poll are also cheaper to
                // send and to apply).
                std::thread::sleep(POLL);
            }
        }
        self.drain();
        Ok(())
    }

    /// Reads and discards what the listener wrote (its `Token` frame, at most 64 KiB per
    /// call), without waiting: a socket closed with unread bytes resets the connection, and
    /// the listener would get an error instead of the end of the stream (and over TCP could
    /// lose what it had not read yet).
    fn drain(&mut self) {
        if self.stream.set_nonblocking(true).is_err() {
            return;
        }
        let mut buf = [0u8; 4096];
        for _ in 0..16 {
            match self.stream.read(&mut buf) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        let _ = self.stream.set_nonblocking(false);
    }

    /// Reads the listener's `Token` frame (at most [`MAX_TOKEN_FRAME_BYTES`], within
    /// [`TOKEN_WAIT`]) and compares it with `expected` in constant time; `Err` with the
    /// reason the listener is told when it is missing or wrong. Before the token matched,
    /// nothing of the history is sent, and at most 4 KiB are read.
    fn read_token(&mut self, expected: &str) -> std::io::Result<Result<(), &'static str>> {
        self.stream.set_read_timeout(Duration::from_millis(100))?;
        let deadline = Instant::now() + TOKEN_WAIT;
        let mut reader = FrameReader::new();
        let mut buf = [0u8; 512];
        let mut read = 0usize;
        loop {
            match reader.next_message() {
                Ok(Some(Message::Token { token })) => {
                    return Ok(
                        if live::token_matches(token.as_bytes(), expected.as_bytes()) {
                            Ok(())
                        } else if token.is_empty() {
                            Err(NEEDS_TOKEN)
                        } else {
                            Err("wrong token")
                        },
                    );
                }
                Ok(Some(_)) | Err(_) => {
                    return Ok(Err("the first frame of a listener must be its Token"))
                }
                Ok(None) => {}
            }
            if read > MAX_TOKEN_FRAME_BYTES as usize + 4 {
                return Ok(Err("the token frame is too long"));
            }
            if self.stop.load(Ordering::Relaxed) {
                return Err(ErrorKind::Interrupted.into());
            }
            if Instant::now() >= deadline {
                return Ok(Err(
                    "no token was sent in time (memsnap watch --token, or MEMSNAP_LIVE_TOKEN)",
                ));
            }
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    read += n;
                    reader.push(&buf[..n]);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The wire id of the stack of an entry with raw stack `raw` and extra stack `extra`,
    /// added to `batch` the first time; `None` for an entry with neither.
    fn stack_id(
        &mut self,
        raw: RawStackId,
        extra: Option<u32>,
        batch: &mut EntryBatch,
    ) -> Option<u32> {
        if raw == NO_STACK && extra.is_none() {
            return None;
        }
        if let Some(&id) = self.stacks.get(&(raw, extra)) {
            return Some(id);
        }
        let native: Vec<Frame> = self
            .native
            .get(&raw)
            .map(|f| f.to_vec())
            .unwrap_or_default();
        let frames = match &self.extra {
            Some(stacks) => stacks.frames(native, extra),
            None => native,
        };
        let wire: Vec<u32> = frames.iter().map(|f| self.frame_id(f, batch)).collect();
        let id = self.stacks.len() as u32;
        self.stacks.insert((raw, extra), id);
        batch.stacks.push(wire);
        Some(id)
    }

    fn frame_id(&mut self, frame: &Frame, batch: &mut EntryBatch) -> u32 {
        let key = (
            frame.name.clone(),
            frame.filename.clone(),
            frame.line.clone(),
        );
        if frame.extra.is_empty() {
            if let Some(&id) = self.frames.get(&key) {
                return id;
            }
        }
        let id = self.frames_sent;
        self.frames_sent += 1;
        batch.frames.push(frame.clone());
        if frame.extra.is_empty() {
            self.frames.insert(key, id);
        }
        id
    }

    /// Writes one message; a write that times out is retried until the server stops.
    fn send(&mut self, message: &Message) -> std::io::Result<()> {
        self.buf.clear();
        live::encode(message, &mut self.buf).map_err(std::io::Error::other)?;
        let mut at = 0;
        while at < self.buf.len() {
            if self.stop.load(Ordering::Relaxed) {
                return Err(ErrorKind::Interrupted.into());
            }
            match self.stream.write(&self.buf[at..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => at += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

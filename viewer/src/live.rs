//! Attaching to a live recording (issue 26), free of UI: a receiver reads a recorder's live
//! stream (`CachingAllocator::serve_live`, the protocol of [`memsnap_format::live`]), rebuilds
//! the snapshot as entries arrive, and now and then makes a normal [`Document`] of it, which
//! the window shows like any opened file (steps, phases, filter, hover and pin included).
//!
//! ## From the socket to the picture
//!
//! 1. [`LiveSession::start`] runs `receive` in a [`Job`] (the one way the viewer works off
//!    the UI thread; this job runs as long as the connection does, its result is how the
//!    connection ended, and its cancel flag is the Detach button). The receiver reads the
//!    socket with a short timeout, splits the bytes with [`FrameReader`] and applies each
//!    message to a [`LiveSnapshot`].
//! 2. Every [`STATUS_INTERVAL`] while something changes it publishes a [`LiveStatus`]
//!    (entries received, dropped, rebuilds) and the [`LiveTail`] (the entries after the
//!    newest document, as the running change of active bytes: O(1) amortised per entry) to
//!    [`Shared`] and asks the window to redraw: the counts and the timeline's line past the
//!    document move at 20 updates a second whatever the size of the run, and an idle
//!    connection asks for nothing.
//! 3. When a rebuild is due ([`Pacer`]) and entries arrived since the last one, it merges
//!    what was received into one [`Snapshot`] ([`merge`]: O(n) for n entries received) and
//!    starts a second job that runs [`Document::prepare`] on it (the loader's own step: the
//!    replay, curves and drawing indexes, O(n log n)); the document's steps and profiles
//!    then follow in its own background jobs, as for a file. The finished document is put in
//!    the [`Shared`] slot (its tail restarts after its last entry, with what arrived while it
//!    was built), and the UI takes it with [`LiveSession::take_document`] (unless the
//!    view is paused: then it stays there, and resuming shows the newest).
//! 4. Rebuilds are bounded: one at a time, at most one per [`MIN_REBUILD_INTERVAL`], and
//!    never sooner than [`BACKOFF`] times the last rebuild's duration after it ended, so with
//!    millions of entries the rebuilds take at most a fifth of one core and the receiver
//!    keeps reading (it never waits for a rebuild).
//! 5. When the connection ends (the recorder closed it, a refused stream, Detach), the
//!    receiver builds a last document from everything received, publishes it and returns an
//!    [`Ended`]: the snapshot received, the next sequence number and the reason. Nothing
//!    received is lost on a disconnect.
//!
//! ## Reattaching
//!
//! A new connection starts with `Hello` and `State` again: the state's trace is the
//! recorder's ring, entries numbered `next_seq - len .. next_seq` (the protocol's sequence
//! numbers). [`LiveSession::reattach`] carries the snapshot received so far ([`Received`])
//! into the new receiver; [`merge`] keeps every entry received before and appends only the
//! new connection's entries numbered from the old `next_seq` on, so no entry is repeated.
//! Entries the ring overwrote while nobody listened are counted as dropped. Segments are
//! those of the newest state (the allocator's state at the last connect). A recorder whose
//! state starts below the old `next_seq` (a new process on the same socket) is another
//! recording: the reattach refuses it and keeps what was received.

use std::collections::HashMap;
use std::io::Read;
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memsnap_format::io::Detected;
use memsnap_format::live::{Applied, FrameReader, LiveSnapshot};
use memsnap_format::{Compression, Format, Snapshot, StackId, StrId, TraceEntry};

use crate::document::{Document, DocumentError};
use crate::job::{Job, JobError, Progress};
use crate::live_tail::LiveTail;
use crate::loader::LoadedSnapshot;

/// The least time between the starts of two rebuilds.
pub const MIN_REBUILD_INTERVAL: Duration = Duration::from_millis(100);

/// After a rebuild that took `d`, the next starts no sooner than `BACKOFF * d` after it ended.
pub const BACKOFF: u32 = 4;

/// How often the counts are published while bytes arrive.
pub const STATUS_INTERVAL: Duration = Duration::from_millis(50);

/// How long one read waits for bytes before the receiver looks at its flags and rebuilds.
const READ_TIMEOUT: Duration = Duration::from_millis(20);

/// When the next rebuild may start: one at a time, at most one per [`MIN_REBUILD_INTERVAL`],
/// and no sooner than [`BACKOFF`] times the last one's duration after it ended. O(1).
#[derive(Clone, Copy, Debug, Default)]
pub struct Pacer {
    /// When the last rebuild started and when it ended (`None` while it runs).
    last: Option<(Instant, Option<Instant>)>,
}

impl Pacer {
    /// Whether a rebuild may start at `now`.
    pub fn due(&self, now: Instant) -> bool {
        match self.last {
            None => true,
            Some((_, None)) => false,
            Some((started, Some(ended))) => now >= self.next_start(started, ended),
        }
    }

    /// Whether a rebuild may start at `now` when no entry arrived for `quiet`. The backoff
    /// spaces rebuilds while entries stream in (each is stale soon, and a rebuild of 10M
    /// entries takes a second of a core); once the stream has been quiet for
    /// [`MIN_REBUILD_INTERVAL`] the rebuild that shows everything starts without it (at 10M
    /// entries the last picture came 6 s after the recording ended, the backoff's 4 s
    /// after a 1.1 s rebuild, plus that rebuild). O(1).
    pub fn due_quiet(&self, now: Instant, quiet: Duration) -> bool {
        match self.last {
            None => true,
            Some((_, None)) => false,
            Some((started, Some(_))) => {
                quiet >= MIN_REBUILD_INTERVAL && now >= started + MIN_REBUILD_INTERVAL
            }
        }
    }

    /// The earliest start after a rebuild that ran from `started` to `ended`.
    pub fn next_start(&self, started: Instant, ended: Instant) -> Instant {
        let took = ended.saturating_duration_since(started);
        (started + MIN_REBUILD_INTERVAL).max(ended + took * BACKOFF)
    }

    pub fn started(&mut self, at: Instant) {
        self.last = Some((at, None));
    }

    pub fn ended(&mut self, at: Instant) {
        if let Some((started, _)) = self.last {
            self.last = Some((started, Some(at)));
        }
    }

    /// How long the last finished rebuild took.
    pub fn last_took(&self) -> Option<Duration> {
        match self.last {
            Some((started, Some(ended))) => Some(ended.saturating_duration_since(started)),
            _ => None,
        }
    }
}

/// What the receiver reports to the UI, replaced about every [`STATUS_INTERVAL`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveStatus {
    /// Connected and reading (false before the connection and after it ended).
    pub connected: bool,
    /// The state arrived on this connection.
    pub has_state: bool,
    /// Trace entries received over every connection of this session (what a save writes).
    pub entries: u64,
    /// Entries the recorder reported dropped (this listener fell behind its ring) plus those
    /// the ring overwrote between two connections.
    pub dropped: u64,
    /// Bytes and frames received on this connection.
    pub bytes: u64,
    pub frames: u64,
    /// Status updates published so far (the UI's update rate, measured).
    pub updates: u64,
    /// Documents rebuilt so far, the entries in the newest and how long it took.
    pub rebuilds: u64,
    pub rebuilt_entries: u64,
    pub last_rebuild: Option<Duration>,
}

/// Why a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The recorder closed the connection (the program ended or stopped serving).
    Closed,
    /// The user detached.
    Detached,
    /// Connecting or reading failed, or the stream was refused (what was wrong).
    Failed(String),
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndReason::Closed => f.write_str("the recorder closed the connection"),
            EndReason::Detached => f.write_str("detached"),
            EndReason::Failed(what) => f.write_str(what),
        }
    }
}

/// What was received over the connections so far: carried into a reattach.
#[derive(Clone, Debug)]
pub struct Received {
    pub snapshot: Arc<Snapshot>,
    /// The device whose trace grew.
    pub device: i64,
    /// The sequence number of the next entry the recorder would send.
    pub next_seq: u64,
    /// Entries dropped so far (see [`LiveStatus::dropped`]).
    pub dropped: u64,
}

/// How a connection ended: the reason, and everything received (`None` when nothing was).
#[derive(Debug)]
pub struct Ended {
    pub reason: EndReason,
    pub received: Option<Received>,
}

/// What the receiver and the UI share.
#[derive(Default)]
pub struct Shared {
    status: Mutex<LiveStatus>,
    document: Mutex<Option<Document>>,
    /// What arrived after the newest document published ([`LiveTail`]), at the status rate.
    /// Shared, so neither side copies it while it holds the lock (a receiver descheduled
    /// mid-copy held up the UI's poll for tens of milliseconds).
    tail: Mutex<Option<Arc<LiveTail>>>,
    /// The view is paused: the receiver keeps reading but builds no documents.
    paused: AtomicBool,
    /// The session was dropped (its document closed): no last document is built.
    closed: AtomicBool,
}

impl Shared {
    fn set_status(&self, status: &LiveStatus) {
        if let Ok(mut s) = self.status.lock() {
            *s = status.clone();
        }
    }

    fn set_tail(&self, tail: Option<&LiveTail>) {
        let tail = tail.map(|t| Arc::new(t.clone()));
        let replaced = self
            .tail
            .lock()
            .ok()
            .map(|mut slot| std::mem::replace(&mut *slot, tail));
        drop(replaced);
    }

    fn publish(&self, document: Document) {
        // A document not taken (rare: the UI takes one within a frame) is dropped after the
        // lock is released: freeing millions of entries must not hold up the UI's lock.
        let replaced = self
            .document
            .lock()
            .ok()
            .and_then(|mut slot| slot.replace(document));
        drop(replaced);
    }
}

/// An address the viewer can attach to: `unix:/path`, `tcp:127.0.0.1:PORT` or a socket path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    Tcp(String),
}

impl Address {
    /// Parses what `--attach` and the dialog take (the addresses `memsnap watch` takes).
    pub fn parse(text: &str) -> Result<Address, String> {
        let text = text.trim();
        if let Some(tcp) = text.strip_prefix("tcp:") {
            if tcp.is_empty() {
                return Err("tcp: needs HOST:PORT".into());
            }
            return Ok(Address::Tcp(tcp.to_owned()));
        }
        let path = text.strip_prefix("unix:").unwrap_or(text);
        if path.is_empty() {
            return Err(
                "empty address (expected unix:/path.sock, tcp:127.0.0.1:PORT or a socket path)"
                    .into(),
            );
        }
        Ok(Address::Unix(PathBuf::from(path)))
    }

    /// The address as text (`unix:/path` or `tcp:HOST:PORT`).
    pub fn url(&self) -> String {
        match self {
            Address::Unix(p) => format!("unix:{}", p.display()),
            Address::Tcp(a) => format!("tcp:{a}"),
        }
    }

    /// A short name for the tab: the private directory of a default socket
    /// (`memsnap-live-<pid>`), else the socket's file name, or the TCP address.
    pub fn short_name(&self) -> String {
        match self {
            Address::Unix(p) => {
                let file = p.file_name().map(|n| n.to_string_lossy().into_owned());
                let dir = p
                    .parent()
                    .and_then(Path::file_name)
                    .map(|n| n.to_string_lossy().into_owned());
                match (file.as_deref(), dir) {
                    (Some("live.sock"), Some(dir)) if dir.starts_with("memsnap-live-") => {
                        format!("live {dir}")
                    }
                    (Some(file), _) => format!("live {file}"),
                    _ => format!("live {}", p.display()),
                }
            }
            Address::Tcp(a) => format!("live {a}"),
        }
    }
}

/// A live socket found where recorders put theirs by default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundSocket {
    pub path: PathBuf,
    /// The recording process, from the directory's name.
    pub pid: u32,
    /// Whether that process still runs (a socket left by a crashed run does not answer).
    pub running: bool,
}

/// The directories recorders make their default sockets in (`LiveAddr::parse("1")`:
/// `$XDG_RUNTIME_DIR`, else `/tmp`); both are scanned, since the recording and the viewer
/// may see different environments.
pub fn default_socket_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if run.is_dir() {
            dirs.push(run);
        }
    }
    let tmp = PathBuf::from("/tmp");
    if !dirs.contains(&tmp) {
        dirs.push(tmp);
    }
    dirs
}

/// The sockets `memsnap-live-<pid>/live.sock` (and `memsnap-live-<pid>-<device>/live.sock`)
/// under `bases`, the running ones first, then by
/// pid. O(entries of the directories); unreadable directories are skipped.
pub fn find_sockets(bases: &[PathBuf]) -> Vec<FoundSocket> {
    let mut found = Vec::new();
    for base in bases {
        let Ok(entries) = std::fs::read_dir(base) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("memsnap-live-"))
                // `<pid>`, or `<pid>-<device>` for a device after the first (the C ABI
                // library's `MEMSNAP_LIVE=1` serves each device: `LiveAddr::for_device`).
                .and_then(|p| {
                    p.split_once('-')
                        .map_or(p, |(pid, _)| pid)
                        .parse::<u32>()
                        .ok()
                })
            else {
                continue;
            };
            let path = entry.path().join("live.sock");
            if std::fs::symlink_metadata(&path).is_ok() {
                found.push(FoundSocket {
                    running: Path::new(&format!("/proc/{pid}")).exists(),
                    path,
                    pid,
                });
            }
        }
    }
    found.sort_by(|a, b| {
        (b.running.cmp(&a.running))
            .then(a.pid.cmp(&b.pid))
            .then_with(|| a.path.cmp(&b.path))
    });
    found.dedup_by(|a, b| a.path == b.path);
    found
}

/// A connection to a recorder.
enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    fn open(addr: &Address) -> Result<Conn, String> {
        let conn = match addr {
            Address::Tcp(a) => Conn::Tcp(
                TcpStream::connect(a.as_str())
                    .map_err(|e| format!("cannot connect to {a}: {e}"))?,
            ),
            Address::Unix(p) => Conn::Unix(
                UnixStream::connect(p)
                    .map_err(|e| format!("cannot connect to {}: {e}", p.display()))?,
            ),
        };
        let timeout = Some(READ_TIMEOUT);
        match &conn {
            Conn::Unix(s) => s.set_read_timeout(timeout),
            Conn::Tcp(s) => s.set_read_timeout(timeout),
        }
        .map_err(|e| format!("cannot set a read timeout: {e}"))?;
        Ok(conn)
    }

    /// Sends the listener's one frame, its token (empty when none): a recorder with a token
    /// reads it and refuses a wrong one, one without never reads it (protocol version 2).
    fn send_token(&mut self, token: &str) -> Result<(), String> {
        match self {
            Conn::Unix(s) => memsnap_format::live::send_token(s, token),
            Conn::Tcp(s) => memsnap_format::live::send_token(s, token),
        }
        .map_err(|e| format!("cannot send the token to the recorder: {e}"))
    }

    /// Bytes read; `None` when nothing came within the timeout; `Some(0)` at the end.
    fn read(&mut self, buf: &mut [u8]) -> Result<Option<usize>, String> {
        let r = match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        };
        match r {
            Ok(n) => Ok(Some(n)),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(format!("reading from the recorder: {e}")),
        }
    }
}

/// The snapshot received so far: `base` (earlier connections) followed by what `live` (this
/// connection) added after it. `state_first_seq` is the number of the first entry of this
/// connection's state.
///
/// Without a base it is a copy of `live`'s snapshot. With one, it is a copy of the base with
/// the segments of this connection's state and this connection's entries numbered from
/// `base.next_seq` on, their stacks and strings interned into the base's tables (each stack
/// once). O(n) for n entries received, plus O(frames) of the new stacks.
pub fn merge(
    base: Option<&Received>,
    live: &mut LiveSnapshot,
    state_first_seq: u64,
) -> Option<Snapshot> {
    let device = usize::try_from(live.device()).unwrap_or(0);
    let current = live.snapshot();
    let Some(base) = base else {
        return current.cloned();
    };
    let mut out = Snapshot::clone(&base.snapshot);
    let Some(current) = current else {
        return Some(out);
    };
    let skip = base.next_seq.saturating_sub(state_first_seq);
    let trace = current.traces().get(device).map_or(&[][..], Vec::as_slice);
    let new = &trace[usize::try_from(skip).unwrap_or(usize::MAX).min(trace.len())..];
    out.segments.clear();
    out.add_segments_from(current, current.segments.iter().cloned());
    // A new connection's state repeats the annotations the recorder still holds: only those
    // after the last one received are new (annotations come in time order; one at the same
    // microsecond as the last received is taken as a repeat).
    if let Some(annotations) = current.external_annotations.as_ref() {
        let last = out
            .external_annotations
            .as_ref()
            .and_then(|a| a.last())
            .map(|a| a.time_us);
        let fresh = annotations
            .iter()
            .filter(|a| last.is_none_or(|t| a.time_us > t))
            .cloned();
        out.external_annotations
            .get_or_insert_with(Vec::new)
            .extend(fresh);
    }
    let made = reinterned(&mut out, current, new);
    let traces = out.device_traces.get_or_insert_with(Vec::new);
    if traces.len() <= device {
        traces.resize_with(device + 1, Vec::new);
    }
    traces[device].extend(made);
    Some(out)
}

/// `entries` of `source`, with their stacks and strings interned into `out`'s tables. O(n)
/// plus the frames of each stack once.
fn reinterned(out: &mut Snapshot, source: &Snapshot, entries: &[TraceEntry]) -> Vec<TraceEntry> {
    let mut stacks: Vec<Option<StackId>> = vec![None; source.stacks.len()];
    let mut strings: HashMap<StrId, StrId> = HashMap::new();
    let mut string = |out: &mut Snapshot, id: StrId| {
        *strings
            .entry(id)
            .or_insert_with(|| out.strings.intern(source.str(id)))
    };
    entries
        .iter()
        .map(|e| {
            let mut e = e.clone();
            if let Some(old) = e.frames {
                let new = match stacks.get(old.index()).copied().flatten() {
                    Some(known) => known,
                    None => {
                        let new = out.intern_stack(source.stack_frames(old).cloned());
                        if let Some(slot) = stacks.get_mut(old.index()) {
                            *slot = Some(new);
                        }
                        new
                    }
                };
                e.frames = Some(new);
            }
            let context = e.compile_context(&source.strings).map(|id| string(out, id));
            e.set_compile_context(context, &out.strings);
            let metadata = e.user_metadata(&source.strings).map(|id| string(out, id));
            e.set_user_metadata(metadata, &out.strings);
            if let Some(name) = e.other_action() {
                let name = string(out, name);
                e.set_other_action(name);
            }
            if let Some(tag) = e.rare.as_ref().and_then(|r| r.internal_metadata) {
                let tag = string(out, tag);
                e.rare_mut().internal_metadata = Some(tag);
            }
            e
        })
        .collect()
}

/// Drops a document that was replaced on a thread of its own (a [`Job`] whose result nobody
/// takes): freeing a rebuilt document of millions of entries takes tens of milliseconds,
/// which the UI thread must not spend (measured: a 40 ms frame at 1.5M entries before).
pub fn retire(document: Document) {
    let _ = Job::<()>::spawn("dropping a replaced live document", None, move |_| {
        drop(document);
        Ok(())
    });
}

/// One attachment to a recorder: the receiver job, what it published, the pause, and the
/// save in progress. The UI calls [`LiveSession::poll`] once a frame.
pub struct LiveSession {
    /// The id of the documents it makes (a live document keeps its id across rebuilds).
    pub id: u64,
    pub address: Address,
    /// Sent to the recorder first on every connection (empty when `None`): a recorder run
    /// with `MEMSNAP_LIVE_TOKEN` refuses a listener without it.
    token: Option<String>,
    shared: Arc<Shared>,
    receiver: Option<Job<Ended>>,
    /// How the last connection ended (`None` while connected).
    ended: Option<EndReason>,
    /// What the ended connections received (carried into a reattach).
    received: Option<Received>,
    /// The newest document built (the one a save writes, even while the view is paused).
    latest: Option<Arc<Snapshot>>,
    shown_entries: u64,
    saving: Option<Job<(PathBuf, usize), memsnap_format::FormatError>>,
    repaint: Option<egui::Context>,
}

impl LiveSession {
    /// Connects to `address` in the background, sending `token` (the recorder's
    /// `MEMSNAP_LIVE_TOKEN`, when it has one); `repaint` is asked to redraw as updates arrive.
    pub fn start(
        id: u64,
        address: Address,
        token: Option<String>,
        repaint: Option<egui::Context>,
    ) -> LiveSession {
        let mut session = LiveSession {
            id,
            address,
            token,
            shared: Arc::default(),
            receiver: None,
            ended: None,
            received: None,
            latest: None,
            shown_entries: 0,
            saving: None,
            repaint,
        };
        session.connect();
        session
    }

    fn connect(&mut self) {
        let (id, address, token, shared, base, repaint) = (
            self.id,
            self.address.clone(),
            self.token.clone().unwrap_or_default(),
            self.shared.clone(),
            self.received.clone(),
            self.repaint.clone(),
        );
        self.ended = None;
        self.receiver = Some(Job::spawn(
            format!("receiving {}", self.address.url()),
            self.repaint.clone(),
            move |progress| {
                Ok(receive(
                    id, &address, &token, base, &shared, progress, repaint,
                ))
            },
        ));
    }

    /// Takes what the receiver finished (call it once a frame).
    pub fn poll(&mut self) {
        if let Some(job) = &self.receiver {
            if let Some(result) = job.poll() {
                self.receiver = None;
                self.finish(result);
            }
        }
    }

    /// Waits for the receiver to end (tests).
    pub fn wait(&mut self) {
        if let Some(job) = self.receiver.take() {
            let result = job.wait();
            self.finish(result);
        }
    }

    fn finish(&mut self, result: Result<Ended, JobError>) {
        match result {
            Ok(ended) => {
                if ended.received.is_some() {
                    self.received = ended.received;
                }
                self.ended = Some(ended.reason);
            }
            // A panic in the receiver costs the connection; what it published stays.
            Err(e) => self.ended = Some(EndReason::Failed(e.to_string())),
        }
        if let Ok(mut status) = self.shared.status.lock() {
            status.connected = false;
        }
    }

    /// The counts the receiver published last.
    pub fn status(&self) -> LiveStatus {
        self.shared
            .status
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Whether the receiver runs (connecting or connected).
    pub fn is_receiving(&self) -> bool {
        self.receiver.is_some()
    }

    /// How the last connection ended, once it did.
    pub fn ended(&self) -> Option<&EndReason> {
        self.ended.as_ref()
    }

    /// The status line: what is happening and how many entries were received.
    pub fn status_line(&self) -> String {
        let status = self.status();
        let mut line = match &self.ended {
            Some(reason) => format!(
                "disconnected: {reason}; {} entries received",
                status.entries
            ),
            None if !status.has_state => format!("connecting to {}…", self.address.url()),
            None => format!(
                "live: {} entries received from {}",
                status.entries,
                self.address.url()
            ),
        };
        if self.is_paused() && self.ended.is_none() {
            line.push_str(&format!(
                " (paused: showing {} entries)",
                self.shown_entries()
            ));
        }
        line
    }

    /// The dropped marker's text, when the recorder dropped entries.
    pub fn dropped_line(&self) -> Option<String> {
        let dropped = self.status().dropped;
        (dropped > 0).then(|| format!("{dropped} entries dropped by the recorder"))
    }

    /// What arrived after the newest document built ([`LiveTail`]; `None` before the first
    /// and while paused: a paused view is frozen). The caller draws it only past the document
    /// it continues ([`LiveTail::continues`]).
    pub fn tail(&self) -> Option<Arc<LiveTail>> {
        if self.is_paused() {
            return None;
        }
        self.shared.tail.lock().ok()?.clone()
    }

    /// Entries of the document the UI took last.
    pub fn shown_entries(&self) -> u64 {
        self.shown_entries
    }

    /// A new document to show, if one was built since the last call and the view is not
    /// paused.
    pub fn take_document(&mut self) -> Option<Document> {
        if self.is_paused() {
            return None;
        }
        let document = self.shared.document.lock().ok()?.take()?;
        self.latest = Some(document.snapshot.clone());
        self.shown_entries = document.snapshot.entry_count() as u64;
        Some(document)
    }

    pub fn is_paused(&self) -> bool {
        self.shared.paused.load(Ordering::Relaxed)
    }

    /// Freezes the view (the stream is still received) or resumes it (the newest document is
    /// shown as soon as it is built).
    pub fn set_paused(&self, paused: bool) {
        self.shared.paused.store(paused, Ordering::Relaxed);
    }

    /// Stops receiving; everything received stays.
    pub fn detach(&self) {
        if let Some(job) = &self.receiver {
            job.cancel();
        }
    }

    /// Connects again after the connection ended; the new entries are appended to what was
    /// received (see the module docs). Does nothing while connected.
    pub fn reattach(&mut self) {
        if self.receiver.is_none() {
            self.connect();
        }
    }

    /// The newest snapshot received and built (what a save writes): after a disconnect,
    /// everything received.
    pub fn latest_snapshot(&self) -> Option<Arc<Snapshot>> {
        if self.ended.is_some() {
            if let Some(received) = &self.received {
                return Some(received.snapshot.clone());
            }
        }
        // While paused the newest document waits in the slot: it is newer than the one shown.
        let waiting = self
            .shared
            .document
            .lock()
            .ok()
            .and_then(|slot| slot.as_ref().map(|d| d.snapshot.clone()));
        waiting.or_else(|| self.latest.clone())
    }

    /// Writes what was received to `path` in the background (format by extension, msgpack
    /// by default; an atomic write through [`memsnap_format::io::write_path`]). Returns false
    /// when nothing was received yet or a save is running.
    pub fn save(&mut self, path: PathBuf) -> bool {
        let Some(snapshot) = self.latest_snapshot() else {
            return false;
        };
        if self.saving.is_some() {
            return false;
        }
        self.saving = Some(Job::spawn(
            format!("saving {}", path.display()),
            self.repaint.clone(),
            move |_| {
                let format = Format::from_path(&path).unwrap_or(Format::Msgpack);
                memsnap_format::io::write_path(&path, &snapshot, Some(format))?;
                Ok((path, snapshot.entry_count()))
            },
        ));
        true
    }

    /// Whether a save is being written.
    pub fn is_saving(&self) -> bool {
        self.saving.is_some()
    }

    /// The result of the save, once it is done: the path and entries written, or the error.
    pub fn poll_save(&mut self) -> Option<Result<(PathBuf, usize), String>> {
        let result = self.saving.as_ref()?.poll()?;
        self.saving = None;
        Some(result.map_err(|e| e.to_string()))
    }

    /// Waits for the save to be done (tests).
    pub fn wait_save(&mut self) -> Option<Result<(PathBuf, usize), String>> {
        let result = self.saving.take()?.wait();
        Some(result.map_err(|e| e.to_string()))
    }
}

impl Drop for LiveSession {
    fn drop(&mut self) {
        // Closing the document ends its connection, and nobody will look at a last document.
        self.shared.closed.store(true, Ordering::Relaxed);
        self.detach();
    }
}

/// The receiver: connects, reads and applies the stream, publishes counts and documents,
/// and returns how the connection ended with everything received. Runs in a [`Job`]; the
/// job's cancel flag detaches.
fn receive(
    id: u64,
    address: &Address,
    token: &str,
    base: Option<Received>,
    shared: &Shared,
    progress: &Progress,
    repaint: Option<egui::Context>,
) -> Ended {
    // The counts carry over a reattach (updates and rebuilds go on counting); this
    // connection's start from zero.
    let before = shared.status.lock().map(|s| s.clone()).unwrap_or_default();
    let mut status = LiveStatus {
        entries: base.as_ref().map_or(0, |b| {
            let device = usize::try_from(b.device).unwrap_or(0);
            b.snapshot.traces().get(device).map_or(0, Vec::len) as u64
        }),
        dropped: base.as_ref().map_or(0, |b| b.dropped),
        updates: before.updates,
        rebuilds: before.rebuilds,
        rebuilt_entries: before.rebuilt_entries,
        last_rebuild: before.last_rebuild,
        ..LiveStatus::default()
    };
    let wake = || {
        if let Some(ctx) = &repaint {
            ctx.request_repaint();
        }
    };
    let base_entries = status.entries;
    let mut receiver = Receiver {
        id,
        name: address.short_name(),
        base,
        live: LiveSnapshot::new(),
        state_first_seq: 0,
        gap: 0,
        rebuild: None,
        pacer: Pacer::default(),
        repaint: repaint.clone(),
        tail: None,
    };
    let mut conn = match Conn::open(address).and_then(|mut conn| {
        conn.send_token(token)?;
        Ok(conn)
    }) {
        Ok(conn) => conn,
        Err(what) => {
            shared.set_status(&status);
            wake();
            return Ended {
                reason: EndReason::Failed(what),
                received: receiver.base,
            };
        }
    };
    status.connected = true;
    progress.set("receiving", 0, 0);
    let mut reader = FrameReader::new();
    let mut buf = vec![0; 1 << 16];
    let mut last_status = Instant::now();
    let mut built_len = None;
    let mut published = LiveStatus::default();
    // When the received count last changed (the stream is quiet after it).
    let mut changed = (0u64, Instant::now());
    let reason = loop {
        if progress.is_cancelled() {
            break EndReason::Detached;
        }
        if let Err(reason) = receiver.drain(&mut reader, &mut status) {
            break reason;
        }
        let received = receiver.received_entries(base_entries);
        status.entries = received;
        receiver.extend_tail(received, base_entries);
        match conn.read(&mut buf) {
            Ok(Some(0)) => break EndReason::Closed,
            Ok(Some(n)) => {
                reader.push(&buf[..n]);
                status.bytes += n as u64;
            }
            Ok(None) => {}
            Err(what) => break EndReason::Failed(what),
        }
        status.frames = reader.frames();
        let now = Instant::now();
        if received != changed.0 {
            changed = (received, now);
        }
        // A new document goes out with the counts that describe it.
        let mut rebuilt = None;
        if let Some(document) = receiver.poll_rebuild(now, &mut status) {
            rebuilt = Some(document);
            // What arrived while it was built follows it.
            receiver.restart_tail(status.rebuilt_entries, received, base_entries);
        }
        let paused = shared.paused.load(Ordering::Relaxed);
        if !paused
            && status.has_state
            && receiver.rebuild.is_none()
            && built_len != Some(received)
            && (receiver.pacer.due(now)
                || receiver.pacer.due_quiet(now, now.duration_since(changed.1)))
        {
            built_len = Some(received);
            receiver.start_rebuild(now);
        }
        // Published when something changed: an idle connection asks for no redraws.
        if rebuilt.is_some()
            || now.duration_since(last_status) >= STATUS_INTERVAL && status != published
        {
            last_status = now;
            status.updates += 1;
            // The tail first: a status that counts N entries has a tail through them.
            shared.set_tail(receiver.tail.as_ref());
            shared.set_status(&status);
            published = status.clone();
            if let Some(document) = rebuilt {
                shared.publish(document);
            }
            wake();
        }
    };
    // The rest of the stream that arrived before the end still counts.
    if reason == EndReason::Closed || reason == EndReason::Detached {
        if let Err(refused) = receiver.drain(&mut reader, &mut status) {
            status.connected = false;
            return receiver.finish(refused, status, shared, wake);
        }
    }
    status.entries = receiver.received_entries(base_entries);
    status.connected = false;
    receiver.finish(reason, status, shared, wake)
}

/// The receiver's state for one connection.
struct Receiver {
    id: u64,
    name: String,
    base: Option<Received>,
    live: LiveSnapshot,
    state_first_seq: u64,
    /// Entries the ring overwrote between the last connection and this one.
    gap: u64,
    rebuild: Option<(Job<Document, DocumentError>, Instant, u64)>,
    pacer: Pacer,
    repaint: Option<egui::Context>,
    /// What arrived after the newest document built on this connection (none before it).
    tail: Option<LiveTail>,
}

impl Receiver {
    /// Applies every whole message read so far.
    fn drain(
        &mut self,
        reader: &mut FrameReader,
        status: &mut LiveStatus,
    ) -> Result<(), EndReason> {
        let refused = |e: memsnap_format::live::LiveError| {
            EndReason::Failed(format!("the stream is refused: {e}"))
        };
        while let Some(message) = reader.next_message().map_err(refused)? {
            match self.live.apply(message).map_err(refused)? {
                Applied::State { entries } => {
                    self.state_first_seq = self.live.next_seq() - entries as u64;
                    if let Some(base) = &self.base {
                        if self.live.next_seq() < base.next_seq || self.live.device() != base.device
                        {
                            return Err(EndReason::Failed(format!(
                                "another recording answers at this address (it has recorded {} entries on device {}; {} were received before on device {})",
                                self.live.next_seq(),
                                self.live.device(),
                                base.next_seq,
                                base.device
                            )));
                        }
                        self.gap = self.state_first_seq.saturating_sub(base.next_seq);
                        status.dropped += self.gap;
                    }
                    status.has_state = true;
                }
                Applied::Dropped { missed } => status.dropped += missed,
                // The annotations are in the snapshot; those the recorder lost are not
                // entries, so they are not counted as dropped ones.
                Applied::Hello | Applied::Entries { .. } | Applied::Annotations { .. } => {}
            }
        }
        Ok(())
    }

    /// Entries received over every connection (base plus this connection's new ones).
    fn received_entries(&self, base_entries: u64) -> u64 {
        let trace = self.live.trace().len() as u64;
        match &self.base {
            None => trace,
            Some(base) => {
                let skip = base
                    .next_seq
                    .saturating_sub(self.state_first_seq)
                    .min(trace);
                base_entries + trace - skip
            }
        }
    }

    /// This connection's entries from `from` on, counted as [`Receiver::received_entries`]
    /// counts (after the `base_entries` of earlier connections); none before those.
    fn entries_from(&self, from: u64, base_entries: u64) -> &[TraceEntry] {
        let trace = self.live.trace();
        let skip = self.base.as_ref().map_or(0, |base| {
            base.next_seq
                .saturating_sub(self.state_first_seq)
                .min(trace.len() as u64)
        });
        let Some(at) = from.checked_sub(base_entries) else {
            return &[];
        };
        usize::try_from(at + skip)
            .ok()
            .and_then(|at| trace.get(at..))
            .unwrap_or(&[])
    }

    /// Adds the entries received up to `received` to the tail. O(new entries).
    fn extend_tail(&mut self, received: u64, base_entries: u64) {
        // Taken out while the entries (borrowed from `self.live`) are pushed.
        let Some(mut tail) = self.tail.take() else {
            return;
        };
        let done = tail.after_entries + tail.entries;
        let new = usize::try_from(received.saturating_sub(done)).unwrap_or(usize::MAX);
        let entries = self.entries_from(done, base_entries);
        for entry in &entries[..new.min(entries.len())] {
            tail.push(entry);
        }
        self.tail = Some(tail);
    }

    /// Starts the tail after a document of `after` entries, with what arrived since (up to
    /// `received`). O(entries since).
    fn restart_tail(&mut self, after: u64, received: u64, base_entries: u64) {
        let device = self.live.device();
        self.tail = (after >= base_entries).then(|| LiveTail::new(device, after));
        self.extend_tail(received, base_entries);
    }

    fn loaded(&self, snapshot: Snapshot, took: Duration) -> LoadedSnapshot {
        LoadedSnapshot {
            name: self.name.clone(),
            path: None,
            snapshot,
            detected: Detected {
                format: Format::Msgpack,
                compression: Compression::None,
            },
            file_bytes: 0,
            decode_time: took,
        }
    }

    /// Merges what was received and prepares its document in a job of its own.
    fn start_rebuild(&mut self, now: Instant) {
        let Some(snapshot) = merge(self.base.as_ref(), &mut self.live, self.state_first_seq) else {
            return;
        };
        let entries = self.live_entries_of(&snapshot);
        let loaded = self.loaded(snapshot, now.elapsed());
        let (id, repaint) = (self.id, self.repaint.clone());
        self.pacer.started(now);
        self.rebuild = Some((
            Job::spawn(format!("rebuilding {}", self.name), None, move |_| {
                Document::prepare(id, loaded, repaint)
            }),
            now,
            entries,
        ));
    }

    fn live_entries_of(&self, snapshot: &Snapshot) -> u64 {
        let device = usize::try_from(self.live.device()).unwrap_or(0);
        snapshot.traces().get(device).map_or(0, Vec::len) as u64
    }

    /// The rebuilt document, once it is ready.
    fn poll_rebuild(&mut self, now: Instant, status: &mut LiveStatus) -> Option<Document> {
        let result = self.rebuild.as_ref()?.0.poll()?;
        let (_, started, entries) = self.rebuild.take()?;
        self.pacer.ended(now);
        status.rebuilds += 1;
        status.rebuilt_entries = entries;
        status.last_rebuild = Some(now.duration_since(started));
        // A snapshot that cannot be shown yet (no entries, no segments) waits for more.
        result.ok()
    }

    /// The last document (everything received), published with the final counts.
    fn finish(
        mut self,
        reason: EndReason,
        mut status: LiveStatus,
        shared: &Shared,
        wake: impl Fn(),
    ) -> Ended {
        // A rebuild still running is of fewer entries than the last one's: not waited for.
        self.rebuild = None;
        if shared.closed.load(Ordering::Relaxed) {
            return Ended {
                reason,
                received: None,
            };
        }
        let received = match merge(self.base.as_ref(), &mut self.live, self.state_first_seq) {
            Some(snapshot) if self.live.snapshot().is_some() => {
                let entries = self.live_entries_of(&snapshot);
                let started = Instant::now();
                let snapshot = Arc::new(snapshot);
                let loaded = self.loaded(Snapshot::clone(&snapshot), Duration::ZERO);
                if let Ok(document) = Document::prepare(self.id, loaded, self.repaint.clone()) {
                    status.rebuilds += 1;
                    status.rebuilt_entries = entries;
                    status.last_rebuild = Some(started.elapsed());
                    shared.publish(document);
                }
                Some(Received {
                    snapshot,
                    device: self.live.device(),
                    next_seq: self.live.next_seq(),
                    dropped: status.dropped,
                })
            }
            // Nothing arrived on this connection: what earlier ones received stays.
            _ => self.base.take(),
        };
        status.updates += 1;
        shared.set_status(&status);
        wake();
        Ended { reason, received }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsnap_format::{compare, Frame};
    use memsnap_recorder::{CachingAllocator, HistoryOptions, HostDevice, StackMode, Stream};

    fn recorder(max_entries: usize) -> Arc<CachingAllocator<HostDevice>> {
        let alloc = Arc::new(CachingAllocator::new(HostDevice::new(1 << 30)));
        alloc.record_memory_history(HistoryOptions {
            max_entries,
            stacks: StackMode::None,
            ..HistoryOptions::default()
        });
        alloc
    }

    /// `steps` steps of activations made and freed, each site with its own stack, and one
    /// block kept per step.
    fn record(alloc: &CachingAllocator<HostDevice>, steps: usize) {
        let stack = |name: &str| {
            alloc
                .register_stack(&[
                    Frame::new(name, "model.py", 10),
                    Frame::new("train", "train.py", 3),
                ])
                .unwrap()
        };
        let (fwd, bwd, opt) = (stack("forward"), stack("backward"), stack("step"));
        for _ in 0..steps {
            let acts: Vec<u64> = (0..20u64)
                .map(|i| {
                    alloc
                        .malloc_with_stack(4096 * (1 + i % 7), Stream::DEFAULT, fwd)
                        .unwrap()
                })
                .collect();
            for p in acts {
                alloc.free_with_stack(p, bwd).unwrap();
            }
            alloc
                .malloc_with_stack(1 << 16, Stream::DEFAULT, opt)
                .unwrap();
        }
    }

    /// Polls `session` (taking its documents) until `done` holds; a generous deadline turns
    /// a hang into a failure.
    fn poll_until(
        session: &mut LiveSession,
        what: &str,
        mut done: impl FnMut(&LiveSession) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            session.poll();
            let _ = session.take_document();
            if done(session) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:?}, shown {}",
                session.status(),
                session.shown_entries()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The session's tail is the allocator's own entries after the document it continues,
    /// through the last one received: their count, and their change of active bytes.
    fn assert_tail_is_what_followed_its_document(
        session: &LiveSession,
        alloc: &CachingAllocator<HostDevice>,
    ) {
        let tail = session.tail().expect("a tail once a document was built");
        let recorded = alloc.snapshot();
        let trace = &recorded.traces()[0];
        assert_eq!(tail.device, 0);
        assert_eq!(tail.after_entries + tail.entries, trace.len() as u64);
        let followed = &trace[tail.after_entries as usize..];
        let delta: i64 = followed
            .iter()
            .map(|e| match e.action {
                memsnap_format::Action::Alloc => e.size as i64,
                memsnap_format::Action::FreeCompleted => -(e.size as i64),
                _ => 0,
            })
            .sum();
        assert_eq!(tail.delta, delta);
        assert_eq!(tail.points.last().map_or(0, |p| p.entries), tail.entries);
    }

    fn trace_len(snapshot: &Snapshot) -> u64 {
        snapshot.traces().first().map_or(0, Vec::len) as u64
    }

    /// The snapshot without its segments (a listener's are those at its last connect).
    fn without_segments(snapshot: &Snapshot) -> Snapshot {
        let mut s = snapshot.clone();
        s.segments.clear();
        s
    }

    #[test]
    fn every_recorded_entry_arrives_and_the_save_is_the_allocators_own_trace() {
        let alloc = recorder(usize::MAX);
        record(&alloc, 3);
        let dir = tempfile::tempdir().unwrap();
        let server = alloc
            .serve_live(&format!("unix:{}", dir.path().join("run.sock").display()))
            .unwrap();
        let mut session = LiveSession::start(1, Address::parse(&server.url()).unwrap(), None, None);
        // Entries recorded before and while attached.
        record(&alloc, 60);
        let recorded = alloc.recorded_entries();
        poll_until(&mut session, "every entry in a document", |s| {
            s.status().entries == recorded && s.shown_entries() == recorded
        });
        assert!(session.is_receiving());
        assert_eq!(session.status().dropped, 0);
        assert!(session.status().rebuilds >= 1 && session.status().updates >= 1);
        assert!(session
            .status_line()
            .starts_with(&format!("live: {recorded} entries received")));
        // Entries after the document shown: the tail carries them until the next one.
        record(&alloc, 40);
        let recorded = alloc.recorded_entries();
        poll_until(&mut session, "the entries after the document", |s| {
            s.status().entries == recorded
        });
        assert_tail_is_what_followed_its_document(&session, &alloc);
        // (Taking the allocator's snapshot recorded a `snapshot` entry.)
        let recorded = alloc.recorded_entries();
        poll_until(&mut session, "the newest document", |s| {
            s.shown_entries() == recorded
        });

        let path = dir.path().join("saved.msgpack");
        assert!(session.save(path.clone()));
        let (written, entries) = session.wait_save().expect("a save").expect("written");
        assert_eq!((written, entries as u64), (path.clone(), recorded));
        let (saved, _) = memsnap_format::read_path(&path).expect("the save reads back");
        assert_eq!(
            compare::diff(
                &without_segments(&saved),
                &without_segments(&alloc.snapshot())
            ),
            None
        );
    }

    #[test]
    fn a_recorder_with_a_token_refuses_a_session_without_it_and_serves_one_with_it() {
        const TOKEN: &str = "a token of sixteen bytes or more";
        let alloc = recorder(usize::MAX);
        record(&alloc, 5);
        let dir = tempfile::tempdir().unwrap();
        let url = format!("unix:{}", dir.path().join("run.sock").display());
        let _server = alloc.serve_live_with_token(&url, TOKEN).unwrap();
        for wrong in [None, Some("not the token at all, sixteen+".to_owned())] {
            let mut session = LiveSession::start(8, Address::parse(&url).unwrap(), wrong, None);
            session.wait();
            let reason = session.ended().expect("ended").to_string();
            assert!(reason.contains("the stream is refused"), "{reason}");
            assert!(session.latest_snapshot().is_none());
        }
        let mut session = LiveSession::start(
            9,
            Address::parse(&url).unwrap(),
            Some(TOKEN.to_owned()),
            None,
        );
        let recorded = alloc.recorded_entries();
        poll_until(&mut session, "the entries with the token", |s| {
            s.status().entries == recorded
        });
        assert!(session.is_receiving());
    }

    #[test]
    fn a_disconnect_keeps_what_was_received_and_a_reattach_appends_without_repeats() {
        let alloc = recorder(usize::MAX);
        let dir = tempfile::tempdir().unwrap();
        let url = format!("unix:{}", dir.path().join("run.sock").display());
        let server = alloc.serve_live(&url).unwrap();
        let mut session = LiveSession::start(7, Address::parse(&url).unwrap(), None, None);
        let annotate = |name: &str| {
            alloc.record_annotation(&[("stage", "START"), ("name", name)]);
            // Each its own microsecond: a reattach tells repeats by time.
            std::thread::sleep(Duration::from_millis(2));
        };
        annotate("before the disconnect");
        record(&alloc, 10);
        let first = alloc.recorded_entries();
        poll_until(&mut session, "the first entries", |s| {
            s.status().entries == first
        });
        drop(server);
        poll_until(&mut session, "the disconnect", |s| !s.is_receiving());
        assert_eq!(session.ended(), Some(&EndReason::Closed));
        assert_eq!(
            session.status_line(),
            format!("disconnected: the recorder closed the connection; {first} entries received")
        );
        let kept = session.latest_snapshot().expect("what was received stays");
        assert_eq!(trace_len(&kept), first);

        // Recorded while nobody listened, then served again at the same address: the new
        // state's ring repeats the first entries, and they are not added twice.
        record(&alloc, 25);
        annotate("while nobody listened");
        let server = alloc.serve_live(&url).unwrap();
        session.reattach();
        record(&alloc, 5);
        annotate("after the reattach");
        let total = alloc.recorded_entries();
        poll_until(&mut session, "every entry after the reattach", |s| {
            s.status().entries == total && s.shown_entries() == total
        });
        assert_eq!(session.status().dropped, 0);
        poll_until(&mut session, "the last annotation", |s| {
            s.latest_snapshot()
                .is_some_and(|m| m.external_annotations.as_ref().map(Vec::len) == Some(3))
        });
        let merged = session.latest_snapshot().unwrap();
        assert_eq!(trace_len(&merged), total);
        // Every annotation once: the reattach's state repeated the first.
        assert_eq!(merged.external_annotations.as_ref().map(Vec::len), Some(3));
        assert_eq!(
            compare::diff(
                &without_segments(&merged),
                &without_segments(&alloc.snapshot())
            ),
            None
        );
        // The tail after a reattach counts the entries of both connections.
        record(&alloc, 7);
        let total = alloc.recorded_entries();
        poll_until(
            &mut session,
            "the entries after the reattach's document",
            |s| s.status().entries == total,
        );
        assert_tail_is_what_followed_its_document(&session, &alloc);
        drop(server);
    }

    #[test]
    fn entries_the_ring_overwrote_while_detached_are_counted_as_dropped() {
        let alloc = recorder(256);
        let dir = tempfile::tempdir().unwrap();
        let url = format!("unix:{}", dir.path().join("run.sock").display());
        let server = alloc.serve_live(&url).unwrap();
        let mut session = LiveSession::start(7, Address::parse(&url).unwrap(), None, None);
        record(&alloc, 2);
        let first = alloc.recorded_entries();
        poll_until(&mut session, "the first entries", |s| {
            s.status().entries == first
        });
        session.detach();
        poll_until(&mut session, "the detach", |s| !s.is_receiving());
        assert_eq!(session.ended(), Some(&EndReason::Detached));
        record(&alloc, 40);
        session.reattach();
        let total = alloc.recorded_entries();
        poll_until(&mut session, "the reattach", |s| {
            s.status().entries + s.status().dropped == total
        });
        let status = session.status();
        assert!(status.dropped > 0, "{status:?}");
        assert_eq!(
            session.dropped_line(),
            Some(format!(
                "{} entries dropped by the recorder",
                status.dropped
            ))
        );
        drop(server);
    }

    /// A server that sends `bytes` and keeps the connection open until the client goes.
    fn fake_server(dir: &Path, bytes: Vec<u8>) -> (Address, std::thread::JoinHandle<()>) {
        let path = dir.join("fake.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let thread = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            use std::io::Write;
            let _ = stream.write_all(&bytes);
            let _ = stream.read(&mut [0; 16]);
        });
        (Address::Unix(path), thread)
    }

    #[test]
    fn a_malformed_stream_ends_the_connection_with_a_clear_error_and_no_panic() {
        let cases: [(Vec<u8>, &str); 3] = [
            // A frame whose body is not msgpack.
            (
                vec![5, 0, 0, 0, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1],
                "malformed message in frame 0",
            ),
            // A length over the limit.
            (vec![0xff, 0xff, 0xff, 0xff], "over the limit"),
            // A whole message, but entries before Hello.
            (
                {
                    let mut out = Vec::new();
                    memsnap_format::live::encode(
                        &memsnap_format::live::Message::Dropped {
                            missed: 1,
                            resume_seq: 1,
                        },
                        &mut out,
                    )
                    .unwrap();
                    out
                },
                "the first message must be Hello",
            ),
        ];
        for (bytes, expected) in cases {
            let dir = tempfile::tempdir().unwrap();
            let (address, server) = fake_server(dir.path(), bytes);
            let mut session = LiveSession::start(3, address, None, None);
            session.wait();
            let reason = session.ended().expect("ended").to_string();
            assert!(reason.contains("the stream is refused"), "{reason}");
            assert!(reason.contains(expected), "{reason}");
            assert!(session.latest_snapshot().is_none());
            assert!(session
                .status_line()
                .starts_with("disconnected: the stream is refused"));
            drop(session);
            server.join().unwrap();
        }
        // Nobody listening: a connect error, not a hang.
        let mut session = LiveSession::start(
            4,
            Address::parse("unix:/nonexistent/x.sock").unwrap(),
            None,
            None,
        );
        session.wait();
        assert!(session
            .ended()
            .unwrap()
            .to_string()
            .starts_with("cannot connect to /nonexistent/x.sock"));
    }

    #[test]
    fn a_stream_refused_after_its_state_keeps_what_was_received() {
        use memsnap_format::live::{encode, Bytes, Message, PROTOCOL_VERSION};
        let alloc = recorder(usize::MAX);
        record(&alloc, 4);
        let state = alloc.snapshot();
        let entries = trace_len(&state);
        let mut bytes = Vec::new();
        for message in [
            Message::Hello {
                protocol: PROTOCOL_VERSION,
                producer: "a test".into(),
                device: 0,
            },
            Message::State {
                snapshot: Bytes(memsnap_format::msgpack::to_vec(&state).unwrap()),
                next_seq: entries,
            },
        ] {
            encode(&message, &mut bytes).unwrap();
        }
        // Then a frame that is not a message.
        bytes.extend_from_slice(&[3, 0, 0, 0, 0xc1, 0xc1, 0xc1]);
        let dir = tempfile::tempdir().unwrap();
        let (address, server) = fake_server(dir.path(), bytes);
        let mut session = LiveSession::start(5, address, None, None);
        session.wait();
        let reason = session.ended().expect("ended").to_string();
        assert!(reason.contains("malformed message in frame 2"), "{reason}");
        let kept = session.latest_snapshot().expect("the state received stays");
        assert_eq!(trace_len(&kept), entries);
        assert_eq!(
            session.status_line(),
            format!("disconnected: {reason}; {entries} entries received")
        );
        assert!(session.take_document().is_some(), "its document is built");
        drop(session);
        server.join().unwrap();
    }

    #[test]
    fn the_default_socket_directories_are_found_with_their_pids() {
        let base = tempfile::tempdir().unwrap();
        let ours = base
            .path()
            .join(format!("memsnap-live-{}", std::process::id()));
        std::fs::create_dir(&ours).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(ours.join("live.sock")).unwrap();
        // The second device's endpoint of the same process.
        let second = base
            .path()
            .join(format!("memsnap-live-{}-1", std::process::id()));
        std::fs::create_dir(&second).unwrap();
        let _second = std::os::unix::net::UnixListener::bind(second.join("live.sock")).unwrap();
        // Not recorders' directories: skipped.
        std::fs::create_dir(base.path().join("memsnap-live-x")).unwrap();
        std::fs::create_dir(base.path().join("memsnap-live-12")).unwrap();
        let found = find_sockets(&[base.path().to_owned(), base.path().join("missing")]);
        assert_eq!(
            found,
            vec![
                FoundSocket {
                    path: ours.join("live.sock"),
                    pid: std::process::id(),
                    running: true,
                },
                FoundSocket {
                    path: second.join("live.sock"),
                    pid: std::process::id(),
                    running: true,
                },
            ]
        );
    }

    #[test]
    fn rebuilds_wait_for_four_times_the_last_rebuild_and_at_least_the_interval() {
        let t0 = Instant::now();
        let mut pacer = Pacer::default();
        assert!(pacer.due(t0), "the first rebuild starts at once");
        pacer.started(t0);
        assert!(!pacer.due(t0 + Duration::from_secs(60)), "one at a time");
        // A fast rebuild: the interval decides.
        pacer.ended(t0 + Duration::from_millis(5));
        assert!(!pacer.due(t0 + Duration::from_millis(99)));
        assert!(pacer.due(t0 + MIN_REBUILD_INTERVAL));
        // A slow one (1 s): the next waits 4 s after it ended.
        let t1 = t0 + Duration::from_secs(1);
        pacer.started(t1);
        pacer.ended(t1 + Duration::from_secs(1));
        assert_eq!(pacer.last_took(), Some(Duration::from_secs(1)));
        assert!(!pacer.due(t1 + Duration::from_millis(4_999)));
        assert!(pacer.due(t1 + Duration::from_secs(6)));
        // The stream went quiet: the last rebuild does not wait for the backoff.
        let t2 = t1 + Duration::from_millis(1_200);
        assert!(!pacer.due(t2));
        assert!(
            !pacer.due_quiet(t2, Duration::from_millis(50)),
            "still streaming"
        );
        assert!(pacer.due_quiet(t2, MIN_REBUILD_INTERVAL));
        pacer.started(t2);
        assert!(
            !pacer.due_quiet(t2 + Duration::from_secs(9), Duration::from_secs(9)),
            "one at a time"
        );
    }

    #[test]
    fn addresses_parse_like_memsnap_watch_and_get_short_names() {
        assert_eq!(
            Address::parse("unix:/run/x.sock"),
            Ok(Address::Unix("/run/x.sock".into()))
        );
        assert_eq!(
            Address::parse("/run/x.sock"),
            Ok(Address::Unix("/run/x.sock".into()))
        );
        assert_eq!(
            Address::parse("tcp:127.0.0.1:7077"),
            Ok(Address::Tcp("127.0.0.1:7077".into()))
        );
        assert!(Address::parse("unix:").is_err());
        assert!(Address::parse("tcp:").is_err());
        assert_eq!(
            Address::parse("/tmp/memsnap-live-42/live.sock")
                .unwrap()
                .short_name(),
            "live memsnap-live-42"
        );
        assert_eq!(
            Address::parse("/tmp/run.sock").unwrap().short_name(),
            "live run.sock"
        );
    }
}

//! The live endpoint (`serve_live`): what listeners receive while the allocator records.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use memsnap_format::live::{Applied, FrameReader, LiveSnapshot};
use memsnap_format::{compare, Frame, Snapshot};
use memsnap_recorder::{CachingAllocator, HistoryOptions, HostDevice, StackMode, Stream};

/// A raw client: reads frames and rebuilds the snapshot.
struct Client {
    stream: UnixStream,
    reader: FrameReader,
    live: LiveSnapshot,
    dropped_markers: usize,
}

impl Client {
    fn connect(url: &str) -> Client {
        let path = url.strip_prefix("unix:").expect("a unix address");
        let stream = UnixStream::connect(path).expect("connect");
        // A bug shows as a failed read, not a test that hangs.
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Client {
            stream,
            reader: FrameReader::new(),
            live: LiveSnapshot::new(),
            dropped_markers: 0,
        }
    }

    /// Reads until entry `seq` (exclusive) has been received or reported dropped.
    fn read_until(&mut self, seq: u64) {
        let mut buf = vec![0; 1 << 16];
        while self.live.snapshot().is_none() || self.live.next_seq() < seq {
            match self.reader.next_message().expect("a well-formed stream") {
                Some(m) => {
                    if let Applied::Dropped { .. } = self.live.apply(m).expect("applies") {
                        self.dropped_markers += 1;
                    }
                }
                None => {
                    let n = self
                        .stream
                        .read(&mut buf)
                        .expect("the recorder keeps sending");
                    assert!(n > 0, "the recorder closed the connection");
                    self.reader.push(&buf[..n]);
                }
            }
        }
    }
}

impl Client {
    /// Reads and applies everything until the recorder closes the connection.
    fn read_to_end(&mut self) {
        let mut buf = vec![0; 1 << 16];
        loop {
            match self.reader.next_message().expect("a well-formed stream") {
                Some(m) => {
                    self.live.apply(m).expect("applies");
                }
                None => match self.stream.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => self.reader.push(&buf[..n]),
                    Err(e) => panic!("reading: {e}"),
                },
            }
        }
    }
}

/// `alloc` published at `live.sock` in a new temporary folder (kept while the folder is).
fn served<D: memsnap_recorder::Device>(
    alloc: &Arc<CachingAllocator<D>>,
) -> (tempfile::TempDir, memsnap_recorder::LiveServer) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("unix:{}", dir.path().join("live.sock").display());
    let server = alloc.serve_live(&url).unwrap();
    (dir, server)
}

fn recorder(max_entries: usize) -> Arc<CachingAllocator<HostDevice>> {
    let alloc = Arc::new(CachingAllocator::new(HostDevice::new(1 << 30)));
    alloc.record_memory_history(HistoryOptions {
        max_entries,
        stacks: StackMode::None,
        ..HistoryOptions::default()
    });
    alloc
}

/// A few steps of a training-like pattern: parameters kept, activations made and freed,
/// each call site with its own given stack.
fn train(alloc: &CachingAllocator<HostDevice>, steps: usize, per_step: usize) {
    let stack = |name: &str| {
        alloc
            .register_stack(&[
                Frame::new(name, "model.py", 10),
                Frame::new("train", "train.py", 3),
            ])
            .unwrap()
    };
    let (fwd, bwd, opt) = (stack("forward"), stack("backward"), stack("step"));
    let mut kept = Vec::new();
    for step in 0..steps {
        let mut acts = Vec::new();
        for i in 0..per_step {
            let size = 4096 * (1 + (i % 7) as u64);
            acts.push(alloc.malloc_with_stack(size, Stream::DEFAULT, fwd).unwrap());
        }
        for p in acts.drain(..) {
            alloc.free_with_stack(p, bwd).unwrap();
        }
        // A leak of one block per step: memory that drifts.
        kept.push(
            alloc
                .malloc_with_stack(1 << 20, Stream::DEFAULT, opt)
                .unwrap(),
        );
        if step % 2 == 1 {
            let _ = alloc.malloc(512, Stream::DEFAULT).map(|p| alloc.free(p));
        }
    }
}

/// The snapshot without its segments (a listener's segments are those at connect).
fn without_segments(mut s: Snapshot) -> Snapshot {
    s.segments.clear();
    s
}

#[test]
fn two_listeners_receive_every_entry_and_rebuild_the_recorders_own_trace() {
    let alloc = recorder(usize::MAX);
    train(&alloc, 2, 10);
    let server = alloc.serve_live("unix:/nonexistent-dir/x.sock");
    assert!(
        server.is_err(),
        "an unbindable path is an error, not a panic"
    );
    let dir = tempfile::tempdir().unwrap();
    let url = format!("unix:{}", dir.path().join("live.sock").display());
    let server = alloc.serve_live(&url).unwrap();
    let mode = std::fs::metadata(dir.path().join("live.sock"))
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .unwrap();
    assert_eq!(mode, 0o600);

    let mut a = Client::connect(&server.url());
    let mut b = Client::connect(&server.url());
    // Entries recorded before, during and after the connections.
    train(&alloc, 6, 50);
    let recorded = alloc.recorded_entries();
    a.read_until(recorded);
    b.read_until(recorded);
    let dump = alloc.snapshot();
    for c in [a, b] {
        assert_eq!(c.live.next_seq(), recorded);
        assert_eq!(c.live.missed(), 0);
        assert_eq!(c.live.trace().len() as u64, recorded);
        let rebuilt = c.live.into_snapshot().unwrap();
        assert_eq!(
            compare::diff(&without_segments(rebuilt), &without_segments(dump.clone())),
            None
        );
    }
    assert_eq!(server.counters().connections.load(Ordering::Relaxed), 2);
}

use std::sync::atomic::Ordering;

#[test]
fn a_listener_that_reconnects_gets_the_state_again() {
    let alloc = recorder(usize::MAX);
    let (dir, server) = served(&alloc);
    let mut first = Client::connect(&server.url());
    train(&alloc, 2, 5);
    first.read_until(alloc.recorded_entries());
    drop(first);
    train(&alloc, 2, 5);
    let mut second = Client::connect(&server.url());
    let recorded = alloc.recorded_entries();
    second.read_until(recorded);
    assert_eq!(second.live.trace().len() as u64, recorded);
    // Dropping the server removes the socket.
    let path = dir.path().join("live.sock");
    drop(server);
    assert!(!path.exists());
}

#[test]
fn a_stalled_listener_does_not_hold_the_allocator_and_gets_the_dropped_marker() {
    // A small ring: a listener that does not read falls out of it.
    let alloc = recorder(4096);
    let (_dir, server) = served(&alloc);
    let mut stalled = Client::connect(&server.url());
    stalled.read_until(0);
    // Far more than the socket buffers hold while the listener reads nothing: the
    // allocator's calls all return (a listener that blocked them would hang this test).
    train(&alloc, 200, 200);
    let recorded = alloc.recorded_entries();
    assert!(recorded > 80_000);
    stalled.read_until(recorded);
    assert!(stalled.dropped_markers >= 1);
    assert!(stalled.live.missed() > 0);
    // Every entry was received or reported missed, and the newest ones are the ring's.
    let received = stalled.live.trace().len() as u64;
    assert_eq!(received + stalled.live.missed(), recorded);
    let dump = alloc.snapshot();
    let ring = &dump.traces()[0];
    let got = stalled.live.trace();
    let tail = ring.len().min(got.len()).min(1000);
    let (ours, theirs) = (&got[got.len() - tail..], &ring[ring.len() - tail..]);
    for (x, y) in ours.iter().zip(theirs) {
        assert_eq!((x.action, x.addr, x.size), (y.action, y.addr, y.size));
    }
    assert!(server.counters().entries_dropped.load(Ordering::Relaxed) > 0);
}

#[test]
fn each_device_of_one_address_gets_an_endpoint_of_its_own() {
    use memsnap_recorder::LiveAddr;
    use std::path::PathBuf;
    let unix = LiveAddr::parse("unix:/run/train.sock").unwrap();
    assert_eq!(unix.for_device(0), Some(unix.clone()));
    assert_eq!(
        unix.for_device(3),
        Some(LiveAddr::Unix {
            path: PathBuf::from("/run/train.sock.3"),
            private_dir: None
        })
    );
    let LiveAddr::Unix {
        path,
        private_dir: Some(dir),
    } = LiveAddr::parse("1").unwrap().for_device(2).unwrap()
    else {
        panic!("the default is a private directory");
    };
    let name = format!("memsnap-live-{}-2", std::process::id());
    assert_eq!(dir.file_name().unwrap().to_str(), Some(name.as_str()));
    assert_eq!(path, dir.join("live.sock"));
    let tcp = LiveAddr::parse("tcp:127.0.0.1:7000").unwrap();
    assert_eq!(
        tcp.for_device(2),
        Some(LiveAddr::parse("tcp:127.0.0.1:7002").unwrap())
    );
    let any_port = LiveAddr::parse("tcp:127.0.0.1:0").unwrap();
    assert_eq!(any_port.for_device(5), Some(any_port.clone()));
    let last = LiveAddr::parse("tcp:127.0.0.1:65535").unwrap();
    assert_eq!(last.for_device(1), None, "the port would overflow");
}

fn history(max_entries: usize, clear_history: bool) -> HistoryOptions {
    HistoryOptions {
        max_entries,
        stacks: StackMode::None,
        clear_history,
        ..HistoryOptions::default()
    }
}

/// Regression: `clear_history` restarted the entry numbers, so a listener connected before
/// it received nothing until the new count passed its own, then silently missed the entries
/// in between (and history off then on did the same).
#[test]
fn entries_recorded_after_a_clear_or_history_off_reach_a_connected_listener() {
    let alloc = recorder(usize::MAX);
    let (_dir, server) = served(&alloc);
    let mut client = Client::connect(&server.url());
    train(&alloc, 3, 20);
    client.read_until(alloc.live_entries());
    let before = client.live.trace().len();

    alloc.record_memory_history(history(usize::MAX, true));
    assert_eq!(
        alloc.recorded_entries(),
        0,
        "the recorder's own count restarts"
    );
    train(&alloc, 1, 4);
    client.read_until(alloc.live_entries());
    // Everything recorded since the clear arrived, after what was received before it.
    let dump = alloc.snapshot();
    let since_clear = &dump.traces()[0];
    let got = client.live.trace();
    assert_eq!(got.len(), before + since_clear.len());
    for (x, y) in got[before..].iter().zip(since_clear.iter()) {
        assert_eq!((x.action, x.addr, x.size), (y.action, y.addr, y.size));
    }
    // The dump's own `snapshot` entry, so that nothing is left unsent when history goes off
    // (entries discarded before they were sent are reported as `Dropped`).
    client.read_until(alloc.live_entries());

    alloc.record_memory_history(HistoryOptions {
        enabled: memsnap_recorder::HistoryMode::Off,
        ..history(usize::MAX, false)
    });
    let _ = alloc.malloc(4096, Stream::DEFAULT).map(|p| alloc.free(p));
    alloc.record_memory_history(history(usize::MAX, false));
    let kept = client.live.trace().len();
    train(&alloc, 1, 4);
    let recorded_again = alloc.recorded_entries();
    client.read_until(alloc.live_entries());
    assert_eq!(
        client.live.trace().len() as u64,
        kept as u64 + recorded_again
    );
    assert_eq!(client.live.missed(), 0);
}

#[test]
fn annotations_recorded_after_connect_reach_the_listener_and_its_snapshot() {
    let alloc = recorder(usize::MAX);
    alloc.record_annotation(&[("stage", "START"), ("name", "ProfilerStep#0")]);
    let (_dir, server) = served(&alloc);
    let mut client = Client::connect(&server.url());
    for step in 1..4 {
        let name = format!("ProfilerStep#{step}");
        alloc.record_annotation(&[("stage", "START"), ("name", &name)]);
        train(&alloc, 1, 5);
        alloc.record_annotation(&[("stage", "END"), ("name", &name)]);
    }
    // An entry after the last annotation: it is sent with or after it.
    let _ = alloc.malloc(512, Stream::DEFAULT).map(|p| alloc.free(p));
    client.read_until(alloc.live_entries());
    let dump = alloc.snapshot();
    let ours = dump.external_annotations.clone().unwrap();
    assert_eq!(ours.len(), 7);
    let rebuilt = client.live.into_snapshot().unwrap();
    assert_eq!(rebuilt.external_annotations, Some(ours));
}

/// The annotation ring keeps `max_entries`: a listener that was not sent the ones it
/// overwrote is told how many it missed.
#[test]
fn annotations_overwritten_before_they_were_sent_are_counted_as_missed() {
    let alloc = recorder(8);
    let (_dir, server) = served(&alloc);
    let mut client = Client::connect(&server.url());
    client.read_until(0);
    // The listener's thread copies at most the ring's 8 per poll (every 5 ms when idle):
    // most of 10,000 annotations recorded in a loop are overwritten before it looks.
    for i in 0..10_000 {
        alloc.record_annotation(&[("name", &i.to_string())]);
    }
    let _ = alloc.malloc(512, Stream::DEFAULT).map(|p| alloc.free(p));
    client.read_until(alloc.live_entries());
    let got = client
        .live
        .snapshot()
        .unwrap()
        .external_annotations
        .as_ref()
        .map_or(0, Vec::len) as u64;
    assert!(client.live.missed_annotations() > 0);
    assert_eq!(got + client.live.missed_annotations(), 10_000);
}

/// What must agree between the recorder's segments and a listener's: the segment list, the
/// size sums of its blocks, and each block's place and state (and, for allocated blocks, the
/// request). Sizes here are multiples of 512 that the allocator splits exactly.
fn segment_shape(snapshot: &Snapshot) -> Vec<(u64, u64, Option<bool>, Vec<String>)> {
    snapshot
        .segments
        .iter()
        .map(|s| {
            let blocks = s
                .block_addresses()
                .map(|(addr, b)| {
                    let requested = if b.state == memsnap_format::BlockState::ActiveAllocated {
                        b.requested_size
                    } else {
                        None
                    };
                    format!("{addr:#x}+{} {:?} {requested:?}", b.size, b.state)
                })
                .collect();
            (s.address, s.total_size, s.is_expandable, blocks)
        })
        .collect()
}

/// Regression: a listener's segments were those at connect, so a block allocated before it
/// connected and freed after stayed `active_allocated` (a replay of the saved snapshot
/// counted it live for the whole window), and segments released or made after connect were
/// still there or missing.
#[test]
fn segments_made_freed_and_split_after_connect_stay_the_recorders() {
    use memsnap_recorder::SimulatedDevice;
    const MIB: u64 = 1 << 20;
    for conf in ["", "expandable_segments:True"] {
        let alloc =
            Arc::new(CachingAllocator::with_conf(SimulatedDevice::new(1 << 34), conf).unwrap());
        alloc.record_memory_history(history(usize::MAX, false));
        let s = Stream::DEFAULT;
        let a = alloc.malloc(4 * MIB, s).unwrap();
        let b = alloc.malloc(8 * MIB, s).unwrap();
        let small: Vec<u64> = (0..4).map(|_| alloc.malloc(4096, s).unwrap()).collect();
        let (_dir, server) = served(&alloc);
        let mut client = Client::connect(&server.url());
        client.read_until(alloc.live_entries());

        alloc.free(a).unwrap();
        alloc.free(small[1]).unwrap();
        let big = alloc.malloc(40 * MIB, s).unwrap();
        alloc.free(b).unwrap();
        alloc.empty_cache().unwrap();
        let c = alloc.malloc(2 * MIB, s).unwrap();
        let d = alloc.malloc(1536, s).unwrap();
        alloc.free(big).unwrap();
        alloc.empty_cache().unwrap();
        let e = alloc.malloc(6 * MIB, s).unwrap();
        client.read_until(alloc.live_entries());

        let dump = alloc.snapshot();
        let mut rebuilt = client.live.into_snapshot().unwrap();
        assert_eq!(
            segment_shape(&rebuilt),
            segment_shape(&dump),
            "conf {conf:?}"
        );
        let sums = |snap: &Snapshot| -> Vec<_> {
            snap.segments
                .iter()
                .map(|s| (s.allocated_size, s.active_size, s.requested_size))
                .collect()
        };
        assert_eq!(sums(&rebuilt), sums(&dump), "conf {conf:?}");
        assert_eq!(memsnap_format::validate(&rebuilt), vec![], "conf {conf:?}");
        // The freed block is no longer an allocation of the final segments.
        let allocated: Vec<u64> = rebuilt
            .segments
            .iter()
            .flat_map(|s| s.block_addresses())
            .filter(|(_, b)| b.state == memsnap_format::BlockState::ActiveAllocated)
            .map(|(addr, _)| addr)
            .collect();
        assert!(
            !allocated.contains(&a) || [c, d, e].contains(&a),
            "conf {conf:?}"
        );
        rebuilt.segments.clear();
        drop(server);
    }
}

/// Connects over TCP, sends `token` (the listener's first frame) and applies what comes
/// until the state arrived or the stream ended; the error, if the stream was refused.
fn tcp_listener_with_token(
    port: u16,
    token: &str,
) -> Result<LiveSnapshot, memsnap_format::live::LiveError> {
    use memsnap_format::live::{encode, Message};
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut frame = Vec::new();
    encode(
        &Message::Token {
            token: token.to_owned(),
        },
        &mut frame,
    )
    .unwrap();
    stream.write_all(&frame).unwrap();
    let (mut reader, mut live) = (FrameReader::new(), LiveSnapshot::new());
    let mut buf = vec![0; 1 << 16];
    while !live.has_state() {
        match reader.next_message()? {
            Some(m) => {
                live.apply(m)?;
            }
            None => {
                let n = stream.read(&mut buf).expect("the recorder answers");
                assert!(n > 0, "closed without a word");
                reader.push(&buf[..n]);
            }
        }
    }
    Ok(live)
}

#[test]
fn a_non_loopback_address_is_served_only_with_a_token_of_16_bytes_or_more() {
    let alloc = recorder(usize::MAX);
    let err = alloc.serve_live("tcp:0.0.0.0:0").err().expect("refused");
    assert!(err.to_string().contains("only with a token"), "{err}");
    let err = alloc
        .serve_live_with_token("tcp:0.0.0.0:0", "short")
        .err()
        .expect("refused");
    assert!(err.to_string().contains("at least 16"), "{err}");
    let server = alloc
        .serve_live_with_token("tcp:0.0.0.0:0", "0123456789abcdef")
        .unwrap();
    let memsnap_recorder::LiveAddr::Tcp(sa) = server.addr() else {
        panic!("a TCP endpoint");
    };
    assert!(sa.ip().is_unspecified() && sa.port() != 0);
    train(&alloc, 1, 3);
    let live = tcp_listener_with_token(sa.port(), "0123456789abcdef").unwrap();
    assert!(!live.trace().is_empty());
}

#[test]
fn a_listener_without_the_right_token_is_refused_before_any_state() {
    let alloc = recorder(usize::MAX);
    let token = "a-token-of-enough-bytes";
    let server = alloc
        .serve_live_with_token("tcp:127.0.0.1:0", token)
        .unwrap();
    let memsnap_recorder::LiveAddr::Tcp(sa) = server.addr() else {
        panic!("a TCP endpoint");
    };
    train(&alloc, 1, 3);
    for (given, reason) in [
        ("a-token-of-enough-byteZ", "wrong token"),
        ("a-token", "wrong token"),
        ("", "needs a token"),
    ] {
        let err = tcp_listener_with_token(sa.port(), given).expect_err("refused");
        assert!(
            matches!(&err, memsnap_format::live::LiveError::Refused { reason: r } if r.contains(reason)),
            "{given:?}: {err}"
        );
    }
    assert_eq!(server.counters().refused.load(Ordering::Relaxed), 3);
    assert!(tcp_listener_with_token(sa.port(), token).is_ok());
}

#[test]
fn connections_over_the_listener_limit_are_closed_at_once() {
    use memsnap_recorder::live::MAX_LISTENERS;
    let alloc = recorder(usize::MAX);
    let server = alloc
        .serve_live_with_token("tcp:127.0.0.1:0", "a-token-of-enough-bytes")
        .unwrap();
    let memsnap_recorder::LiveAddr::Tcp(sa) = *server.addr() else {
        panic!("a TCP endpoint");
    };
    // Listeners that never send their token: each holds a thread while it is waited for.
    let mut silent = Vec::new();
    for _ in 0..MAX_LISTENERS {
        let mut s = std::net::TcpStream::connect(sa).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        // Its Hello arrives: it was accepted and has its thread.
        let mut head = [0u8; 4];
        s.read_exact(&mut head).unwrap();
        silent.push(s);
    }
    let mut over = std::net::TcpStream::connect(sa).unwrap();
    over.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(over.read(&mut buf).unwrap(), 0, "closed without a Hello");
    assert_eq!(server.counters().refused.load(Ordering::Relaxed), 1);
    drop(server);
}

/// Regression: `memsnap watch` writes its token frame to every recorder (empty when it has
/// none); a recorder without a token never read it, and closing a socket with unread bytes
/// reset the connection: the watch got "Connection reset by peer" instead of the end.
#[test]
fn a_listener_that_wrote_to_a_recorder_without_a_token_gets_the_end_not_a_reset() {
    use memsnap_format::live::{encode, Message};
    use std::io::Write;
    let alloc = recorder(usize::MAX);
    let (_dir, server) = served(&alloc);
    let mut client = Client::connect(&server.url());
    let mut frame = Vec::new();
    encode(&Message::Token { token: "".into() }, &mut frame).unwrap();
    client.stream.write_all(&frame).unwrap();
    train(&alloc, 1, 3);
    client.read_until(alloc.live_entries());
    drop(server);
    let mut rest = Vec::new();
    let end = client.stream.read_to_end(&mut rest);
    assert!(end.is_ok(), "{end:?}");
}

/// A caller that keeps its own stack per allocation beside the allocator (as the C ABI keeps
/// Python stacks): the frame `caller.py:<address>` for each `alloc` recorded after connect,
/// and the allocator's own frames with `drop_me` trimmed off.
#[derive(Default)]
struct OwnStacks {
    /// States given to listeners.
    states: std::sync::atomic::AtomicUsize,
}

impl memsnap_recorder::live::LiveStacks for OwnStacks {
    fn state(
        &self,
        take: &mut dyn FnMut() -> memsnap_recorder::live::LiveState,
    ) -> memsnap_recorder::live::LiveState {
        self.states.fetch_add(1, Ordering::Relaxed);
        take()
    }

    fn extra(
        &self,
        _device: i64,
        _first_seq: u64,
        entries: &[(memsnap_format::Action, u64)],
    ) -> Vec<Option<u32>> {
        entries
            .iter()
            .map(|&(action, addr)| {
                (action == memsnap_format::Action::Alloc).then_some((addr % 1_000_000) as u32)
            })
            .collect()
    }

    fn frames(&self, native: Vec<Frame>, extra: Option<u32>) -> Vec<Frame> {
        let mut frames: Vec<Frame> = native.into_iter().filter(|f| f.name != "drop_me").collect();
        if let Some(line) = extra {
            frames.push(Frame::new("caller", "caller.py", i64::from(line)));
        }
        frames
    }
}

#[test]
fn a_callers_own_stacks_reach_listeners_spliced_into_the_entries_frames() {
    let alloc = recorder(usize::MAX);
    let own_stacks = Arc::new(OwnStacks::default());
    let dir = tempfile::tempdir().unwrap();
    let url = format!("unix:{}", dir.path().join("live.sock").display());
    let server = memsnap_recorder::live::serve_with_stacks(
        alloc.clone(),
        memsnap_recorder::LiveAddr::parse(&url).unwrap(),
        None,
        Some(own_stacks.clone()),
    )
    .unwrap();
    let mut client = Client::connect(&server.url());
    // The state first: what follows comes as entries.
    client.read_until(alloc.recorded_entries());
    let own = alloc
        .register_stack(&[
            Frame::new("drop_me", "abi.rs", 1),
            Frame::new("f", "m.py", 2),
        ])
        .unwrap();
    let a = alloc.malloc_with_stack(4096, Stream::DEFAULT, own).unwrap();
    let b = alloc.malloc(8192, Stream::DEFAULT).unwrap();
    alloc.free_with_stack(a, own).unwrap();
    alloc.free(b).unwrap();
    let recorded = alloc.recorded_entries();
    client.read_until(recorded);
    let received = client.live.into_snapshot().unwrap();
    assert_eq!(
        own_stacks.states.load(Ordering::Relaxed),
        1,
        "the state went through it"
    );
    let trace = &received.device_traces.as_ref().unwrap()[0];
    let frames = |i: usize| -> Vec<(String, i64)> {
        trace[i]
            .frames
            .map(|id| {
                received
                    .stack_frames(id)
                    .map(|f| (f.name.clone(), f.line.as_i64().unwrap_or(-1)))
                    .collect()
            })
            .unwrap_or_default()
    };
    let line = |addr: u64| (addr % 1_000_000) as i64;
    let allocs: Vec<usize> = (0..trace.len())
        .filter(|&i| trace[i].action == memsnap_format::Action::Alloc)
        .collect();
    assert_eq!(allocs.len(), 2);
    // The given stack, trimmed, with the caller's frame; the stackless one has it alone.
    assert_eq!(
        frames(allocs[0]),
        vec![("f".to_owned(), 2), ("caller".to_owned(), line(a))]
    );
    assert_eq!(frames(allocs[1]), vec![("caller".to_owned(), line(b))]);
    // Frees keep their own (trimmed) frames: the caller gave none for them.
    let free_a = (0..trace.len())
        .find(|&i| trace[i].action == memsnap_format::Action::FreeRequested && trace[i].addr == a)
        .unwrap();
    assert_eq!(frames(free_a), vec![("f".to_owned(), 2)]);
}

#[test]
fn catching_up_before_the_server_is_dropped_sends_the_listener_the_end_of_the_run() {
    let alloc = recorder(usize::MAX);
    let (_dir, server) = served(&alloc);
    let mut client = Client::connect(&server.url());
    client.read_until(alloc.recorded_entries());
    // Reads whatever comes until the connection closes.
    let reader = std::thread::spawn(move || {
        client.read_to_end();
        client
    });
    // A burst right before the end: the listener has not been sent most of it yet.
    train(&alloc, 20, 500);
    let recorded = alloc.recorded_entries();
    assert!(server.catch_up(Duration::from_secs(30)));
    drop(server);
    // Everything was written before the connection closed.
    let client = reader.join().unwrap();
    assert_eq!(client.live.next_seq(), recorded);
    assert_eq!(client.live.missed(), 0);
}

#[test]
fn catching_up_with_a_listener_that_stopped_reading_gives_up_at_its_bound() {
    let alloc = recorder(usize::MAX);
    let (dir, server) = served(&alloc);
    // Connected, never reads: once the socket's buffers are full its thread cannot send.
    let _stalled = UnixStream::connect(dir.path().join("live.sock")).unwrap();
    train(&alloc, 40, 2_000);
    let started = std::time::Instant::now();
    assert!(!server.catch_up(Duration::from_millis(300)));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

//! Live publishing from a process that loads the library: `MEMSNAP_LIVE` alone, and
//! `memsnap_serve_live` through the Python module (`memsnap_torch.serve_live`, no torch).
//! A client connects while the process runs and rebuilds its trace from the stream.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use memsnap_format::live::{FrameReader, LiveSnapshot};
use memsnap_format::Action;

use super::{built_library, have_program};

/// Allocates three blocks, says "ready", waits for a line, allocates a fourth and frees the
/// first, says "done", waits for a line and exits. Prints what `serve_live` returned when
/// its first argument is an address (the Python module's path), or nothing (`MEMSNAP_LIVE`).
const PROGRAM: &str = r#"
import ctypes, os, sys
library, address = sys.argv[1], sys.argv[2]
if address != "-":
    sys.path.insert(0, sys.argv[3])
    os.environ["MEMSNAP_LIBRARY"] = library
    import memsnap_torch
    lib = memsnap_torch.load_library()
    assert memsnap_torch.live_address() is None
    url = memsnap_torch.serve_live(True if address == "1" else address)
    assert memsnap_torch.serve_live(True) == url, "asking again gives the same address"
    try:
        memsnap_torch.serve_live("tcp:127.0.0.1:0")
    except memsnap_torch.MemsnapError as e:
        assert "already published" in str(e), e
    else:
        raise AssertionError("a second address for the device was accepted")
    memsnap_torch.record_history("all", context="all", stacks="none", max_entries=1000)
    print("url", url, flush=True)
else:
    lib = ctypes.CDLL(library)
    lib.memsnap_alloc.restype = ctypes.c_void_p
    lib.memsnap_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.memsnap_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
kept = [lib.memsnap_alloc(1 << 20, 0, None) for _ in range(3)]
assert all(kept)
print("ready", flush=True)
sys.stdin.readline()
kept.append(lib.memsnap_alloc(2 << 20, 0, None))
lib.memsnap_free(kept.pop(0), 1 << 20, 0, None)
print("done", flush=True)
sys.stdin.readline()
"#;

struct Run {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Run {
    fn start(address: &str, env: &[(&str, &str)]) -> Run {
        let mut command = Command::new("python3");
        command
            .arg("-c")
            .arg(PROGRAM)
            .arg(built_library("libmemsnap_recorder.so"))
            .arg(address)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("python"))
            .env("MEMSNAP_BACKEND", "simulated")
            .env_remove("MEMSNAP_DUMP")
            .env_remove("MEMSNAP_LIVE")
            .env_remove("MEMSNAP_LIVE_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Run {
            child,
            stdin,
            stdout,
        }
    }

    /// The next line the program prints (empty when it ended).
    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim_end().to_owned()
    }

    fn go_on(&mut self) {
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Lets the program end; its stderr, after checking that it succeeded.
    fn finish(mut self) -> String {
        self.go_on();
        drop(self.stdin);
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        let out = self.child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "the program failed: {rest}{stderr}");
        stderr
    }
}

/// A listener on a unix socket that rebuilds the snapshot.
struct Client {
    stream: UnixStream,
    reader: FrameReader,
    live: LiveSnapshot,
}

impl Client {
    fn connect(url: &str) -> Client {
        let path = url.strip_prefix("unix:").expect("a unix address");
        let stream = UnixStream::connect(path).expect("connect");
        // A bug shows as a failed read, not a test that hangs.
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client {
            stream,
            reader: FrameReader::new(),
            live: LiveSnapshot::new(),
        }
    }

    /// Reads until `done` holds for the rebuilt trace.
    fn read_until(&mut self, done: impl Fn(&[memsnap_format::TraceEntry]) -> bool) {
        let mut buf = vec![0; 1 << 16];
        while self.live.snapshot().is_none() || !done(self.live.trace()) {
            match self.reader.next_message().expect("a well-formed stream") {
                Some(m) => {
                    self.live.apply(m).expect("applies");
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

fn count(trace: &[memsnap_format::TraceEntry], action: Action, size: u64) -> usize {
    trace
        .iter()
        .filter(|e| e.action == action && e.size == size)
        .count()
}

/// Connects to the running program, checks the state (three allocations), lets it allocate
/// and free, and reads until both arrive.
fn watch_the_run(run: &mut Run, url: &str) {
    assert_eq!(run.line(), "ready");
    let mut client = Client::connect(url);
    client.read_until(|_| true);
    assert_eq!(count(client.live.trace(), Action::Alloc, 1 << 20), 3);
    run.go_on();
    assert_eq!(run.line(), "done");
    client.read_until(|t| {
        count(t, Action::Alloc, 2 << 20) == 1 && count(t, Action::FreeCompleted, 1 << 20) == 1
    });
    let trace = client.live.trace();
    assert_eq!(count(trace, Action::Alloc, 1 << 20), 3);
    let freed = trace
        .iter()
        .find(|e| e.action == Action::FreeCompleted)
        .unwrap();
    let first = trace.iter().find(|e| e.action == Action::Alloc).unwrap();
    assert_eq!(freed.addr, first.addr, "the first block is the one freed");
}

#[test]
fn memsnap_live_alone_publishes_the_run_and_removes_its_socket_at_exit() {
    if !have_program("python3", "the MEMSNAP_LIVE test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("live.sock");
    let url = format!("unix:{}", socket.display());
    // No MEMSNAP_HISTORY: MEMSNAP_LIVE turns the history on.
    let mut run = Run::start("-", &[("MEMSNAP_LIVE", &url)]);
    watch_the_run(&mut run, &url);
    let stderr = run.finish();
    assert_eq!(
        stderr.matches(&format!("memsnap: live at {url}")).count(),
        1,
        "the address is said once: {stderr}"
    );
    assert!(!socket.exists(), "the socket is removed at exit");
}

#[test]
fn an_endpoint_that_cannot_listen_is_reported_and_the_run_goes_on() {
    if !have_program("python3", "the MEMSNAP_LIVE failure test") {
        return;
    }
    // The last: any address, but without MEMSNAP_LIVE_TOKEN.
    for address in [
        "unix:/nonexistent-memsnap-dir/x.sock",
        "bogus",
        "tcp:0.0.0.0:0",
    ] {
        let mut run = Run::start(
            "-",
            &[("MEMSNAP_LIVE", address), ("MEMSNAP_HISTORY", "all")],
        );
        assert_eq!(run.line(), "ready", "allocations work ({address})");
        run.go_on();
        assert_eq!(run.line(), "done");
        let stderr = run.finish();
        assert!(
            stderr.contains(&format!("memsnap: MEMSNAP_LIVE={address}: "))
                && stderr.contains("recording goes on without live publishing"),
            "{address}: {stderr}"
        );
        assert!(!stderr.contains("live at"), "{stderr}");
    }
}

#[test]
fn a_token_lets_memsnap_live_listen_on_every_interface() {
    if !have_program("python3", "the MEMSNAP_LIVE_TOKEN test") {
        return;
    }
    let mut run = Run::start(
        "-",
        &[
            ("MEMSNAP_LIVE", "tcp:0.0.0.0:0"),
            ("MEMSNAP_LIVE_TOKEN", "0123456789abcdef"),
            ("MEMSNAP_HISTORY", "all"),
        ],
    );
    assert_eq!(run.line(), "ready");
    run.go_on();
    assert_eq!(run.line(), "done");
    let stderr = run.finish();
    assert!(stderr.contains("memsnap: live at tcp:0.0.0.0:"), "{stderr}");
}

#[test]
fn the_python_module_starts_publishing_and_returns_the_address() {
    if !have_program("python3", "the serve_live test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("py.sock");
    let asked = format!("unix:{}", socket.display());
    let mut run = Run::start(&asked, &[]);
    let said = run.line();
    assert_eq!(said, format!("url {asked}"));
    watch_the_run(&mut run, &asked);
    let stderr = run.finish();
    assert!(
        stderr.contains(&format!("memsnap: live at {asked}")),
        "{stderr}"
    );
}

#[test]
fn the_default_address_is_a_private_socket_named_after_the_pid() {
    if !have_program("python3", "the serve_live default test") {
        return;
    }
    let runtime = tempfile::tempdir().unwrap();
    let mut run = Run::start(
        "1",
        &[("XDG_RUNTIME_DIR", runtime.path().to_str().unwrap())],
    );
    let pid = run.child.id();
    let said = run.line();
    let url = said.strip_prefix("url ").expect("the address").to_owned();
    let private = runtime.path().join(format!("memsnap-live-{pid}"));
    assert_eq!(url, format!("unix:{}", private.join("live.sock").display()));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&private).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    watch_the_run(&mut run, &url);
    run.finish();
    assert!(
        !private.exists(),
        "the private directory is removed at exit"
    );
}

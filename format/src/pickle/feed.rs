//! Where the VM's bytes come from: a slice already in memory, or a reader seen through a
//! window of about [`READ_CHUNK`] bytes, so loading a file never holds the whole file.

use std::io::Read;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Mutex, PoisonError};

/// Bytes a [`ReaderFeed`] asks its reader for at a time.
const READ_CHUNK: usize = 256 << 10;

/// Where the VM's bytes come from.
pub trait Feed {
    /// The bytes available now, from the current window start.
    fn window(&self) -> &[u8];
    /// Moves the window start `drop` bytes on (always, even when reading then fails), then
    /// reads until at least `need` bytes are available or the input ends.
    fn refill(&mut self, drop: usize, need: usize) -> std::io::Result<()>;
}

/// Input already in memory: the window is the rest of the slice.
pub struct SliceFeed<'a> {
    data: &'a [u8],
    start: usize,
}

impl<'a> SliceFeed<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        SliceFeed { data, start: 0 }
    }
}

impl Feed for SliceFeed<'_> {
    #[inline(always)]
    fn window(&self) -> &[u8] {
        &self.data[self.start..]
    }

    fn refill(&mut self, drop: usize, _need: usize) -> std::io::Result<()> {
        self.start += drop;
        Ok(())
    }
}

/// A reader seen through a buffer of about [`READ_CHUNK`] bytes: read on this thread
/// ([`ReaderFeed::new`]), or on another one, ahead of the VM ([`read_ahead`]).
pub(crate) struct ReaderFeed<R> {
    source: Source<R>,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

enum Source<R> {
    /// Read into the window's buffer when the VM wants more.
    Here(R),
    /// Read into chunks by [`read_ahead`]'s thread.
    Ahead {
        chunks: Receiver<Chunk>,
        /// Emptied chunks, back to the thread to fill again.
        spent: Sender<Vec<u8>>,
        /// The thread sent its last chunk.
        ended: bool,
        /// The read error the thread ended with, returned again on each later refill (as
        /// a reader read here would return it again).
        failed: Option<(std::io::ErrorKind, String)>,
    },
}

impl<R: Read> ReaderFeed<R> {
    pub fn new(reader: R) -> Self {
        ReaderFeed {
            source: Source::Here(reader),
            buf: Vec::new(),
            start: 0,
            end: 0,
        }
    }

    fn ahead(chunks: Receiver<Chunk>, spent: Sender<Vec<u8>>) -> Self {
        ReaderFeed {
            source: Source::Ahead {
                chunks,
                spent,
                ended: false,
                failed: None,
            },
            buf: Vec::new(),
            start: 0,
            end: 0,
        }
    }
}

impl<R: Read> Feed for ReaderFeed<R> {
    #[inline(always)]
    fn window(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn refill(&mut self, drop: usize, need: usize) -> std::io::Result<()> {
        self.start += drop;
        if self.end - self.start >= need {
            return Ok(());
        }
        let reader = match &mut self.source {
            Source::Here(reader) => reader,
            Source::Ahead { .. } => return self.take_chunks(need),
        };
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        let size = need.max(READ_CHUNK);
        if self.buf.len() < size {
            self.buf.resize(size, 0);
        }
        while self.end < need {
            match reader.read(&mut self.buf[self.end..]) {
                Ok(0) => break,
                Ok(n) => self.end += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl<R> ReaderFeed<R> {
    /// [`Feed::refill`] from the chunks [`read_ahead`]'s thread read: while the window is
    /// short of `need`, the next chunk becomes the window's buffer, with the window's unread
    /// tail copied into the room before its bytes; a tail longer than that room (a long
    /// string) gets the chunk's bytes appended instead.
    fn take_chunks(&mut self, need: usize) -> std::io::Result<()> {
        let Source::Ahead {
            chunks,
            spent,
            ended,
            failed,
        } = &mut self.source
        else {
            return Ok(());
        };
        while self.end - self.start < need {
            if let Some((kind, message)) = failed {
                return Err(std::io::Error::new(*kind, message.clone()));
            }
            if *ended {
                break;
            }
            let chunk = match chunks.recv() {
                Ok(Ok(chunk)) => chunk,
                Ok(Err(e)) => {
                    *ended = true;
                    *failed = Some((e.kind(), e.to_string()));
                    return Err(e);
                }
                Err(_) => {
                    *ended = true;
                    break;
                }
            };
            let tail = self.end - self.start;
            if tail <= AHEAD_HEADROOM {
                let mut chunk = chunk;
                let at = AHEAD_HEADROOM - tail;
                chunk[at..AHEAD_HEADROOM].copy_from_slice(&self.buf[self.start..self.end]);
                let window = std::mem::replace(&mut self.buf, chunk);
                if window.capacity() == AHEAD_BUFFER {
                    let _ = spent.send(window);
                }
                self.start = at;
                self.end = self.buf.len();
            } else {
                self.buf.copy_within(self.start..self.end, 0);
                self.buf.truncate(tail);
                self.buf.extend_from_slice(&chunk[AHEAD_HEADROOM..]);
                self.start = 0;
                self.end = self.buf.len();
                let _ = spent.send(chunk);
            }
        }
        Ok(())
    }
}

/// Bytes [`read_ahead`]'s thread reads into each chunk.
const AHEAD_CHUNK: usize = 256 << 10;

/// Room kept free before each chunk's bytes: the window's unread tail (an entry cut by the
/// chunk's end, a few KiB at most) is copied there, so the window stays one slice without
/// the chunk being copied.
const AHEAD_HEADROOM: usize = 64 << 10;

/// A chunk's buffer: the room, then the bytes.
const AHEAD_BUFFER: usize = AHEAD_HEADROOM + AHEAD_CHUNK;

/// Chunks read and not yet taken. With the one being filled and the window's, a
/// [`read_ahead`] holds at most 4 chunks (1.25 MiB).
const AHEAD_QUEUE: usize = 2;

/// A chunk [`read_ahead`]'s thread read: its bytes are `buf[AHEAD_HEADROOM..]`.
type Chunk = std::io::Result<Vec<u8>>;

/// Runs `body` with a feed of `reader`'s bytes read on another (scoped) thread, a few
/// chunks ahead of the VM: the kernel's copy of a file into memory (a tenth of a plain
/// pickle's load) then runs beside the decoding rather than in front of each piece of it.
/// When no thread can be started, `body` gets a feed that reads on this thread. The thread
/// stops at the reader's end, at its first error (the feed returns it), or as soon as the
/// feed is dropped (its next chunk has nowhere to go).
pub(crate) fn read_ahead<R: Read + Send, T>(reader: R, body: impl FnOnce(ReaderFeed<R>) -> T) -> T {
    // Taken by the thread when it starts; still here if it could not be started.
    let slot = Mutex::new(Some(reader));
    let slot = &slot;
    std::thread::scope(|scope| {
        let (chunk_to, chunks) = sync_channel(AHEAD_QUEUE);
        let (spent, spent_from) = channel();
        let started = std::thread::Builder::new()
            .name("memsnap-read-ahead".into())
            .spawn_scoped(scope, move || {
                let reader = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
                if let Some(reader) = reader {
                    read_chunks(reader, &chunk_to, &spent_from);
                }
            });
        if started.is_ok() {
            return body(ReaderFeed::ahead(chunks, spent));
        }
        match slot.lock().unwrap_or_else(PoisonError::into_inner).take() {
            Some(reader) => body(ReaderFeed::new(reader)),
            // Not reached (the thread never ran): a feed with nothing in it.
            None => body(ReaderFeed::ahead(chunks, spent)),
        }
    })
}

/// [`read_ahead`]'s thread: fills chunks (reusing the spent ones) and sends them on, until
/// the reader ends or fails or the feed is gone.
fn read_chunks(mut reader: impl Read, chunks: &SyncSender<Chunk>, spent: &Receiver<Vec<u8>>) {
    loop {
        let mut buf = spent.try_recv().unwrap_or_default();
        buf.resize(AHEAD_BUFFER, 0);
        let mut n = AHEAD_HEADROOM;
        let mut at_end = false;
        while n < buf.len() {
            match reader.read(&mut buf[n..]) {
                Ok(0) => {
                    at_end = true;
                    break;
                }
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // The bytes read before it first: the error is then met where they end.
                    buf.truncate(n);
                    if n > AHEAD_HEADROOM && chunks.send(Ok(buf)).is_err() {
                        return;
                    }
                    let _ = chunks.send(Err(e));
                    return;
                }
            }
        }
        buf.truncate(n);
        if n > AHEAD_HEADROOM && chunks.send(Ok(buf)).is_err() {
            return;
        }
        if at_end {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out its bytes in pieces of varying size, then an error if asked.
    struct Pieces {
        data: Vec<u8>,
        at: usize,
        step: usize,
        fail_at_end: bool,
    }

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.at == self.data.len() && self.fail_at_end {
                return Err(std::io::Error::other("the disk went away"));
            }
            self.step = (self.step * 7 + 13) % 40_000 + 1;
            let n = self.step.min(buf.len()).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    /// `data` in pieces from the first byte; failing at its end when `fail_at_end`.
    fn pieces(data: &[u8], fail_at_end: bool) -> Pieces {
        Pieces {
            data: data.to_vec(),
            at: 0,
            step: 1,
            fail_at_end,
        }
    }

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    /// Walks a feed with windows of many sizes (past the chunk's room and past a chunk) and
    /// checks every window against the input; returns the offset reached.
    fn walk(feed: &mut impl Feed, data: &[u8]) -> usize {
        let mut offset = 0;
        let mut drop = 0;
        for (i, need) in [1usize, 4096, 70_000, 300_000, 5, 1 << 20, 64 << 10, 3]
            .into_iter()
            .cycle()
            .enumerate()
        {
            feed.refill(drop, need).expect("read");
            offset += drop;
            let window = feed.window();
            let have = (data.len() - offset).min(window.len());
            assert_eq!(&window[..have], &data[offset..offset + have], "at {offset}");
            assert!(window.len() >= need.min(data.len() - offset), "at {offset}");
            if window.is_empty() {
                return offset;
            }
            drop = (need / 2 + i % 97).min(window.len());
        }
        unreachable!()
    }

    #[test]
    fn read_ahead_feeds_every_byte_in_order_whatever_windows_are_asked_for() {
        let data = bytes(3_000_000);
        let reader = pieces(&data, false);
        let reached = read_ahead(reader, |mut feed| walk(&mut feed, &data));
        assert_eq!(reached, data.len());
        // The feed that reads on this thread gives the same bytes.
        let mut here = ReaderFeed::new(std::io::Cursor::new(data.clone()));
        assert_eq!(walk(&mut here, &data), data.len());
    }

    #[test]
    fn a_read_error_on_the_read_ahead_thread_comes_back_on_every_later_refill() {
        let data = bytes(700_000);
        let reader = pieces(&data, true);
        read_ahead(reader, |mut feed| {
            feed.refill(0, 500_000).expect("before the error");
            assert_eq!(&feed.window()[..500_000], &data[..500_000]);
            for _ in 0..3 {
                let err = feed.refill(0, 800_000).expect_err("past the error");
                assert_eq!(err.to_string(), "the disk went away");
            }
        });
    }

    /// The thread of a feed dropped early (a parse error, a cancel) ends: `read_ahead`
    /// returns although the reader never ends.
    #[test]
    fn a_feed_dropped_early_stops_its_read_ahead_thread() {
        let first = read_ahead(std::io::repeat(7), |mut feed| {
            feed.refill(0, 10).expect("read");
            feed.window()[0]
        });
        assert_eq!(first, 7);
    }
}

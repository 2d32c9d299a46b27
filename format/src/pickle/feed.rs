//! Where the VM's bytes come from: a slice already in memory, or a reader seen through a
//! window of about [`READ_CHUNK`] bytes, so loading a file never holds the whole file.

use std::io::Read;

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

/// A reader seen through a buffer of about [`READ_CHUNK`] bytes.
pub(crate) struct ReaderFeed<R> {
    reader: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl<R: Read> ReaderFeed<R> {
    pub fn new(reader: R) -> Self {
        ReaderFeed {
            reader,
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
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        let size = need.max(READ_CHUNK);
        if self.buf.len() < size {
            self.buf.resize(size, 0);
        }
        while self.end < need {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => break,
                Ok(n) => self.end += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

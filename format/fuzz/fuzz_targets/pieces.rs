//! A reader that hands out 7 bytes per read, so opcodes straddle a streaming reader's window
//! (shared by the fuzz targets that compare a stream with a slice).

use std::io::Read;

pub struct Pieces<'a>(pub &'a [u8]);

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.0.len()).min(7);
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

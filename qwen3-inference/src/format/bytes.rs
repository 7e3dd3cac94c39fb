//! Bounds-checked little-endian reading of a byte slice, for headers that may be hostile.
//!
//! Every read either returns the value or an error saying which field ran past the end; nothing
//! here can panic or allocate more than the input's length. The tokenizer file reader uses it too.

use anyhow::{bail, Result};
use byteorder::{ByteOrder, LittleEndian};

/// A cursor over a byte slice.
pub struct ByteReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> ByteReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        ByteReader { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes left to read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes, or an error naming `what` if fewer remain.
    pub fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            bail!(
                "truncated header: {what} needs {n} bytes at offset {} but only {} remain",
                self.pos,
                self.remaining()
            );
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.bytes(1, what)?[0])
    }

    pub fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(LittleEndian::read_u16(self.bytes(2, what)?))
    }

    pub fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(LittleEndian::read_u32(self.bytes(4, what)?))
    }

    pub fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(LittleEndian::read_u64(self.bytes(8, what)?))
    }

    pub fn f32(&mut self, what: &str) -> Result<f32> {
        Ok(LittleEndian::read_f32(self.bytes(4, what)?))
    }

    pub fn f64(&mut self, what: &str) -> Result<f64> {
        Ok(LittleEndian::read_f64(self.bytes(8, what)?))
    }

    /// A string stored as a u32 byte length followed by UTF-8 bytes (checked).
    pub fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u32(what)? as usize;
        let b = self.bytes(len, what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => bail!("{what} is not valid UTF-8: {e}"),
        }
    }

    /// A count that will size a `Vec` of items each at least `min_item_bytes` long: refused when
    /// the remaining bytes could not hold that many, so a hostile count cannot make us allocate
    /// more than the input's size.
    pub fn count(&mut self, min_item_bytes: usize, what: &str) -> Result<usize> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_item_bytes.max(1)) > self.remaining() {
            bail!(
                "corrupt header: {what} is {n} but only {} bytes remain",
                self.remaining()
            );
        }
        Ok(n)
    }
}

/// Little-endian writing into a growing `Vec<u8>`, the mirror of [`ByteReader`].
#[derive(Default)]
pub struct ByteWriter {
    pub buf: Vec<u8>,
}

impl ByteWriter {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f32(&mut self, v: f32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f64(&mut self, v: f64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    /// u32 length, then the bytes.
    pub fn string(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.bytes(s.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_written() {
        let mut w = ByteWriter::default();
        w.u8(7);
        w.u16(0x1234);
        w.u32(0xDEAD_BEEF);
        w.u64(1 << 40);
        w.f32(1.5);
        w.f64(1e-6);
        w.string("héllo");
        let mut r = ByteReader::new(&w.buf);
        assert_eq!(r.u8("a").unwrap(), 7);
        assert_eq!(r.u16("b").unwrap(), 0x1234);
        assert_eq!(r.u32("c").unwrap(), 0xDEAD_BEEF);
        assert_eq!(r.u64("d").unwrap(), 1 << 40);
        assert_eq!(r.f32("e").unwrap(), 1.5);
        assert_eq!(r.f64("f").unwrap(), 1e-6);
        assert_eq!(r.string("g").unwrap(), "héllo");
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn truncation_and_hostile_counts_are_errors() {
        let mut r = ByteReader::new(&[1, 2, 3]);
        let e = r.u32("vocab size").unwrap_err().to_string();
        assert!(e.contains("vocab size"), "{e}");
        let mut r = ByteReader::new(&[0xFF, 0xFF, 0xFF, 0xFF, 0]);
        assert!(r.count(8, "tensor count").is_err());
        let mut r = ByteReader::new(&[2, 0, 0, 0, 0xC3, 0x28]);
        assert!(r.string("name").is_err());
    }
}

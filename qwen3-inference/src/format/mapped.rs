//! A file mapped read-only into memory: the one place where the library and the exporter map a
//! file, and so the one place its `unsafe` is argued.
//!
//! Mapping lets the weights stay in the page cache, shared and never copied: a 17 GiB model runs
//! on a machine whose memory could not hold a copy of it. The price is a promise that no one
//! changes the file while it is mapped.
//!
//! # Soundness
//!
//! [`MappedFile::map`] is safe to call, and its soundness rests on one assumption that Rust
//! cannot check and this crate does not enforce: **no process writes to or truncates the file
//! while it is mapped**. Were one to, the bytes behind a `&[u8]` would change under the borrow
//! (undefined behaviour), or reading a truncated page would raise SIGBUS. Every mmap-based runtime
//! (llama.cpp, safetensors' users, memmap2's) makes the same assumption, and pico-qwen keeps it on
//! its side: it never writes a file in place (the exporter writes a temporary and renames it,
//! `format::atomic`, which leaves a mapping of the old file intact), and it maps only model files
//! and checkpoints, which a user does not edit while running them. Running a model while another
//! program rewrites that very file in place is unsupported.

use anyhow::{Context, Result};
use memmap2::Mmap;
use std::fs::File;
use std::ops::{Deref, Range};

/// The bytes of a file, mapped read-only. Dereferences to `&[u8]`, borrowed from the mapping, so
/// no view of it can outlive it.
pub struct MappedFile {
    map: Mmap,
}

impl MappedFile {
    /// Maps `file` read-only.
    pub fn map(file: &File) -> Result<MappedFile> {
        // SAFETY: `Mmap::map` is unsafe because the mapping's contents could change (or the file
        // shrink) if another process writes the file while it is mapped: this module's
        // "Soundness" section states that assumption and why pico-qwen can rely on it. The
        // mapping is read-only, and only ever read through `&[u8]` borrowed from `self`, so no
        // view outlives it.
        let map = unsafe { Mmap::map(file) }.context("cannot mmap")?;
        Ok(MappedFile { map })
    }

    /// Asks the kernel for 2 MiB pages under the mapping ([`crate::pages`]); a hint only.
    pub fn advise_huge_pages(&self) {
        crate::pages::advise_huge_pages(&self.map);
    }

    /// Tells the kernel that this process will rarely read the whole pages within `range` again
    /// (Linux `MADV_DONTNEED`): they leave the process's resident memory (the page cache keeps
    /// them until it needs the room), and a later read maps them back. For bytes a copy has
    /// replaced (the kernels' own order of the weights, `ModelFile::derived`), so that the
    /// copy does not count twice. A hint: an error changes nothing and is ignored.
    pub fn release(&self, range: std::ops::Range<usize>) {
        const PAGE: usize = 4096;
        let (start, end) = (range.start.next_multiple_of(PAGE), range.end / PAGE * PAGE);
        if start >= end || end > self.map.len() {
            return;
        }
        #[cfg(target_os = "linux")]
        // SAFETY: the mapping is a read-only shared mapping of a file (`Mmap::map`). For such a
        // mapping `MADV_DONTNEED` only drops the page-table entries: the next read of a page
        // faults it in again from the page cache or the file, with the same bytes, since the
        // file does not change while mapped (the module's "Soundness"). So the bytes behind
        // every `&[u8]` borrowed from it stay what they were; only their residency changes.
        // The range lies within the mapping (checked above).
        let _ = unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        };
    }
}

impl Deref for MappedFile {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map
    }
}

/// Files mapped one after another, read as one run of bytes: a model file's one mapping, or the
/// parts of a GGUF file that llama.cpp's `gguf-split` cut (`-00001-of-00003.gguf`, ...). Part
/// `k`'s bytes are at offsets `start_k .. start_k + len_k` of the run, `start_k` the lengths of
/// the parts before it added up; a tensor lies within one part, so every range read is a borrow
/// of one mapping, never a copy.
pub struct MappedParts {
    /// Each part's first offset in the run, and its mapping, in order.
    parts: Vec<(usize, MappedFile)>,
}

impl MappedParts {
    /// One mapped file, as it is.
    pub fn one(map: MappedFile) -> MappedParts {
        MappedParts {
            parts: vec![(0, map)],
        }
    }

    /// Adds `map` after the parts already here; returns its first offset in the run.
    pub fn push(&mut self, map: MappedFile) -> usize {
        let start = self.len();
        self.parts.push((start, map));
        start
    }

    /// The run's length: every part's bytes.
    pub fn len(&self) -> usize {
        self.parts.last().map_or(0, |(start, m)| start + m.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many files.
    pub fn count(&self) -> usize {
        self.parts.len()
    }

    /// The first file's bytes (a GGUF's metadata; the whole of a single file).
    pub fn first(&self) -> &[u8] {
        &self.parts[0].1
    }

    /// Each file's bytes, in order.
    pub fn parts(&self) -> impl Iterator<Item = &[u8]> {
        self.parts.iter().map(|(_, m)| &m[..])
    }

    /// The whole run as one slice, when it is one file.
    pub fn whole(&self) -> Option<&[u8]> {
        match self.parts.as_slice() {
            [(_, m)] => Some(m),
            _ => None,
        }
    }

    /// The part holding offset `at`, and its first offset.
    fn part(&self, at: usize) -> Option<&(usize, MappedFile)> {
        let k = self.parts.partition_point(|(start, _)| *start <= at);
        self.parts.get(k.checked_sub(1)?)
    }

    /// Bytes `range` of the run, if they lie within one part.
    pub fn get(&self, range: Range<usize>) -> Option<&[u8]> {
        let (start, map) = self.part(range.start)?;
        map.get(range.start - start..range.end.checked_sub(*start)?)
    }

    /// [`MappedFile::advise_huge_pages`] for every part.
    pub fn advise_huge_pages(&self) {
        self.parts.iter().for_each(|(_, m)| m.advise_huge_pages());
    }

    /// [`MappedFile::release`] of bytes `range` of the run, within the part that holds its start.
    pub fn release(&self, range: Range<usize>) {
        if let Some((start, map)) = self.part(range.start) {
            map.release(range.start - start..range.end.saturating_sub(*start).min(map.len()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(bytes: &[u8]) -> MappedFile {
        let dir = std::env::temp_dir().join(format!("pq-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.bin", bytes.len()));
        std::fs::write(&path, bytes).unwrap();
        MappedFile::map(&File::open(&path).unwrap()).unwrap()
    }

    /// Ranges within a part are that part's bytes; a range across two parts, or past the end,
    /// is none.
    #[test]
    fn parts_read_as_one_run() {
        let mut parts = MappedParts::one(mapped(&[1, 2, 3]));
        assert_eq!(parts.push(mapped(&[4, 5, 6, 7, 8])), 3);
        assert_eq!((parts.len(), parts.count()), (8, 2));
        assert_eq!(parts.get(0..3), Some(&[1, 2, 3][..]));
        assert_eq!(parts.get(4..8), Some(&[5, 6, 7, 8][..]));
        assert_eq!(parts.get(3..3), Some(&[][..]));
        assert_eq!(parts.get(3..8), Some(&[4, 5, 6, 7, 8][..]));
        assert_eq!(parts.get(2..4), None);
        assert_eq!(parts.get(7..9), None);
        assert_eq!(parts.get(9..9), None);
        assert!(parts.whole().is_none());
        assert_eq!(parts.first(), &[1, 2, 3]);
    }
}

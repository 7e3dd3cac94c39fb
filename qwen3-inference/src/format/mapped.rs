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
use std::ops::Deref;

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
    /// replaced (the AVX-512 kernels' order of the weights, `ModelFile::derived`), so that the
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

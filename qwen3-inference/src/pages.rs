//! Huge pages under the mapped weights and the KV cache (Linux).
//!
//! Decoding a token streams every weight once, so its speed is the rate at which the cores can
//! stream memory, and on the dev machine that rate depends on how the pages behind the memory lie
//! in physical memory: the q8 decode kernel streams a buffer in 2 MiB pages markedly faster than
//! one in scattered 4 KiB pages, and a file whose page cache holds 64 KiB runs streams nearly as
//! fast as 2 MiB ones (measured: docs/performance.md, "Huge pages").
//!
//! The page cache holds a file in folios (runs of physically contiguous pages), whose size is
//! decided when the pages enter it:
//! - pages read from disk come in readahead-sized folios; `MADV_HUGEPAGE` on the mapping asks the
//!   fault path to read ahead in 2 MiB folios (Linux mm/filemap.c, `do_sync_mmap_readahead`);
//! - pages written by a program come in folios the size of its writes, which is why the exporter
//!   writes in aligned 4 MiB chunks (`atomic.rs`).
//!
//! A 2 MiB folio is mapped with a single page-table entry when the mapping is 2 MiB-aligned, which
//! Linux arranges by itself for large file mappings. All of this is a hint: where the kernel or
//! the filesystem has no large folios, or on other systems, the mapping keeps small pages and
//! everything works the same, only slower. [`huge_page_share`] says how much of a mapping is
//! mapped with 2 MiB entries (`qwen3 bench` prints it).
//!
//! Attention streams the KV cache the same way, once per layer and token, so the CPU backend keeps
//! it in [`HugePageF32s`] chunks: anonymous memory advised before its first touch, so that each
//! 2 MiB of it is one huge page when the kernel has one to give.

use memmap2::{Mmap, MmapMut};
use std::marker::PhantomData;

/// Asks the kernel to back `map` with huge pages where it can. A hint: errors (a kernel built
/// without transparent huge pages says EINVAL) change nothing and are ignored.
pub fn advise_huge_pages(map: &Mmap) {
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}

/// An anonymous mapping of `bytes` zeroed bytes, advised to use huge pages before any is touched
/// (so the first touch of each 2 MiB allocates a huge page): the buffer `qwen3 bench` measures the
/// memory bandwidth with, in pages like the weights'.
pub fn huge_page_buffer(bytes: usize) -> std::io::Result<MmapMut> {
    let map = MmapMut::map_anon(bytes)?;
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    Ok(map)
}

/// A fixed number of zeroed values in their own anonymous mapping, advised to use huge pages (see
/// [`huge_page_buffer`]). Memory is committed as it is first touched, 2 MiB at a time where huge
/// pages are given, 4 KiB otherwise.
pub struct HugePages<T> {
    map: MmapMut,
    len: usize,
    _values: PhantomData<T>,
}

/// f32s in huge pages: the weights' bandwidth buffer, and the KV cache's chunks in f32.
pub type HugePageF32s = HugePages<f32>;

impl<T: bytemuck::Pod> HugePages<T> {
    /// `len` zeros; an error when the bytes do not fit in the address space or cannot be mapped.
    pub fn zeroed(len: usize) -> std::io::Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        // A mapping cannot be empty; one byte stands in for zero values.
        let map = huge_page_buffer(bytes.max(1))?;
        Ok(HugePages {
            map,
            len,
            _values: PhantomData,
        })
    }

    fn byte_len(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
}

impl<T: bytemuck::Pod> std::ops::Deref for HugePages<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // A mapping starts on a page boundary, which meets the alignment of every `Pod` value
        // type used here (f32, u16); the length is a whole number of values by construction.
        // (`cast_slice` checks both and panics rather than misreading.)
        bytemuck::cast_slice(&self.map[..self.byte_len()])
    }
}

impl<T: bytemuck::Pod> AsRef<[T]> for HugePages<T> {
    fn as_ref(&self) -> &[T] {
        self
    }
}

impl<T: bytemuck::Pod> std::ops::DerefMut for HugePages<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let n = self.byte_len();
        bytemuck::cast_slice_mut(&mut self.map[..n])
    }
}

/// How much of a mapping is resident, and how much of that through huge (PMD) page-table entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageShare {
    pub resident_bytes: u64,
    pub huge_bytes: u64,
}

impl PageShare {
    /// `huge_bytes / resident_bytes`, 0 when nothing is resident.
    pub fn fraction(&self) -> f64 {
        if self.resident_bytes == 0 {
            0.0
        } else {
            self.huge_bytes as f64 / self.resident_bytes as f64
        }
    }
}

/// The [`PageShare`] of the mapping that holds `addr`, from `/proc/self/smaps`; `None` where that
/// file does not exist (not Linux) or has no such mapping.
pub fn huge_page_share(addr: *const u8) -> Option<PageShare> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    parse_smaps(&smaps, addr as usize)
}

/// The [`PageShare`]s of the mappings that hold `addrs`, added up (a GGUF file split in parts,
/// each part its own mapping), from one read of `/proc/self/smaps`; `None` as above for any.
pub fn huge_page_share_of(addrs: impl IntoIterator<Item = *const u8>) -> Option<PageShare> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    sum_of(&smaps, addrs)
}

fn sum_of(smaps: &str, addrs: impl IntoIterator<Item = *const u8>) -> Option<PageShare> {
    let mut sum = PageShare {
        resident_bytes: 0,
        huge_bytes: 0,
    };
    for addr in addrs {
        let share = parse_smaps(smaps, addr as usize)?;
        sum.resident_bytes += share.resident_bytes;
        sum.huge_bytes += share.huge_bytes;
    }
    Some(sum)
}

/// Finds the entry of `smaps` whose address range holds `addr` and reads its `Rss`, and its huge
/// page lines: `FilePmdMapped` for a file mapping, `AnonHugePages` for an anonymous one (both in
/// kB; see proc(5)).
fn parse_smaps(smaps: &str, addr: usize) -> Option<PageShare> {
    let mut inside = false;
    let mut found: Option<PageShare> = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        // An entry starts with "start-end perms offset dev inode [path]", addresses in hex.
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                if found.is_some() {
                    break;
                }
                inside = a <= addr && addr < b;
                if inside {
                    found = Some(PageShare {
                        resident_bytes: 0,
                        huge_bytes: 0,
                    });
                }
                continue;
            }
        }
        let Some(share) = found.as_mut().filter(|_| inside) else {
            continue;
        };
        let mut fields = line.split_whitespace();
        let (Some(key), Some(kb)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Ok(kb) = kb.parse::<u64>() else { continue };
        match key {
            "Rss:" => share.resident_bytes = kb * 1024,
            "FilePmdMapped:" | "AnonHugePages:" => share.huge_bytes += kb * 1024,
            _ => {}
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two entries of a real /proc/self/smaps (Linux 6.18), trimmed to the lines read here and a
    /// few around them: the model file mapped mostly with 2 MiB pages, then an anonymous mapping.
    const SMAPS: &str = "\
7fa964e00000-7fa98ba71000 r--s 00000000 fe:00 2883604                    /models/q06b.bin
Size:             635332 kB
KernelPageSize:        4 kB
MMUPageSize:           4 kB
Rss:              618672 kB
Pss:              618672 kB
AnonHugePages:         0 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:    587776 kB
THPeligible:           0
7fa98bc00000-7fa9b2871000 rw-p 00000000 00:00 0
Size:             635332 kB
Rss:              618672 kB
AnonHugePages:    616448 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:         0 kB
";

    #[test]
    fn the_shares_of_several_mappings_add_up() {
        let addrs = [0x7fa964e00000usize, 0x7fa98bc00000].map(|a| a as *const u8);
        let both = sum_of(SMAPS, addrs).unwrap();
        assert_eq!(both.resident_bytes, 2 * 618672 * 1024);
        assert_eq!(both.huge_bytes, (587776 + 616448) * 1024);
        assert_eq!(sum_of(SMAPS, [0x10usize as *const u8]), None);
    }

    #[test]
    fn reads_the_entry_holding_the_address() {
        let file = parse_smaps(SMAPS, 0x7fa964e00000 + 12345).unwrap();
        assert_eq!(file.resident_bytes, 618672 * 1024);
        assert_eq!(file.huge_bytes, 587776 * 1024);
        let anon = parse_smaps(SMAPS, 0x7fa9b2870fff).unwrap();
        assert_eq!(anon.huge_bytes, 616448 * 1024);
        assert_eq!(parse_smaps(SMAPS, 0x7fa98ba71000), None);
        assert_eq!(parse_smaps("", 0x1000), None);
    }

    #[test]
    fn huge_page_floats_are_zeroed_and_writable() {
        let mut x = HugePageF32s::zeroed(3 << 20).unwrap();
        assert_eq!(x.len(), 3 << 20);
        assert!(x.iter().all(|&v| v == 0.0));
        x[(3 << 20) - 1] = 2.5;
        assert_eq!(x[(3 << 20) - 1], 2.5);
        assert!(HugePageF32s::zeroed(0).unwrap().is_empty());
        assert!(HugePageF32s::zeroed(usize::MAX / 2).is_err());
    }

    #[test]
    fn finds_our_own_mapping() {
        let mut map = memmap2::MmapMut::map_anon(1 << 20).unwrap();
        map.fill(1);
        if cfg!(target_os = "linux") {
            let share = huge_page_share(map.as_ptr()).expect("the mapping is in smaps");
            if std::env::var_os("QWEN3_UNDER_QEMU").is_some() {
                // Under qemu-user, /proc/self/smaps is qemu's rendering of the guest's mappings,
                // and qemu 10 reports every entry with Rss 0 (qemu 7.2 reports the host's).
                eprintln!("under qemu-user: not checking resident bytes ({share:?})");
                return;
            }
            // Neighbouring anonymous mappings may have been merged into this entry.
            assert!(share.resident_bytes >= 1 << 20, "{share:?}");
        }
    }
}

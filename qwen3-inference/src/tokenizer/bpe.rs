//! Byte-pair encoding of one pre-tokenized piece: start from one token per byte, then repeatedly
//! merge the adjacent pair whose merge has the lowest rank (the earliest line of tokenizer.json's
//! `merges`), leftmost first among equal ranks, until no adjacent pair has a merge.
//!
//! This is the order HuggingFace `tokenizers` uses (`models/bpe/word.rs`, `merge_all`): a
//! min-heap of candidate merges ordered by (rank, position). Each merge is O(log n), so a piece
//! of n bytes costs O(n log n); stale heap entries (a pair that an earlier merge destroyed) are
//! recognised and skipped when popped.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// A fast hasher for the u64 keys below (a pair of token ids). The std SipHash is built to resist
/// hostile keys, which token ids from our own file are not, and is several times slower here.
#[derive(Default)]
pub struct IdPairHasher(u64);

impl Hasher for IdPairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // FxHash-style: fold 8 bytes at a time (used for the per-call piece cache).
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let v = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // Fold the two ids together, multiply by 2^64 / golden ratio (Fibonacci hashing), and
        // fold the well-mixed high half back into the low bits the table indexes with.
        let h = (v ^ (v >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

/// Merge table: (left id, right id) packed in a u64 -> (rank, merged id).
pub type MergeMap = HashMap<u64, (u32, u32), BuildHasherDefault<IdPairHasher>>;

fn pair_key(left: u32, right: u32) -> u64 {
    ((left as u64) << 32) | right as u64
}

/// Builds the merge table from the merge list (rank = index).
pub fn merge_map(merges: &[[u32; 3]]) -> MergeMap {
    let mut map = MergeMap::with_capacity_and_hasher(merges.len(), Default::default());
    for (rank, &[l, r, m]) in merges.iter().enumerate() {
        // A duplicated pair keeps its first (lowest) rank, as HF's HashMap-from-iterator would
        // keep the last; tokenizer.json files never repeat a pair, so this only guards the file.
        map.entry(pair_key(l, r)).or_insert((rank as u32, m));
    }
    map
}

/// A symbol of the piece being merged: a token id and its neighbours in a doubly linked list
/// over the initial byte positions (`usize::MAX` = none). A merged-away symbol has `id == DEAD`.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;
const DEAD: u32 = u32::MAX;

/// Encodes one piece (its raw bytes) into token ids, appending them to `out`.
///
/// `byte_ids[b]` is the single-byte token of byte `b`; a byte without one is dropped, as HF's BPE
/// does when the model has no `unk_token` (byte-level vocabularies contain all 256 bytes).
pub fn encode_piece(piece: &[u8], byte_ids: &[u32; 256], merges: &MergeMap, out: &mut Vec<u32>) {
    let mut syms: Vec<Symbol> = Vec::with_capacity(piece.len());
    for &b in piece {
        let id = byte_ids[b as usize];
        if id == super::file::NO_ID {
            continue;
        }
        let i = syms.len();
        syms.push(Symbol {
            id,
            prev: if i == 0 { NONE } else { i - 1 },
            next: i + 1,
        });
    }
    let Some(last) = syms.last_mut() else { return };
    last.next = NONE;

    // Candidate merges as Reverse((rank, left position, merged id)): a min-heap on (rank, pos).
    let mut heap = BinaryHeap::with_capacity(syms.len());
    for i in 0..syms.len().saturating_sub(1) {
        if let Some(&(rank, merged)) = merges.get(&pair_key(syms[i].id, syms[i + 1].id)) {
            heap.push(Reverse((rank, i, merged)));
        }
    }

    while let Some(Reverse((rank, i, merged))) = heap.pop() {
        let left = syms[i];
        if left.id == DEAD || left.next == NONE {
            continue;
        }
        let right = syms[left.next];
        // Stale entry: an earlier merge changed this pair.
        match merges.get(&pair_key(left.id, right.id)) {
            Some(&(r, m)) if r == rank && m == merged => {}
            _ => continue,
        }
        // Merge `right` into `left`.
        let j = left.next;
        syms[i].id = merged;
        syms[i].next = right.next;
        syms[j].id = DEAD;
        if right.next != NONE {
            syms[right.next].prev = i;
        }
        // New candidate pairs with the neighbours.
        if left.prev != NONE {
            let p = left.prev;
            if let Some(&(r, m)) = merges.get(&pair_key(syms[p].id, merged)) {
                heap.push(Reverse((r, p, m)));
            }
        }
        if right.next != NONE {
            if let Some(&(r, m)) = merges.get(&pair_key(merged, syms[right.next].id)) {
                heap.push(Reverse((r, i, m)));
            }
        }
    }

    // Walk the list from the first symbol (position 0 is never merged away: merges keep the
    // left position).
    let mut i = 0;
    while i != NONE {
        out.push(syms[i].id);
        i = syms[i].next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Toy vocabulary: bytes a=0 b=1 c=2, then merges.
    fn toy() -> ([u32; 256], MergeMap) {
        let mut byte_ids = [super::super::file::NO_ID; 256];
        byte_ids[b'a' as usize] = 0;
        byte_ids[b'b' as usize] = 1;
        byte_ids[b'c' as usize] = 2;
        // rank 0: a a -> 3 (aa); rank 1: b c -> 4 (bc); rank 2: aa aa -> 5; rank 3: a bc -> 6
        let merges = merge_map(&[[0, 0, 3], [1, 2, 4], [3, 3, 5], [0, 4, 6]]);
        (byte_ids, merges)
    }

    fn enc(s: &str) -> Vec<u32> {
        let (b, m) = toy();
        let mut out = Vec::new();
        encode_piece(s.as_bytes(), &b, &m, &mut out);
        out
    }

    #[test]
    fn lowest_rank_first_then_leftmost() {
        // "aaa": (a,a) at 0 and 1 have the same rank; the leftmost wins -> aa a.
        assert_eq!(enc("aaa"), [3, 0]);
        assert_eq!(enc("aaaa"), [5]);
        // "abc": (b,c) rank 1 before (a,bc) rank 3.
        assert_eq!(enc("abc"), [6]);
        assert_eq!(enc("aabc"), [3, 4]);
        assert_eq!(enc("axc"), [0, 2]);
        assert_eq!(enc(""), Vec::<u32>::new());
    }
}

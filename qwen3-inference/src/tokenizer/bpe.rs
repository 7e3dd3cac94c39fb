//! Byte-pair encoding of one pre-tokenized piece: start from one token per byte, then repeatedly
//! merge the adjacent pair whose merge has the lowest rank (the earliest line of tokenizer.json's
//! `merges`), leftmost first among equal ranks, until no adjacent pair has a merge.
//!
//! This is the order HuggingFace `tokenizers` uses (`models/bpe/word.rs`, `merge_all`): a
//! min-heap of candidate merges ordered by (rank, position). Each merge is O(log n), so a piece
//! of n bytes costs O(n log n); stale heap entries (a pair that an earlier merge destroyed) are
//! recognised and skipped when popped.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Marks an absent id: a byte with no single-byte token, a tokenizer with no BOS. The tokenizer
/// file stores it as is (`file::NO_ID`).
pub const NO_ID: u32 = u32::MAX;

/// The merge list, grouped by left token so a lookup is a short binary search and loading
/// builds nothing (no hash table of 151k pairs at every start).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MergeTable {
    /// The merges whose left token is `i` are `entries[starts[i]..starts[i + 1]]`
    /// (`starts.len()` = token count + 1).
    pub starts: Vec<u32>,
    /// (right, rank, merged), sorted by right within each group.
    pub entries: Vec<[u32; 3]>,
}

impl MergeTable {
    /// Builds the table from tokenizer.json's merge list: (left, right, merged) in rank order,
    /// every id below `n_tokens`. A repeated pair keeps its first (lowest) rank.
    pub fn from_ranked(n_tokens: usize, ranked: &[[u32; 3]]) -> MergeTable {
        let mut v: Vec<(u32, u32, u32, u32)> = ranked
            .iter()
            .enumerate()
            .map(|(rank, &[l, r, m])| (l, r, rank as u32, m))
            .collect();
        v.sort_unstable();
        v.dedup_by_key(|e| (e.0, e.1));
        let mut starts = vec![0u32; n_tokens + 1];
        for e in &v {
            starts[e.0 as usize + 1] += 1;
        }
        for i in 0..n_tokens {
            starts[i + 1] += starts[i];
        }
        let entries = v.iter().map(|&(_, r, rank, m)| [r, rank, m]).collect();
        MergeTable { starts, entries }
    }

    /// Number of merges.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// (rank, merged id) of the merge of `left` followed by `right`, if there is one.
    #[inline]
    pub fn get(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        let l = left as usize;
        let (a, b) = (
            *self.starts.get(l)? as usize,
            *self.starts.get(l + 1)? as usize,
        );
        let group = self.entries.get(a..b)?;
        let k = group.binary_search_by_key(&right, |e| e[0]).ok()?;
        Some((group[k][1], group[k][2]))
    }
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
pub fn encode_piece(piece: &[u8], byte_ids: &[u32; 256], merges: &MergeTable, out: &mut Vec<u32>) {
    let mut syms: Vec<Symbol> = Vec::with_capacity(piece.len());
    for &b in piece {
        let id = byte_ids[b as usize];
        if id == NO_ID {
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
        if let Some((rank, merged)) = merges.get(syms[i].id, syms[i + 1].id) {
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
        match merges.get(left.id, right.id) {
            Some((r, m)) if r == rank && m == merged => {}
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
            if let Some((r, m)) = merges.get(syms[p].id, merged) {
                heap.push(Reverse((r, p, m)));
            }
        }
        if right.next != NONE {
            if let Some((r, m)) = merges.get(merged, syms[right.next].id) {
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
    fn toy() -> ([u32; 256], MergeTable) {
        let mut byte_ids = [NO_ID; 256];
        byte_ids[b'a' as usize] = 0;
        byte_ids[b'b' as usize] = 1;
        byte_ids[b'c' as usize] = 2;
        // rank 0: a a -> 3 (aa); rank 1: b c -> 4 (bc); rank 2: aa aa -> 5; rank 3: a bc -> 6
        let merges = MergeTable::from_ranked(7, &[[0, 0, 3], [1, 2, 4], [3, 3, 5], [0, 4, 6]]);
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

//! Requests whose prompts hold images (Qwen3.5, Qwen3-VL; docs/vision.md): what such a request
//! brings ([`PromptImages`]: each image's vectors and DeepStack features at its rows, every prompt
//! token's M-RoPE positions),
//! how a step's rows get their inputs ([`StepInputs`]), and how far the prefix cache may reuse a
//! slot's tokens ([`image_reuse`]).
//!
//! The image's `<|image_pad|>` tokens are the same ids whatever the picture, so the prefix cache
//! cannot compare tokens alone: each image carries a key (a hash of its vectors) and its vectors,
//! and a cached prefix is reused only up to the first image that differs from the new prompt's:
//! another key, or (on the rare equal keys of different pictures) other vectors.

use super::Slot;
use crate::model::{RowInputs, Segment};
use std::sync::Arc;

/// One image of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptImage {
    /// The prompt row of its first `<|image_pad|>` token.
    pub row: usize,
    /// Its merged vectors, `[tokens, hidden]` (`VisionTower::forward`), in place of its pads'
    /// embeddings. Shared: a slot's prefix cache keeps them after the request ([`CachedImage`]).
    pub vectors: Arc<[f32]>,
    /// Qwen3-VL's DeepStack features, each `[tokens, hidden]`: feature `l` is added to the
    /// pads' hidden states after text layer `l`. Empty for Qwen3.5.
    pub deepstack: Vec<Vec<f32>>,
    /// A hash of `vectors`: the prefix cache's key for the image (equal vectors are checked
    /// too).
    pub key: u64,
}

/// An image among a slot's cached tokens, for the prefix cache: its rows, key and vectors.
#[derive(Debug, Clone)]
pub(super) struct CachedImage {
    pub(super) row: usize,
    pub(super) rows: usize,
    pub(super) key: u64,
    pub(super) vectors: Arc<[f32]>,
}

impl CachedImage {
    /// The slot's record of `image` in a model of width `hidden`.
    pub(super) fn of(image: &PromptImage, hidden: usize) -> CachedImage {
        CachedImage {
            row: image.row,
            rows: image.rows(hidden),
            key: image.key,
            vectors: image.vectors.clone(),
        }
    }

    /// Its place and values, to compare ([`ImageAt::same`]).
    fn at(&self) -> ImageAt<'_> {
        ImageAt {
            row: self.row,
            rows: self.rows,
            key: self.key,
            vectors: &self.vectors,
        }
    }
}

/// An image's place among a sequence's rows and its values, borrowed from a prompt's
/// [`PromptImage`] or a slot's [`CachedImage`], so that the two compare without a copy.
struct ImageAt<'a> {
    row: usize,
    rows: usize,
    key: u64,
    vectors: &'a Arc<[f32]>,
}

impl ImageAt<'_> {
    /// Whether `other` is the same image at the same rows: the key first (cheap), then every
    /// value's bits (a 64-bit key can collide; the vectors cannot).
    fn same(&self, other: &ImageAt) -> bool {
        (self.row, self.rows, self.key) == (other.row, other.rows, other.key)
            && (Arc::ptr_eq(self.vectors, other.vectors)
                || (self.vectors.len() == other.vectors.len()
                    && self
                        .vectors
                        .iter()
                        .zip(other.vectors.iter())
                        .all(|(a, b)| a.to_bits() == b.to_bits())))
    }
}

impl PromptImage {
    /// Its place and values in a model of width `hidden`, to compare ([`ImageAt::same`]).
    fn at(&self, hidden: usize) -> ImageAt<'_> {
        ImageAt {
            row: self.row,
            rows: self.rows(hidden),
            key: self.key,
            vectors: &self.vectors,
        }
    }

    /// The image whose pads start at prompt row `row`, its key computed.
    pub fn new(row: usize, vectors: Vec<f32>, deepstack: Vec<Vec<f32>>) -> PromptImage {
        // FNV-1a over the values' bits: the same picture encodes to the same bits (the tower
        // is deterministic), another to others.
        let key = vectors.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            v.to_bits()
                .to_le_bytes()
                .iter()
                .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
        });
        PromptImage {
            row,
            vectors: vectors.into(),
            deepstack,
            key,
        }
    }

    /// Rows it covers in a model of width `hidden`.
    pub fn rows(&self, hidden: usize) -> usize {
        self.vectors.len() / hidden
    }
}

/// A prompt's images and positions (`vision::positions::mrope_positions`).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptImages {
    /// In prompt order.
    pub images: Vec<PromptImage>,
    /// `[time, height, width]` of every prompt token.
    pub positions: Vec<[u32; 3]>,
    /// The position of the first token after the prompt, every component (transformers'
    /// `rope_deltas` plus the prompt's length).
    pub next: u32,
}

impl PromptImages {
    /// The M-RoPE positions of the sequence's token at cache position `p`: the prompt's own, and
    /// after it `next` counting up, its three components equal.
    pub fn position(&self, p: usize) -> [u32; 3] {
        match self.positions.get(p) {
            Some(&t) => t,
            None => [(self.next as usize + p - self.positions.len()) as u32; 3],
        }
    }

    /// Why a prompt of `len` tokens in a model of width `hidden` cannot take these, if it cannot.
    pub fn check(&self, len: usize, hidden: usize) -> Result<(), String> {
        if self.positions.len() != len {
            return Err(format!(
                "{} image positions for a prompt of {len} tokens",
                self.positions.len()
            ));
        }
        // transformers' positions never pass a token's index: an image's rows and columns take
        // fewer positions than its tokens.
        if let Some(p) = self
            .positions
            .iter()
            .flatten()
            .find(|&&p| p as usize >= len)
        {
            return Err(format!(
                "an image position {p} is past the prompt's {len} tokens"
            ));
        }
        if self.next as usize > len {
            return Err(format!(
                "the position after the prompt, {}, is past its {len} tokens",
                self.next
            ));
        }
        let mut end = 0;
        for im in &self.images {
            let n = im.rows(hidden);
            if let Some(f) = im.deepstack.iter().find(|f| f.len() != im.vectors.len()) {
                return Err(format!(
                    "a DeepStack feature of {} values beside an image of {}",
                    f.len(),
                    im.vectors.len()
                ));
            }
            if im.vectors.len() % hidden != 0 || n == 0 || im.row < end || im.row + n > len {
                return Err(format!(
                    "an image of {} values at prompt row {} does not fit the prompt's {len} rows of {hidden}",
                    im.vectors.len(),
                    im.row
                ));
            }
            end = im.row + n;
        }
        Ok(())
    }
}

/// How many of a prompt's first `reuse` tokens a slot may give it, its cached images
/// `cached` against the prompt's `images`: up to the first image either has that the other does
/// not have at the same rows with the same vectors.
pub(super) fn image_reuse(
    cached: &[CachedImage],
    images: Option<&PromptImages>,
    hidden: usize,
    reuse: usize,
) -> usize {
    let prompt = images.map_or(&[][..], |p| &p.images[..]);
    let in_cache = |x: &ImageAt| cached.iter().any(|c| c.at().same(x));
    let in_prompt = |x: &ImageAt| prompt.iter().any(|p| p.at(hidden).same(x));
    // Only images before the limit matter; each is compared with the other side's (the cheap
    // fields first, the vectors only when they agree).
    let mut limit = reuse;
    let every = cached
        .iter()
        .map(CachedImage::at)
        .chain(prompt.iter().map(|p| p.at(hidden)));
    for im in every {
        if im.row < limit && !(in_cache(&im) && in_prompt(&im)) {
            limit = im.row;
        }
    }
    limit
}

/// A step's rows' own inputs when some of its sequences hold images: every row's positions and
/// the images' rows that run in it, copied from the requests (the step's pass borrows them
/// while the requests' grammars may be at work on another thread).
#[derive(Default)]
pub(super) struct StepInputs {
    positions: Vec<[u32; 3]>,
    values: Vec<f32>,
    /// (step row, first value, values).
    runs: Vec<(usize, usize, usize)>,
    /// (layer, step row, first value, values): DeepStack features, their values in `values`.
    deepstack: Vec<(usize, usize, usize, usize)>,
}

/// A step's runs as the pass takes them, borrowing [`StepInputs`]' values: the images' vectors
/// (`(row, values)`) and their DeepStack features (`(layer, row, values)`).
pub(super) type StepRuns<'a> = (Vec<(usize, &'a [f32])>, Vec<(usize, usize, &'a [f32])>);

impl StepInputs {
    /// Fills the inputs of the step `plan` over `slots`; false (and nothing filled) when no
    /// sequence in it holds images.
    pub(super) fn build(&mut self, slots: &[Slot], plan: &[Segment], hidden: usize) -> bool {
        self.positions.clear();
        self.values.clear();
        self.runs.clear();
        self.deepstack.clear();
        let images = |seg: &Segment| slots[seg.seq].job.as_ref().and_then(|j| j.images.as_ref());
        if !plan.iter().any(|seg| images(seg).is_some()) {
            return false;
        }
        let mut row = 0;
        for seg in plan {
            let span = seg.pos..seg.pos + seg.len;
            match images(seg) {
                None => self.positions.extend(span.clone().map(|p| [p as u32; 3])),
                Some(im) => {
                    self.positions.extend(span.clone().map(|p| im.position(p)));
                    for image in &im.images {
                        let n = image.rows(hidden);
                        let (lo, hi) = (image.row.max(span.start), (image.row + n).min(span.end));
                        if lo < hi {
                            let at = row + lo - span.start;
                            let rows = (lo - image.row) * hidden..(hi - image.row) * hidden;
                            let v = &image.vectors[rows.clone()];
                            self.runs.push((at, self.values.len(), v.len()));
                            self.values.extend_from_slice(v);
                            for (l, feature) in image.deepstack.iter().enumerate() {
                                let v = &feature[rows.clone()];
                                self.deepstack.push((l, at, self.values.len(), v.len()));
                                self.values.extend_from_slice(v);
                            }
                        }
                    }
                }
            }
            row += seg.len;
        }
        true
    }

    /// The runs as the pass takes them, borrowing the values.
    pub(super) fn runs(&self) -> StepRuns<'_> {
        let runs = self
            .runs
            .iter()
            .map(|&(row, at, n)| (row, &self.values[at..at + n]))
            .collect();
        let deepstack = self
            .deepstack
            .iter()
            .map(|&(l, row, at, n)| (l, row, &self.values[at..at + n]))
            .collect();
        (runs, deepstack)
    }

    /// The pass's [`RowInputs`] over `runs` (from [`StepInputs::runs`]).
    pub(super) fn row_inputs<'a>(&'a self, runs: &'a StepRuns<'a>) -> RowInputs<'a> {
        RowInputs {
            positions: Some(&self.positions),
            embeddings: &runs.0,
            deepstack: &runs.1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(at: &[(usize, f32)], len: usize) -> PromptImages {
        PromptImages {
            images: at
                .iter()
                .map(|&(row, v)| PromptImage::new(row, vec![v; 4], vec![]))
                .collect(),
            positions: vec![[0; 3]; len],
            next: len as u32,
        }
    }

    /// A cached prefix is reused up to the first image that differs, or that one side lacks.
    #[test]
    fn the_prefix_cache_stops_at_a_different_image() {
        let hidden = 2;
        let cached = |p: &PromptImages| -> Vec<CachedImage> {
            p.images
                .iter()
                .map(|im| CachedImage::of(im, hidden))
                .collect()
        };
        let a = images(&[(2, 1.0), (8, 2.0)], 12);
        // The same images: as far as the tokens agree.
        assert_eq!(image_reuse(&cached(&a), Some(&a), hidden, 11), 11);
        // The second image differs: up to its row.
        let b = images(&[(2, 1.0), (8, 3.0)], 12);
        assert_eq!(image_reuse(&cached(&a), Some(&b), hidden, 11), 8);
        // A text prompt over a cached image: up to the image.
        assert_eq!(image_reuse(&cached(&a), None, hidden, 11), 2);
        // An image in the prompt where the cache has text.
        assert_eq!(image_reuse(&[], Some(&a), hidden, 11), 2);
        // Images past the tokens in common do not matter.
        assert_eq!(image_reuse(&cached(&a), Some(&b), hidden, 6), 6);
        assert_ne!(a.images[1].key, b.images[1].key);
        // Two pictures whose keys collide: the vectors tell them apart.
        let mut forged = b.clone();
        forged.images[1].key = a.images[1].key;
        assert_eq!(image_reuse(&cached(&a), Some(&forged), hidden, 11), 8);
        // The same picture encoded again (other buffers, equal values): reused.
        let again = images(&[(2, 1.0), (8, 2.0)], 12);
        assert_eq!(image_reuse(&cached(&a), Some(&again), hidden, 11), 11);
    }

    #[test]
    fn positions_go_on_after_the_prompt() {
        let mut p = images(&[], 3);
        p.positions = vec![[0; 3], [1, 1, 2], [2; 3]];
        p.next = 3;
        assert_eq!(p.position(1), [1, 1, 2]);
        assert_eq!(p.position(3), [3; 3]);
        assert_eq!(p.position(5), [5; 3]);
        assert!(p.check(3, 2).is_ok());
        assert!(p.check(4, 2).is_err());
        // Positions past the tokens are not transformers'.
        let mut far = p.clone();
        far.positions[2] = [7; 3];
        assert!(far.check(3, 2).unwrap_err().contains("past"));
        let bad = images(&[(2, 1.0)], 3); // 2 rows from row 2 of 3
        assert!(bad.check(3, 2).unwrap_err().contains("does not fit"));
    }
}

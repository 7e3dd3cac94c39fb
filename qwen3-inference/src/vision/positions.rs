//! Where an image's tokens sit for the rotary embedding: M-RoPE's three-component positions
//! (time, height, width), as transformers' `get_rope_index` gives them to Qwen3-VL and Qwen3.5.
//!
//! Text tokens count up one at a time, the three components equal (so text alone is plain RoPE).
//! An image's `T x H' x W'` tokens (its grid in merged tokens: `H' = H / merge`) take
//! `(start + t, start + row, start + col)`, row-major, where `start` is the position after the
//! text before it; the text after the image resumes at `start + max(H', W')`, not at `start`
//! plus the image's token count: a 20 x 30 image moves the text on by 30 positions, not 600.
//! So a prompt's last position is below its length, and decoding continues from
//! [`Positions::next`] (transformers keeps the difference as `rope_deltas`).
//!
//! Which component turns which rotary frequency is [`mrope_component`]: Qwen3-VL and Qwen3.5
//! interleave them (`mrope_interleaved`).

use anyhow::{anyhow, bail, ensure, Result};

/// A prompt's positions, one triple per token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Positions {
    /// `[t, h, w]` per token.
    pub thw: Vec<[u32; 3]>,
    /// The position of the first token after the prompt (every component).
    pub next: u32,
}

/// The positions of a prompt whose tokens `is_image` marks (each run of image tokens one image,
/// in order), the images' grids in patches (`image_grid_thw`) and the merger's `merge` size.
/// Every run must hold exactly its image's `T * (H/merge) * (W/merge)` tokens.
pub fn mrope_positions(is_image: &[bool], grids: &[[usize; 3]], merge: usize) -> Result<Positions> {
    let mut thw = Vec::with_capacity(is_image.len());
    let mut pos = 0u32;
    let mut images = grids.iter();
    let mut i = 0;
    while i < is_image.len() {
        // A run of text tokens, or of one image's tokens.
        let run = is_image[i..]
            .iter()
            .take_while(|&&b| b == is_image[i])
            .count();
        if !is_image[i] {
            for _ in 0..run {
                thw.push([pos; 3]);
                pos = pos
                    .checked_add(1)
                    .ok_or_else(|| anyhow!("positions past 2^32"))?;
            }
        } else {
            let Some(&[t, h, w]) = images.next() else {
                bail!(
                    "the prompt has more runs of image tokens than the {} images given",
                    grids.len()
                );
            };
            ensure!(
                h % merge == 0 && w % merge == 0,
                "an image grid of {h}x{w} patches is not whole {merge}x{merge} blocks"
            );
            let (gh, gw) = (h / merge, w / merge);
            ensure!(
                run == t * gh * gw,
                "an image of {t}x{gh}x{gw} tokens has a run of {run} image tokens in the prompt"
            );
            for ti in 0..t {
                for r in 0..gh {
                    for c in 0..gw {
                        thw.push([pos + ti as u32, pos + r as u32, pos + c as u32]);
                    }
                }
            }
            pos += gh.max(gw) as u32;
        }
        i += run;
    }
    ensure!(
        images.next().is_none(),
        "{} images given, fewer runs of image tokens in the prompt",
        grids.len()
    );
    Ok(Positions { thw, next: pos })
}

/// Which component turns which rotary frequency: RoPE's own (`kernels/rope.rs`).
pub use crate::kernels::mrope_component;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_alone_counts_up() {
        let p = mrope_positions(&[false; 5], &[], 2).unwrap();
        assert_eq!(p.thw, (0..5).map(|i| [i; 3]).collect::<Vec<_>>());
        assert_eq!(p.next, 5);
    }

    #[test]
    fn an_image_moves_the_text_by_its_longer_side() {
        // Two text tokens, an image of 2 x 3 merged tokens (grid 4 x 6 patches), one text token.
        let mut is_image = vec![false, false];
        is_image.extend([true; 6]);
        is_image.push(false);
        let p = mrope_positions(&is_image, &[[1, 4, 6]], 2).unwrap();
        assert_eq!(&p.thw[2..5], &[[2, 2, 2], [2, 2, 3], [2, 2, 4]]);
        assert_eq!(p.thw[7], [2, 3, 4]);
        assert_eq!(p.thw[8], [5; 3]);
        assert_eq!(p.next, 6);
    }

    #[test]
    fn runs_that_do_not_fit_their_images_are_refused() {
        let e = mrope_positions(&[true; 5], &[[1, 4, 6]], 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("run of 5 image tokens"), "{e}");
        let e = mrope_positions(&[true; 6], &[], 2).unwrap_err().to_string();
        assert!(e.contains("more runs of image tokens"), "{e}");
        let e = mrope_positions(&[false; 6], &[[1, 4, 6]], 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fewer runs"), "{e}");
    }
}

//! The noise model of the rounded exports' bounds: the exact model run with every weight moved
//! by its real rounding error with a random sign (see `noise_sigmas`).

use super::*;
use qwen3_inference::format::writer::{ModelWriter, TensorSpec};

/// Writes a copy of the f32 model `exact` whose every matrix weight is moved by its own rounding
/// error in `stored` (`e = w_stored - w`) with a random sign: `w + s * e`, `s = +-1` (seeded).
/// Same error magnitudes, weight by weight, as the real rounding; only the signs are random.
/// With `seed == None` every sign is +1: an f32 file holding exactly the stored (rounded) weights.
pub(super) fn write_sign_flipped(
    exact: &ModelFile,
    stored: &ModelFile,
    seed: Option<u64>,
    out: &Path,
) {
    let specs: Vec<TensorSpec> = exact.header().tensors.iter().map(|t| t.spec()).collect();
    let mut w = ModelWriter::create(out, exact.config(), specs.clone()).unwrap();
    let mut state = seed
        .unwrap_or(0)
        .wrapping_mul(2862933555777941757)
        .wrapping_add(3037000493);
    let mut coin = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 63 == 1
    };
    for spec in &specs {
        let mut v = values(exact.tensor(&spec.name).unwrap().data);
        if spec.shape.len() == 2 {
            let q = in_hf_order(
                stored,
                &spec.name,
                values(stored.tensor(&spec.name).unwrap().data),
            );
            for (x, &y) in v.iter_mut().zip(&q) {
                let e = y - *x;
                *x += if seed.is_none() || coin() { e } else { -e };
            }
        }
        w.write_f32(&spec.name, &v).unwrap();
    }
    w.finish().unwrap();
}

/// Tensor `name`'s values `v` of file `stored` in HF's order: as they are, but in a GGUF whose
/// Gated DeltaNets' value heads are tiled (`ValueHeads::Tiled`: llama.cpp's converter moved
/// grouped head `k r + j` of `r` a key head to `j kh + k`), each value head's rows (columns of
/// `out_proj`) moved back.
fn in_hf_order(stored: &ModelFile, name: &str, v: Vec<f32>) -> Vec<f32> {
    use qwen3_inference::format::ValueHeads;
    let Some(la) = &stored.config().linear_attention else {
        return v;
    };
    if la.value_heads != ValueHeads::Tiled || !name.contains(".linear_attn.") {
        return v;
    }
    let (kh, vh) = (
        la.linear_num_key_heads as usize,
        la.linear_num_value_heads as usize,
    );
    let (dv, kd) = (la.linear_value_head_dim as usize, la.key_dim() as usize);
    // Where grouped head g lies among the tiled ones.
    let tiled = |g: usize| ValueHeads::tiled_place(g, kh, vh);
    let shape = &stored.tensor(name).unwrap().shape;
    let width = shape.get(1).copied().unwrap_or(1) as usize;
    // Value heads as runs of rows: (first row, rows a head), or out_proj's columns.
    let rows = match name.rsplit_once(".linear_attn.").unwrap().1 {
        "in_proj_qkv.weight" | "conv1d.weight" => Some((2 * kd, dv)),
        "in_proj_z.weight" => Some((0, dv)),
        "in_proj_a.weight" | "in_proj_b.weight" | "A_log" | "dt_bias" => Some((0, 1)),
        "out_proj.weight" => None,
        _ => return v,
    };
    let mut out = v.clone();
    match rows {
        Some((first, each)) => {
            let run = each * width;
            for g in 0..vh {
                let (to, from) = (first * width + g * run, first * width + tiled(g) * run);
                out[to..to + run].copy_from_slice(&v[from..from + run]);
            }
        }
        None => {
            for (o, row) in out.chunks_exact_mut(width).zip(v.chunks_exact(width)) {
                for g in 0..vh {
                    o[g * dv..(g + 1) * dv].copy_from_slice(&row[tiled(g) * dv..][..dv]);
                }
            }
        }
    }
    out
}

/// The standard deviation of each logit's error caused by rounding the weights (and, for q8, the
/// activations), per position.
///
/// Rounding moves each weight by a small error (bf16: relative error up to 2^-8; q8: up to half
/// a scale step) whose sign is, to a good approximation, independent of the other weights'. How
/// much such errors move the logits depends on the network (attention softmaxes and the SwiGLU
/// amplify; RMSNorm rescales), so instead of assuming a gain we propagate the noise through the
/// model: the exact f32 model is run with every weight moved by its real rounding error with a
/// random sign ([`write_sign_flipped`]), [`DRAWS`] times, and the RMS over draws and vocabulary of
/// the change of the logits at each position is that position's sigma. For q8 files, whose
/// kernels also round every activation row before a product (W8A8), the draws move the
/// activations by their rounding errors with random signs as well ([`ActivationNoise`]). The real
/// rounding is one more such draw (with the signs rounding chose), so the test allows [`SIGMAS`] sigma (plus
/// [`F32_TOL`]) for the rounded model against HF, with the largest sigma of any position: one
/// stated bound per export ([`export_bound`]).
///
/// Why the largest and not each position's own sigma: the response of one position to the
/// rounding is heavy-tailed across realizations (near-tied attention scores or SwiGLU gates
/// respond non-linearly), so a position's sigma estimated from a few draws can be far below what
/// the one real realization does there. Measured with per-position sigmas: the real bf16 error
/// reached 6.7 of its position's sigma on tiny-f16-sharded-gqa4 (case 1, position 5), which is
/// 3.7 of the largest sigma of that export.
///
///
/// (A first version drew Gaussian noise with each matrix's RMS rounding error instead. It
/// underestimated the sigma, and the bf16 tests failed at 6.2-6.7 of its sigmas: bf16's error is
/// relative, largest on the largest weights, which matter most; the Gaussian spread it evenly.)
/// Returns, per case, one sigma per row of [`our_logits`].
pub(super) fn noise_sigmas(
    exact: &ModelFile,
    stored: &ModelFile,
    refr: &Reference,
    dir: &Path,
) -> Vec<Vec<f32>> {
    let exact_model = Model::load(exact).unwrap();
    // q8 files also round the activations before every product (W8A8), and so do a GGUF's
    // Q4_0 (q4 in groups of 32) and K-quants, in groups of 32.
    let w8a8_group = match stored.config().dtype {
        DType::Q8 | DType::Q4 => Some(stored.config().group_size as usize),
        d if d.is_k_quant() => Some(qwen3_inference::kernels::dot::k_quants::GROUP),
        _ => None,
    };
    let files: Vec<PathBuf> = (0..DRAWS)
        .map(|seed| {
            let path = dir.join(format!("perturbed-{seed}.bin"));
            write_sign_flipped(exact, stored, Some(seed), &path);
            path
        })
        .collect();
    rms_change(&exact_model, refr, |seed, ci, case| {
        let file = ModelFile::open(&files[seed as usize]).unwrap();
        let model = Model::load(&file).unwrap();
        match w8a8_group {
            Some(gs) => {
                let backend = RoundingNoise::new(Some(gs), false, seed * 1000 + ci as u64);
                our_logits_on(&backend, &model, case).0
            }
            None => our_logits(&model, case).0,
        }
    })
}

/// Per case and row of [`our_logits`], the RMS over [`DRAWS`] draws and the vocabulary of how
/// far `noisy(seed, case index, case)` moves the logits of `exact`: the sigmas of
/// [`noise_sigmas`] and [`kv_bf16_sigmas`].
pub(super) fn rms_change(
    exact: &Model,
    refr: &Reference,
    mut noisy: impl FnMut(u64, usize, &Case) -> Vec<f32>,
) -> Vec<Vec<f32>> {
    let vocab = exact.config.vocab_size as usize;
    let base: Vec<Vec<f32>> = refr.cases.iter().map(|c| our_logits(exact, c).0).collect();
    let mut sum_sq: Vec<Vec<f64>> = base.iter().map(|b| vec![0.0; b.len() / vocab]).collect();
    for seed in 0..DRAWS {
        for (ci, case) in refr.cases.iter().enumerate() {
            let moved = noisy(seed, ci, case);
            for (row, acc) in sum_sq[ci].iter_mut().enumerate() {
                let span = row * vocab..(row + 1) * vocab;
                *acc += moved[span.clone()]
                    .iter()
                    .zip(&base[ci][span])
                    .map(|(a, b)| ((a - b) as f64).powi(2))
                    .sum::<f64>();
            }
        }
    }
    sum_sq
        .iter()
        .map(|rows| {
            rows.iter()
                .map(|&s| (s / (DRAWS as f64 * vocab as f64)).sqrt() as f32)
                .collect()
        })
        .collect()
}

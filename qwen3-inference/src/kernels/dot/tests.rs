//! The dot kernels of every instruction set this CPU has, against the scalar references of
//! `dot/mod.rs`, `q4.rs` and `q6.rs`.

use super::*;

/// The activations' forms the matrix product asks for q8 weights (the interleaved layout, which
/// AVX2's q8 kernel reads in a prompt in groups of 32 and 64).
const Q8_FORM: Forms = Forms {
    q4: false,
    q8: true,
    k: false,
};

fn rand_vec(n: usize, seed: &mut u64, scale: f32) -> Vec<f32> {
    (0..n).map(|_| crate::testing::lcg(seed) * scale).collect()
}

/// Relative agreement with the scalar reference: different summation orders of n products of
/// magnitude m differ by about n * eps * m, so compare against that scale, not exactly.
fn close(a: f32, b: f32, n: usize, mag: f32) -> bool {
    (a - b).abs() <= 4.0 * n as f32 * f32::EPSILON * mag + 1e-6
}

#[test]
fn every_isa_matches_scalar() {
    let mut seed = 42;
    for d in available() {
        for n in [0, 1, 7, 16, 31, 64, 100, 1024, 3072] {
            let a = rand_vec(n, &mut seed, 2.0);
            let b = rand_vec(n, &mut seed, 3.0);
            let (r, s) = ((d.f32)(&a, &b), dot_f32_scalar(&a, &b));
            assert!(close(r, s, n, 6.0), "{} f32 n={n}: {r} vs {s}", d.isa);
            let w: Vec<u16> = a.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let (r, s) = ((d.bf16)(&w, &b), dot_bf16_scalar(&w, &b));
            assert!(close(r, s, n, 6.0), "{} bf16 n={n}: {r} vs {s}", d.isa);
        }
        for gs in [16, 32, 64, 96, 128] {
            for groups in [1, 3, 16] {
                let n = gs * groups;
                let a = rand_vec(n, &mut seed, 1.5);
                let b = rand_vec(n, &mut seed, 4.0);
                let (mut qa, mut sa) = (vec![0i8; n], vec![0f32; groups]);
                let (mut qb, mut sb) = (vec![0i8; n], vec![0f32; groups]);
                crate::quant::quantize_q8(&a, gs, &mut qa, &mut sa);
                (d.quantize_q8)(&b, gs, &mut qb, &mut sb);
                // The SIMD quantizer must equal the reference bit for bit.
                let (mut qr, mut sr) = (vec![0i8; n], vec![0f32; groups]);
                crate::quant::quantize_q8(&b, gs, &mut qr, &mut sr);
                assert_eq!(qb, qr, "{} quantize gs={gs}", d.isa);
                assert_eq!(sb, sr, "{} quantize scales gs={gs}", d.isa);
                let (r, s) = (
                    (d.q8_f32)(&qa, &sa, &b, gs),
                    dot_q8_f32_scalar(&qa, &sa, &b, gs),
                );
                assert!(close(r, s, n, 6.0), "{} q8_f32 gs={gs}: {r} vs {s}", d.isa);
                let r = (d.q8)(&qa, &sa, &qb, &sb, gs);
                let s = dot_q8_scalar(&qa, &sa, &qb, &sb, gs);
                assert!(
                    close(r, s, groups, 6.0 * gs as f32),
                    "{} q8 gs={gs}: {r} vs {s}",
                    d.isa
                );
            }
        }
    }
}

/// The bf16 rows product (a prompt's) gives every (row, token) the bits of that pair's dot
/// product (decode's), over shapes that take each tile of the AVX-512 kernel and rows whose
/// length 16 does not divide.
#[test]
fn bf16_rows_equal_their_dots() {
    let mut seed = 17;
    for d in available() {
        for (rows, t, cols) in [(1, 1, 16), (9, 7, 64), (4, 4, 1024), (6, 5, 48), (3, 3, 20)] {
            let w: Vec<u16> = rand_vec(rows * cols, &mut seed, 1.0)
                .iter()
                .map(|v| (v.to_bits() >> 16) as u16)
                .collect();
            let x = rand_vec(t * cols, &mut seed, 3.0);
            let mut out = vec![f32::NAN; rows * t];
            (d.bf16_rows)(&w, &x, t, &mut out);
            for r in 0..rows {
                for i in 0..t {
                    let dot = (d.bf16)(&w[r * cols..(r + 1) * cols], &x[i * cols..(i + 1) * cols]);
                    assert_eq!(
                        out[r * t + i].to_bits(),
                        dot.to_bits(),
                        "{} [{rows}x{cols}]x[{t}] ({r},{i})",
                        d.isa
                    );
                }
            }
        }
    }
}

/// Every quantizer rounds exact ties to even, as the reference does: max|x| = 127 makes the
/// scale exactly 1, so x / s = x.
#[test]
fn every_quantizer_rounds_ties_to_even() {
    let mut x = vec![0.0f32; 32];
    x[..8].copy_from_slice(&[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5, -2.5]);
    x[16..24].copy_from_slice(&[-127.0, 3.5, -3.5, 4.5, 0.25, -0.75, 100.5, 101.5]);
    let want: [i8; 16] = [
        127, 0, 2, 2, 0, -2, 126, -2, -127, 4, -4, 4, 0, -1, 100, 102,
    ];
    for d in available() {
        let (mut q, mut s) = (vec![0i8; 32], vec![0f32; 2]);
        (d.quantize_q8)(&x, 16, &mut q, &mut s);
        assert_eq!(s, [1.0, 1.0], "{}", d.isa);
        assert_eq!(&q[..8], &want[..8], "{}", d.isa);
        assert_eq!(&q[16..24], &want[8..], "{}", d.isa);
    }
}

/// `w` (`[rows, cols]`) packed as q4 or (`six`) q6 in groups of `gs`, with the kernel of
/// `d` and the reference for that packing.
fn packed(
    six: bool,
    w: &[f32],
    cols: usize,
    gs: usize,
    d: &Dots,
) -> (Vec<u8>, Vec<u16>, MatQ4, MatQ4) {
    let (p, ws, kernel, reference) = file_order(six, w, cols, gs, d);
    (
        interleaved::packed_for_kernels(d.q4_layout, six, &p, cols, gs),
        ws,
        kernel,
        reference,
    )
}

/// [`packed`] in the file's order, whatever the kernel reads.
fn file_order(
    six: bool,
    w: &[f32],
    cols: usize,
    gs: usize,
    d: &Dots,
) -> (Vec<u8>, Vec<u16>, MatQ4, MatQ4) {
    let mut ws = vec![0u16; w.len() / gs];
    match six {
        true => {
            let mut p = vec![0u8; w.len() / 4 * 3];
            crate::quant::quantize_q6(w, cols, gs, &mut p, &mut ws);
            (p, ws, d.q6_rows, q6::mat_q6_scalar)
        }
        false => {
            let mut p = vec![0u8; w.len() / 2];
            crate::quant::quantize_q4(w, gs, &mut p, &mut ws);
            (p, ws, d.q4_rows, q4::mat_q4_scalar)
        }
    }
}

/// Every instruction set's q4 and q6 kernels against the scalar references (`q4.rs`,
/// `q6.rs`), which are themselves checked against the dequantized product: group sizes the
/// SIMD kernels take (32) and ones they hand back to the reference, rows of whole chunks
/// and with a tail.
#[test]
fn q4_and_q6_rows_match_the_reference() {
    let mut seed = 9;
    for d in available() {
        for (six, gs) in [
            (false, 16),
            (false, 32),
            (false, 64),
            (false, 128),
            (true, 32),
            (true, 64),
            (true, 128),
        ] {
            let name = if six { "q6" } else { "q4" };
            for (rows, t, groups) in [
                (1, 1, 3),
                (3, 2, 1),
                (5, 3, 17),
                (2, 3, 2),
                (3, 1, 32),
                (2, 5, 22),
                (2, 2, 7),
                // The AVX2 kernel's prompt tiles of eight tokens, and 3, 4, 6 or 7 after.
                (3, 11, 9),
                (2, 12, 5),
                (2, 14, 4),
                (1, 15, 9),
                // AVX-512's prompt tiles of two rows by four tokens and the smaller ones
                // after, over blocks of 16 rows, rows of whole blocks of 16 groups and with a
                // short block.
                (37, 33, 17),
                (16, 32, 8),
                (19, 41, 7),
                (3, 32, 9),
                (5, 9, 32),
                (3, 6, 48),
            ] {
                let cols = gs * groups;
                let w = rand_vec(rows * cols, &mut seed, 1.0);
                let x = rand_vec(t * cols, &mut seed, 3.0);
                let (p, ws, kernel, reference) = file_order(six, &w, cols, gs, &d);
                let mut buf = ActsQ8Buf::default();
                let acts = buf.quantize_for_q4_as(&x, t, cols, gs, d.q4_layout);
                let (mut got, mut want) = (vec![f32::NAN; rows * t], vec![0f32; rows * t]);
                kernel(
                    &interleaved::packed_for_kernels(d.q4_layout, six, &p, cols, gs),
                    &ws,
                    &acts,
                    &mut got,
                    0,
                );
                reference(&p, &ws, &acts, &mut want, 0);
                for (k, (&r, &s)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        close(r, s, cols, 6.0),
                        "{} {name} gs={gs} [{k}]: {r} vs {s}",
                        d.isa
                    );
                }
            }
        }
    }
}

/// Weights and activations at the ends of their ranges, where a kernel that sums products
/// in 16 bits would overflow if it could: every stored weight at its top (q4 15, q6 63) or
/// bottom (0) value, every activation at +127 or -127, for q4 and q6 and every instruction
/// set. The sums are exact integers, `q * cols` with `q` the weight's level.
#[test]
fn q4_and_q6_rows_at_the_extremes() {
    let (gs, cols) = (32, 32 * 12);
    // A few rows and tokens (the step kernels), and a prompt's block (AVX-512's prompt
    // product).
    for (d, (rows, t)) in available()
        .into_iter()
        .flat_map(|d| [(d, (3, 2)), (d, (17, 33))])
    {
        for six in [false, true] {
            for byte in [0xffu8, 0x00] {
                for sign in [1.0f32, -1.0] {
                    let len = match six {
                        true => rows * cols / 4 * 3,
                        false => rows * cols / 2,
                    };
                    let (p, ws) = (vec![byte; len], vec![0x3c00u16; rows * cols / gs]); // f16 1.0
                    let x = vec![sign; t * cols];
                    let mut buf = ActsQ8Buf::default();
                    let acts = buf.quantize_for_q4_as(&x, t, cols, gs, d.q4_layout);
                    let (kernel, offset, top) = match six {
                        true => (d.q6_rows, 32.0, 63.0),
                        false => (d.q4_rows, 8.0, 15.0),
                    };
                    let level = if byte == 0 { -offset } else { top - offset };
                    let want = sign * level * cols as f32;
                    let mut got = vec![f32::NAN; rows * t];
                    kernel(&p, &ws, &acts, &mut got, 0);
                    for (k, &g) in got.iter().enumerate() {
                        assert!(
                            (g - want).abs() <= 1e-5 * want.abs(),
                            "{} six={six} byte={byte:#x} sign={sign} [{k}]: {g} vs {want}",
                            d.isa
                        );
                    }
                }
            }
        }
    }
}

/// A SIMD q4 or q6 kernel handed activations in a layout other than its own panics, naming
/// the layout, instead of reading the lanes wrong (or, for the AVX-512 and NEON kernels,
/// past the end of the shorter `Pairs` arrays). The scalar references read the plain rows
/// and take either.
#[test]
fn q4_kernels_refuse_a_foreign_layout() {
    let (rows, t, gs, cols) = (2, 3, 32, 256);
    let mut seed = 17;
    for d in available() {
        if matches!(d.isa, "scalar" | "neon") {
            continue; // their q4 and q6 products are the references
        }
        let other = match d.q4_layout {
            q4::Q4Layout::Halves | q4::Q4Layout::Interleaved => q4::Q4Layout::Pairs,
            q4::Q4Layout::Pairs => q4::Q4Layout::Halves,
        };
        for six in [false, true] {
            let w = rand_vec(rows * cols, &mut seed, 1.0);
            let x = rand_vec(t * cols, &mut seed, 1.0);
            let (p, ws, kernel, _) = packed(six, &w, cols, gs, &d);
            let mut buf = ActsQ8Buf::default();
            let acts = buf.quantize_for_q4_as(&x, t, cols, gs, other);
            let mut out = vec![0f32; rows * t];
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                kernel(&p, &ws, &acts, &mut out, 0)
            }));
            let msg = caught.expect_err("a foreign layout was accepted");
            // A formatted message is a String, a literal one a &str.
            let msg = match msg.downcast_ref::<&str>() {
                Some(s) => s.to_string(),
                None => msg.downcast_ref::<String>().cloned().unwrap_or_default(),
            };
            assert!(msg.contains("Q4Layout"), "{} six={six}: {msg}", d.isa);
        }
    }
}

/// The block kernel against one scalar dot product per (row, token), over shapes that take
/// every tile of the AVX-512, AVX2 and NEON kernels (2 or 1 rows; 4, 3, 2 or 1 tokens) and every
/// prefetch depth of their decode paths, and group sizes with one and several 64-byte
/// chunks, a 32-byte tail (96), and ones a kernel does not handle itself (16, 32).
#[test]
fn q8_rows_matches_scalar_dots() {
    let mut seed = 7;
    for d in available() {
        for gs in [16, 32, 64, 96, 128] {
            for (rows, t, groups) in [
                (1, 1, 3),
                (3, 2, 1),
                (2, 5, 17),
                (5, 8, 2),
                (3, 13, 20),
                (4, 20, 16),
                // Rows in several blocks of `for_each_tile`, the last one odd; tokens
                // in a tile of 4 and one of 3.
                (37, 7, 2),
                // Prompts over two and three blocks of 16 groups, the last one short (13
                // and 13 groups: a run of 8 and one of 5).
                (3, 9, 29),
                (2, 8, 45),
                // The same from 16 tokens, where groups of 64 reorder too: tiles of 1 to 4
                // tokens, blocks of rows after the first, ragged blocks of groups.
                (18, 17, 29),
                (3, 19, 45),
                (2, 18, 21),
                // Decode over enough rows that the AVX-512 kernel takes each of its
                // prefetch depths (32 KiB, 8 KiB, none) as the end of the rows nears.
                (160, 1, 4),
            ] {
                let cols = gs * groups;
                let w = rand_vec(rows * cols, &mut seed, 1.0);
                let x = rand_vec(t * cols, &mut seed, 3.0);
                let (mut wq, mut ws) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
                crate::quant::quantize_q8(&w, gs, &mut wq, &mut ws);
                let mut buf = ActsQ8Buf::default();
                // Laid out as the matrix product lays them out for q8 weights (AVX2 reorders a
                // prompt's weights in groups of 32 and 64 to read them so); without the layout, a
                // kernel that would read it takes another path, with the same bits.
                let acts = buf.quantize_for_weights(&x, t, cols, gs, Q8_FORM);
                let (xq, xs) = (acts.q, acts.scales);
                let mut out = vec![f32::NAN; rows * t];
                (d.q8_rows)(&wq, &ws, &acts, &mut out, 0);
                let mut as_is = vec![f32::NAN; rows * t];
                let mut plain_buf = ActsQ8Buf::default();
                let plain_acts = plain_buf.quantize(&x, t, cols, gs);
                (d.q8_rows)(&wq, &ws, &plain_acts, &mut as_is, 0);
                // Prefetching further (as decode does when more rows follow) changes no
                // value.
                let mut ahead = vec![f32::NAN; rows * t];
                (d.q8_rows)(&wq, &ws, &acts, &mut ahead, 1 << 20);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&ahead), bits(&out), "{} q8_rows ahead", d.isa);
                assert_eq!(bits(&as_is), bits(&out), "{} q8_rows not laid out", d.isa);
                let per = cols / gs;
                for r in 0..rows {
                    let (w_r, ws_r) = (&wq[r * cols..(r + 1) * cols], &ws[r * per..(r + 1) * per]);
                    for i in 0..t {
                        let (x_i, xs_i) =
                            (&xq[i * cols..(i + 1) * cols], &xs[i * per..(i + 1) * per]);
                        let want = dot_q8_scalar(w_r, ws_r, x_i, xs_i, gs);
                        let got = out[r * t + i];
                        // Decode and every token of a product of several: exactly the row's
                        // dot product, so that a token gets the same bits in a prompt, in a
                        // serving step beside others and alone.
                        let dot = (d.q8)(w_r, ws_r, x_i, xs_i, gs);
                        assert_eq!(
                            got.to_bits(),
                            dot.to_bits(),
                            "{} gs={gs} [{rows}x{cols}]x[{t}]: ({r},{i}) against its dot product",
                            d.isa
                        );
                        assert!(
                            close(got, want, groups, 3.0 * gs as f32),
                            "{} q8_rows gs={gs} [{rows}x{cols}]x[{t}]: ({r},{i}) {got} vs {want}",
                            d.isa
                        );
                    }
                }
            }
        }
    }
}

/// A prompt's tokens get the same bits from the block product (prefill) as one at a time
/// (decode), so a prompt run in one pass leaves the same KV cache and logits as the same
/// tokens run one by one (the parity tests check that end to end on tiny models).
#[test]
fn prefill_rows_equal_decode_rows() {
    let mut seed = 11;
    for d in available() {
        // 21 and 19 groups: a last block of 5 and of 3 groups, whose odd last group the
        // kernels of groups of 32 (q8_pairs.rs) add alone, into either accumulator.
        for (gs, groups) in [16, 32, 64, 128]
            .into_iter()
            .flat_map(|gs| [(gs, 21), (gs, 19), (gs, 45)])
        {
            // Rows in three blocks of `for_each_tile`.
            let (rows, t, cols) = (39, 9, groups * gs);
            let w = rand_vec(rows * cols, &mut seed, 1.0);
            let x = rand_vec(t * cols, &mut seed, 3.0);
            let (mut wq, mut ws) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
            crate::quant::quantize_q8(&w, gs, &mut wq, &mut ws);
            let mut buf = ActsQ8Buf::default();
            let mut all = vec![f32::NAN; rows * t];
            let acts = buf.quantize_for_weights(&x, t, cols, gs, Q8_FORM);
            (d.q8_rows)(&wq, &ws, &acts, &mut all, 0);
            for i in 0..t {
                let mut one = vec![f32::NAN; rows];
                let acts = buf.quantize(&x[i * cols..(i + 1) * cols], 1, cols, gs);
                (d.q8_rows)(&wq, &ws, &acts, &mut one, 0);
                for r in 0..rows {
                    assert_eq!(
                        all[r * t + i].to_bits(),
                        one[r].to_bits(),
                        "{} gs={gs} row {r} token {i}",
                        d.isa
                    );
                }
            }
        }
    }
}

/// The same for q4 and q6 weights, with rows of full chunks and a tail, and prefetching
/// that reaches past the rows (as decode asks when more rows follow).
#[test]
fn q4_and_q6_prefill_rows_equal_decode_rows() {
    let mut seed = 13;
    for d in available() {
        for (six, groups) in [
            (false, 4),
            (false, 17),
            (false, 34),
            (true, 4),
            (true, 7),
            (true, 17),
            (true, 34),
        ] {
            let (rows, t, gs) = (39, 9, 32);
            let cols = groups * gs;
            let w = rand_vec(rows * cols, &mut seed, 1.0);
            let x = rand_vec(t * cols, &mut seed, 3.0);
            let (p, ws, kernel, _) = packed(six, &w, cols, gs, &d);
            let mut buf = ActsQ8Buf::default();
            let mut all = vec![f32::NAN; rows * t];
            kernel(
                &p,
                &ws,
                &buf.quantize_for_q4_as(&x, t, cols, gs, d.q4_layout),
                &mut all,
                0,
            );
            for i in 0..t {
                let mut one = vec![f32::NAN; rows];
                let acts =
                    buf.quantize_for_q4_as(&x[i * cols..(i + 1) * cols], 1, cols, gs, d.q4_layout);
                kernel(&p, &ws, &acts, &mut one, 1 << 20);
                for r in 0..rows {
                    assert_eq!(
                        all[r * t + i].to_bits(),
                        one[r].to_bits(),
                        "{} {} {groups} groups: row {r} token {i}",
                        d.isa,
                        if six { "q6" } else { "q4" }
                    );
                }
            }
        }
    }
}

/// AVX-512's q8 kernel on interleaved weights (groups of 32 and 64) against one scalar dot
/// product per (row, token), over shapes that take whole blocks of 16 groups and short ones,
/// every tile (2 or 1 rows; 4, 3, 2 or 1 tokens), and prefetching past the rows; and a
/// prompt's tokens get the bits each gets alone (decode).
#[test]
fn q8_interleaved_rows_match_scalar_dots() {
    let mut seed = 17;
    for d in available() {
        let Some(kernel) = d.q8_interleaved else {
            continue;
        };
        for gs in [32, 64] {
            for (rows, t, groups) in [
                (1, 1, 3),
                (3, 2, 16),
                (2, 5, 17),
                (5, 8, 2),
                (5, 6, 17),
                (3, 13, 20),
                (37, 7, 35),
                (160, 1, 4),
                // Decode over whole blocks of 16 groups and a short one.
                (7, 1, 35),
            ] {
                let cols = gs * groups;
                let w = rand_vec(rows * cols, &mut seed, 1.0);
                let x = rand_vec(t * cols, &mut seed, 3.0);
                let (mut wq, mut ws) = (vec![0i8; w.len()], vec![0f32; w.len() / gs]);
                crate::quant::quantize_q8(&w, gs, &mut wq, &mut ws);
                let wk = interleaved::q8_for_kernels(&d, &wq, cols, gs);
                let layout = q4::Q4Layout::Interleaved;
                let mut buf = ActsQ8Buf::default();
                let acts = buf.quantize_for_q4_as(&x, t, cols, gs, layout);
                let mut out = vec![f32::NAN; rows * t];
                kernel(&wk, &ws, &acts, &mut out, 1 << 20);
                let per = cols / gs;
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                for r in 0..rows {
                    let (w_r, ws_r) = (&wq[r * cols..(r + 1) * cols], &ws[r * per..(r + 1) * per]);
                    for i in 0..t {
                        let want = dot_q8_scalar(w_r, ws_r, acts.q_row(i), acts.scales_row(i), gs);
                        let got = out[r * t + i];
                        assert!(
                            close(got, want, groups, 3.0 * gs as f32),
                            "{} q8 interleaved gs={gs} [{rows}x{cols}]x[{t}]: ({r},{i}) {got} vs {want}",
                            d.isa
                        );
                    }
                }
                let mut one_by_one = vec![f32::NAN; rows * t];
                for i in 0..t {
                    let mut one = vec![f32::NAN; rows];
                    let x_i = &x[i * cols..(i + 1) * cols];
                    let acts = buf.quantize_for_q4_as(x_i, 1, cols, gs, layout);
                    kernel(&wk, &ws, &acts, &mut one, 0);
                    for r in 0..rows {
                        one_by_one[r * t + i] = one[r];
                    }
                }
                assert_eq!(
                    bits(&out),
                    bits(&one_by_one),
                    "{} q8 interleaved gs={gs} [{rows}x{cols}]x[{t}]: prompt vs decode",
                    d.isa
                );
            }
        }
    }
}

#[test]
fn q8_product_approximates_the_float_product() {
    // W8A8 error: each factor is within half a step of the truth, so the product of a group
    // is off by at most about (|w| * step_x + |x| * step_w) / 2 per element.
    let mut seed = 9;
    let (n, gs) = (1024, 64);
    let a = rand_vec(n, &mut seed, 1.0);
    let b = rand_vec(n, &mut seed, 1.0);
    let (mut qa, mut sa) = (vec![0i8; n], vec![0f32; n / gs]);
    let (mut qb, mut sb) = (vec![0i8; n], vec![0f32; n / gs]);
    crate::quant::quantize_q8(&a, gs, &mut qa, &mut sa);
    crate::quant::quantize_q8(&b, gs, &mut qb, &mut sb);
    let exact: f32 = dot_f32_scalar(&a, &b);
    let approx = (dots().q8)(&qa, &sa, &qb, &sb, gs);
    let bound = n as f32 * (1.0 / 127.0);
    assert!((exact - approx).abs() < bound, "{exact} vs {approx}");
}

//! The sampler's tests: each filter against its definition, the fast top-p against the plain one,
//! the draw, and the same tokens from every instruction set's build.

use super::draw::draw;
use super::filter::{max_value, min_p_floor};
use super::top_p::{nucleus, plain_nucleus, Nucleus};
use super::*;
use crate::format::GenerationDefaults;

fn cfg(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed,
    }
}

/// A fixed pseudo-random logit vector over `n` tokens with distinct values.
fn logits(n: usize, spread: f32) -> Vec<f32> {
    let mut rng = Rng::new(12345);
    (0..n)
        .map(|_| (rng.next_f64() as f32 - 0.5) * spread)
        .collect()
}

fn ranked(l: &[f32]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..l.len()).collect();
    idx.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
    idx
}

#[test]
fn greedy_is_argmax() {
    let l = logits(1000, 10.0);
    let want = ranked(&l)[0] as u32;
    let mut s = Sampler::new(cfg(0.0, 20, 0.9, 0.1, 7)).unwrap();
    for _ in 0..5 {
        assert_eq!(s.sample(&l, &[], &[]), want);
    }
    assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
    assert_eq!(argmax(&[f32::NAN, -1.0, f32::NAN, 2.0]), 3);
    assert_eq!(argmax(&[f32::NAN; 3]), 0);
    assert_eq!(argmax(&[]), 0);
    // Ties in different lanes of the vectorized maximum: still the first.
    let mut v = vec![0.0f32; 40];
    (v[37], v[5], v[21]) = (2.0, 2.0, 1.0);
    assert_eq!(argmax(&v), 5);
}

#[test]
fn same_seed_same_tokens_every_seed_valid() {
    let l = logits(500, 4.0);
    for seed in [0, 1, u64::MAX] {
        let run = |seed| {
            let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.0, seed)).unwrap();
            (0..50).map(|_| s.sample(&l, &[], &[])).collect::<Vec<_>>()
        };
        let a = run(seed);
        assert_eq!(a, run(seed), "seed {seed}");
        // Not a constant stream: seed 0 is as good as any other.
        assert!(a.iter().any(|&t| t != a[0]), "seed {seed}");
    }
    let mut a = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 1)).unwrap();
    let mut b = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 2)).unwrap();
    let ra: Vec<u32> = (0..50).map(|_| a.sample(&l, &[], &[])).collect();
    let rb: Vec<u32> = (0..50).map(|_| b.sample(&l, &[], &[])).collect();
    assert_ne!(ra, rb);
}

#[test]
fn top_k_never_leaves_the_k_best() {
    let l = logits(2000, 3.0);
    let best: Vec<usize> = ranked(&l)[..10].to_vec();
    let mut s = Sampler::new(cfg(1.5, 10, 1.0, 0.0, 99)).unwrap();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..5000 {
        let t = s.sample(&l, &[], &[]) as usize;
        assert!(best.contains(&t), "token {t} is not among the 10 best");
        seen.insert(t);
    }
    // With flat-ish logits and 5000 draws, all 10 show up (the filter is not top-1).
    assert_eq!(seen.len(), 10);
}

/// The kept set must be exactly the smallest prefix (by probability) whose mass reaches p:
/// every token inside it is drawn, nothing outside it ever is.
#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    for (n, spread, p) in [(3000, 12.0, 0.9f32), (200, 2.0, 0.5), (5000, 30.0, 0.95)] {
        let l = logits(n, spread);
        let order = ranked(&l);
        let max = l[order[0]] as f64;
        let z: f64 = l.iter().map(|&v| (v as f64 - max).exp()).sum();
        let mut mass = 0.0;
        let mut nucleus = 0;
        while mass < p as f64 * z {
            mass += (l[order[nucleus]] as f64 - max).exp();
            nucleus += 1;
        }
        let inside: std::collections::HashSet<usize> = order[..nucleus].iter().copied().collect();
        let mut s = Sampler::new(cfg(1.0, 0, p, 0.0, 5)).unwrap();
        assert_eq!(kept_by_nucleus(&mut s, &l).len(), nucleus, "n {n} p {p}");
        let mut seen = std::collections::HashSet::new();
        for _ in 0..4000 {
            let t = s.sample(&l, &[], &[]) as usize;
            assert!(
                inside.contains(&t),
                "token {t} outside the nucleus of {nucleus}"
            );
            seen.insert(t);
        }
        if nucleus <= 50 {
            assert_eq!(seen.len(), nucleus, "every nucleus token is reachable");
        }
    }
}

/// The tokens [`nucleus`] keeps (top-p and min-p without top-k, as `sample` runs it), in
/// increasing order; checks the count it returns.
fn kept_by_nucleus(s: &mut Sampler, l: &[f32]) -> Vec<u32> {
    let inv_t = 1.0 / s.cfg.temperature;
    let max = max_value(l) * inv_t;
    let floor = min_p_floor(s.cfg.min_p, max);
    let mut w = vec![0f32; l.len()];
    let mut c = Vec::new();
    match nucleus(
        l,
        inv_t,
        max,
        s.cfg.top_p as f64,
        floor,
        &mut w,
        &mut c,
        &mut s.top_p,
    ) {
        Nucleus::Listed => {
            let mut kept: Vec<u32> = c.iter().map(|&(_, i)| i).collect();
            kept.sort_unstable();
            kept
        }
        Nucleus::Weighted(n) => {
            let kept: Vec<u32> = (0..l.len() as u32)
                .filter(|&i| w[i as usize] > 0.0)
                .collect();
            assert_eq!(kept.len(), n, "the count nucleus returns");
            kept
        }
    }
}

/// The tokens top-p and min-p keep by their definitions: [`plain_nucleus`] (a full sort, f64
/// sums, the library `exp`), then the tokens of it at least `min_p` times as likely as the top one.
fn reference_kept(l: &[f32], t: f32, p: f32, min_p: f32) -> Vec<u32> {
    let scaled: Vec<f32> = l.iter().map(|&v| v * (1.0 / t)).collect();
    let max = scaled[argmax(&scaled)] as f64;
    let mut kept = plain_nucleus(&scaled, p as f64);
    kept.retain(|&i| (scaled[i as usize] as f64 - max).exp() >= min_p as f64);
    kept.sort_unstable();
    kept
}

/// Top-p over the whole vocabulary searches its cut by thresholds (`nucleus`): the kept set
/// must be exactly the plain top-p's, from a few tokens to nearly all, with and without min-p
/// binding first.
#[test]
fn fast_top_p_keeps_exactly_the_plain_set() {
    let vocab = 151936;
    for (n, spread, t, p, min_p, spikes) in [
        (vocab, 8.0, 1.0, 0.9, 0.0, false),
        (vocab, 8.0, 1.5, 0.9, 0.0, false),
        (vocab, 40.0, 0.6, 0.95, 0.0, false),
        (vocab, 12.0, 1.0, 0.9, 0.0, true),
        (vocab, 12.0, 1.5, 0.95, 0.0, true),
        (vocab, 12.0, 0.7, 0.8, 0.0, true),
        // The spikes hold most of the mass: the cut is found while few blocks are read, so
        // the search's passes compute the weights instead of reading them back.
        (vocab, 4.0, 0.5, 0.8, 0.0, true),
        (vocab, 20.0, 1.0, 0.9, 0.05, false),
        (vocab, 8.0, 1.0, 0.5, 0.3, false),
        (vocab, 8.0, 1.0, 0.99, 0.5, false),
        (vocab, 12.0, 1.0, 0.95, 0.1, true),
        (3000, 12.0, 1.0, 0.9, 0.0, false),
        (200, 2.0, 1.0, 0.5, 0.0, false),
        (10, 1.0, 1.0, 0.99, 0.0, false),
    ] {
        let mut l = logits(n, spread);
        if spikes {
            // A few tokens far above the rest, as a trained model's logits have.
            for (k, v) in l.iter_mut().step_by(9973).take(6).enumerate() {
                *v += 12.0 - k as f32;
            }
        }
        let want = reference_kept(&l, t, p, min_p);
        let mut s = Sampler::new(cfg(t, 0, p, min_p, 5)).unwrap();
        let got = kept_by_nucleus(&mut s, &l);
        assert_eq!(
            got.len(),
            want.len(),
            "n {n} spread {spread} T {t} p {p} min-p {min_p}"
        );
        assert_eq!(got, want, "n {n} spread {spread} T {t} p {p} min-p {min_p}");
    }
}

/// The draw walks blocks of 64 weights, then the weights of one block: `u` picks the token
/// where the running sum passes `u * total`, across block ends too.
#[test]
fn draw_lands_where_the_running_sum_passes_u() {
    let mut w = vec![0f32; 200];
    (w[10], w[63], w[64], w[150], w[199]) = (1.0, 1.0, 2.0, 3.0, 1.0); // total 8
    let mut sums = Vec::new();
    for (u, want) in [
        (0.0, 10),
        (0.1, 10),
        (0.13, 63),
        (0.25, 64),
        (0.49, 64),
        (0.5, 150),
        (0.87, 150),
        (0.875, 199),
        (0.999_999, 199),
    ] {
        assert_eq!(draw(&w, u, &mut sums), want, "u {u}");
    }
    assert_eq!(draw(&[0.5], 0.7, &mut sums), 0);
}

/// Each instruction set's build of the sampler draws the same tokens from the same seed.
#[test]
fn every_instruction_set_draws_the_same_tokens() {
    let l = logits(151936, 12.0);
    for c in [
        cfg(1.0, 0, 1.0, 0.0, 11),
        cfg(1.5, 0, 0.9, 0.0, 12),
        cfg(0.6, 20, 0.95, 0.0, 13),
        cfg(1.0, 0, 1.0, 0.02, 14),
    ] {
        // The baseline build, then every other one this CPU can run.
        let mut builds: Vec<(&str, SampleFn)> = vec![("baseline", Sampler::sample_body)];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                // SAFETY: this CPU has AVX2.
                builds.push(("avx2", |s, l, c, g| unsafe { sample_avx2(s, l, c, g) }));
            }
            if is_x86_feature_detected!("avx512f") {
                // SAFETY: this CPU has AVX-512F.
                builds.push(("avx512", |s, l, c, g| unsafe { sample_avx512(s, l, c, g) }));
            }
        }
        builds.push(("dispatched", Sampler::sample));
        let mut want = None;
        for (name, build) in builds {
            let mut s = Sampler::new(c.clone()).unwrap();
            let got: Vec<u32> = (0..20).map(|_| build(&mut s, &l, &[], &[])).collect();
            assert_eq!(
                got,
                *want.get_or_insert_with(|| got.clone()),
                "{name}, {c:?}"
            );
        }
    }
}

/// A temperature so small that the scaled logits overflow is greedy, whatever the filters.
#[test]
fn a_vanishing_temperature_is_greedy() {
    let l = [1.0f32, 3.0, 2.0, -1.0];
    for (k, p, m) in [(0, 1.0, 0.0), (0, 0.9, 0.0), (2, 0.9, 0.1), (0, 1.0, 0.5)] {
        let mut s = Sampler::new(cfg(1e-39, k, p, m, 1)).unwrap();
        for _ in 0..10 {
            assert_eq!(s.sample(&l, &[], &[]), 1, "top-k {k} top-p {p} min-p {m}");
        }
    }
}

#[test]
fn min_p_drops_unlikely_tokens() {
    // p ~ exp(l): logits 0, -1, -2, -5 -> ratios 1, 0.37, 0.14, 0.007 of the max.
    let l = [0.0f32, -1.0, -2.0, -5.0];
    let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.1, 3)).unwrap();
    for _ in 0..2000 {
        assert!(s.sample(&l, &[], &[]) < 3);
    }
}

#[test]
fn penalties_move_the_argmax() {
    let l = [2.0f32, 1.5, -1.0];
    let mut c = cfg(0.0, 0, 1.0, 0.0, 0);
    c.repetition_penalty = 2.0;
    let mut s = Sampler::new(c.clone()).unwrap();
    // 2.0 / 2 = 1.0 < 1.5; repeated ids count once.
    assert_eq!(s.sample(&l, &[0, 0, 0], &[]), 1);
    assert_eq!(s.sample(&l, &[], &[]), 0);
    c.repetition_penalty = 1.0;
    c.presence_penalty = 0.6;
    let mut s = Sampler::new(c.clone()).unwrap();
    assert_eq!(
        s.sample(&l, &[0], &[]),
        0,
        "presence penalty ignores the prompt"
    );
    assert_eq!(s.sample(&l, &[0], &[0, 0]), 1);
    // Frequency: 2.0 - 0.3 = 1.7 stays first after one occurrence, 2.0 - 0.6 = 1.4 does not
    // after two.
    c.presence_penalty = 0.0;
    c.frequency_penalty = 0.3;
    let mut s = Sampler::new(c).unwrap();
    assert_eq!(s.sample(&l, &[0], &[0]), 0);
    assert_eq!(s.sample(&l, &[0], &[0, 0]), 1);
}

#[test]
fn invalid_settings_are_refused() {
    for (c, msg) in [
        (cfg(-0.1, 0, 1.0, 0.0, 0), "temperature"),
        (cfg(f32::NAN, 0, 1.0, 0.0, 0), "temperature"),
        (cfg(1.0, 0, 0.0, 0.0, 0), "top-p"),
        (cfg(1.0, 0, 1.5, 0.0, 0), "top-p"),
        (cfg(1.0, 0, 1.0, -0.5, 0), "min-p"),
    ] {
        let e = Sampler::new(c).err().unwrap().to_string();
        assert!(e.contains(msg), "{e}");
    }
    let mut c = cfg(1.0, 0, 1.0, 0.0, 0);
    c.repetition_penalty = 0.0;
    assert!(Sampler::new(c).is_err());
}

#[test]
fn defaults_follow_the_model() {
    let g = GenerationDefaults {
        temperature: Some(0.6),
        top_p: Some(0.95),
        top_k: Some(20),
        min_p: Some(0.0),
        repetition_penalty: None,
        do_sample: Some(true),
    };
    let c = SamplerConfig::from_defaults(&g, 4);
    assert_eq!(
        (c.temperature, c.top_k, c.top_p, c.min_p),
        (0.6, 20, 0.95, 0.0)
    );
    let g = GenerationDefaults {
        do_sample: Some(false),
        ..g
    };
    assert!(SamplerConfig::from_defaults(&g, 4).is_greedy());
}

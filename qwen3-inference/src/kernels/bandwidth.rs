//! A pass that only reads memory, as fast as a core can: `qwen3 bench` times it over a large
//! buffer to measure the machine's read bandwidth, the ceiling of decode (docs/performance.md,
//! "The roofline of decode").
//!
//! Its loop keeps 64 independent sums, so nothing waits on an addition and each cache line costs
//! few instructions: a core's out-of-order window then holds many lines' loads at once, which is
//! what streaming from DRAM needs. A dot product is a worse probe: on one thread, `dot(a, a)`
//! through the f32 kernel read less than this loop does (measured: docs/benchmarks.md,
//! "Measuring").

vectorized! {
    /// `sum` = the sum of `x` (in an order of its own; the value only keeps the reads alive).
    pub fn read_sum(x: &[f32], sum: &mut f32) {
        let mut acc = [0f32; 64];
        let chunks = x.chunks_exact(64);
        let tail = chunks.remainder();
        for c in chunks {
            for (a, v) in acc.iter_mut().zip(c) {
                *a += v;
            }
        }
        *sum = acc.iter().sum::<f32>() + tail.iter().sum::<f32>();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn read_sum_adds_everything() {
        for n in [0, 1, 63, 64, 65, 1000] {
            let x: Vec<f32> = (0..n).map(|i| (i % 5) as f32).collect();
            let mut s = -1.0;
            super::read_sum(&x, &mut s);
            assert_eq!(s, x.iter().sum::<f32>(), "n={n}");
        }
    }
}

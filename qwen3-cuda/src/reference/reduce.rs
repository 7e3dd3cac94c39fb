//! The reductions of `kernels/common.cuh`, in their exact order.

/// `warp_sum`: butterfly over 32 lanes; at each step lane l adds lane l ^ offset. All lanes end
/// equal (see common.cuh), so lane 0's value is the result.
pub fn warp_sum(lanes: &[f32; 32]) -> f32 {
    let mut v = *lanes;
    for offset in [16, 8, 4, 2, 1] {
        let prev = v;
        for (l, x) in v.iter_mut().enumerate() {
            *x = prev[l] + prev[l ^ offset];
        }
    }
    v[0]
}

fn warp_max(lanes: &[f32; 32]) -> f32 {
    lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// `block_sum`: `per_thread[t]` is thread t's value; `per_thread.len()` is blockDim.x, a multiple
/// of 32 and at most 1024. Each warp's butterfly sum fills a 32-slot partial array whose unused
/// slots are 0, and the partials are butterfly-summed again.
pub fn block_sum(per_thread: &[f32]) -> f32 {
    assert!(per_thread.len().is_multiple_of(32) && per_thread.len() <= 1024);
    let mut partial = [0.0f32; 32];
    for (w, lanes) in per_thread.chunks_exact(32).enumerate() {
        partial[w] = warp_sum(lanes.try_into().expect("32 lanes"));
    }
    warp_sum(&partial)
}

/// `block_max`: the order of a max does not change its value (no NaN reaches here).
pub fn block_max(per_thread: &[f32]) -> f32 {
    let mut partial = [f32::NEG_INFINITY; 32];
    for (w, lanes) in per_thread.chunks_exact(32).enumerate() {
        partial[w] = warp_max(lanes.try_into().expect("32 lanes"));
    }
    warp_max(&partial)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::test_values;

    #[test]
    fn warp_sum_is_the_sum() {
        let v: [f32; 32] = std::array::from_fn(|i| i as f32);
        assert_eq!(warp_sum(&v), 496.0);
    }

    /// The butterfly pairs lane 1 with lane 17 before either meets lane 0: two values each below
    /// half an ulp of 1.0 survive together in the tree, where a left-to-right sum drops both.
    #[test]
    fn warp_sum_adds_in_tree_order() {
        let mut v = [0.0f32; 32];
        v[0] = 1.0;
        v[1] = 3e-8;
        v[17] = 3e-8;
        let left_to_right = v.iter().fold(0.0f32, |a, &x| a + x);
        assert_eq!(left_to_right, 1.0);
        assert_eq!(warp_sum(&v), 1.0 + (3e-8f32 + 3e-8f32));
        assert!(warp_sum(&v) > 1.0);
    }

    #[test]
    fn block_sum_and_max_match_naive() {
        for threads in [32, 128, 256, 1024] {
            let v = test_values(threads, threads as u64);
            let naive: f64 = v.iter().map(|&x| x as f64).sum();
            assert!((block_sum(&v) as f64 - naive).abs() < 1e-4, "{threads}");
            let m = v.iter().copied().fold(f32::MIN, f32::max);
            assert_eq!(block_max(&v), m);
        }
    }
}

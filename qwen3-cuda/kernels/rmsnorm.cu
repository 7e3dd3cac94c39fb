// RMSNorm over rows, as HuggingFace's Qwen3RMSNorm (transformers, modeling_qwen3.py):
//
//     out[r, i] = (x[r, i] * (1 / sqrt(mean_i(x[r, i]^2) + eps))) * w[i]
//
// x, out: [rows, n]; w: [n] (norm weights are always f32 in the model file); eps from the file.
// The same kernel serves the hidden-size norms (rows = tokens, n = hidden_size) and the per-head
// q_norm / k_norm (rows = tokens * heads, n = head_dim = 128).
//
// One block per row; blockDim.x is a multiple of 32 (the host picks min(256, n rounded up to 32)).
// Thread t sums the squares of x[t], x[t + blockDim.x], ... with fmaf, then block_sum adds the
// per-thread sums in a fixed tree order (see common.cuh). 1 / sqrtf is correctly rounded here
// (NVRTC's default --prec-div=true --prec-sqrt=true), not the approximate rsqrtf.
extern "C" __global__ void rmsnorm_f32(float* out, const float* x, const float* w, int n, float eps) {
    const float* xr = x + (size_t)blockIdx.x * n;
    float* outr = out + (size_t)blockIdx.x * n;

    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        ss = fmaf(xr[i], xr[i], ss);
    }
    ss = block_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);

    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        outr[i] = (xr[i] * scale) * w[i];
    }
}

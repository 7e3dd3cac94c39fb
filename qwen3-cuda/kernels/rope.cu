// Rotary position embedding in HuggingFace's rotate-half layout (transformers, modeling_qwen3.py,
// apply_rotary_pos_emb): with h = head_dim / 2, each pair (i, i + h) of a head is rotated by the
// angle pos * inv_freq[i]:
//
//     out[i]     = x[i] * cos[pos, i] - x[i + h] * sin[pos, i]
//     out[i + h] = x[i + h] * cos[pos, i] + x[i] * sin[pos, i]
//
// which is HF's q * cos + rotate_half(q) * sin, since HF's cos/sin repeat the same h values twice.
// x: [n_tok, n_heads, head_dim], rotated in place; token t sits at position pos0 + t.
// cos, sin: [n_pos, h], precomputed on the host from rope_theta in the model file.
// Grid: (n_heads, n_tok); each thread rotates pairs i = threadIdx.x, threadIdx.x + blockDim.x, ...
// With --fmad=false each product is rounded, then the sum: the same as HF's f32 arithmetic.

extern "C" __global__ void rope(float* x, const float* cos_table, const float* sin_table, int n_heads,
                                int head_dim, int pos0) {
    const int half = head_dim / 2;
    const int t = blockIdx.y;
    float* xh = x + ((size_t)t * n_heads + blockIdx.x) * head_dim;
    const float* c = cos_table + (size_t)(pos0 + t) * half;
    const float* s = sin_table + (size_t)(pos0 + t) * half;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float a = xh[i];
        const float b = xh[i + half];
        xh[i] = a * c[i] - b * s[i];
        xh[i + half] = b * c[i] + a * s[i];
    }
}

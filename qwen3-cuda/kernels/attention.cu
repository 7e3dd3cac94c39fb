// Causal grouped-query attention over the KV cache on the device, as HuggingFace's
// eager_attention_forward (transformers, modeling_qwen3.py) in f32:
//
//     score[j] = (q . k[j]) * scale            j = 0 ..= p (causal: a query sees itself and the past)
//     prob     = softmax(score)                 exp(score - max) / sum
//     out      = sum_j prob[j] * v[j]
//
// q, out: [n_tok, n_heads, head_dim]; query token t sits at position p = pos0 + t.
// k_cache, v_cache: one layer's cache, [ctx, n_kv, head_dim] (token-major, so storing a step's keys
// is one contiguous copy). GQA: query head h reads kv head h / (n_heads / n_kv), as HF's repeat_kv.
// scores: scratch [n_tok, n_heads, ctx] in global memory (no shared-memory limit on the context).
// scale = head_dim^-0.5, computed on the host.
//
// One block per (head, query token), blockDim.x a multiple of 32 (the host uses 128):
//   1. each warp takes keys j = warp, warp + n_warps, ...; its lanes split the head_dim products
//      (fmaf, lane-strided) and warp_sum adds them; lane 0 stores score[j].
//   2. block_max, then each thread exponentiates its strided scores and block_sum adds them;
//      each prob is exp / sum, as torch's softmax.
//   3. thread i accumulates out[i] over j in order with fmaf (reads of v[j] are coalesced).
// expf is not correctly rounded (CUDA documents 2 ulp), so the CPU reference matches this kernel to
// a few ulp, not bit for bit.

extern "C" __global__ void attention(float* out, float* scores, const float* q, const float* k_cache,
                                     const float* v_cache, int n_heads, int n_kv, int head_dim, int ctx,
                                     int pos0, float scale) {
    const int h = blockIdx.x;
    const int t = blockIdx.y;
    const int n_keys = pos0 + t + 1;
    const int kvh = h / (n_heads / n_kv);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5;
    const float* qh = q + ((size_t)t * n_heads + h) * head_dim;
    float* s = scores + ((size_t)t * n_heads + h) * ctx;

    // 1. scores
    for (int j = warp; j < n_keys; j += n_warps) {
        const float* kj = k_cache + ((size_t)j * n_kv + kvh) * head_dim;
        float d = 0.0f;
        for (int i = lane; i < head_dim; i += 32) {
            d = fmaf(qh[i], kj[i], d);
        }
        d = warp_sum(d);
        if (lane == 0) {
            s[j] = d * scale;
        }
    }
    __syncthreads();  // makes the global writes of step 1 visible to the whole block

    // 2. softmax
    float m = NEG_INF;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) {
        m = fmaxf(m, s[j]);
    }
    m = block_max(m);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) {
        const float e = expf(s[j] - m);
        s[j] = e;
        sum += e;
    }
    sum = block_sum(sum);
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) {
        s[j] = s[j] / sum;
    }
    __syncthreads();

    // 3. weighted sum of values
    float* oh = out + ((size_t)t * n_heads + h) * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n_keys; j++) {
            acc = fmaf(s[j], v_cache[((size_t)j * n_kv + kvh) * head_dim + i], acc);
        }
        oh[i] = acc;
    }
}

// Element-wise steps of a layer. n elements, grid ceil(n / blockDim.x).

// SwiGLU's gate, in place: gate[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x))
// (HF ACT2FN["silu"], torch.nn.functional.silu). gate, up: [n_tok, intermediate_size] flattened.
extern "C" __global__ void silu_mul(float* gate, const float* up, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        gate[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}

// Residual connection: x[i] += y[i]. x, y: [n_tok, hidden_size] flattened.
extern "C" __global__ void add_assign(float* x, const float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = x[i] + y[i];
    }
}

// A bias added to every row (Qwen2's q/k/v projections): x[i] += bias[i % n], i < rows * n.
// x: [n_tok, n] flattened; bias: [n].
extern "C" __global__ void add_bias(float* x, const float* bias, int n, int total) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        x[i] = x[i] + bias[i % n];
    }
}

// A mixture of experts' weighted rows added back (transformers' index_add_ of expert(x) * w):
// out[rows[r]][j] += weights[r] * y[r][j], thread i = r * n + j < n_rows * n. The product and
// the sum are two roundings (--fmad=false), as on the CPU. No row repeats within a launch (a
// token chooses an expert once), so no two threads write one value.
extern "C" __global__ void scatter_add_rows(float* out, const float* y, const unsigned int* rows,
                                            const float* weights, int n_rows, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_rows * n) {
        const int r = i / n;
        const int j = i - r * n;
        float* o = out + (long long)rows[r] * n + j;
        *o = *o + weights[r] * y[i];
    }
}

// Token embedding: copy (and dequantize) one row of the embedding table per token, on the device,
// so the full 151936-row table is never expanded to f32 anywhere.
//
//     out[t, c] = E[tokens[t], c]      E: [vocab, cols] as stored; tokens: [n_tok]; out: [n_tok, cols]
//
// Grid: (ceil(cols / blockDim.x), n_tok). Token ids are checked against the vocabulary on the host
// before they are uploaded. The q8 value is q * scale exactly as quant::dequantize_q8 computes it.

extern "C" __global__ void embed_q8(float* out, const unsigned int* tokens, const signed char* q,
                                    const float* scales, int gs, int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) {
        return;
    }
    const size_t i = (size_t)tokens[blockIdx.y] * cols + c;
    out[(size_t)blockIdx.y * cols + c] = (float)q[i] * scales[i / gs];
}

// q6 (layout: matmul.cu): value c of row `tok`, as quant::q6_int times its group's scale.
extern "C" __global__ void embed_q6(float* out, const unsigned int* tokens,
                                    const unsigned char* packed, const unsigned short* scales,
                                    int gs, int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) {
        return;
    }
    const size_t tok = tokens[blockIdx.y];
    const Q6Place at = q6_place(packed + tok * (size_t)(cols / 4 * 3), cols, c);
    const int nibble = (at.second ? *at.nib >> 4 : *at.nib) & 15;
    const int high = (*at.high >> at.shift) & 3;
    const float scale = f16_bits_to_float(scales[(tok * cols + c) / gs]);
    out[(size_t)blockIdx.y * cols + c] = (float)((nibble | high << 4) - 32) * scale;
}

extern "C" __global__ void embed_bf16(float* out, const unsigned int* tokens, const unsigned short* w,
                                      int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) {
        return;
    }
    const size_t i = (size_t)tokens[blockIdx.y] * cols + c;
    out[(size_t)blockIdx.y * cols + c] = __uint_as_float((unsigned int)w[i] << 16);
}

extern "C" __global__ void embed_f32(float* out, const unsigned int* tokens, const float* w, int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) {
        return;
    }
    const size_t i = (size_t)tokens[blockIdx.y] * cols + c;
    out[(size_t)blockIdx.y * cols + c] = w[i];
}

// Matrix products with the weights as the model file stores them: y = W x for one token (decode)
// and Y = X W^T for a tile of tokens (prefill). Weight-only quantization: activations stay f32.
//
//     y[t, r] = sum_c W[r, c] * x[t, c]        W: [rows, cols], x: [n_tok, cols], y: [n_tok, rows]
//
// Weight layouts (docs/format.md):
//   q8    q: rows*cols int8 values, row-major; scales: rows * (cols/gs) f32, row-major, so
//         W[r, c] = q[r*cols + c] * scales[r*(cols/gs) + c/gs]
//   q4    packed: rows*cols/2 bytes, each group of gs values in gs/2 bytes, byte j holding value j
//         in its low nibble and value j + gs/2 in its high one, both as q + 8; scales: rows *
//         (cols/gs) f16 bits, so W[r, c] = (nibble - 8) * half(scales[r*(cols/gs) + c/gs])
//   q6    packed: rows*cols*3/4 bytes, each row in blocks of 128 values (the last may hold fewer,
//         a multiple of 32); a block of n values is n/2 nibble bytes packed as q4's groups of 32,
//         then n/4 high bytes, byte k holding the two high bits of nibble byte k's low and high
//         values (bits 0-1, 2-3) and of nibble byte k + n/4's (bits 4-5, 6-7); values are q + 32;
//         scales as q4's (quant::quantize_q6)
//   bf16  raw bfloat16 bits, row-major; W[r, c] = float(bits << 16)
//   f32   row-major
//
// Work split: one warp per weight row, 8 rows (256 threads) per block; grid.y walks tiles of
// TOK_TILE tokens, so each weight byte is read once per tile of tokens (that is what makes prefill
// cheaper per token than decode). Lane L handles columns c = 4L .. 4L+3 of each 128-column stripe:
// for q8 that is one 4-byte load (char4), so the 32 lanes of a warp read 128 consecutive bytes in
// one coalesced transaction; bf16 reads 8 bytes and f32 16 bytes a lane, equally contiguous.
// Requirements (checked on the host): cols % 4 == 0, gs % 4 == 0 (four columns never straddle
// two groups), x and the weights 16-byte aligned (every tensor in the file is 64-byte aligned).
// q4 reads a lane's four columns from four consecutive bytes (the low or the high nibbles of one
// half of a group): gs % 8 == 0 keeps them in one half, and with cols % gs == 0 (so each row's
// cols/2 bytes are a multiple of 4) the 4-byte load aligned. The 32 lanes read 64 distinct
// bytes, each twice (the lanes of a group's first half and of its second read the same bytes).
// q6 likewise reads four consecutive nibble bytes and four consecutive high bytes: gs % 32 == 0
// (so cols % 32 == 0: a row is a whole number of 24-byte runs, and every block a multiple of 4
// bytes) keeps both loads aligned.
//
// Accumulation order, reproduced exactly by src/reference/matmul.rs:
//   d = w0*x0; d = fmaf(w1, x1, d); d = fmaf(w2, x2, d); d = fmaf(w3, x3, d)   (4 columns)
//   acc = fmaf(d, s, acc)       s = the group's scale for q8 and q4, 1.0 for bf16 and f32
//   y = warp_sum(acc)           (butterfly over the 32 lanes)
// A token's result does not depend on which tile it is in, so batched prefill and one-token decode
// give bit-identical outputs.

#define TOK_TILE 8
#define ROWS_PER_BLOCK 8

// Four consecutive weights of one row as floats, and the scale that applies to them.
struct Q8Weights {
    const signed char* q;
    const float* scales;
    int gs;
    __device__ float4 load4(size_t row, int cols, int c, float* scale) const {
        const char4 v = *(const char4*)(q + row * cols + c);
        *scale = scales[row * (cols / gs) + c / gs];
        return make_float4((float)v.x, (float)v.y, (float)v.z, (float)v.w);
    }
};

struct Q4Weights {
    const unsigned char* packed;
    const unsigned short* scales;
    int gs;
    __device__ float4 load4(size_t row, int cols, int c, float* scale) const {
        const int half = gs / 2, g = c / gs, j = c % gs;
        // Columns c..c+3 are values j..j+3 of group g: bytes j..j+3 of its first half, low
        // nibbles, or bytes j-half.. of it, high nibbles.
        const size_t byte = row * (size_t)(cols / 2) + (size_t)g * half + (j % half);
        const unsigned int word = *(const unsigned int*)(packed + byte);
        const unsigned int v = (j < half ? word : word >> 4) & 0x0f0f0f0fu;
        *scale = f16_bits_to_float(scales[row * (cols / gs) + g]);
        return make_float4((float)((int)(v & 0xff) - 8), (float)((int)((v >> 8) & 0xff) - 8),
                           (float)((int)((v >> 16) & 0xff) - 8), (float)((int)(v >> 24) - 8));
    }
};

struct Q6Weights {
    const unsigned char* packed;
    const unsigned short* scales;
    int gs;
    __device__ float4 load4(size_t row, int cols, int c, float* scale) const {
        // Columns c..c+3: four consecutive nibble bytes and four consecutive high bytes.
        const Q6Place at = q6_place(packed + row * (size_t)(cols / 4 * 3), cols, c);
        const unsigned int word = *(const unsigned int*)at.nib;
        const unsigned int high = *(const unsigned int*)at.high;
        const unsigned int v = ((at.second ? word >> 4 : word) & 0x0f0f0f0fu) |
                               (((high >> at.shift) & 0x03030303u) << 4);
        *scale = f16_bits_to_float(scales[row * (cols / gs) + c / gs]);
        return make_float4((float)((int)(v & 0xff) - 32), (float)((int)((v >> 8) & 0xff) - 32),
                           (float)((int)((v >> 16) & 0xff) - 32), (float)((int)(v >> 24) - 32));
    }
};

struct Bf16Weights {
    const unsigned short* w;
    __device__ float4 load4(size_t row, int cols, int c, float* scale) const {
        // Little-endian: the lower half of each 32-bit word is the earlier column.
        const uint2 v = *(const uint2*)(w + row * cols + c);
        *scale = 1.0f;
        return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                           __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
    }
};

struct F32Weights {
    const float* w;
    __device__ float4 load4(size_t row, int cols, int c, float* scale) const {
        *scale = 1.0f;
        return *(const float4*)(w + row * cols + c);
    }
};

template <typename Weights>
__device__ void matmul_tile(const Weights& w, float* y, const float* x, int rows, int cols, int n_tok) {
    const int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) {
        return;  // row is the same for the 32 lanes of a warp, so whole warps leave together
    }
    const int t0 = blockIdx.y * TOK_TILE;
    const int nt = min(TOK_TILE, n_tok - t0);

    float acc[TOK_TILE];
#pragma unroll
    for (int t = 0; t < TOK_TILE; t++) {
        acc[t] = 0.0f;
    }
    for (int c = lane * 4; c < cols; c += 128) {
        float s;
        const float4 wv = w.load4((size_t)row, cols, c, &s);
#pragma unroll
        for (int t = 0; t < TOK_TILE; t++) {
            if (t < nt) {
                const float4 xv = *(const float4*)(x + (size_t)(t0 + t) * cols + c);
                float d = wv.x * xv.x;
                d = fmaf(wv.y, xv.y, d);
                d = fmaf(wv.z, xv.z, d);
                d = fmaf(wv.w, xv.w, d);
                acc[t] = fmaf(d, s, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TOK_TILE; t++) {
        if (t < nt) {  // nt is uniform across the warp, so every lane takes part in warp_sum
            const float total = warp_sum(acc[t]);
            if (lane == 0) {
                y[(size_t)(t0 + t) * rows + row] = total;
            }
        }
    }
}

extern "C" __global__ void matmul_q8(float* y, const signed char* q, const float* scales, int gs,
                                     const float* x, int rows, int cols, int n_tok) {
    matmul_tile(Q8Weights{q, scales, gs}, y, x, rows, cols, n_tok);
}

extern "C" __global__ void matmul_q4(float* y, const unsigned char* packed,
                                     const unsigned short* scales, int gs, const float* x, int rows,
                                     int cols, int n_tok) {
    matmul_tile(Q4Weights{packed, scales, gs}, y, x, rows, cols, n_tok);
}

extern "C" __global__ void matmul_q6(float* y, const unsigned char* packed,
                                     const unsigned short* scales, int gs, const float* x, int rows,
                                     int cols, int n_tok) {
    matmul_tile(Q6Weights{packed, scales, gs}, y, x, rows, cols, n_tok);
}

extern "C" __global__ void matmul_bf16(float* y, const unsigned short* w, const float* x, int rows,
                                       int cols, int n_tok) {
    matmul_tile(Bf16Weights{w}, y, x, rows, cols, n_tok);
}

extern "C" __global__ void matmul_f32(float* y, const float* w, const float* x, int rows, int cols,
                                      int n_tok) {
    matmul_tile(F32Weights{w}, y, x, rows, cols, n_tok);
}

// Reductions and weight-format pieces shared by every kernel (prepended to each kernel source
// before NVRTC compiles it).
//
// Every kernel is compiled with `--fmad=false`, so the compiler never fuses a multiply and an add
// on its own: where a kernel wants a fused multiply-add it writes `fmaf` explicitly. That makes
// each kernel's arithmetic exactly what its source says, and lets the CPU references in
// `src/reference/` reproduce it bit for bit (`f32::mul_add` is the same correctly rounded fma).

// Sum over the 32 lanes of a warp by butterfly exchange: at each step lane l adds the value of
// lane l ^ offset. Both partners compute the same sum (addition commutes), so after the five steps
// every lane holds the identical total.
// -infinity, the neutral element of max. NVRTC has no <math.h>, so no INFINITY macro.
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

// Sum over a whole block (blockDim.x a multiple of 32, at most 1024): each warp reduces its own
// lanes, lane 0 of warp w writes partial[w], then every warp reduces the 32 partials, so every
// thread returns the total. partial[] is zero-initialised first: a block of fewer than 32 warps
// leaves the upper slots unwritten, and they must add nothing. The last barrier lets a second call
// reuse partial[] safely.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x < 32) {
        partial[threadIdx.x] = 0.0f;
    }
    __syncthreads();
    v = warp_sum(v);
    if (lane == 0) {
        partial[warp] = v;
    }
    __syncthreads();
    const float total = warp_sum(partial[lane]);
    __syncthreads();
    return total;
}

// Maximum over a whole block; same shape as block_sum, with -inf as the neutral element.
__device__ float block_max(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x < 32) {
        partial[threadIdx.x] = NEG_INF;
    }
    __syncthreads();
    v = warp_max(v);
    if (lane == 0) {
        partial[warp] = v;
    }
    __syncthreads();
    const float total = warp_max(partial[lane]);
    __syncthreads();
    return total;
}

// The weight formats' shared pieces (matmul.cu, embed.cu).

// An f16 bit pattern as a float (PTX's conversion; NVRTC needs no header for it).
__device__ __forceinline__ float f16_bits_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Where value c of a q6 row starting at `row` lives (the layout: matmul.cu). Its block b holds n
// values (128, or fewer in the last); c is value i of it, in its run of 32 (i / 32) the low or
// the `second` (high) nibble of nibble byte `nib`, and its two high bits are bits `shift` and
// `shift + 1` of high byte `high`. Values c..c+3 with c % 4 == 0 sit at the same place in the
// three following bytes of each.
struct Q6Place {
    const unsigned char* nib;
    const unsigned char* high;
    int second;
    int shift;
};

__device__ __forceinline__ Q6Place q6_place(const unsigned char* row, int cols, int c) {
    const int b = c / 128, i = c % 128, n = min(128, cols - 128 * b);
    const int m = n / 4, p = 16 * (i / 32) + i % 16, second = (i % 32) >= 16;
    const unsigned char* block = row + (size_t)b * 96;
    return Q6Place{block + p, block + n / 2 + p % m, second, 4 * (p >= m) + 2 * second};
}

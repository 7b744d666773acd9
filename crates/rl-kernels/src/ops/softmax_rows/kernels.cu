// The row-wise steps of blocked attention on CUDA (ops/softmax_rows/): the scaled, masked softmax
// of a query block's scores and its backward, one thread block per score row. The score matmuls stay
// in cuBLAS; these replace the dozen candle kernels (casts, broadcasts, reductions) per step that
// each read and wrote the whole score matrix. Compiled at run time by NVRTC with no headers: bf16
// travels as its bits and converts as candle's casts do (round to nearest even).

#define THREADS 256

typedef unsigned short bf16;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float load(const float* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ float load(const bf16* p, unsigned long long i) {
    return __uint_as_float(((unsigned int)p[i]) << 16);
}

__device__ __forceinline__ void store(float* p, unsigned long long i, float v) { p[i] = v; }
__device__ __forceinline__ void store(bf16* p, unsigned long long i, float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        p[i] = (bf16)((u >> 16) | 0x40u);  // NaN stays NaN
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    p[i] = (bf16)(u >> 16);
}

// The maximum (max = true) or sum of `v` over the thread block, in every thread.
__device__ float block_reduce(float v, bool max, float* shared) {
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = max ? fmaxf(v, w) : v + w;
    }
    const unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < blockDim.x / 32 ? shared[lane] : (max ? neg_inf() : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = max ? fmaxf(v, w) : v + w;
    }
    __syncthreads();  // `shared` is free for the next reduction
    return v;
}

// p[r] = softmax(s[r] * scale + mask[r % rows]) over `keys` columns, in f32. Score row r belongs to
// query row r % rows of the block (rows of every head follow each other).
template <typename T>
__device__ void masked_softmax(const T* s, const T* mask, T* p, unsigned int rows, unsigned int keys, float scale) {
    __shared__ float shared[32];
    const unsigned long long r = blockIdx.x;
    const T* sr = s + r * keys;
    const T* mr = mask + (r % rows) * (unsigned long long)keys;
    T* pr = p + r * keys;
    float m = neg_inf();
    for (unsigned int j = threadIdx.x; j < keys; j += blockDim.x) m = fmaxf(m, load(sr, j) * scale + load(mr, j));
    m = block_reduce(m, true, shared);
    float sum = 0.0f;
    for (unsigned int j = threadIdx.x; j < keys; j += blockDim.x) sum += expf(load(sr, j) * scale + load(mr, j) - m);
    sum = block_reduce(sum, false, shared);
    for (unsigned int j = threadIdx.x; j < keys; j += blockDim.x)
        store(pr, j, expf(load(sr, j) * scale + load(mr, j) - m) / sum);
}

// ds[r] = scale * p[r] * (dp[r] - <p[r], dp[r]>): the gradient of the unscaled scores.
template <typename T>
__device__ void softmax_grad(const T* p, const T* dp, T* ds, unsigned int keys, float scale) {
    __shared__ float shared[32];
    const unsigned long long r = blockIdx.x;
    const T* pr = p + r * keys;
    const T* dpr = dp + r * keys;
    T* dsr = ds + r * keys;
    float dot = 0.0f;
    for (unsigned int j = threadIdx.x; j < keys; j += blockDim.x) dot += load(pr, j) * load(dpr, j);
    dot = block_reduce(dot, false, shared);
    for (unsigned int j = threadIdx.x; j < keys; j += blockDim.x)
        store(dsr, j, load(pr, j) * (load(dpr, j) - dot) * scale);
}

extern "C" __global__ void __launch_bounds__(THREADS)
masked_softmax_f32(const float* s, const float* mask, float* p, unsigned int rows, unsigned int keys, float scale) {
    masked_softmax(s, mask, p, rows, keys, scale);
}

extern "C" __global__ void __launch_bounds__(THREADS)
masked_softmax_bf16(const bf16* s, const bf16* mask, bf16* p, unsigned int rows, unsigned int keys, float scale) {
    masked_softmax(s, mask, p, rows, keys, scale);
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_grad_f32(const float* p, const float* dp, float* ds, unsigned int keys, float scale) {
    softmax_grad(p, dp, ds, keys, scale);
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_grad_bf16(const bf16* p, const bf16* dp, bf16* ds, unsigned int keys, float scale) {
    softmax_grad(p, dp, ds, keys, scale);
}

// CUDA kernels of the attention example (its GPU build, attention-cuda): the two ops of
// attention.cpp, varlen_attention and masked_attention, with the same semantics.
//
// Plain CUDA behind C entry points, as activation_kernels.cu: the torch side
// (attention_cuda.cpp) checks tensors and passes raw pointers, so nvcc never parses torch's
// headers. Correctness over speed: one block per (query row, head) streams the keys in tiles of
// kThreads with an online softmax (running max and total, rescaled per tile), accumulating in
// float; each thread scores one key of a tile, then owns output columns tid, tid + kThreads, ...
// A query that sees no key gets zeros, as on the CPU.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
// Head sizes up to kMaxHead: q is staged in shared memory, each thread holds kMaxHead /
// kThreads output columns. The torch side refuses larger heads.
constexpr int kMaxHead = 512;
constexpr int kColumnsPerThread = kMaxHead / kThreads;

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Every thread of the block gets op over all threads' values. `scratch` holds kWarps floats;
// the trailing barrier lets the next call reuse it.
template <typename Op>
__device__ float block_reduce(float value, Op op, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) {
    scratch[warp] = value;
  }
  __syncthreads();
  float result = scratch[0];
  for (int w = 1; w < kWarps; ++w) {
    result = op(result, scratch[w]);
  }
  __syncthreads();
  return result;
}

// One query row against `sk` keys (key j at k + j * k_stride, its value at v + j * v_stride);
// `seen(j)` says whether key j takes part. Called by the whole block, with block-uniform
// arguments (every barrier is reached by every thread).
template <typename T, typename Seen>
__device__ void attend_row(T* __restrict__ out, const T* __restrict__ q,
                           const T* __restrict__ k, const T* __restrict__ v, int64_t sk,
                           int64_t k_stride, int64_t v_stride, int d, int dv, float scale,
                           float softcap, Seen seen) {
  __shared__ float q_row[kMaxHead];
  __shared__ float probs[kThreads];
  __shared__ float scratch[kWarps];
  const int tid = threadIdx.x;
  for (int x = tid; x < d; x += kThreads) {
    q_row[x] = to_float(q[x]);
  }
  __syncthreads();
  const float neg_inf = -__int_as_float(0x7f800000);
  float running_max = neg_inf;  // block-uniform
  float total = 0.f;            // block-uniform
  float acc[kColumnsPerThread];
  for (int c = 0; c < kColumnsPerThread; ++c) {
    acc[c] = 0.f;
  }
  for (int64_t tile = 0; tile < sk; tile += kThreads) {
    const int64_t j = tile + tid;
    float score = neg_inf;
    if (j < sk && seen(j)) {
      const T* kj = k + j * k_stride;
      float dot = 0.f;
      for (int x = 0; x < d; ++x) {
        dot += q_row[x] * to_float(kj[x]);
      }
      score = dot * scale;
      if (softcap > 0.f) {
        score = softcap * tanhf(score / softcap);
      }
    }
    const float tile_max = block_reduce(score, MaxOp(), scratch);
    const float new_max = fmaxf(running_max, tile_max);
    if (new_max == neg_inf) {
      continue;  // no key seen yet (block-uniform)
    }
    const float p = score == neg_inf ? 0.f : expf(score - new_max);
    const float correction = running_max == neg_inf ? 0.f : expf(running_max - new_max);
    probs[tid] = p;
    // block_reduce's barriers also publish probs[] to the whole block.
    total = total * correction + block_reduce(p, SumOp(), scratch);
    const int n = static_cast<int>(sk - tile < kThreads ? sk - tile : kThreads);
    for (int c = 0; c < kColumnsPerThread; ++c) {
      const int x = tid + c * kThreads;
      if (x >= dv) {
        break;
      }
      float sum = 0.f;
      for (int t = 0; t < n; ++t) {
        const float pt = probs[t];
        if (pt != 0.f) {
          sum += pt * to_float(v[(tile + t) * v_stride + x]);
        }
      }
      acc[c] = acc[c] * correction + sum;
    }
    running_max = new_max;
    __syncthreads();  // probs[] is rewritten by the next tile
  }
  for (int c = 0; c < kColumnsPerThread; ++c) {
    const int x = tid + c * kThreads;
    if (x >= dv) {
      break;
    }
    out[x] = from_float<T>(total > 0.f ? acc[c] / total : 0.f);
  }
}

// Packed sequences: q (rows, hq, d), k (total_k, hk, d), v (total_k, hk, dv); grid (rows, hq).
template <typename T>
__global__ void varlen_kernel(T* __restrict__ out, const T* __restrict__ q,
                              const T* __restrict__ k, const T* __restrict__ v,
                              const int64_t* __restrict__ cu_q, const int64_t* __restrict__ cu_k,
                              int64_t batch, int hq, int hk, int d, int dv, float scale,
                              bool causal, int64_t window_left, int64_t window_right,
                              float softcap) {
  const int64_t row = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  T* out_row = out + (row * hq + h) * dv;
  if (row >= cu_q[batch]) {  // past the last sequence: rows no sequence owns
    for (int x = threadIdx.x; x < dv; x += kThreads) {
      out_row[x] = from_float<T>(0.f);
    }
    return;
  }
  int64_t lo = 0, hi = batch - 1;  // the sequence b with cu_q[b] <= row < cu_q[b + 1]
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (cu_q[mid] <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t q0 = cu_q[lo], sq = cu_q[lo + 1] - q0;
  const int64_t k0 = cu_k[lo], sk = cu_k[lo + 1] - k0;
  const int64_t diag = (row - q0) + sk - sq;  // bottom-right aligned
  const int g = h / (hq / hk);
  auto seen = [=](int64_t j) {
    if (causal && j > diag) return false;
    if (window_left >= 0 && j < diag - window_left) return false;
    if (window_right >= 0 && !causal && j > diag + window_right) return false;
    return true;
  };
  attend_row(out_row, q + (row * hq + h) * d, k + (k0 * hk + g) * d, v + (k0 * hk + g) * dv, sk,
             static_cast<int64_t>(hk) * d, static_cast<int64_t>(hk) * dv, d, dv, scale, softcap,
             seen);
}

// Batched (b, hq, sq, d) with a boolean mask (b, hq, sq, sk); grid (b * hq * sq).
template <typename T>
__global__ void masked_kernel(T* __restrict__ out, const T* __restrict__ q,
                              const T* __restrict__ k, const T* __restrict__ v,
                              const bool* __restrict__ mask, int hq, int hk, int64_t sq,
                              int64_t sk, int d, int dv, float scale, float softcap) {
  const int64_t row = blockIdx.x;  // (b * hq + h) * sq + i
  const int64_t bh = row / sq;
  const int64_t b = bh / hq;
  const int h = static_cast<int>(bh % hq);
  const int g = h / (hq / hk);
  const bool* mask_row = mask + row * sk;
  auto seen = [=](int64_t j) { return mask_row[j]; };
  attend_row(out + row * dv, q + row * d, k + (b * hk + g) * sk * d, v + (b * hk + g) * sk * dv,
             sk, d, dv, d, dv, scale, softcap, seen);
}

template <typename T>
cudaError_t launch_varlen(void* out, const void* q, const void* k, const void* v,
                          const int64_t* cu_q, const int64_t* cu_k, int64_t batch, int64_t rows,
                          int hq, int hk, int d, int dv, float scale, bool causal,
                          int64_t window_left, int64_t window_right, float softcap,
                          cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(hq));
  varlen_kernel<T><<<grid, kThreads, 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(q), static_cast<const T*>(k),
      static_cast<const T*>(v), cu_q, cu_k, batch, hq, hk, d, dv, scale, causal, window_left,
      window_right, softcap);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_masked(void* out, const void* q, const void* k, const void* v,
                          const bool* mask, int64_t batch, int hq, int hk, int64_t sq, int64_t sk,
                          int d, int dv, float scale, float softcap, cudaStream_t stream) {
  masked_kernel<T><<<static_cast<unsigned>(batch * hq * sq), kThreads, 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(q), static_cast<const T*>(k),
      static_cast<const T*>(v), mask, hq, hk, sq, sk, d, dv, scale, softcap);
  return cudaGetLastError();
}

}  // namespace

// The largest head size (q/k and v) the kernels take.
extern "C" int kerneld_example_attention_max_head() { return kMaxHead; }

// dtype: 0 float32, 1 float16, 2 bfloat16 (the torch side maps its scalar types). cu_q and
// cu_k are device pointers to batch + 1 offsets, checked by the caller.
extern "C" cudaError_t kerneld_example_varlen_attention(
    int dtype, void* out, const void* q, const void* k, const void* v, const int64_t* cu_q,
    const int64_t* cu_k, int64_t batch, int64_t rows, int64_t hq, int64_t hk, int64_t d,
    int64_t dv, float scale, int causal, int64_t window_left, int64_t window_right,
    float softcap, cudaStream_t stream) {
  const int ihq = static_cast<int>(hq), ihk = static_cast<int>(hk);
  const int id = static_cast<int>(d), idv = static_cast<int>(dv);
  switch (dtype) {
    case 0:
      return launch_varlen<float>(out, q, k, v, cu_q, cu_k, batch, rows, ihq, ihk, id, idv,
                                  scale, causal != 0, window_left, window_right, softcap, stream);
    case 1:
      return launch_varlen<__half>(out, q, k, v, cu_q, cu_k, batch, rows, ihq, ihk, id, idv,
                                   scale, causal != 0, window_left, window_right, softcap, stream);
    case 2:
      return launch_varlen<__nv_bfloat16>(out, q, k, v, cu_q, cu_k, batch, rows, ihq, ihk, id,
                                          idv, scale, causal != 0, window_left, window_right,
                                          softcap, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t kerneld_example_masked_attention(int dtype, void* out, const void* q,
                                                        const void* k, const void* v,
                                                        const bool* mask, int64_t batch,
                                                        int64_t hq, int64_t hk, int64_t sq,
                                                        int64_t sk, int64_t d, int64_t dv,
                                                        float scale, float softcap,
                                                        cudaStream_t stream) {
  const int ihq = static_cast<int>(hq), ihk = static_cast<int>(hk);
  const int id = static_cast<int>(d), idv = static_cast<int>(dv);
  switch (dtype) {
    case 0:
      return launch_masked<float>(out, q, k, v, mask, batch, ihq, ihk, sq, sk, id, idv, scale,
                                  softcap, stream);
    case 1:
      return launch_masked<__half>(out, q, k, v, mask, batch, ihq, ihk, sq, sk, id, idv, scale,
                                   softcap, stream);
    case 2:
      return launch_masked<__nv_bfloat16>(out, q, k, v, mask, batch, ihq, ihk, sq, sk, id, idv,
                                          scale, softcap, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

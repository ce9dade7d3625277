// CUDA kernels of the activation-cuda example: SiLU-and-mul and RMSNorm.
//
// Plain CUDA with C entry points: the torch side (activation_cuda.cpp) checks tensors and passes
// raw pointers, so nvcc never parses torch's headers and the build needs only the toolkit wheels.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

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

// One block per row: out[r, i] = silu(x[r, i]) * x[r, d + i].
template <typename T>
__global__ void silu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t d) {
  const int64_t row = blockIdx.x;
  const T* x = in + row * 2 * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float a = to_float(x[i]);
    const float b = to_float(x[d + i]);
    out[row * d + i] = from_float<T>(a / (1.0f + expf(-a)) * b);
  }
}

// One block per row: out = x * rsqrt(mean(x^2) + eps) * weight, accumulated in float.
template <typename T>
__global__ void rms_norm_kernel(T* __restrict__ out, const T* __restrict__ in,
                                const T* __restrict__ weight, int64_t d, float epsilon) {
  __shared__ float partial[32];
  const int64_t row = blockIdx.x;
  const T* x = in + row * d;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = to_float(x[i]);
    sum += v * v;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_down_sync(0xffffffffu, sum, offset);
  }
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) {
    partial[warp] = sum;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) / 32;
    sum = lane < warps ? partial[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) {
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) {
      partial[0] = rsqrtf(sum / static_cast<float>(d) + epsilon);
    }
  }
  __syncthreads();
  const float scale = partial[0];
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    out[row * d + i] = from_float<T>(to_float(x[i]) * scale * to_float(weight[i]));
  }
}

int threads_for(int64_t d) {
  int threads = 32;
  while (threads < 1024 && threads < d) {
    threads *= 2;
  }
  return threads;
}

template <typename T>
cudaError_t launch_silu_and_mul(void* out, const void* in, int64_t rows, int64_t d,
                                cudaStream_t stream) {
  silu_and_mul_kernel<T><<<static_cast<unsigned>(rows), threads_for(d), 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(in), d);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_rms_norm(void* out, const void* in, const void* weight, int64_t rows,
                            int64_t d, float epsilon, cudaStream_t stream) {
  rms_norm_kernel<T><<<static_cast<unsigned>(rows), threads_for(d), 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(in), static_cast<const T*>(weight), d,
      epsilon);
  return cudaGetLastError();
}

}  // namespace

// dtype: 0 float32, 1 float16, 2 bfloat16 (the torch side maps its scalar types).
extern "C" cudaError_t kerneld_example_silu_and_mul(int dtype, void* out, const void* in,
                                                    int64_t rows, int64_t d,
                                                    cudaStream_t stream) {
  switch (dtype) {
    case 0:
      return launch_silu_and_mul<float>(out, in, rows, d, stream);
    case 1:
      return launch_silu_and_mul<__half>(out, in, rows, d, stream);
    case 2:
      return launch_silu_and_mul<__nv_bfloat16>(out, in, rows, d, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t kerneld_example_rms_norm(int dtype, void* out, const void* in,
                                                const void* weight, int64_t rows, int64_t d,
                                                float epsilon, cudaStream_t stream) {
  switch (dtype) {
    case 0:
      return launch_rms_norm<float>(out, in, weight, rows, d, epsilon, stream);
    case 1:
      return launch_rms_norm<__half>(out, in, weight, rows, d, epsilon, stream);
    case 2:
      return launch_rms_norm<__nv_bfloat16>(out, in, weight, rows, d, epsilon, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// Torch side of the attention example's CUDA build (attention-cuda): the schemas of
// attention.cpp (varlen_attention, masked_attention), their checks, the CUDA dispatch key.
//
// Built as activation_cuda.cpp is, and for the same reason: it must import on a CPU-only torch,
// so cudart is linked statically, nothing of libc10_cuda or libtorch_cuda is referenced at link
// time, and the current stream is looked up with dlsym when an op runs.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <limits>
#include <vector>

#ifndef KERNEL_VERSION
#define KERNEL_VERSION 1
#endif

extern "C" int kerneld_example_attention_max_head();
extern "C" cudaError_t kerneld_example_varlen_attention(
    int dtype, void* out, const void* q, const void* k, const void* v, const int64_t* cu_q,
    const int64_t* cu_k, int64_t batch, int64_t rows, int64_t hq, int64_t hk, int64_t d,
    int64_t dv, float scale, int causal, int64_t window_left, int64_t window_right,
    float softcap, cudaStream_t stream);
extern "C" cudaError_t kerneld_example_masked_attention(int dtype, void* out, const void* q,
                                                        const void* k, const void* v,
                                                        const bool* mask, int64_t batch,
                                                        int64_t hq, int64_t hk, int64_t sq,
                                                        int64_t sk, int64_t d, int64_t dv,
                                                        float scale, float softcap,
                                                        cudaStream_t stream);

namespace {

// c10::cuda::CUDAStream is one c10::Stream (see activation_cuda.cpp).
struct StreamValue {
  int8_t device_type;
  int8_t device_index;
  int64_t id;
};
using GetCurrentStream = StreamValue (*)(int8_t);
using StreamHandle = cudaStream_t (*)(const StreamValue*);

cudaStream_t current_stream(int8_t device) {
  static const auto get_current = reinterpret_cast<GetCurrentStream>(
      dlsym(RTLD_DEFAULT, "_ZN3c104cuda20getCurrentCUDAStreamEa"));
  static const auto handle =
      reinterpret_cast<StreamHandle>(dlsym(RTLD_DEFAULT, "_ZNK3c104cuda10CUDAStream6streamEv"));
  if (get_current == nullptr || handle == nullptr) {
    return nullptr;
  }
  const StreamValue stream = get_current(device);
  return handle(&stream);
}

int dtype_code(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return 0;
    case at::kHalf:
      return 1;
    case at::kBFloat16:
      return 2;
    default:
      TORCH_CHECK(false, name, ": unsupported dtype ", t.scalar_type());
  }
}

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) {
      cudaSetDevice(device);
    }
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

void raise_on_error(cudaError_t err, const char* name) {
  TORCH_CHECK(err == cudaSuccess, name, ": CUDA call failed: ", cudaGetErrorString(err));
}

void check_qkv(const char* op, const at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
               const at::Tensor& v) {
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda() && out.is_cuda(), op,
              ": expects CUDA tensors");
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device() && out.device() == q.device(),
              op, ": q, k, v and out must be on one device");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  q.scalar_type() == out.scalar_type(),
              op, ": q, k, v and out must have the same dtype");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && out.is_contiguous(),
              op, ": q, k, v and out must be contiguous");
  TORCH_CHECK(q.size(-1) == k.size(-1), op, ": q and k must have the same head size, got ",
              q.sizes(), " and ", k.sizes());
  const int64_t max_head = kerneld_example_attention_max_head();
  TORCH_CHECK(q.size(-1) <= max_head && v.size(-1) <= max_head, op,
              ": head sizes up to ", max_head, " are supported, got ", q.size(-1), " and ",
              v.size(-1));
}

// The offsets on the host, to check them as the CPU op does (a copy and a sync per call: the
// example favours clear errors over speed).
std::vector<int64_t> host_offsets(const at::Tensor& offsets, cudaStream_t stream) {
  std::vector<int64_t> host(static_cast<size_t>(offsets.numel()));
  raise_on_error(cudaMemcpyAsync(host.data(), offsets.data_ptr(), host.size() * sizeof(int64_t),
                                 cudaMemcpyDeviceToHost, stream),
                 "varlen_attention");
  raise_on_error(cudaStreamSynchronize(stream), "varlen_attention");
  return host;
}

void varlen_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                      const at::Tensor& cu_seqlens_k, double softmax_scale, bool causal,
                      int64_t window_left, int64_t window_right, double softcap) {
  check_qkv("varlen_attention", out, q, k, v);
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
              "varlen_attention: q, k and v must be (total, heads, head_size), got ", q.sizes());
  TORCH_CHECK(q.size(1) % k.size(1) == 0 && k.size(1) == v.size(1),
              "varlen_attention: query heads must be a multiple of key/value heads, got ",
              q.size(1), " and ", k.size(1));
  TORCH_CHECK(out.size(0) == q.size(0) && out.size(1) == q.size(1) && out.size(2) == v.size(2),
              "varlen_attention: out has shape ", out.sizes());
  TORCH_CHECK(cu_seqlens_q.scalar_type() == at::kLong && cu_seqlens_k.scalar_type() == at::kLong &&
                  cu_seqlens_q.is_contiguous() && cu_seqlens_k.is_contiguous() &&
                  cu_seqlens_q.device() == q.device() && cu_seqlens_k.device() == q.device() &&
                  cu_seqlens_q.numel() == cu_seqlens_k.numel() && cu_seqlens_q.numel() >= 1,
              "varlen_attention: cu_seqlens_q and cu_seqlens_k must be contiguous int64 tensors "
              "of batch + 1 offsets on q's device");
  TORCH_CHECK(q.size(0) <= std::numeric_limits<int32_t>::max(),
              "varlen_attention: too many query rows for one launch: ", q.size(0));
  const int8_t device = q.device().index();
  DeviceScope scope(device);
  cudaStream_t stream = current_stream(device);
  const int64_t batch = cu_seqlens_q.numel() - 1;
  const std::vector<int64_t> cq = host_offsets(cu_seqlens_q, stream);
  const std::vector<int64_t> ck = host_offsets(cu_seqlens_k, stream);
  TORCH_CHECK(cq[0] == 0 && ck[0] == 0 && cq[batch] <= q.size(0) && ck[batch] <= k.size(0),
              "varlen_attention: cu_seqlens do not fit q (", q.size(0), ") and k (", k.size(0),
              ")");
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(cq[b + 1] >= cq[b] && ck[b + 1] >= ck[b],
                "varlen_attention: cu_seqlens must not decrease");
  }
  if (out.numel() == 0) {
    return;
  }
  raise_on_error(kerneld_example_varlen_attention(
                     dtype_code(q, "varlen_attention"), out.data_ptr(), q.data_ptr(),
                     k.data_ptr(), v.data_ptr(), cu_seqlens_q.data_ptr<int64_t>(),
                     cu_seqlens_k.data_ptr<int64_t>(), batch, q.size(0), q.size(1), k.size(1),
                     q.size(2), v.size(2), static_cast<float>(softmax_scale), causal ? 1 : 0,
                     window_left, window_right, static_cast<float>(softcap), stream),
                 "varlen_attention");
}

void masked_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& mask, double softmax_scale,
                      double softcap) {
  check_qkv("masked_attention", out, q, k, v);
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "masked_attention: q, k and v must be (batch, heads, seq, head_size), got ",
              q.sizes());
  TORCH_CHECK(q.size(1) % k.size(1) == 0 && k.size(1) == v.size(1) && k.size(2) == v.size(2) &&
                  k.size(0) == q.size(0) && v.size(0) == q.size(0),
              "masked_attention: query heads must be a multiple of key/value heads");
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.is_contiguous() && mask.dim() == 4 &&
                  mask.device() == q.device() && mask.size(0) == q.size(0) &&
                  mask.size(1) == q.size(1) && mask.size(2) == q.size(2) &&
                  mask.size(3) == k.size(2),
              "masked_attention: mask must be a contiguous bool (batch, heads, q_len, k_len) "
              "tensor on q's device, got ",
              mask.sizes());
  TORCH_CHECK(out.sizes() == at::IntArrayRef({q.size(0), q.size(1), q.size(2), v.size(3)}),
              "masked_attention: out has shape ", out.sizes());
  const int64_t rows = q.size(0) * q.size(1) * q.size(2);
  TORCH_CHECK(rows <= std::numeric_limits<int32_t>::max(),
              "masked_attention: too many query rows for one launch: ", rows);
  if (out.numel() == 0) {
    return;
  }
  const int8_t device = q.device().index();
  DeviceScope scope(device);
  raise_on_error(kerneld_example_masked_attention(
                     dtype_code(q, "masked_attention"), out.data_ptr(), q.data_ptr(),
                     k.data_ptr(), v.data_ptr(), mask.data_ptr<bool>(), q.size(0), q.size(1),
                     k.size(1), q.size(2), k.size(2), q.size(3), v.size(3),
                     static_cast<float>(softmax_scale), static_cast<float>(softcap),
                     current_stream(device)),
                 "masked_attention");
}

}  // namespace

// TORCH_LIBRARY pastes its first argument, so expand TORCH_EXTENSION_NAME first.
#define KERNEL_LIBRARY(NS, M) TORCH_LIBRARY(NS, M)
#define KERNEL_LIBRARY_IMPL(NS, K, M) TORCH_LIBRARY_IMPL(NS, K, M)

KERNEL_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def(
      "varlen_attention(Tensor! out, Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, float softmax_scale, bool causal, int window_left, "
      "int window_right, float softcap) -> ()");
  m.def(
      "masked_attention(Tensor! out, Tensor q, Tensor k, Tensor v, Tensor mask, "
      "float softmax_scale, float softcap) -> ()");
}

KERNEL_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CUDA, m) {
  m.impl("varlen_attention", &varlen_attention);
  m.impl("masked_attention", &masked_attention);
}

// An empty module: importing it runs the registrations above (limited API, no pybind11).
#define KERNEL_CONCAT_(A, B) A##B
#define KERNEL_CONCAT(A, B) KERNEL_CONCAT_(A, B)
#define KERNEL_STR_(X) #X
#define KERNEL_STR(X) KERNEL_STR_(X)

PyMODINIT_FUNC KERNEL_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, KERNEL_STR(TORCH_EXTENSION_NAME), nullptr, -1, nullptr,
  };
  return PyModule_Create(&module_def);
}

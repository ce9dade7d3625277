// Torch side of the activation-cuda example: op schemas, tensor checks, the CUDA dispatch key.
//
// It must import on a CPU-only torch (kerneld serves the same store to every job, and the build
// machine has no CUDA torch): cudart is linked statically, and nothing from libc10_cuda or
// libtorch_cuda is referenced at link time. The current stream is looked up with dlsym when an
// op runs; without a CUDA torch there can be no CUDA tensor to run on anyway.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>

#ifndef KERNEL_VERSION
#define KERNEL_VERSION 1
#endif

extern "C" cudaError_t kerneld_example_silu_and_mul(int dtype, void* out, const void* in,
                                                    int64_t rows, int64_t d, cudaStream_t stream);
extern "C" cudaError_t kerneld_example_rms_norm(int dtype, void* out, const void* in,
                                                const void* weight, int64_t rows, int64_t d,
                                                float epsilon, cudaStream_t stream);

namespace {

// c10::cuda::CUDAStream is one c10::Stream = {Device {DeviceType int8, DeviceIndex int8},
// StreamId int64}: trivially copyable and 16 bytes, so the Itanium ABI returns it in registers.
struct StreamValue {
  int8_t device_type;
  int8_t device_index;
  int64_t id;
};
using GetCurrentStream = StreamValue (*)(int8_t);
using StreamHandle = cudaStream_t (*)(const StreamValue*);

// Torch's current stream for `device` (so ops order with the caller's work), or the legacy
// default stream where torch's CUDA library is absent.
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

// Runs on the tensors' device, then restores the caller's current device.
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

void check_cuda(const at::Tensor& out, const at::Tensor& input, const char* name) {
  TORCH_CHECK(input.is_cuda() && out.is_cuda(), name, ": expects CUDA tensors");
  TORCH_CHECK(out.device() == input.device(), name, ": out and input are on different devices");
  TORCH_CHECK(out.scalar_type() == input.scalar_type(), name, ": out and input dtypes differ");
  TORCH_CHECK(out.is_contiguous() && input.is_contiguous(), name,
              ": out and input must be contiguous");
}

void raise_on_error(cudaError_t err, const char* name) {
  TORCH_CHECK(err == cudaSuccess, name, ": CUDA launch failed: ", cudaGetErrorString(err));
}

void silu_and_mul(at::Tensor& out, const at::Tensor& input) {
  check_cuda(out, input, "silu_and_mul");
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) % 2 == 0,
              "silu_and_mul: the last dimension of the input must be even, got ", input.sizes());
  const int64_t d = input.size(-1) / 2;
  TORCH_CHECK(out.size(-1) == d && out.numel() * 2 == input.numel(), "silu_and_mul: out has shape ",
              out.sizes(), " for input ", input.sizes());
  if (out.numel() == 0) {
    return;
  }
  const int8_t device = input.device().index();
  DeviceScope scope(device);
  raise_on_error(kerneld_example_silu_and_mul(dtype_code(input, "silu_and_mul"), out.data_ptr(),
                                              input.data_ptr(), input.numel() / (2 * d), d,
                                              current_stream(device)),
                 "silu_and_mul");
}

void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight,
              double epsilon) {
  check_cuda(out, input, "rms_norm");
  TORCH_CHECK(weight.is_cuda() && weight.device() == input.device() &&
                  weight.scalar_type() == input.scalar_type() && weight.is_contiguous(),
              "rms_norm: weight must be a contiguous CUDA tensor of the input's dtype and device");
  TORCH_CHECK(input.dim() >= 1 && weight.dim() == 1 && weight.size(0) == input.size(-1),
              "rms_norm: weight has shape ", weight.sizes(), " for input ", input.sizes());
  TORCH_CHECK(out.sizes() == input.sizes(), "rms_norm: out has shape ", out.sizes(),
              " for input ", input.sizes());
  const int64_t d = input.size(-1);
  if (out.numel() == 0) {
    return;
  }
  const int8_t device = input.device().index();
  DeviceScope scope(device);
  raise_on_error(kerneld_example_rms_norm(dtype_code(input, "rms_norm"), out.data_ptr(),
                                          input.data_ptr(), weight.data_ptr(), input.numel() / d,
                                          d, static_cast<float>(epsilon), current_stream(device)),
                 "rms_norm");
}

}  // namespace

// TORCH_LIBRARY pastes its first argument, so expand TORCH_EXTENSION_NAME first.
#define KERNEL_LIBRARY(NS, M) TORCH_LIBRARY(NS, M)
#define KERNEL_LIBRARY_IMPL(NS, K, M) TORCH_LIBRARY_IMPL(NS, K, M)

KERNEL_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  m.def("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()");
}

KERNEL_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CUDA, m) {
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("rms_norm", &rms_norm);
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

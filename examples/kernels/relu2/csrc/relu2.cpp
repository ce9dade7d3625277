// Squared ReLU, the second and smallest kerneld example kernel (CPU only).
//
// It exists so tests have two kernels with distinct op namespaces to load side by side. The
// namespace is TORCH_EXTENSION_NAME, unique per build. KERNEL_VERSION >= 2 adds `relu2_and_mul`.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdint>

#ifndef KERNEL_VERSION
#define KERNEL_VERSION 1
#endif

namespace {

float relu2_value(float a) {
  const float r = a > 0.0f ? a : 0.0f;
  return r * r;
}

template <typename T>
void relu2_loop(T* out, const T* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<T>(relu2_value(static_cast<float>(in[i])));
  }
}

template <typename T>
void relu2_and_mul_loop(T* out, const T* in, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < d; ++i) {
      const float a = static_cast<float>(in[r * 2 * d + i]);
      const float b = static_cast<float>(in[r * 2 * d + d + i]);
      out[r * d + i] = static_cast<T>(relu2_value(a) * b);
    }
  }
}

void check_common(const at::Tensor& out, const at::Tensor& input, const char* name) {
  TORCH_CHECK(input.device().is_cpu() && out.device().is_cpu(), name, ": expects CPU tensors");
  TORCH_CHECK(out.scalar_type() == input.scalar_type(), name, ": out and input dtypes differ");
  TORCH_CHECK(out.is_contiguous(), name, ": out must be contiguous");
}

void relu2(at::Tensor& out, const at::Tensor& input) {
  check_common(out, input, "relu2");
  TORCH_CHECK(out.sizes() == input.sizes(), "relu2: out has shape ", out.sizes(), " for input ",
              input.sizes());
  const at::Tensor x = input.contiguous();
  const int64_t n = x.numel();
  switch (x.scalar_type()) {
    case at::kFloat:
      relu2_loop(out.data_ptr<float>(), x.data_ptr<float>(), n);
      break;
    case at::kBFloat16:
      relu2_loop(out.data_ptr<c10::BFloat16>(), x.data_ptr<c10::BFloat16>(), n);
      break;
    case at::kHalf:
      relu2_loop(out.data_ptr<c10::Half>(), x.data_ptr<c10::Half>(), n);
      break;
    default:
      TORCH_CHECK(false, "relu2: unsupported dtype ", x.scalar_type());
  }
}

#if KERNEL_VERSION >= 2
void relu2_and_mul(at::Tensor& out, const at::Tensor& input) {
  check_common(out, input, "relu2_and_mul");
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) % 2 == 0,
              "relu2_and_mul: the last dimension of the input must be even, got ", input.sizes());
  const int64_t d = input.size(-1) / 2;
  TORCH_CHECK(out.dim() == input.dim() && out.size(-1) == d && out.numel() * 2 == input.numel(),
              "relu2_and_mul: out has shape ", out.sizes(), " for input ", input.sizes());
  if (out.numel() == 0) {
    return;
  }
  const at::Tensor x = input.contiguous();
  const int64_t rows = x.numel() / (2 * d);
  switch (x.scalar_type()) {
    case at::kFloat:
      relu2_and_mul_loop(out.data_ptr<float>(), x.data_ptr<float>(), rows, d);
      break;
    case at::kBFloat16:
      relu2_and_mul_loop(out.data_ptr<c10::BFloat16>(), x.data_ptr<c10::BFloat16>(), rows, d);
      break;
    case at::kHalf:
      relu2_and_mul_loop(out.data_ptr<c10::Half>(), x.data_ptr<c10::Half>(), rows, d);
      break;
    default:
      TORCH_CHECK(false, "relu2_and_mul: unsupported dtype ", x.scalar_type());
  }
}
#endif

}  // namespace

// TORCH_LIBRARY pastes its first argument, so expand TORCH_EXTENSION_NAME first.
#define KERNEL_LIBRARY(NS, M) TORCH_LIBRARY(NS, M)
#define KERNEL_LIBRARY_IMPL(NS, K, M) TORCH_LIBRARY_IMPL(NS, K, M)

KERNEL_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("relu2(Tensor! out, Tensor input) -> ()");
#if KERNEL_VERSION >= 2
  m.def("relu2_and_mul(Tensor! out, Tensor input) -> ()");
#endif
}

KERNEL_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CPU, m) {
  m.impl("relu2", &relu2);
#if KERNEL_VERSION >= 2
  m.impl("relu2_and_mul", &relu2_and_mul);
#endif
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

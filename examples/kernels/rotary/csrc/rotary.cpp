// Rotary position embedding, the function-kernel example of kerneld (CPU only).
//
// Transformers marks `apply_rotary_pos_emb` (a function, not a layer) as the hub kind
// `rotary_pos_emb`; this kernel is what such a mapping loads. The op rotates each row of the
// last dimension in two halves, as Transformers' `rotate_half` does:
//   out[i]     = x[i] * cos[i]     - x[i + h] * sin[i]
//   out[i + h] = x[i + h] * cos[i + h] + x[i] * sin[i + h]        (h = D / 2)
// `cos` and `sin` arrive broadcast to x's shape (the Python wrapper expands them). The op
// namespace is TORCH_EXTENSION_NAME, unique per build.

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

template <typename T>
void rotary_loop(T* out, const T* x, const T* cos, const T* sin, int64_t rows, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * d;
    for (int64_t i = 0; i < h; ++i) {
      const float a = static_cast<float>(x[o + i]);
      const float b = static_cast<float>(x[o + h + i]);
      out[o + i] = static_cast<T>(a * static_cast<float>(cos[o + i]) -
                                  b * static_cast<float>(sin[o + i]));
      out[o + h + i] = static_cast<T>(b * static_cast<float>(cos[o + h + i]) +
                                      a * static_cast<float>(sin[o + h + i]));
    }
  }
}

void apply_rotary(at::Tensor& out, const at::Tensor& input, const at::Tensor& cos,
                  const at::Tensor& sin) {
  TORCH_CHECK(input.device().is_cpu() && out.device().is_cpu() && cos.device().is_cpu() &&
                  sin.device().is_cpu(),
              "apply_rotary: expects CPU tensors");
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) % 2 == 0,
              "apply_rotary: the last dimension of the input must be even, got ", input.sizes());
  TORCH_CHECK(cos.sizes() == input.sizes() && sin.sizes() == input.sizes(),
              "apply_rotary: cos ", cos.sizes(), " and sin ", sin.sizes(),
              " must have the input's shape ", input.sizes());
  TORCH_CHECK(out.sizes() == input.sizes(), "apply_rotary: out has shape ", out.sizes(),
              " for input ", input.sizes());
  TORCH_CHECK(out.scalar_type() == input.scalar_type() && cos.scalar_type() == input.scalar_type() &&
                  sin.scalar_type() == input.scalar_type(),
              "apply_rotary: out, input, cos and sin must have the same dtype");
  TORCH_CHECK(out.is_contiguous(), "apply_rotary: out must be contiguous");
  if (out.numel() == 0) {
    return;
  }
  const at::Tensor x = input.contiguous();
  const at::Tensor c = cos.contiguous();
  const at::Tensor s = sin.contiguous();
  const int64_t d = x.size(-1);
  const int64_t rows = x.numel() / d;
  switch (x.scalar_type()) {
    case at::kFloat:
      rotary_loop(out.data_ptr<float>(), x.data_ptr<float>(), c.data_ptr<float>(),
                  s.data_ptr<float>(), rows, d);
      break;
    case at::kBFloat16:
      rotary_loop(out.data_ptr<c10::BFloat16>(), x.data_ptr<c10::BFloat16>(),
                  c.data_ptr<c10::BFloat16>(), s.data_ptr<c10::BFloat16>(), rows, d);
      break;
    case at::kHalf:
      rotary_loop(out.data_ptr<c10::Half>(), x.data_ptr<c10::Half>(), c.data_ptr<c10::Half>(),
                  s.data_ptr<c10::Half>(), rows, d);
      break;
    default:
      TORCH_CHECK(false, "apply_rotary: unsupported dtype ", x.scalar_type());
  }
}

}  // namespace

// TORCH_LIBRARY pastes its first argument, so expand TORCH_EXTENSION_NAME first.
#define KERNEL_LIBRARY(NS, M) TORCH_LIBRARY(NS, M)
#define KERNEL_LIBRARY_IMPL(NS, K, M) TORCH_LIBRARY_IMPL(NS, K, M)

KERNEL_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("apply_rotary(Tensor! out, Tensor input, Tensor cos, Tensor sin) -> ()");
}

KERNEL_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CPU, m) { m.impl("apply_rotary", &apply_rotary); }

// An empty module keeps the extension within the limited API (see activation.cpp).
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

// Activation ops of the kerneld example kernel (CPU only).
//
// Plain loops with float accumulation: the point is a real native extension in Hub layout whose
// results tests can check against PyTorch, not speed. The op namespace is TORCH_EXTENSION_NAME,
// unique per build (it is also the metadata.json `id` and the module name), so several builds and
// versions of this kernel can be loaded into one process side by side.
//
// KERNEL_VERSION >= 2 adds `gelu_and_mul`, so a test can tell v1 from v2 after import.
//
// Besides the gated ops, `silu` and `gelu_tanh` are the plain elementwise activations that
// Transformers' `SiLU` and `GeluTanh` layer kinds map to (`out` has the input's shape).

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#ifndef KERNEL_VERSION
#define KERNEL_VERSION 1
#endif

namespace {

// Gated activations take [..., 2*d] and write act(x[..., :d]) * x[..., d:] into [..., d].
struct SiluOp {
  static float apply(float a) { return a / (1.0f + std::exp(-a)); }
};

struct GeluTanhOp {
  static float apply(float a) {
    constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
    constexpr float kKappa = 0.044715f;
    return 0.5f * a * (1.0f + std::tanh(kBeta * (a + kKappa * a * a * a)));
  }
};

struct GeluErfOp {
  static float apply(float a) {
    constexpr float kInvSqrt2 = 0.7071067811865476f;
    return 0.5f * a * (1.0f + std::erf(a * kInvSqrt2));
  }
};

template <typename Op, typename T>
void gated_loop(T* out, const T* in, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * 2 * d;
    T* y = out + r * d;
    for (int64_t i = 0; i < d; ++i) {
      const float a = static_cast<float>(x[i]);
      const float b = static_cast<float>(x[d + i]);
      y[i] = static_cast<T>(Op::apply(a) * b);
    }
  }
}

template <typename Op>
void gated(at::Tensor& out, const at::Tensor& input, const char* name) {
  TORCH_CHECK(input.device().is_cpu() && out.device().is_cpu(), name, ": expects CPU tensors");
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) % 2 == 0, name,
              ": the last dimension of the input must be even, got ", input.sizes());
  TORCH_CHECK(out.scalar_type() == input.scalar_type(), name, ": out and input dtypes differ");
  TORCH_CHECK(out.is_contiguous(), name, ": out must be contiguous");
  const int64_t d = input.size(-1) / 2;
  TORCH_CHECK(out.dim() == input.dim() && out.size(-1) == d && out.numel() * 2 == input.numel(),
              name, ": out has shape ", out.sizes(), " for input ", input.sizes());
  if (out.numel() == 0) {
    return;
  }
  const at::Tensor x = input.contiguous();
  const int64_t rows = x.numel() / (2 * d);
  switch (x.scalar_type()) {
    case at::kFloat:
      gated_loop<Op>(out.data_ptr<float>(), x.data_ptr<float>(), rows, d);
      break;
    case at::kBFloat16:
      gated_loop<Op>(out.data_ptr<c10::BFloat16>(), x.data_ptr<c10::BFloat16>(), rows, d);
      break;
    case at::kHalf:
      gated_loop<Op>(out.data_ptr<c10::Half>(), x.data_ptr<c10::Half>(), rows, d);
      break;
    default:
      TORCH_CHECK(false, name, ": unsupported dtype ", x.scalar_type());
  }
}

// Elementwise activations: out[i] = act(x[i]), same shape.
template <typename Op, typename T>
void elementwise_loop(T* out, const T* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<T>(Op::apply(static_cast<float>(in[i])));
  }
}

template <typename Op>
void elementwise(at::Tensor& out, const at::Tensor& input, const char* name) {
  TORCH_CHECK(input.device().is_cpu() && out.device().is_cpu(), name, ": expects CPU tensors");
  TORCH_CHECK(out.scalar_type() == input.scalar_type(), name, ": out and input dtypes differ");
  TORCH_CHECK(out.is_contiguous(), name, ": out must be contiguous");
  TORCH_CHECK(out.sizes() == input.sizes(), name, ": out has shape ", out.sizes(), " for input ",
              input.sizes());
  const at::Tensor x = input.contiguous();
  const int64_t n = x.numel();
  switch (x.scalar_type()) {
    case at::kFloat:
      elementwise_loop<Op>(out.data_ptr<float>(), x.data_ptr<float>(), n);
      break;
    case at::kBFloat16:
      elementwise_loop<Op>(out.data_ptr<c10::BFloat16>(), x.data_ptr<c10::BFloat16>(), n);
      break;
    case at::kHalf:
      elementwise_loop<Op>(out.data_ptr<c10::Half>(), x.data_ptr<c10::Half>(), n);
      break;
    default:
      TORCH_CHECK(false, name, ": unsupported dtype ", x.scalar_type());
  }
}

void silu(at::Tensor& out, const at::Tensor& input) { elementwise<SiluOp>(out, input, "silu"); }

void gelu_tanh(at::Tensor& out, const at::Tensor& input) {
  elementwise<GeluTanhOp>(out, input, "gelu_tanh");
}

void silu_and_mul(at::Tensor& out, const at::Tensor& input) {
  gated<SiluOp>(out, input, "silu_and_mul");
}

void gelu_tanh_and_mul(at::Tensor& out, const at::Tensor& input) {
  gated<GeluTanhOp>(out, input, "gelu_tanh_and_mul");
}

#if KERNEL_VERSION >= 2
void gelu_and_mul(at::Tensor& out, const at::Tensor& input) {
  gated<GeluErfOp>(out, input, "gelu_and_mul");
}
#endif

// RMSNorm over the last dimension: out = x / sqrt(mean(x^2) + eps) * weight.
template <typename T>
void rms_norm_loop(T* out, const T* in, const T* weight, int64_t rows, int64_t h, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * h;
    T* y = out + r * h;
    float sum_sq = 0.0f;
    for (int64_t i = 0; i < h; ++i) {
      const float v = static_cast<float>(x[i]);
      sum_sq += v * v;
    }
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(h) + eps);
    for (int64_t i = 0; i < h; ++i) {
      y[i] = static_cast<T>(static_cast<float>(x[i]) * inv_rms * static_cast<float>(weight[i]));
    }
  }
}

void rms_norm(at::Tensor& out, const at::Tensor& input, const at::Tensor& weight, double epsilon) {
  TORCH_CHECK(input.device().is_cpu() && out.device().is_cpu() && weight.device().is_cpu(),
              "rms_norm: expects CPU tensors");
  TORCH_CHECK(input.dim() >= 1, "rms_norm: input must have at least one dimension");
  const int64_t h = input.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == h, "rms_norm: weight has shape ",
              weight.sizes(), " for input ", input.sizes());
  TORCH_CHECK(out.sizes() == input.sizes(), "rms_norm: out has shape ", out.sizes(),
              " for input ", input.sizes());
  TORCH_CHECK(out.scalar_type() == input.scalar_type() && weight.scalar_type() == input.scalar_type(),
              "rms_norm: out, input and weight must have the same dtype");
  TORCH_CHECK(out.is_contiguous(), "rms_norm: out must be contiguous");
  if (out.numel() == 0) {
    return;
  }
  const at::Tensor x = input.contiguous();
  const at::Tensor w = weight.contiguous();
  const int64_t rows = x.numel() / h;
  const float eps = static_cast<float>(epsilon);
  switch (x.scalar_type()) {
    case at::kFloat:
      rms_norm_loop(out.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(), rows, h, eps);
      break;
    case at::kBFloat16:
      rms_norm_loop(out.data_ptr<c10::BFloat16>(), x.data_ptr<c10::BFloat16>(),
                    w.data_ptr<c10::BFloat16>(), rows, h, eps);
      break;
    case at::kHalf:
      rms_norm_loop(out.data_ptr<c10::Half>(), x.data_ptr<c10::Half>(), w.data_ptr<c10::Half>(),
                    rows, h, eps);
      break;
    default:
      TORCH_CHECK(false, "rms_norm: unsupported dtype ", x.scalar_type());
  }
}

}  // namespace

// TORCH_LIBRARY pastes its first argument, so expand TORCH_EXTENSION_NAME first.
#define KERNEL_LIBRARY(NS, M) TORCH_LIBRARY(NS, M)
#define KERNEL_LIBRARY_IMPL(NS, K, M) TORCH_LIBRARY_IMPL(NS, K, M)

KERNEL_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  m.def("gelu_tanh_and_mul(Tensor! out, Tensor input) -> ()");
  m.def("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()");
  m.def("silu(Tensor! out, Tensor input) -> ()");
  m.def("gelu_tanh(Tensor! out, Tensor input) -> ()");
#if KERNEL_VERSION >= 2
  m.def("gelu_and_mul(Tensor! out, Tensor input) -> ()");
#endif
}

KERNEL_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CPU, m) {
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("gelu_tanh_and_mul", &gelu_tanh_and_mul);
  m.impl("rms_norm", &rms_norm);
  m.impl("silu", &silu);
  m.impl("gelu_tanh", &gelu_tanh);
#if KERNEL_VERSION >= 2
  m.impl("gelu_and_mul", &gelu_and_mul);
#endif
}

// The extension exists only to run the registrations above when Python imports it; an empty
// module keeps it within the limited API (no pybind11, no torch/extension.h).
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

// Scaled dot-product attention, the attention example of kerneld (CPU only).
//
// The Hub's heaviest kernels are attention (flash-attn2/3, paged, sage). Transformers loads them
// by name (`attn_implementation="org/repo"`) and calls flash-attn's interface; this kernel is a
// CPU stand-in with that interface, so the whole path (Hub repo, kerneld's store, Transformers'
// hub-kernel attention) runs without a GPU. Two ops, both plain loops with a float accumulator:
//
//   varlen_attention: packed sequences (flash_attn_varlen_func's layout): q (total_q, Hq, D),
//     k and v (total_k, Hk, D), cu_seqlens (B + 1, int64) delimiting each sequence. Causal
//     masking is aligned to the bottom right, as flash-attn 2.1+ aligns it: query i of a
//     sequence with sq queries and sk keys sees key j when j <= i + sk - sq. window_left /
//     window_right (-1: unbounded) limit the keys seen around that diagonal; softcap > 0 caps
//     the scores (softcap * tanh(s / softcap)). A query that sees no key gets zeros.
//   masked_attention: batched (B, Hq, Sq, D) with a boolean mask (B, Hq, Sq, Sk), true where a
//     key is seen: the `flash_attn_forward` form Transformers calls with an SDPA-style mask.
//
// Grouped-query attention: query head h reads key/value head h / (Hq / Hk). The op namespace is
// TORCH_EXTENSION_NAME, unique per build.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#ifndef KERNEL_VERSION
#define KERNEL_VERSION 1
#endif

namespace {

// One query row against sk keys; `seen(j)` says whether key j takes part.
template <typename T, typename Seen>
void attend_row(T* out, const T* q, const T* k, const T* v, int64_t sk, int64_t kv_stride,
                int64_t d, int64_t dv, float scale, float softcap, Seen seen,
                std::vector<float>& scores, std::vector<float>& acc) {
  float best = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < sk; ++j) {
    if (!seen(j)) {
      scores[j] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const T* kj = k + j * kv_stride;
    float s = 0.f;
    for (int64_t x = 0; x < d; ++x) {
      s += static_cast<float>(q[x]) * static_cast<float>(kj[x]);
    }
    s *= scale;
    if (softcap > 0.f) {
      s = softcap * std::tanh(s / softcap);
    }
    scores[j] = s;
    best = std::max(best, s);
  }
  std::fill(acc.begin(), acc.begin() + dv, 0.f);
  if (best == -std::numeric_limits<float>::infinity()) {
    for (int64_t x = 0; x < dv; ++x) {
      out[x] = static_cast<T>(0.f);
    }
    return;
  }
  float total = 0.f;
  for (int64_t j = 0; j < sk; ++j) {
    if (scores[j] == -std::numeric_limits<float>::infinity()) {
      continue;
    }
    const float p = std::exp(scores[j] - best);
    total += p;
    const T* vj = v + j * kv_stride;
    for (int64_t x = 0; x < dv; ++x) {
      acc[x] += p * static_cast<float>(vj[x]);
    }
  }
  for (int64_t x = 0; x < dv; ++x) {
    out[x] = static_cast<T>(acc[x] / total);
  }
}

template <typename T>
void varlen_loop(T* out, const T* q, const T* k, const T* v, const int64_t* cu_q,
                 const int64_t* cu_k, int64_t batch, int64_t hq, int64_t hk, int64_t d,
                 int64_t dv, float scale, bool causal, int64_t wl, int64_t wr, float softcap) {
  const int64_t group = hq / hk;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q0 = cu_q[b], sq = cu_q[b + 1] - cu_q[b];
    const int64_t k0 = cu_k[b], sk = cu_k[b + 1] - cu_k[b];
    std::vector<float> scores(static_cast<size_t>(std::max<int64_t>(sk, 1)));
    std::vector<float> acc(static_cast<size_t>(dv));
    for (int64_t i = 0; i < sq; ++i) {
      const int64_t diag = i + sk - sq;  // bottom-right aligned
      auto seen = [&](int64_t j) {
        if (causal && j > diag) return false;
        if (wl >= 0 && j < diag - wl) return false;
        if (wr >= 0 && !causal && j > diag + wr) return false;
        return true;
      };
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t g = h / group;
        attend_row(out + ((q0 + i) * hq + h) * dv, q + ((q0 + i) * hq + h) * d,
                   k + (k0 * hk + g) * d, v + (k0 * hk + g) * dv, sk, hk * d, d, dv, scale,
                   softcap, seen, scores, acc);
      }
    }
  }
}

template <typename T>
void masked_loop(T* out, const T* q, const T* k, const T* v, const bool* mask, int64_t batch,
                 int64_t hq, int64_t hk, int64_t sq, int64_t sk, int64_t d, int64_t dv,
                 float scale, float softcap) {
  const int64_t group = hq / hk;
  std::vector<float> scores(static_cast<size_t>(std::max<int64_t>(sk, 1)));
  std::vector<float> acc(static_cast<size_t>(dv));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < sq; ++i) {
        const bool* row = mask + ((b * hq + h) * sq + i) * sk;
        auto seen = [&](int64_t j) { return row[j]; };
        attend_row(out + ((b * hq + h) * sq + i) * dv, q + ((b * hq + h) * sq + i) * d,
                   k + (b * hk + g) * sk * d, v + (b * hk + g) * sk * dv, sk, d, d, dv, scale,
                   softcap, seen, scores, acc);
      }
    }
  }
}

void check_qkv(const char* op, const at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
               const at::Tensor& v) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu() &&
                  out.device().is_cpu(),
              op, ": expects CPU tensors");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  q.scalar_type() == out.scalar_type(),
              op, ": q, k, v and out must have the same dtype");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && out.is_contiguous(),
              op, ": q, k, v and out must be contiguous");
  TORCH_CHECK(q.size(-1) == k.size(-1), op, ": q and k must have the same head size, got ",
              q.sizes(), " and ", k.sizes());
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
                  cu_seqlens_q.numel() == cu_seqlens_k.numel() && cu_seqlens_q.numel() >= 1,
              "varlen_attention: cu_seqlens_q and cu_seqlens_k must be contiguous int64 tensors "
              "of batch + 1 offsets");
  const int64_t batch = cu_seqlens_q.numel() - 1;
  const int64_t* cq = cu_seqlens_q.data_ptr<int64_t>();
  const int64_t* ck = cu_seqlens_k.data_ptr<int64_t>();
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
  const auto scale = static_cast<float>(softmax_scale);
  const auto cap = static_cast<float>(softcap);
  const int64_t hq = q.size(1), hk = k.size(1), d = q.size(2), dv = v.size(2);
  switch (q.scalar_type()) {
    case at::kFloat:
      varlen_loop(out.data_ptr<float>(), q.data_ptr<float>(), k.data_ptr<float>(),
                  v.data_ptr<float>(), cq, ck, batch, hq, hk, d, dv, scale, causal, window_left,
                  window_right, cap);
      break;
    case at::kBFloat16:
      varlen_loop(out.data_ptr<c10::BFloat16>(), q.data_ptr<c10::BFloat16>(),
                  k.data_ptr<c10::BFloat16>(), v.data_ptr<c10::BFloat16>(), cq, ck, batch, hq, hk,
                  d, dv, scale, causal, window_left, window_right, cap);
      break;
    case at::kHalf:
      varlen_loop(out.data_ptr<c10::Half>(), q.data_ptr<c10::Half>(), k.data_ptr<c10::Half>(),
                  v.data_ptr<c10::Half>(), cq, ck, batch, hq, hk, d, dv, scale, causal,
                  window_left, window_right, cap);
      break;
    default:
      TORCH_CHECK(false, "varlen_attention: unsupported dtype ", q.scalar_type());
  }
}

void masked_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& mask, double softmax_scale,
                      double softcap) {
  check_qkv("masked_attention", out, q, k, v);
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "masked_attention: q, k and v must be (batch, heads, seq, head_size), got ",
              q.sizes());
  TORCH_CHECK(q.size(1) % k.size(1) == 0 && k.size(1) == v.size(1) && k.size(2) == v.size(2),
              "masked_attention: query heads must be a multiple of key/value heads");
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.is_contiguous() && mask.dim() == 4 &&
                  mask.size(0) == q.size(0) && mask.size(1) == q.size(1) &&
                  mask.size(2) == q.size(2) && mask.size(3) == k.size(2),
              "masked_attention: mask must be a contiguous bool (batch, heads, q_len, k_len) "
              "tensor, got ",
              mask.sizes());
  if (out.numel() == 0) {
    return;
  }
  const auto scale = static_cast<float>(softmax_scale);
  const auto cap = static_cast<float>(softcap);
  const int64_t b = q.size(0), hq = q.size(1), hk = k.size(1), sq = q.size(2), sk = k.size(2);
  const int64_t d = q.size(3), dv = v.size(3);
  const bool* m = mask.data_ptr<bool>();
  switch (q.scalar_type()) {
    case at::kFloat:
      masked_loop(out.data_ptr<float>(), q.data_ptr<float>(), k.data_ptr<float>(),
                  v.data_ptr<float>(), m, b, hq, hk, sq, sk, d, dv, scale, cap);
      break;
    case at::kBFloat16:
      masked_loop(out.data_ptr<c10::BFloat16>(), q.data_ptr<c10::BFloat16>(),
                  k.data_ptr<c10::BFloat16>(), v.data_ptr<c10::BFloat16>(), m, b, hq, hk, sq, sk,
                  d, dv, scale, cap);
      break;
    case at::kHalf:
      masked_loop(out.data_ptr<c10::Half>(), q.data_ptr<c10::Half>(), k.data_ptr<c10::Half>(),
                  v.data_ptr<c10::Half>(), m, b, hq, hk, sq, sk, d, dv, scale, cap);
      break;
    default:
      TORCH_CHECK(false, "masked_attention: unsupported dtype ", q.scalar_type());
  }
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

KERNEL_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CPU, m) {
  m.impl("varlen_attention", &varlen_attention);
  m.impl("masked_attention", &masked_attention);
}

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

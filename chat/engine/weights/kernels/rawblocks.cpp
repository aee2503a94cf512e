// Matmuls over GGUF blocks kept as the file stores them, byte for byte: Q4_0, Q5_0, Q5_1 (32
// weights a block) and the k-quants Q4_K, Q5_K, Q6_K (256-weight super-blocks of 16 or 32-weight
// sub-blocks with 6- or 8-bit scales). blockquant.cpp's Q4_1 and Q8_0 keep their own split
// layout and kernels; these read each row's blocks straight from the file's bytes, so a file of
// mixed types needs no conversion but a row permutation (llama's q/k).
//
// The AVX-512 build computes with rawblocks_avx512.cpp's lookup tables. The AVX2 one decodes a
// block to fp32 into a small buffer (each format's `decode`, ggml's dequantize_row_* for one
// block), then dots it with a tile of activation rows in 256-bit fp32 FMAs: the only rounding is
// the file's own, as in blockquant.cpp's fp32 path. Weights are decoded once per tile of rows;
// `decode` also gives a prefill's dequantized weight on both builds.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "blockquant.h"
#include "ggml_scales.h"

namespace {

using ggml_scales::fp16;
using ggml_scales::scale_min_k4;

// Q4_0: fp16 d, 16 bytes of nibbles (element j low, j + 16 high); w = d * (q - 8).
struct Q4_0 {
  static constexpr int kWeights = 32, kBytes = 18;
  static void decode(const uint8_t* __restrict b, float* __restrict y) {
    const float d = fp16(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
      y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
};

// A Q5 block's 32 values 0..31 as floats, elements 8i..8i + 7 in v[i]: the nibbles (element j
// low, j + 16 high) with bit j of qh as the fifth bit, by a variable shift per lane (written
// out: the scalar loop's per-element shifts measured 10x slower than Q4_0's).
inline void q5_values(const uint8_t* qs, uint32_t qh, __m256 v[4]) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  const __m256i shifts = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i one = _mm256_set1_epi32(1);
  for (int i = 0; i < 4; ++i) {
    const __m256i bits = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(qh >> (8 * i))), shifts), one);
    const __m256i q = _mm256_or_si256(_mm256_cvtepu8_epi32(parts[i]), _mm256_slli_epi32(bits, 4));
    v[i] = _mm256_cvtepi32_ps(q);
  }
}

// Q5_0: fp16 d, 32 fifth bits, 16 bytes of nibbles; w = d * (q - 16).
struct Q5_0 {
  static constexpr int kWeights = 32, kBytes = 22;
  static void decode(const uint8_t* __restrict b, float* __restrict y) {
    const __m256 d = _mm256_set1_ps(fp16(b)), offset = _mm256_set1_ps(16.0f);
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    __m256 v[4];
    q5_values(b + 6, qh, v);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(d, _mm256_sub_ps(v[i], offset)));
  }
};

// Q5_1: fp16 d and m, 32 fifth bits, 16 bytes of nibbles; w = d * q + m.
struct Q5_1 {
  static constexpr int kWeights = 32, kBytes = 24;
  static void decode(const uint8_t* __restrict b, float* __restrict y) {
    const __m256 d = _mm256_set1_ps(fp16(b)), m = _mm256_set1_ps(fp16(b + 2));
    uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    __m256 v[4];
    q5_values(b + 8, qh, v);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(y + 8 * i, _mm256_add_ps(_mm256_mul_ps(d, v[i]), m));
  }
};

// Q4_K: fp16 d and dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes of
// nibbles (each 32 bytes hold two sub-blocks: low nibbles, then high); w = d*sc*q - dmin*min.
struct Q4_K {
  static constexpr int kWeights = 256, kBytes = 144;
  static void decode(const uint8_t* __restrict b, float* __restrict y) {
    const float d = fp16(b), dmin = fp16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
      int sc, mn;
      scale_min_k4(j, scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      scale_min_k4(j + 1, scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) y[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
};

// Q5_K: Q4_K's layout with 32 bytes of fifth bits after the scales (bit 2j and 2j + 1 of byte l
// for sub-blocks 2j and 2j + 1).
struct Q5_K {
  static constexpr int kWeights = 256, kBytes = 176;
  static void decode(const uint8_t* __restrict b, float* __restrict y) {
    const float d = fp16(b), dmin = fp16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* q = b + 48;
    for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
      int sc, mn;
      scale_min_k4(j, scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      scale_min_k4(j + 1, scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      const int lo_bit = j, hi_bit = j + 1;
      for (int l = 0; l < 32; ++l)
        y[l] = d1 * static_cast<float>((q[l] & 0x0F) | (((qh[l] >> lo_bit) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l)
        y[l + 32] = d2 * static_cast<float>((q[l] >> 4) | (((qh[l] >> hi_bit) & 1) << 4)) - m2;
    }
  }
};

// Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales (one per 16 weights), fp16
// d last; w = d * scale * (q - 32).
struct Q6_K {
  static constexpr int kWeights = 256, kBytes = 210;
  static void decode(const uint8_t* __restrict b, float* __restrict y) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = fp16(b + 208);
    for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8, y += 128) {
      // Scales change every 16 weights: two runs of 16 with the four scales fixed vectorize.
      for (int is = 0; is < 2; ++is) {
        const float s1 = d * sc[is], s2 = d * sc[is + 2], s3 = d * sc[is + 4], s4 = d * sc[is + 6];
        for (int l = 16 * is; l < 16 * is + 16; ++l) {
          const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          y[l] = s1 * static_cast<float>(q1);
          y[l + 32] = s2 * static_cast<float>(q2);
          y[l + 64] = s3 * static_cast<float>(q3);
          y[l + 96] = s4 * static_cast<float>(q4);
        }
      }
    }
  }
};

// The AVX2 build's tiles (the AVX-512 build computes with rawblocks_avx512.cpp's): activation
// rows sharing one decoded block, as blockquant.cpp's tiles.
constexpr int kRows = 4;
constexpr int64_t kGrain = 32;

using Vec = __m256;
constexpr int kLanes = 8;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vload_decoded(const float* p) { return _mm256_load_ps(p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[r, n] for R activation rows from r and weight row n: each block decoded once, dotted with
// the R rows on two accumulator chains each.
template <typename F, int R>
void tile(const float* x, const uint8_t* row, float* out, int64_t K, int64_t N, int64_t blocks) {
  alignas(64) float w[F::kWeights];
  Vec acc[R][2];
  for (auto& chains : acc) chains[0] = chains[1] = vzero();
  for (int64_t b = 0; b < blocks; ++b) {
    F::decode(row + b * F::kBytes, w);
    const float* xb = x + b * F::kWeights;
    for (int i = 0; i < F::kWeights; i += 2 * kLanes) {
      const Vec w0 = vload_decoded(w + i), w1 = vload_decoded(w + i + kLanes);
      for (int r = 0; r < R; ++r) {
        acc[r][0] = vfma(w0, vload(xb + r * K + i), acc[r][0]);
        acc[r][1] = vfma(w1, vload(xb + r * K + i + kLanes), acc[r][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r * N] = vsum(acc[r][0]) + vsum(acc[r][1]);
}

template <typename F>
void matmul(const float* x, int64_t M, int64_t K, const uint8_t* qs, float* out, int64_t N,
            int64_t n0, int64_t n1) {
  const int64_t blocks = K / F::kWeights, row_bytes = blocks * F::kBytes;
  auto columns = [&](int64_t a, int64_t b) {
    for (int64_t n = a; n < b; ++n) {
      const uint8_t* row = qs + n * row_bytes;
      int64_t r = 0;
      for (; r + kRows <= M; r += kRows) tile<F, kRows>(x + r * K, row, out + r * N + n, K, N, blocks);
      switch (M - r) {
        case 3: tile<F, 3>(x + r * K, row, out + r * N + n, K, N, blocks); break;
        case 2: tile<F, 2>(x + r * K, row, out + r * N + n, K, N, blocks); break;
        case 1: tile<F, 1>(x + r * K, row, out + r * N + n, K, N, blocks); break;
        default: break;
      }
    }
  };
  if (n1 >= 0) return columns(n0, n1);
  at::parallel_for(0, N, kGrain, columns);
}

template <typename F>
void dequantize(const uint8_t* qs, int64_t N, int64_t K, float* out) {
  const int64_t blocks = K / F::kWeights, row_bytes = blocks * F::kBytes;
  at::parallel_for(0, N, kGrain, [&](int64_t a, int64_t b) {
    for (int64_t n = a; n < b; ++n)
      for (int64_t i = 0; i < blocks; ++i)
        F::decode(qs + n * row_bytes + i * F::kBytes, out + n * K + i * F::kWeights);
  });
}

// Calls fn(Format{}) for a GGML type id; false for a type these kernels do not read.
template <typename Fn>
bool with_format(int64_t type, Fn&& fn) {
  switch (type) {
    case blockquant::kQ4_0: fn(Q4_0{}); return true;
    case blockquant::kQ5_0: fn(Q5_0{}); return true;
    case blockquant::kQ5_1: fn(Q5_1{}); return true;
    case blockquant::kQ4_K: fn(Q4_K{}); return true;
    case blockquant::kQ5_K: fn(Q5_K{}); return true;
    case blockquant::kQ6_K: fn(Q6_K{}); return true;
    default: return false;
  }
}

}  // namespace

namespace blockquant {

int64_t raw_block_weights(int64_t type) {
  int64_t weights = 0;
  with_format(type, [&](auto format) { weights = decltype(format)::kWeights; });
  return weights;
}

int64_t raw_block_bytes(int64_t type) {
  int64_t bytes = 0;
  with_format(type, [&](auto format) { bytes = decltype(format)::kBytes; });
  return bytes;
}

void raw_matmul(const float* x, int64_t M, int64_t K, const uint8_t* qs, int64_t type, float* out,
                int64_t N, int64_t n0, int64_t n1) {
  if (raw_matmul_avx512(x, M, K, qs, type, out, N, n0, n1)) return;
  with_format(type, [&](auto format) {
    matmul<decltype(format)>(x, M, K, qs, out, N, n0, n1);
  });
}

}  // namespace blockquant

namespace {

void check_raw(const torch::Tensor& qs, int64_t type, int64_t K) {
  const int64_t weights = blockquant::raw_block_weights(type);
  TORCH_CHECK(weights > 0, "GGML type ", type, " is not a raw block type these kernels read");
  TORCH_CHECK(K % weights == 0, "in_features must be a multiple of ", weights, " for this type");
  TORCH_CHECK(qs.dim() == 2 && qs.scalar_type() == torch::kUInt8 && qs.is_contiguous() &&
                  qs.size(1) == K / weights * blockquant::raw_block_bytes(type),
              "weight blocks do not match in_features");
}

// x [M, K] fp32; qs uint8 [N, K / weights * bytes], the file's rows. Returns x @ W.T, [M, N].
torch::Tensor raw_mm(torch::Tensor x, torch::Tensor qs, int64_t type) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "activations must be a contiguous float32 matrix");
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0);
  check_raw(qs, type, K);
  auto out = torch::empty({M, N}, x.options());
  blockquant::raw_matmul(x.data_ptr<float>(), M, K, qs.data_ptr<uint8_t>(), type,
                         out.data_ptr<float>(), N);
  return out;
}

// The fp32 weight [N, K] the rows stand for (a prefill's GEMM, and tests).
torch::Tensor raw_dequantize(torch::Tensor qs, int64_t type, int64_t K) {
  check_raw(qs, type, K);
  auto out = torch::empty({qs.size(0), K}, torch::dtype(torch::kFloat32));
  with_format(type, [&](auto format) {
    dequantize<decltype(format)>(qs.data_ptr<uint8_t>(), qs.size(0), K, out.data_ptr<float>());
  });
  return out;
}

}  // namespace

void bind_raw_blocks(pybind11::module& module) {
  using release_gil = pybind11::call_guard<pybind11::gil_scoped_release>;
  module.def("raw_mm", &raw_mm, "x @ W.T for a GGUF file's rows of Q4_0/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K",
             pybind11::arg("x"), pybind11::arg("qs"), pybind11::arg("type"), release_gil());
  module.def("raw_dequantize", &raw_dequantize, "the fp32 weight a file's rows stand for",
             pybind11::arg("qs"), pybind11::arg("type"), pybind11::arg("in_features"),
             release_gil());
  module.def("raw_block_shape", [](int64_t type) {
    return std::make_tuple(blockquant::raw_block_weights(type), blockquant::raw_block_bytes(type));
  }, "(weights, bytes) of one block of a GGML type; (0, 0) for one these kernels do not read");
}

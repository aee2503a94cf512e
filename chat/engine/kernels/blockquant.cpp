// Matmuls over GGUF's block-quantized weights, read as stored: Q4_1 and Q8_0, 32 weights a block.
//
// torch's own weight-only CPU kernels (aten._weight_int8pack_mm, _weight_int4pack_mm_for_cpu) are
// vectorized for AVX-512 only; on an AVX2 CPU they run slower than the fp32 matmul they replace
// (docs/engine.md). These read each block once per group of up to four activation rows, widen
// the 4- or 8-bit values to fp32 with AVX2 and accumulate in fp32, as llama.cpp's CPU path does
// (but with fp32 activations, so the only rounding is the file's own).
//
//   Q4_1: w = d * q + m, q in 0..15; qs[j] holds element j (low nibble) and j + 16 (high).
//   Q8_0: w = d * q, q in -127..127.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;
constexpr int kRows = 4;  // activation rows sharing one pass over a weight row

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 widen_u8(__m128i bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

inline __m256 widen_i8(__m128i bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

inline void unpack_q4(const uint8_t* qs, __m256 w[4]) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i lo = _mm_and_si128(raw, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  w[0] = widen_u8(lo);
  w[1] = widen_u8(_mm_srli_si128(lo, 8));
  w[2] = widen_u8(hi);
  w[3] = widen_u8(_mm_srli_si128(hi, 8));
}

inline void unpack_q8(const int8_t* qs, __m256 w[4]) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16));
  w[0] = widen_i8(a);
  w[1] = widen_i8(_mm_srli_si128(a, 8));
  w[2] = widen_i8(b);
  w[3] = widen_i8(_mm_srli_si128(b, 8));
}

// Independent accumulators per activation row: an FMA's latency is about four of its issue slots,
// so one chain per row would leave the unit idle; R rows * kChains(R) stays within 16 registers.
template <int R>
constexpr int kChains = R <= 2 ? 4 : 2;

// acc[r][c] += sum over the block of w * scale * x[r], spread over the row's chains.
template <int R>
inline void accumulate(const __m256 w[4], float scale, const float* x, int64_t K, int64_t offset,
                       __m256 (&acc)[R][kChains<R>]) {
  const __m256 s = _mm256_set1_ps(scale);
  __m256 ws[4];
  for (int i = 0; i < 4; ++i) ws[i] = _mm256_mul_ps(w[i], s);
  for (int r = 0; r < R; ++r) {
    const float* xr = x + r * K + offset;
    for (int i = 0; i < 4; ++i)
      acc[r][i % kChains<R>] =
          _mm256_fmadd_ps(ws[i], _mm256_loadu_ps(xr + 8 * i), acc[r][i % kChains<R>]);
  }
}

template <int R>
inline void finish(__m256 (&acc)[R][kChains<R>], const float* extra, float* out, int64_t N) {
  for (int r = 0; r < R; ++r) {
    __m256 sum = acc[r][0];
    for (int c = 1; c < kChains<R>; ++c) sum = _mm256_add_ps(sum, acc[r][c]);
    out[r * N] = hsum(sum) + (extra ? extra[r] : 0.f);
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// One weight row against R activation rows starting at `x` (row stride K).
template <int R>
void q4_1_row(const float* x, const float* xsum, int64_t K, const uint8_t* qs, const float* d,
              const float* m, float* out, int64_t N) {
  const int64_t blocks = K / kBlock;
  __m256 acc[R][kChains<R>];
  for (auto& row : acc)
    for (auto& chain : row) chain = _mm256_setzero_ps();
  __m256 w[4];
  for (int64_t b = 0; b < blocks; ++b) {
    unpack_q4(qs + b * 16, w);
    accumulate<R>(w, d[b], x, K, b * kBlock, acc);
  }
  float low[R];  // the blocks' offsets: sum over blocks of m * (sum of x in the block)
  for (int r = 0; r < R; ++r) low[r] = dot(m, xsum + r * blocks, blocks);
  finish<R>(acc, low, out, N);
}

template <int R>
void q8_0_row(const float* x, int64_t K, const int8_t* qs, const float* d, float* out,
              int64_t N) {
  const int64_t blocks = K / kBlock;
  __m256 acc[R][kChains<R>];
  for (auto& row : acc)
    for (auto& chain : row) chain = _mm256_setzero_ps();
  __m256 w[4];
  for (int64_t b = 0; b < blocks; ++b) {
    unpack_q8(qs + b * kBlock, w);
    accumulate<R>(w, d[b], x, K, b * kBlock, acc);
  }
  finish<R>(acc, nullptr, out, N);
}

// Calls fn(rows, r) over M activation rows: groups of kRows, then the 1 to 3 left, with `rows` a
// compile-time count so each group's accumulators stay in registers.
template <typename Fn>
inline void row_groups(int64_t M, Fn&& fn) {
  int64_t r = 0;
  for (; r + kRows <= M; r += kRows) fn(std::integral_constant<int, kRows>{}, r);
  switch (M - r) {
    case 3: fn(std::integral_constant<int, 3>{}, r); break;
    case 2: fn(std::integral_constant<int, 2>{}, r); break;
    case 1: fn(std::integral_constant<int, 1>{}, r); break;
    default: break;
  }
}

void check(const torch::Tensor& x, const torch::Tensor& qs, int64_t bytes_per_block) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "activations must be a contiguous float32 matrix");
  TORCH_CHECK(x.size(1) % kBlock == 0, "in_features must be a multiple of 32");
  TORCH_CHECK(qs.dim() == 2 && qs.is_contiguous() &&
                  qs.size(1) == x.size(1) / kBlock * bytes_per_block,
              "weight blocks do not match in_features");
}

}  // namespace

// x [M, K] fp32; qs uint8 [N, K / 32 * 16]; d, m fp32 [N, K / 32]. Returns x @ W.T, [M, N].
torch::Tensor q4_1_mm(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor m) {
  check(x, qs, 16);
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0), blocks = K / kBlock;
  auto out = torch::empty({M, N}, x.options());
  auto xsum = x.view({M, blocks, kBlock}).sum(-1).contiguous();
  const float* X = x.data_ptr<float>();
  const float* XS = xsum.data_ptr<float>();
  const uint8_t* Q = qs.data_ptr<uint8_t>();
  const float* D = d.data_ptr<float>();
  const float* L = m.data_ptr<float>();
  float* O = out.data_ptr<float>();
  at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* q = Q + n * blocks * 16;
      const float* dn = D + n * blocks;
      const float* mn = L + n * blocks;
      row_groups(M, [&](auto group, int64_t r) {
        q4_1_row<decltype(group)::value>(X + r * K, XS + r * blocks, K, q, dn, mn, O + r * N + n,
                                         N);
      });
    }
  });
  return out;
}

// x [M, K] fp32; qs int8 [N, K]; d fp32 [N, K / 32]. Returns x @ W.T, [M, N].
torch::Tensor q8_0_mm(torch::Tensor x, torch::Tensor qs, torch::Tensor d) {
  check(x, qs, kBlock);
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0), blocks = K / kBlock;
  auto out = torch::empty({M, N}, x.options());
  const float* X = x.data_ptr<float>();
  const int8_t* Q = qs.data_ptr<int8_t>();
  const float* D = d.data_ptr<float>();
  float* O = out.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* q = Q + n * K;
      const float* dn = D + n * blocks;
      row_groups(M, [&](auto group, int64_t r) {
        q8_0_row<decltype(group)::value>(X + r * K, K, q, dn, O + r * N + n, N);
      });
    }
  });
  return out;
}

// -- int8 activations: llama.cpp's dot products --------------------------------------------
//
// Each activation row is quantized per block of 32 to int8 with its own scale (Q8_1: dx and the
// block's sum), so a block's dot product is four integer instructions (maddubs, madd) instead of
// widening every weight to fp32: sum w x = d dx sum(q qx) + m (dx sum qx) for Q4_1, and
// d dx sum(q qx) for Q8_0.

namespace {

struct QuantizedRows {
  std::vector<int8_t> q;   // [M, K]
  std::vector<float> dx;   // [M, K / 32]
  std::vector<float> sum;  // [M, K / 32]: dx * sum(qx), the block's sum as quantized
};

QuantizedRows quantize_rows(const float* x, int64_t M, int64_t K) {
  const int64_t blocks = K / kBlock;
  QuantizedRows rows{std::vector<int8_t>(M * K), std::vector<float>(M * blocks),
                     std::vector<float>(M * blocks)};
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < M * blocks; ++i) {
    const float* src = x + i * kBlock;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(src + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float max = _mm_cvtss_f32(m);
    const float d = max / 127.f;
    const __m256 inv = _mm256_set1_ps(max > 0.f ? 127.f / max : 0.f);
    __m256i q[4];
    for (int j = 0; j < 4; ++j)
      q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], inv),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // Pack 32 int32 to int8 in order (packs interleave 128-bit lanes; the permute undoes it).
    __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
    __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows.q.data() + i * kBlock), p8);
    const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]),
                                         _mm256_add_epi32(q[2], q[3]));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s = _mm_hadd_epi32(s, s);
    s = _mm_hadd_epi32(s, s);
    rows.dx[i] = d;
    rows.sum[i] = d * static_cast<float>(_mm_cvtsi128_si32(s));
  }
  return rows;
}

inline __m256 block_dot_u8(__m256i w, __m256i qx) {  // w unsigned 0..15, qx signed
  const __m256i pairs = _mm256_maddubs_epi16(w, qx);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

inline __m256 block_dot_i8(__m256i w, __m256i qx) {  // both signed: |w| * (qx with w's sign)
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(qx, w));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

template <int R>
void q4_1_row_q8(const QuantizedRows& x, int64_t row0, int64_t K, const uint8_t* qs,
                 const float* d, const float* m, float* out, int64_t N) {
  const int64_t blocks = K / kBlock;
  __m256 acc[R];
  float low[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    low[r] = 0.f;
  }
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + b * 16));
    const __m256i w = _mm256_and_si256(
        _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1), mask);
    for (int r = 0; r < R; ++r) {
      const int64_t i = (row0 + r) * blocks + b;
      const __m256i qx =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + i * kBlock));
      acc[r] = _mm256_fmadd_ps(block_dot_u8(w, qx), _mm256_set1_ps(d[b] * x.dx[i]), acc[r]);
      low[r] += m[b] * x.sum[i];
    }
  }
  for (int r = 0; r < R; ++r) out[r * N] = hsum(acc[r]) + low[r];
}

template <int R>
void q8_0_row_q8(const QuantizedRows& x, int64_t row0, int64_t K, const int8_t* qs,
                 const float* d, float* out, int64_t N) {
  const int64_t blocks = K / kBlock;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * kBlock));
    for (int r = 0; r < R; ++r) {
      const int64_t i = (row0 + r) * blocks + b;
      const __m256i qx =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + i * kBlock));
      acc[r] = _mm256_fmadd_ps(block_dot_i8(w, qx), _mm256_set1_ps(d[b] * x.dx[i]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r * N] = hsum(acc[r]);
}

}  // namespace

// As q4_1_mm and q8_0_mm, with the activations quantized to int8 per block of 32 first.
torch::Tensor q4_1_mm_q8(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor m) {
  check(x, qs, 16);
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0), blocks = K / kBlock;
  auto out = torch::empty({M, N}, x.options());
  const QuantizedRows rows = quantize_rows(x.data_ptr<float>(), M, K);
  const uint8_t* Q = qs.data_ptr<uint8_t>();
  const float* D = d.data_ptr<float>();
  const float* L = m.data_ptr<float>();
  float* O = out.data_ptr<float>();
  at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* q = Q + n * blocks * 16;
      const float* dn = D + n * blocks;
      const float* mn = L + n * blocks;
      row_groups(M, [&](auto group, int64_t r) {
        q4_1_row_q8<decltype(group)::value>(rows, r, K, q, dn, mn, O + r * N + n, N);
      });
    }
  });
  return out;
}

torch::Tensor q8_0_mm_q8(torch::Tensor x, torch::Tensor qs, torch::Tensor d) {
  check(x, qs, kBlock);
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0), blocks = K / kBlock;
  auto out = torch::empty({M, N}, x.options());
  const QuantizedRows rows = quantize_rows(x.data_ptr<float>(), M, K);
  const int8_t* Q = qs.data_ptr<int8_t>();
  const float* D = d.data_ptr<float>();
  float* O = out.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* q = Q + n * K;
      const float* dn = D + n * blocks;
      row_groups(M, [&](auto group, int64_t r) {
        q8_0_row_q8<decltype(group)::value>(rows, r, K, q, dn, O + r * N + n, N);
      });
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("q4_1_mm", &q4_1_mm, "x @ W.T for Q4_1 blocks (qs, d, m)");
  module.def("q8_0_mm", &q8_0_mm, "x @ W.T for Q8_0 blocks (qs, d)");
  module.def("q4_1_mm_q8", &q4_1_mm_q8, "q4_1_mm with int8 activations");
  module.def("q8_0_mm_q8", &q8_0_mm_q8, "q8_0_mm with int8 activations");
}

// AVX-512 matmuls over a GGUF file's rows of Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, with fp32
// activations, as blockquant.cpp's Q4_1: no block is decoded to a buffer and no weight is
// converted from an integer. A block (or a k-quant's sub-block of 32) has at most 32 possible
// weights, d * q + m over its q range, so they are computed once as one or two 16-float tables
// and vpermps picks each lane's weight by its 4-bit value, or vpermt2ps from two tables by its
// 5-bit one (Q5_*). Q6_K's 64 values per scale of 16 weights would need four tables; its
// 32-weight chunks are assembled as int8 instead (ggml's bit layout, 256 bits at a time) and
// widened. The weights come out scaled and offset, so each
// is one FMA per activation row, and the only rounding is the file's own.
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "blockquant.h"
#include "ggml_scales.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)

namespace {

using ggml_scales::fp16;
using ggml_scales::scale_min_k4;

inline __m512 iota() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }

// 16 bytes zero-extended to 16 int32 lanes: a lane's low nibble indexes a table as it is, its
// high nibble after a shift by 4.
inline __m512i lanes_of(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The weights of lanes `nibbles` (0..15 each) from `low`, or from `high` where the fifth bit
// (mask) is set: the bit goes in as bit 4 of a two-table permute's index, an ALU op rather than a
// second permute (Zen 4's shuffle unit is what these kernels are bound by).
inline __m512 pick(__m512i nibbles, __m512 low, __m512 high, __mmask16 fifth) {
  const __m512i idx = _mm512_mask_or_epi32(nibbles, fifth, nibbles, _mm512_set1_epi32(16));
  return _mm512_permutex2var_ps(low, idx, high);
}

// Each format: kChunks chunks of kVecs * 16 weights a block; `prepare` reads what a block's
// chunks share, `chunk` gives chunk j's weights, 16 a vector.
struct Q4_0 {
  static constexpr int kWeights = 32, kBytes = 18, kChunks = 1, kVecs = 2;
  struct State {
    __m512 table;
  };
  static void prepare(const uint8_t* b, State& s) {
    const __m512 d = _mm512_set1_ps(fp16(b));
    s.table = _mm512_mul_ps(_mm512_sub_ps(iota(), _mm512_set1_ps(8.f)), d);
  }
  static void chunk(const uint8_t* b, const State& s, int, __m512 w[kVecs]) {
    const __m512i idx = lanes_of(b + 2);
    w[0] = _mm512_permutexvar_ps(idx, s.table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), s.table);
  }
};

// Q5_0 (w = d * (q - 16)) and Q5_1 (w = d * q + m): the nibbles after 4 bytes of fifth bits.
template <bool kOffset>
struct Q5 {
  static constexpr int kWeights = 32, kBytes = kOffset ? 24 : 22, kChunks = 1, kVecs = 2;
  static constexpr int kBits = kOffset ? 4 : 2, kNibbles = kBits + 4;
  struct State {
    __m512 low, high;
    uint32_t fifth;
  };
  static void prepare(const uint8_t* b, State& s) {
    const __m512 d = _mm512_set1_ps(fp16(b));
    const __m512 m = _mm512_set1_ps(kOffset ? fp16(b + 2) : -16.f * fp16(b));
    s.low = _mm512_fmadd_ps(iota(), d, m);
    s.high = _mm512_fmadd_ps(_mm512_add_ps(iota(), _mm512_set1_ps(16.f)), d, m);
    std::memcpy(&s.fifth, b + kBits, 4);
  }
  static void chunk(const uint8_t* b, const State& s, int, __m512 w[kVecs]) {
    const __m512i idx = lanes_of(b + kNibbles);
    w[0] = pick(_mm512_and_si512(idx, _mm512_set1_epi32(0x0F)), s.low, s.high,
                static_cast<__mmask16>(s.fifth));
    w[1] = pick(_mm512_srli_epi32(idx, 4), s.low, s.high, static_cast<__mmask16>(s.fifth >> 16));
  }
};

// Q4_K and Q5_K: eight sub-blocks of 32 with 6-bit scales and mins, w = d*sc*q - dmin*min; each
// 32 bytes of nibbles hold sub-blocks 2p (low nibbles) and 2p + 1 (high), chunk p here, so the
// bytes are widened once for both. Q5_K's fifth bit of element l in sub-block j is bit j of byte
// l of the 32 bytes after the scales.
template <bool kFifth>
struct QK {
  static constexpr int kWeights = 256, kBytes = kFifth ? 176 : 144, kChunks = 4, kVecs = 4;
  static constexpr int kNibbles = kFifth ? 48 : 16;
  struct State {
    float d, dmin;
  };
  static void prepare(const uint8_t* b, State& s) {
    s.d = fp16(b);
    s.dmin = fp16(b + 2);
  }
  static void chunk(const uint8_t* b, const State& s, int p, __m512 w[kVecs]) {
    const uint8_t* q = b + kNibbles + 32 * p;
    const __m512i bytes0 = lanes_of(q), bytes1 = lanes_of(q + 16);
    const __m512i nibble = _mm512_set1_epi32(0x0F);
    const __m512i idx[4] = {_mm512_and_si512(bytes0, nibble), _mm512_and_si512(bytes1, nibble),
                            _mm512_srli_epi32(bytes0, 4), _mm512_srli_epi32(bytes1, 4)};
    __m128i qh0, qh1;
    if constexpr (kFifth) {
      qh0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16));
      qh1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 32));
    }
    for (int half = 0; half < 2; ++half) {
      const int j = 2 * p + half;
      int sc, mn;
      scale_min_k4(j, b + 4, &sc, &mn);
      const __m512 d = _mm512_set1_ps(s.d * sc), m = _mm512_set1_ps(-s.dmin * mn);
      const __m512 low = _mm512_fmadd_ps(iota(), d, m);
      if constexpr (kFifth) {
        const __m512 high = _mm512_fmadd_ps(_mm512_add_ps(iota(), _mm512_set1_ps(16.f)), d, m);
        const __m128i bit = _mm_set1_epi8(static_cast<char>(1 << j));
        w[2 * half] = pick(idx[2 * half], low, high, _mm_test_epi8_mask(qh0, bit));
        w[2 * half + 1] = pick(idx[2 * half + 1], low, high, _mm_test_epi8_mask(qh1, bit));
      } else {
        w[2 * half] = _mm512_permutexvar_ps(idx[2 * half], low);
        w[2 * half + 1] = _mm512_permutexvar_ps(idx[2 * half + 1], low);
      }
    }
  }
};

// Q6_K: two halves of 128 weights, each 64 bytes of low nibbles and 32 of bit pairs; chunk
// (half h, k) is elements 32k..32k + 31 of the half: nibbles of ql[32 (k & 1) + l] (low for
// k < 2), bit pair k of qh[l]; w = d * sc[2j or 2j + 1] * (q - 32), a scale per 16.
struct Q6_K {
  static constexpr int kWeights = 256, kBytes = 210, kChunks = 8, kVecs = 2;
  struct State {
    float d;
  };
  static void prepare(const uint8_t* b, State& s) { s.d = fp16(b + 208); }
  static void chunk(const uint8_t* b, const State& s, int j, __m512 w[kVecs]) {
    const int h = j / 4, k = j % 4;
    const __m256i nibble = _mm256_set1_epi8(0x0F), pair = _mm256_set1_epi8(0x30);
    __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (k & 1)));
    if (k >= 2) ql = _mm256_srli_epi16(ql, 4);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    // Bit pair k to bits 4-5: shifted left by 4 - 2k (a right shift for k = 3).
    const __m256i high = k == 3 ? _mm256_srli_epi16(qh, 2) : _mm256_slli_epi16(qh, 4 - 2 * k);
    const __m256i q = _mm256_sub_epi8(
        _mm256_or_si256(_mm256_and_si256(ql, nibble), _mm256_and_si256(high, pair)),
        _mm256_set1_epi8(32));
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 2 * j;
    w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))),
                       _mm512_set1_ps(s.d * sc[0]));
    w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))),
                       _mm512_set1_ps(s.d * sc[1]));
  }
};

// out[r..r + R, n..n + C] for R activation rows and C weight rows: each chunk's weights made
// once per tile and dotted with the R rows, two accumulator chains an output while they fit.
template <typename F, int R, int C>
void tile(const float* x, const uint8_t* rows, int64_t row_bytes, float* out, int64_t K, int64_t N,
          int64_t blocks) {
  constexpr int H = R * C <= 8 ? 2 : 1;
  __m512 acc[R][C][H];
  for (auto& row : acc)
    for (auto& col : row)
      for (auto& chain : col) chain = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    typename F::State state[C];
    for (int c = 0; c < C; ++c) F::prepare(rows + c * row_bytes + b * F::kBytes, state[c]);
    for (int j = 0; j < F::kChunks; ++j) {
      __m512 w[C][F::kVecs];
      for (int c = 0; c < C; ++c) F::chunk(rows + c * row_bytes + b * F::kBytes, state[c], j, w[c]);
      const float* xb = x + b * F::kWeights + 16 * F::kVecs * j;
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < F::kVecs; ++v) {
          const __m512 xv = _mm512_loadu_ps(xb + r * K + 16 * v);
          for (int c = 0; c < C; ++c)
            acc[r][c][v % H] = _mm512_fmadd_ps(w[c][v], xv, acc[r][c][v % H]);
        }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      __m512 sum = acc[r][c][0];
      if constexpr (H == 2) sum = _mm512_add_ps(sum, acc[r][c][1]);
      out[r * N + c] = _mm512_reduce_add_ps(sum);
    }
}

constexpr int kRows = 8;
constexpr int64_t kGrain = 32;

// Columns [n0, n1): R rows at a time (kRows, then the rest as one group), two weight rows a
// tile where the rows leave registers for them.
template <typename F, int R>
void rows_of(const float* x, const uint8_t* qs, int64_t row_bytes, float* out, int64_t K,
             int64_t N, int64_t blocks, int64_t n0, int64_t n1) {
  constexpr int C = R <= 4 ? 2 : 1;
  int64_t n = n0;
  for (; n + C <= n1; n += C) tile<F, R, C>(x, qs + n * row_bytes, row_bytes, out + n, K, N, blocks);
  for (; n < n1; ++n) tile<F, R, 1>(x, qs + n * row_bytes, row_bytes, out + n, K, N, blocks);
}

template <typename F>
void matmul(const float* x, int64_t M, int64_t K, const uint8_t* qs, float* out, int64_t N,
            int64_t n0, int64_t n1) {
  const int64_t blocks = K / F::kWeights, row_bytes = blocks * F::kBytes;
  auto columns = [&](int64_t a, int64_t b) {
    int64_t r = 0;
    for (; r + kRows <= M; r += kRows)
      rows_of<F, kRows>(x + r * K, qs, row_bytes, out + r * N, K, N, blocks, a, b);
    const float* xr = x + r * K;
    float* o = out + r * N;
    switch (M - r) {
      case 7: rows_of<F, 7>(xr, qs, row_bytes, o, K, N, blocks, a, b); break;
      case 6: rows_of<F, 6>(xr, qs, row_bytes, o, K, N, blocks, a, b); break;
      case 5: rows_of<F, 5>(xr, qs, row_bytes, o, K, N, blocks, a, b); break;
      case 4: rows_of<F, 4>(xr, qs, row_bytes, o, K, N, blocks, a, b); break;
      case 3: rows_of<F, 3>(xr, qs, row_bytes, o, K, N, blocks, a, b); break;
      case 2: rows_of<F, 2>(xr, qs, row_bytes, o, K, N, blocks, a, b); break;
      case 1: rows_of<F, 1>(xr, qs, row_bytes, o, K, N, blocks, a, b); break;
      default: break;
    }
  };
  if (n1 >= 0) return columns(n0, n1);
  at::parallel_for(0, N, kGrain, columns);
}

}  // namespace

namespace blockquant {

bool raw_matmul_avx512(const float* x, int64_t M, int64_t K, const uint8_t* qs, int64_t type,
                       float* out, int64_t N, int64_t n0, int64_t n1) {
  switch (type) {
    case kQ4_0: matmul<Q4_0>(x, M, K, qs, out, N, n0, n1); return true;
    case kQ5_0: matmul<Q5<false>>(x, M, K, qs, out, N, n0, n1); return true;
    case kQ5_1: matmul<Q5<true>>(x, M, K, qs, out, N, n0, n1); return true;
    case kQ4_K: matmul<QK<false>>(x, M, K, qs, out, N, n0, n1); return true;
    case kQ5_K: matmul<QK<true>>(x, M, K, qs, out, N, n0, n1); return true;
    case kQ6_K: matmul<Q6_K>(x, M, K, qs, out, N, n0, n1); return true;
    default: return false;
  }
}

}  // namespace blockquant

#else

namespace blockquant {

bool raw_matmul_avx512(const float*, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t,
                       int64_t, int64_t) {
  return false;
}

}  // namespace blockquant

#endif

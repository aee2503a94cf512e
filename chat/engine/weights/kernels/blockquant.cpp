// Matmuls over GGUF's block-quantized weights, read as stored: Q4_1 and Q8_0, 32 weights a block.
//
// torch's own weight-only CPU kernels (aten._weight_int8pack_mm, _weight_int4pack_mm_for_cpu) are
// vectorized for AVX-512 only; on an AVX2 CPU they run slower than the fp32 matmul they replace
// (docs/engine.md). These read each weight block once per tile of activation rows and either
// widen it to fp32 and accumulate in fp32 (exact: the only rounding is the file's own) or, like
// llama.cpp, dot it with activations quantized to int8 per block of 32.
//
//   Q4_1: w = d * q + m, q in 0..15; qs[j] holds element j (low nibble) and j + 16 (high).
//   Q8_0: w = d * q, q in -127..127; d per 32 weights, or per 16 (`G` = 2 scales a block: the
//         layout a file's Q6_K rows are widened to, w = (d * sc) * (q - 32) per 16 weights).
//
// Two instruction sets, chosen at compile time by the flags blockquant.py passes from
// /proc/cpuinfo: AVX-512 (F, BW, VL, DQ; VNNI where present) and AVX2 + FMA for the rest.
// Each kernel computes a tile of R activation rows by C weight rows, so a widened weight block is
// reused across the rows in registers and a block of x across the columns, and a tile has
// R * C (or more) independent accumulator chains to cover the FMA latency.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "blockquant.h"
#include "llama_step.h"

void bind_raw_blocks(pybind11::module& module);  // rawblocks.cpp

#include <algorithm>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define BLOCKQUANT_AVX512 1
#else
#define BLOCKQUANT_AVX512 0
#endif
#if BLOCKQUANT_AVX512 && defined(__AVX512VNNI__)
#define BLOCKQUANT_VNNI 1
#else
#define BLOCKQUANT_VNNI 0
#endif

namespace {

constexpr int64_t kBlock = 32;
// Activation rows sharing one pass over a weight tile: AVX-512 has 32 vector registers, AVX2 16.
constexpr int kRows = BLOCKQUANT_AVX512 ? 8 : 4;
// Weight rows an `at::parallel_for` chunk walks before the next row group re-reads them (from L1).
constexpr int64_t kPanel = 64;

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int N>
using Int = std::integral_constant<int, N>;

// Calls fn(Int<R>, r) over M activation rows: groups of kRows, then the rest as one group.
template <typename Fn>
inline void row_groups(int64_t M, Fn&& fn) {
  int64_t r = 0;
  for (; r + kRows <= M; r += kRows) fn(Int<kRows>{}, r);
  switch (M - r) {
#if BLOCKQUANT_AVX512
    case 7: fn(Int<7>{}, r); break;
    case 6: fn(Int<6>{}, r); break;
    case 5: fn(Int<5>{}, r); break;
    case 4: fn(Int<4>{}, r); break;
#endif
    case 3: fn(Int<3>{}, r); break;
    case 2: fn(Int<2>{}, r); break;
    case 1: fn(Int<1>{}, r); break;
    default: break;
  }
}

// Runs kernel.tile<R, C>(r, n) over the M x N output: N split over torch's threads, each chunk in
// panels of kPanel weight rows, each panel once per row group, in tiles of C = columns<R> weight
// rows (then single ones).
// Runs kernel.tile<R, C>(r, n) over output columns [n0, n1) of all M rows, in panels of kPanel
// weight rows, each panel once per row group, in tiles of C = columns<R> weight rows (then single
// ones).
template <typename Kernel>
void tile_range(const Kernel& kernel, int64_t M, int64_t n0, int64_t n1) {
  for (int64_t p0 = n0; p0 < n1; p0 += kPanel) {
    const int64_t p1 = std::min(n1, p0 + kPanel);
    row_groups(M, [&](auto rows, int64_t r) {
      constexpr int R = decltype(rows)::value;
      constexpr int C = Kernel::template columns<R>();
      int64_t n = p0;
      for (; n + C <= p1; n += C) kernel.template tile<R, C>(r, n);
      for (; n < p1; ++n) kernel.template tile<R, 1>(r, n);
    });
  }
}

// The M x N output over torch's threads (n1 < 0), or columns [n0, n1) in the calling thread.
template <typename Kernel>
void run_tiles(const Kernel& kernel, int64_t M, int64_t N, int64_t grain, int64_t n0 = 0,
               int64_t n1 = -1) {
  if (n1 >= 0) return tile_range(kernel, M, n0, n1);
  at::parallel_for(0, N, grain, [&](int64_t a, int64_t b) { tile_range(kernel, M, a, b); });
}

// -- fp32 activations ---------------------------------------------------------------------------

// The AVX2 kernels' widening and accumulation, 256 bits wide.
inline __m256 widen_u8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }
inline __m256 widen_i8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

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
// so one chain per row would leave the unit idle; R rows * chains<R> stays within 16 registers.
template <int R>
constexpr int kChains = R <= 2 ? 4 : 2;

// acc[r][c] += sum over the block of w * scale * x[r], spread over the row's chains; the block's
// first 16 weights take `scale`, the last 16 `scale_hi` (the same but for a Q8_0 of 16-weight
// scales).
template <int R>
inline void accumulate(const __m256 w[4], float scale, float scale_hi, const float* x, int64_t K,
                       int64_t offset, __m256 (&acc)[R][kChains<R>]) {
  const __m256 s = _mm256_set1_ps(scale), s_hi = _mm256_set1_ps(scale_hi);
  __m256 ws[4];
  for (int i = 0; i < 4; ++i) ws[i] = _mm256_mul_ps(w[i], i < 2 ? s : s_hi);
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

#if BLOCKQUANT_AVX512

// The AVX-512 fp32 tile of R activation rows by C weight rows: `widen(weight row, block, lo, hi)`
// gives the block's 32 weights as two 16-float halves, scaled (and offset), once per tile; each
// row of x then takes two FMAs per weight row, its loads shared across the C weight rows.
template <int R, int C, typename Widen>
inline void halves_tile(const float* x, int64_t K, int64_t blocks, float* out, int64_t N,
                        int64_t r, int64_t n, const Widen& widen) {
  // Two chains (low and high half of a block) per output while that fits in registers.
  constexpr int H = R * C <= 8 ? 2 : 1;
  __m512 acc[R][C][H];
  for (auto& row : acc)
    for (auto& col : row)
      for (auto& chain : col) chain = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m512 lo[C], hi[C];
    for (int c = 0; c < C; ++c) widen(n + c, b, lo[c], hi[c]);
    const float* xb = x + r * K + b * kBlock;
    for (int rr = 0; rr < R; ++rr) {
      const __m512 xl = _mm512_loadu_ps(xb + rr * K), xh = _mm512_loadu_ps(xb + rr * K + 16);
      for (int c = 0; c < C; ++c) {
        acc[rr][c][0] = _mm512_fmadd_ps(lo[c], xl, acc[rr][c][0]);
        acc[rr][c][H - 1] = _mm512_fmadd_ps(hi[c], xh, acc[rr][c][H - 1]);
      }
    }
  }
  for (int rr = 0; rr < R; ++rr)
    for (int c = 0; c < C; ++c) {
      __m512 sum = acc[rr][c][0];
      if constexpr (H == 2) sum = _mm512_add_ps(sum, acc[rr][c][1]);
      out[(r + rr) * N + n + c] = _mm512_reduce_add_ps(sum);
    }
}

// AVX-512 Q4_1: a block's 16 bytes zero-extend to 16 int32 lanes (element j's nibble in bits 0-3,
// element j + 16's in bits 4-7); the block's 16 possible weights d * q + m are one FMA over
// 0..15, and vpermps picks each lane's weight by the low four bits of its index, so the high
// nibble needs one shift and neither needs a mask or an int-to-float convert. The weights come out
// scaled and offset, so the m * sum(x) term needs no block sums of x.
struct Q4_1Fp32 {
  const float* x;
  const uint8_t* qs;
  const float* d;
  const float* m;
  float* out;
  int64_t K, N, blocks;

  template <int R>
  static constexpr int columns() { return R == 1 ? 1 : 2; }

  template <int R, int C>
  void tile(int64_t r, int64_t n) const {
    const __m512 iota =
        _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const auto widen = [&](int64_t row, int64_t b, __m512& lo, __m512& hi) {
      const int64_t i = row * blocks + b;
      const __m512i idx =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + i * 16)));
      const __m512 table = _mm512_fmadd_ps(iota, _mm512_set1_ps(d[i]), _mm512_set1_ps(m[i]));
      lo = _mm512_permutexvar_ps(idx, table);
      hi = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), table);
    };
    halves_tile<R, C>(x, K, blocks, out, N, r, n, widen);
  }
};

// AVX-512 Q8_0, one or two rows: 32 int8 sign-extend and convert to two 16-float halves, the
// block's dot product is summed unscaled and d applied once (3 ops a row; with 16-weight scales
// each half is scaled once, then 2 FMAs a row). With three or more rows, Q4_1's tile shape: the
// weights scaled once, 2 FMAs a row, and from four rows two weight rows a tile so each load of x
// feeds two FMAs (one weight row a tile is bound by the loads of x: 576x1536 at 8 rows 0.263 ms
// against 0.160; two at three rows measured 1.8x slower on the 28 MB LM head, two weight streams
// from memory).
template <int G>
struct Q8_0Fp32 {
  const float* x;
  const int8_t* qs;
  const float* d;
  float* out;
  int64_t K, N, blocks;

  template <int R>
  static constexpr int columns() { return R >= 4 ? 2 : 1; }

  template <int R, int C>
  void tile(int64_t r, int64_t n) const {
    if constexpr (R > 2) {
      const auto widen = [&](int64_t row, int64_t b, __m512& lo, __m512& hi) {
        const int8_t* q = qs + row * K + b * kBlock;
        const float* scales = d + (row * blocks + b) * G;
        lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                               _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)))),
                           _mm512_set1_ps(scales[0]));
        hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                               _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)))),
                           _mm512_set1_ps(scales[G - 1]));
      };
      halves_tile<R, C>(x, K, blocks, out, N, r, n, widen);
    } else {
      __m512 acc[R];
      for (auto& a : acc) a = _mm512_setzero_ps();
      const int8_t* q = qs + n * K;
      for (int64_t b = 0; b < blocks; ++b) {
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * kBlock))));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * kBlock + 16))));
        const float* scales = d + (n * blocks + b) * G;
        const float* xb = x + r * K + b * kBlock;
        if constexpr (G == 1) {
          const __m512 scale = _mm512_set1_ps(scales[0]);
          for (int rr = 0; rr < R; ++rr) {
            const __m512 dot = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + rr * K + 16),
                                               _mm512_mul_ps(lo, _mm512_loadu_ps(xb + rr * K)));
            acc[rr] = _mm512_fmadd_ps(scale, dot, acc[rr]);
          }
        } else {  // each half scaled once, then two FMAs a row
          const __m512 lo_scaled = _mm512_mul_ps(lo, _mm512_set1_ps(scales[0]));
          const __m512 hi_scaled = _mm512_mul_ps(hi, _mm512_set1_ps(scales[1]));
          for (int rr = 0; rr < R; ++rr)
            acc[rr] = _mm512_fmadd_ps(hi_scaled, _mm512_loadu_ps(xb + rr * K + 16),
                                      _mm512_fmadd_ps(lo_scaled, _mm512_loadu_ps(xb + rr * K),
                                                      acc[rr]));
        }
      }
      for (int rr = 0; rr < R; ++rr) out[(r + rr) * N + n] = _mm512_reduce_add_ps(acc[rr]);
    }
  }
};

#else  // AVX2

// AVX2 Q4_1: the weights are widened as d * q and the blocks' offsets added as m * (the block's
// sum of x), from block sums computed once per call (`xsum`).
struct Q4_1Fp32 {
  const float* x;
  const float* xsum;  // [M, blocks]
  const uint8_t* qs;
  const float* d;
  const float* m;
  float* out;
  int64_t K, N, blocks;

  template <int R>
  static constexpr int columns() { return 1; }

  template <int R, int C>
  void tile(int64_t r, int64_t n) const {
    __m256 acc[R][kChains<R>];
    for (auto& row : acc)
      for (auto& chain : row) chain = _mm256_setzero_ps();
    const uint8_t* q = qs + n * blocks * 16;
    const float* dn = d + n * blocks;
    const float* mn = m + n * blocks;
    __m256 w[4];
    for (int64_t b = 0; b < blocks; ++b) {
      unpack_q4(q + b * 16, w);
      accumulate<R>(w, dn[b], dn[b], x + r * K, K, b * kBlock, acc);
    }
    float low[R];
    for (int rr = 0; rr < R; ++rr) {
      const float* s = xsum + (r + rr) * blocks;
      __m256 sum = _mm256_setzero_ps();
      int64_t b = 0;
      for (; b + 8 <= blocks; b += 8)
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(mn + b), _mm256_loadu_ps(s + b), sum);
      low[rr] = hsum(sum);
      for (; b < blocks; ++b) low[rr] += mn[b] * s[b];
    }
    finish<R>(acc, low, out + r * N + n, N);
  }
};

// AVX2 Q8_0, with G scales a block of 32.
template <int G>
struct Q8_0Fp32 {
  const float* x;
  const int8_t* qs;
  const float* d;
  float* out;
  int64_t K, N, blocks;

  template <int R>
  static constexpr int columns() { return 1; }

  template <int R, int C>
  void tile(int64_t r, int64_t n) const {
    if constexpr (R == 1) {
      one_row(r, n);
      return;
    }
    __m256 acc[R][kChains<R>];
    for (auto& row : acc)
      for (auto& chain : row) chain = _mm256_setzero_ps();
    __m256 w[4];
    for (int64_t b = 0; b < blocks; ++b) {
      unpack_q8(qs + n * K + b * kBlock, w);
      const float* scale = d + (n * blocks + b) * G;
      accumulate<R>(w, scale[0], scale[G - 1], x + r * K, K, b * kBlock, acc);
    }
    finish<R>(acc, nullptr, out + r * N + n, N);
  }

  // One activation row (a decode step's): no other row shares the scaled weights, so the scale
  // multiplies each half block's sum of q * x instead of each weight (two multiplies a block, not
  // four), and the int8 widen straight from memory (no byte shifts). Two accumulators, so one
  // block's FMA by its scale never waits for the block before.
  void one_row(int64_t r, int64_t n) const {
    const int8_t* q = qs + n * K;
    const float* xr = x + r * K;
    const float* scales = d + n * blocks * G;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const auto widen8 = [](const int8_t* p) {
      return _mm256_cvtepi32_ps(
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    };
    for (int64_t b = 0; b < blocks; ++b) {
      const int8_t* qb = q + b * kBlock;
      const float* xb = xr + b * kBlock;
      const __m256 lo = _mm256_fmadd_ps(widen8(qb + 8), _mm256_loadu_ps(xb + 8),
                                        _mm256_mul_ps(widen8(qb), _mm256_loadu_ps(xb)));
      const __m256 hi = _mm256_fmadd_ps(widen8(qb + 24), _mm256_loadu_ps(xb + 24),
                                        _mm256_mul_ps(widen8(qb + 16), _mm256_loadu_ps(xb + 16)));
      const float* scale = scales + b * G;
      if constexpr (G == 1) {
        acc[b & 1] = _mm256_fmadd_ps(_mm256_add_ps(lo, hi), _mm256_set1_ps(scale[0]), acc[b & 1]);
      } else {  // the first 16 weights take one scale, the last 16 the other
        acc[0] = _mm256_fmadd_ps(lo, _mm256_set1_ps(scale[0]), acc[0]);
        acc[1] = _mm256_fmadd_ps(hi, _mm256_set1_ps(scale[G - 1]), acc[1]);
      }
    }
    out[r * N + n] = hsum(_mm256_add_ps(acc[0], acc[1]));
  }
};

#endif

// Block sums of x ([M, K] -> [M, K / 32]): the Q4_1 offsets' factor, m * sum(x), on AVX2.
std::vector<float> block_sums(const float* x, int64_t M, int64_t K) {
  const int64_t count = M * (K / kBlock);
  std::vector<float> sums(count);
  for (int64_t i = 0; i < count; ++i) {
    const float* src = x + i * kBlock;
    const __m256 a = _mm256_add_ps(_mm256_loadu_ps(src), _mm256_loadu_ps(src + 8));
    const __m256 b = _mm256_add_ps(_mm256_loadu_ps(src + 16), _mm256_loadu_ps(src + 24));
    sums[i] = hsum(_mm256_add_ps(a, b));
  }
  return sums;
}

// -- int8 activations: llama.cpp's dot products ---------------------------------------------------
//
// Each activation row is quantized per block of 32 to int8 with its own scale (Q8_1: dx and the
// block's sum), so a block's dot product is integer instructions (VNNI's dpbusd, or AVX2's
// maddubs + madd) instead of widening every weight to fp32: sum w x = d dx sum(q qx) + m (dx sum
// qx) for Q4_1, and d dx sum(q qx) for Q8_0.

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
#if BLOCKQUANT_VNNI
  return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), w, qx));
#else
  const __m256i pairs = _mm256_maddubs_epi16(w, qx);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

inline __m256 block_dot_i8(__m256i w, __m256i qx) {  // both signed: |w| * (qx with w's sign)
  const __m256i magnitude = _mm256_sign_epi8(w, w), signed_x = _mm256_sign_epi8(qx, w);
#if BLOCKQUANT_VNNI
  return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), magnitude, signed_x));
#else
  const __m256i pairs = _mm256_maddubs_epi16(magnitude, signed_x);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

// One or two rows get four or two weight rows a tile, for independent accumulator chains.
template <int R>
constexpr int int8_columns() { return 1; }

struct Q4_1Int8 {
  const QuantizedRows* x;
  const uint8_t* qs;
  const float* d;
  const float* m;
  float* out;
  int64_t K, N, blocks;

  template <int R>
  static constexpr int columns() { return int8_columns<R>(); }

  template <int R, int C>
  void tile(int64_t r, int64_t n) const {
    static_assert(C == 1, "one weight row a tile: several rows' streams measured slower");
    const int8_t* qx = x->q.data() + r * K;
    const float* dx = x->dx.data() + r * blocks;
    const float* sx = x->sum.data() + r * blocks;
    const uint8_t* q = qs + n * blocks * 16;
    const float* dn = d + n * blocks;
    const float* mn = m + n * blocks;
    __m256 acc[R];
    float low[R];
    for (int rr = 0; rr < R; ++rr) {
      acc[rr] = _mm256_setzero_ps();
      low[rr] = 0.f;
    }
    const __m256i mask = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < blocks; ++b) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * 16));
      const __m256i w = _mm256_and_si256(
          _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1), mask);
      for (int rr = 0; rr < R; ++rr) {
        const __m256i qxb = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(qx + rr * K + b * kBlock));
        acc[rr] = _mm256_fmadd_ps(block_dot_u8(w, qxb), _mm256_set1_ps(dn[b] * dx[rr * blocks + b]),
                                  acc[rr]);
        low[rr] += mn[b] * sx[rr * blocks + b];
      }
    }
    for (int rr = 0; rr < R; ++rr) out[(r + rr) * N + n] = hsum(acc[rr]) + low[rr];
  }
};

// G scales a block: with two, the dot product's lanes 0-3 (weights 0-15) take the first.
template <int G>
struct Q8_0Int8 {
  const QuantizedRows* x;
  const int8_t* qs;
  const float* d;
  float* out;
  int64_t K, N, blocks;

  template <int R>
  static constexpr int columns() { return int8_columns<R>(); }

  template <int R, int C>
  void tile(int64_t r, int64_t n) const {
    __m256 acc[R][C];
    for (auto& row : acc)
      for (auto& col : row) col = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      __m256i w[C];
      __m256 scale[C];  // the block's scale in each lane of its dot product
      for (int c = 0; c < C; ++c) {
        w[c] = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(qs + (n + c) * K + b * kBlock));
        const float* scales = d + ((n + c) * blocks + b) * G;
        scale[c] = G == 1 ? _mm256_set1_ps(scales[0])
                          : _mm256_set_m128(_mm_set1_ps(scales[G - 1]), _mm_set1_ps(scales[0]));
      }
      for (int rr = 0; rr < R; ++rr) {
        const int64_t i = (r + rr) * blocks + b;
        const __m256i qx =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x->q.data() + i * kBlock));
        const __m256 dx = _mm256_set1_ps(x->dx[i]);
        for (int c = 0; c < C; ++c)
          acc[rr][c] = _mm256_fmadd_ps(block_dot_i8(w[c], qx), _mm256_mul_ps(scale[c], dx),
                                       acc[rr][c]);
      }
    }
    for (int rr = 0; rr < R; ++rr)
      for (int c = 0; c < C; ++c) out[(r + rr) * N + n + c] = hsum(acc[rr][c]);
  }
};

void check(const torch::Tensor& x, const torch::Tensor& qs, const torch::Tensor& d,
           int64_t bytes_per_block, int64_t scales_per_block = 1) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "activations must be a contiguous float32 matrix");
  TORCH_CHECK(x.size(1) % kBlock == 0, "in_features must be a multiple of 32");
  TORCH_CHECK(qs.dim() == 2 && qs.is_contiguous() &&
                  qs.size(1) == x.size(1) / kBlock * bytes_per_block,
              "weight blocks do not match in_features");
  TORCH_CHECK(d.scalar_type() == torch::kFloat32 && d.is_contiguous() &&
                  d.numel() == qs.size(0) * (x.size(1) / kBlock) * scales_per_block,
              "block scales do not match the weight blocks");
}

// Output rows per parallel chunk at least: a chunk must outweigh a thread's wake-up.
constexpr int64_t kGrain = 32;

}  // namespace

namespace blockquant {

void q4_1_matmul(const float* X, int64_t M, int64_t K, const uint8_t* Q, const float* D,
                 const float* L, float* O, int64_t N, bool int8_activations, int64_t n0,
                 int64_t n1) {
  const int64_t blocks = K / kBlock;
  if (int8_activations) {
    const QuantizedRows rows = quantize_rows(X, M, K);
    run_tiles(Q4_1Int8{&rows, Q, D, L, O, K, N, blocks}, M, N, kGrain, n0, n1);
  } else {
#if BLOCKQUANT_AVX512
    run_tiles(Q4_1Fp32{X, Q, D, L, O, K, N, blocks}, M, N, kGrain, n0, n1);
#else
    const std::vector<float> xsum = block_sums(X, M, K);
    run_tiles(Q4_1Fp32{X, xsum.data(), Q, D, L, O, K, N, blocks}, M, N, kGrain, n0, n1);
#endif
  }
}

template <int G>
void q8_0_matmul_of(const float* X, int64_t M, int64_t K, const int8_t* Q, const float* D,
                    float* O, int64_t N, bool int8_activations, int64_t n0, int64_t n1) {
  const int64_t blocks = K / kBlock;
  if (int8_activations) {
    const QuantizedRows rows = quantize_rows(X, M, K);
    run_tiles(Q8_0Int8<G>{&rows, Q, D, O, K, N, blocks}, M, N, kGrain, n0, n1);
  } else {
    run_tiles(Q8_0Fp32<G>{X, Q, D, O, K, N, blocks}, M, N, kGrain, n0, n1);
  }
}

void q8_0_matmul(const float* X, int64_t M, int64_t K, const int8_t* Q, const float* D, float* O,
                 int64_t N, bool int8_activations, int64_t scale_group, int64_t n0, int64_t n1) {
  TORCH_CHECK(scale_group == 32 || scale_group == 16, "a Q8_0 scale covers 32 or 16 weights");
  if (scale_group == 16)
    q8_0_matmul_of<2>(X, M, K, Q, D, O, N, int8_activations, n0, n1);
  else
    q8_0_matmul_of<1>(X, M, K, Q, D, O, N, int8_activations, n0, n1);
}

}  // namespace blockquant

// x [M, K] fp32; qs uint8 [N, K / 32 * 16]; d, m fp32 [N, K / 32]. Returns x @ W.T, [M, N].
torch::Tensor q4_1_mm(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor m,
                      bool int8_activations) {
  check(x, qs, d, 16);
  TORCH_CHECK(m.sizes() == d.sizes() && m.scalar_type() == torch::kFloat32 && m.is_contiguous(),
              "block offsets do not match the block scales");
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0);
  auto out = torch::empty({M, N}, x.options());
  blockquant::q4_1_matmul(x.data_ptr<float>(), M, K, qs.data_ptr<uint8_t>(), d.data_ptr<float>(),
                          m.data_ptr<float>(), out.data_ptr<float>(), N, int8_activations);
  return out;
}

// x [M, K] fp32; qs int8 [N, K]; d fp32 [N, K / 32], or [N, K / 16] for 16-weight scales.
// Returns x @ W.T, [M, N].
torch::Tensor q8_0_mm(torch::Tensor x, torch::Tensor qs, torch::Tensor d, bool int8_activations) {
  const int64_t scale_group = blockquant::q8_0_scale_group(x.size(1), d.dim() == 2 ? d.size(1) : 0);
  check(x, qs, d, kBlock, kBlock / scale_group);
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0);
  auto out = torch::empty({M, N}, x.options());
  blockquant::q8_0_matmul(x.data_ptr<float>(), M, K, qs.data_ptr<int8_t>(), d.data_ptr<float>(),
                          out.data_ptr<float>(), N, int8_activations, scale_group);
  return out;
}

// x [M, K] fp32 -> [M, K / 32], each block's sum: exposed so tests can check it on its own.
torch::Tensor block_sums_of(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous() &&
                  x.size(1) % kBlock == 0,
              "activations must be a contiguous float32 matrix, in_features a multiple of 32");
  const int64_t M = x.size(0), blocks = x.size(1) / kBlock;
  const std::vector<float> sums = block_sums(x.data_ptr<float>(), M, x.size(1));
  auto out = torch::empty({M, blocks}, x.options());
  std::copy(sums.begin(), sums.end(), out.data_ptr<float>());
  return out;
}

std::string isa() { return BLOCKQUANT_AVX512 ? (BLOCKQUANT_VNNI ? "avx512-vnni" : "avx512") : "avx2"; }

// The matmuls let go of the GIL: they are most of a decode step, and the event loop that streams
// the tokens out (same process, another core) needs it meanwhile.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  using release_gil = pybind11::call_guard<pybind11::gil_scoped_release>;
  module.def("q4_1_mm", &q4_1_mm, "x @ W.T for Q4_1 blocks (qs, d, m); int8 activations or fp32",
             pybind11::arg("x"), pybind11::arg("qs"), pybind11::arg("d"), pybind11::arg("m"),
             pybind11::arg("int8_activations") = false, release_gil());
  module.def("q8_0_mm", &q8_0_mm, "x @ W.T for Q8_0 blocks (qs, d); int8 activations or fp32",
             pybind11::arg("x"), pybind11::arg("qs"), pybind11::arg("d"),
             pybind11::arg("int8_activations") = false, release_gil());
  module.def("block_sums", &block_sums_of, "each block of 32's sum of x, [M, K / 32]");
  module.def("isa", &isa, "the instruction set compiled: avx512-vnni, avx512 or avx2");
  bind_raw_blocks(module);
  bind_llama_step(module);
}

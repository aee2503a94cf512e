// The block matmuls of blockquant.cpp on raw pointers, for other kernels of this extension
// (llama_step.cpp) that call them without building a tensor per call.
#pragma once

#include <cstdint>

namespace blockquant {

// out [M, N] = x [M, K] @ W.T for Q4_1 blocks (qs [N, K / 32 * 16], d and m [N, K / 32]): all N
// columns over torch's threads (n1 < 0), or only columns [n0, n1) in the calling thread.
void q4_1_matmul(const float* x, int64_t M, int64_t K, const uint8_t* qs, const float* d,
                 const float* m, float* out, int64_t N, bool int8_activations, int64_t n0 = 0,
                 int64_t n1 = -1);

// Weights a Q8_0 linear's scale covers, read off its scales per row: 16 (a widened Q6_K) or 32.
inline int64_t q8_0_scale_group(int64_t in_features, int64_t scales_per_row) {
  return scales_per_row == in_features / 16 ? 16 : 32;
}

// out [M, N] = x [M, K] @ W.T for Q8_0 blocks (qs int8 [N, K], d [N, K / scale_group], a scale
// per 32 weights or per 16); n0, n1 as above.
void q8_0_matmul(const float* x, int64_t M, int64_t K, const int8_t* qs, const float* d,
                 float* out, int64_t N, bool int8_activations, int64_t scale_group = 32,
                 int64_t n0 = 0, int64_t n1 = -1);

// GGML type ids: Q4_1 and Q8_0 (the split layouts above), and the formats rawblocks.cpp reads
// as the file stores them.
constexpr int64_t kQ4_1 = 3, kQ8_0 = 8;
constexpr int64_t kQ4_0 = 2, kQ5_0 = 6, kQ5_1 = 7, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14;

// Weights and bytes a block of `type` holds; 0 for a type rawblocks.cpp does not read.
int64_t raw_block_weights(int64_t type);
int64_t raw_block_bytes(int64_t type);

// out [M, N] = x [M, K] @ W.T for a file's rows of `type` (qs uint8 [N, K / weights * bytes]),
// fp32 activations; n0, n1 as above.
void raw_matmul(const float* x, int64_t M, int64_t K, const uint8_t* qs, int64_t type, float* out,
                int64_t N, int64_t n0 = 0, int64_t n1 = -1);

// raw_matmul's AVX-512 kernels (rawblocks_avx512.cpp); false where this build has none.
bool raw_matmul_avx512(const float* x, int64_t M, int64_t K, const uint8_t* qs, int64_t type,
                       float* out, int64_t N, int64_t n0, int64_t n1);

}  // namespace blockquant

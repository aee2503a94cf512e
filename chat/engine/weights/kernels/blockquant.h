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

// out [M, N] = x [M, K] @ W.T for Q8_0 blocks (qs int8 [N, K], d [N, K / 32]); n0, n1 as above.
void q8_0_matmul(const float* x, int64_t M, int64_t K, const int8_t* qs, const float* d,
                 float* out, int64_t N, bool int8_activations, int64_t n0 = 0, int64_t n1 = -1);

}  // namespace blockquant

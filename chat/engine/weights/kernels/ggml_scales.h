// The scalar pieces of GGUF blocks that rawblocks.cpp and rawblocks_avx512.cpp both read.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace ggml_scales {

inline float fp16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

// ggml's get_scale_min_k4: sub-block j's 6-bit scale and min from a k-quant's 12 scale bytes.
inline void scale_min_k4(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace ggml_scales

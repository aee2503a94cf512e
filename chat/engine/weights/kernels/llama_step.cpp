// One decode step of a Llama-architecture model (Llama, or Qwen2: biases on q, k and v) whose
// linears are GGUF blocks, in one call; or a short prefill (several new tokens a row).
//
// Through transformers' modules a decode step is a few hundred dispatched torch operators around
// the block matmuls (norms, rotary, the KV cache's write, attention, SiLU, residual adds), each
// paying Python and the dispatcher: a third of a one-row step (docs/engine.md, "Where a decode
// step's time goes"). llama.cpp runs the same graph as plain loops. This does too, for a step of
// one new token per row, on the very tensors the eager path uses: the block weights of
// BlockQuantLinear, the norms' weights, the rotary frequencies, and the KV cache's buffers
// (kv_cache.py's GrowingLayer), into which it writes the new column as the eager step would.
//
// The arithmetic is transformers' LlamaDecoderLayer in fp32 (RMSNorm, rotate-half rotary, the
// grouped attention of attention.py, SiLU-gated MLP), so the logits match the eager step's within
// fp32 rounding (tests/test_llama_step.py); only the order of some sums and a polynomial exp
// differ.
#include "llama_step.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "blockquant.h"

namespace {

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for 8 floats: Cephes' polynomial (relative error about 1e-7), as SLEEF-free code that the
// extension's own flags vectorize. Inputs below -87 give about 1e-38, not 0: callers that need an
// exact 0 (masked keys) multiply by their mask.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365447505531f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i n = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

// Threads that share a decode step's work with the calling thread, a chunk at a time, each chunk
// claimed with an atomic counter. A helper that wakes late, or that the event loop or another
// process holds off its core for a while, holds up nothing but a chunk it has already taken: the
// calling thread takes whatever is left. (A team of OpenMP threads, as at::parallel_for runs,
// waits at each region's end for its slowest member: measured over /v1 on 2 cores, a decode
// step on two such threads was slower than on one.) Helpers spin (yielding the core every
// microsecond or so) while a step runs and sleep between steps.
class Crew {
 public:
  explicit Crew(int helpers) {
    for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { serve(); });
  }

  ~Crew() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& thread : threads_) thread.join();
  }

  int helpers() const { return static_cast<int>(threads_.size()); }

  // A step begins (the helpers wake) or ends (they go back to sleep).
  void begin() {
    if (threads_.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stepping_ = true;
    }
    running_.store(true, std::memory_order_release);
    wake_.notify_all();
  }

  void end() {
    if (threads_.empty()) return;
    running_.store(false, std::memory_order_release);
    std::lock_guard<std::mutex> lock(mutex_);
    stepping_ = false;
  }

  // fn(chunk) for every chunk in [0, chunks), on this thread and whichever helpers are awake;
  // returns when all are done. fn must not throw.
  template <typename Fn>
  void run(int64_t chunks, const Fn& fn) {
    if (threads_.empty() || chunks == 1) {
      for (int64_t chunk = 0; chunk < chunks; ++chunk) fn(chunk);
      return;
    }
    TORCH_CHECK(chunks < kMaxChunks, "too many chunks for one phase");
    call_.store(&trampoline<Fn>, std::memory_order_relaxed);
    fn_.store(&fn, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t phase = (phase_of(claim_.load(std::memory_order_relaxed)) + 1) & kPhaseMask;
    // One word holds the phase, its chunk count and its next chunk, so a claim never pairs one
    // phase's count with another's chunks; publishes the stores above.
    claim_.store(phase << 40 | static_cast<uint64_t>(chunks) << 20, std::memory_order_release);
    for (int64_t chunk; (chunk = claim(phase)) >= 0;) {
      fn(chunk);
      done_.fetch_add(1, std::memory_order_acq_rel);
    }
    while (done_.load(std::memory_order_acquire) < chunks) _mm_pause();
  }

 private:
  using Call = void (*)(const void*, int64_t);

  template <typename Fn>
  static void trampoline(const void* fn, int64_t chunk) {
    (*static_cast<const Fn*>(fn))(chunk);
  }

  static constexpr int64_t kMaxChunks = 1 << 20;
  static constexpr uint64_t kPhaseMask = (uint64_t{1} << 24) - 1;
  static uint64_t phase_of(uint64_t claim) { return claim >> 40; }

  // The next chunk of `phase`, or -1 when it has none left (or another phase has begun).
  int64_t claim(uint64_t phase) {
    uint64_t value = claim_.load(std::memory_order_acquire);
    while (true) {
      const int64_t chunk = static_cast<int64_t>(value & (kMaxChunks - 1));
      const int64_t chunks = static_cast<int64_t>((value >> 20) & (kMaxChunks - 1));
      if (phase_of(value) != phase || chunk >= chunks) return -1;
      if (claim_.compare_exchange_weak(value, value + 1, std::memory_order_acq_rel)) return chunk;
    }
  }

  void serve() {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stepping_ || stop_; });
        if (stop_) return;
      }
      int idle = 0;
      while (running_.load(std::memory_order_acquire)) {
        const uint64_t phase = phase_of(claim_.load(std::memory_order_acquire));
        const int64_t chunk = claim(phase);
        if (chunk >= 0) {
          // The phase cannot end before this chunk is done, so its function stays valid.
          call_.load(std::memory_order_relaxed)(fn_.load(std::memory_order_relaxed), chunk);
          done_.fetch_add(1, std::memory_order_acq_rel);
          idle = 0;
        } else if (++idle % 32 == 0) {
          sched_yield();  // let another thread that wants this core (the event loop) have it
        } else {
          _mm_pause();
        }
      }
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stepping_ = false, stop_ = false;  // under mutex_
  std::atomic<bool> running_{false};
  std::atomic<uint64_t> claim_{0};  // phase (24 bits), its chunk count and next chunk (20 each)
  std::atomic<int64_t> done_{0};
  std::atomic<Call> call_{nullptr};
  std::atomic<const void*> fn_{nullptr};
};

// Output columns a matmul chunk computes: a multiple of the kernels' tiles.
constexpr int64_t kChunk = 64;

inline int64_t chunks_of(int64_t columns) { return (columns + kChunk - 1) / kChunk; }

// A linear over GGUF blocks, as BlockQuantLinear holds it: Q4_1 or Q8_0 split into their
// kernels' layout, or a file's rows of another type (rawblocks.cpp); with a bias or without.
struct BlockLinear {
  torch::Tensor qs, d, m, bias;
  int64_t type = blockquant::kQ4_1;
  bool int8_activations = false;
  int64_t in = 0, out = 0;
  int64_t scale_group = 32;  // Q8_0: weights a scale covers, 32 or 16 (widened Q6_K)

  // y[:, n0:n1] of y = x @ W.T (+ bias), in the calling thread.
  void apply(const float* x, int64_t rows, float* y, int64_t n0, int64_t n1) const {
    if (type == blockquant::kQ4_1)
      blockquant::q4_1_matmul(x, rows, in, qs.data_ptr<uint8_t>(), d.data_ptr<float>(),
                              m.data_ptr<float>(), y, out, int8_activations, n0, n1);
    else if (type == blockquant::kQ8_0)
      blockquant::q8_0_matmul(x, rows, in, qs.data_ptr<int8_t>(), d.data_ptr<float>(), y, out,
                              int8_activations, scale_group, n0, n1);
    else
      blockquant::raw_matmul(x, rows, in, qs.data_ptr<uint8_t>(), type, y, out, n0, n1);
    if (bias.defined() && bias.numel() > 0) {
      const float* b = bias.data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n) y[r * out + n] += b[n];
    }
  }

  // The columns of chunk `chunk` (kChunk of them).
  void apply_chunk(const float* x, int64_t rows, float* y, int64_t chunk) const {
    apply(x, rows, y, chunk * kChunk, std::min(out, (chunk + 1) * kChunk));
  }
};

// (qs, d, m, GGML type, int8 activations, bias: empty for none) as Python hands each linear over.
using LinearParts =
    std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, int64_t, bool, torch::Tensor>;

BlockLinear block_linear(const LinearParts& parts, int64_t in) {
  BlockLinear linear;
  std::tie(linear.qs, linear.d, linear.m, linear.type, linear.int8_activations, linear.bias) =
      parts;
  const bool q4_1 = linear.type == blockquant::kQ4_1, q8_0 = linear.type == blockquant::kQ8_0;
  const int64_t weights = q4_1 || q8_0 ? 32 : blockquant::raw_block_weights(linear.type);
  TORCH_CHECK(weights > 0, "a linear's GGML type ", linear.type, " has no block kernel");
  const int64_t bytes = q4_1 ? in / 32 * 16
                        : q8_0 ? in
                               : in / weights * blockquant::raw_block_bytes(linear.type);
  TORCH_CHECK(in % weights == 0 && linear.qs.dim() == 2 && linear.qs.is_contiguous() &&
                  linear.qs.size(1) == bytes,
              "a linear's blocks do not match its input width");
  TORCH_CHECK(linear.qs.scalar_type() == (q8_0 ? torch::kInt8 : torch::kUInt8),
              "a linear's blocks have the wrong type");
  linear.in = in;
  linear.out = linear.qs.size(0);
  if (q8_0 && linear.d.dim() == 2)
    linear.scale_group = blockquant::q8_0_scale_group(in, linear.d.size(1));
  TORCH_CHECK(!(q4_1 || q8_0) ||
                  (linear.d.scalar_type() == torch::kFloat32 && linear.d.is_contiguous() &&
                   linear.d.numel() == linear.out * (in / linear.scale_group)),
              "a linear's block scales do not match its blocks");
  TORCH_CHECK(!q4_1 || (linear.m.sizes() == linear.d.sizes() && linear.m.is_contiguous() &&
                        linear.m.scalar_type() == torch::kFloat32),
              "a Q4_1 linear's block offsets do not match its scales");
  TORCH_CHECK(linear.bias.numel() == 0 ||
                  (linear.bias.scalar_type() == torch::kFloat32 && linear.bias.is_contiguous() &&
                   linear.bias.numel() == linear.out),
              "a linear's bias does not match its output width");
  return linear;
}

torch::Tensor float_vector(const torch::Tensor& t, int64_t size, const char* what) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.numel() == size,
              what, ": expected a contiguous float32 vector of ", size);
  return t;
}

// RMSNorm as transformers computes it: x * rsqrt(mean(x^2) + eps) * weight.
void rms_norm(const float* x, const float* weight, float eps, int64_t rows, int64_t width,
              float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * width;
    float* o = out + r * width;
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= width; i += 8) {
      const __m256 v = _mm256_loadu_ps(xr + i);
      acc = _mm256_fmadd_ps(v, v, acc);
    }
    float squares = hsum8(acc);
    for (; i < width; ++i) squares += xr[i] * xr[i];
    const float scale = 1.0f / std::sqrt(squares / static_cast<float>(width) + eps);
    for (int64_t j = 0; j < width; ++j) o[j] = weight[j] * (xr[j] * scale);
  }
}

class LlamaStep {
 public:
  LlamaStep(torch::Tensor embed, std::vector<torch::Tensor> input_norms,
            std::vector<torch::Tensor> post_norms, torch::Tensor final_norm,
            std::vector<LinearParts> linears, LinearParts head, torch::Tensor inv_freq,
            int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double rope_scaling,
            double attention_scale, int64_t helpers)
      : crew_(static_cast<int>(std::max<int64_t>(helpers, 0))),
        embed_(embed),
        final_norm_(final_norm),
        inv_freq_(inv_freq),
        heads_(heads),
        kv_heads_(kv_heads),
        head_dim_(head_dim),
        eps_(static_cast<float>(eps)),
        rope_scaling_(static_cast<float>(rope_scaling)),
        attention_scale_(static_cast<float>(attention_scale)) {
    TORCH_CHECK(embed.dim() == 2 && embed.scalar_type() == torch::kFloat32 && embed.is_contiguous(),
                "the embedding table must be a contiguous float32 matrix");
    hidden_ = embed.size(1);
    vocab_ = embed.size(0);
    layers_ = static_cast<int64_t>(input_norms.size());
    TORCH_CHECK(layers_ > 0 && post_norms.size() == input_norms.size() &&
                    linears.size() == static_cast<size_t>(7 * layers_),
                "expected 7 linears (q, k, v, o, gate, up, down) and two norms a layer");
    TORCH_CHECK(head_dim % 16 == 0 && heads % kv_heads == 0, "unsupported attention shape");
    float_vector(final_norm, hidden_, "the final norm");
    float_vector(inv_freq, head_dim / 2, "the rotary frequencies");
    for (int64_t l = 0; l < layers_; ++l) {
      input_norms_.push_back(float_vector(input_norms[l], hidden_, "an input norm"));
      post_norms_.push_back(float_vector(post_norms[l], hidden_, "a post-attention norm"));
      const LinearParts* p = &linears[7 * l];
      Layer layer{block_linear(p[0], hidden_), block_linear(p[1], hidden_),
                  block_linear(p[2], hidden_), block_linear(p[3], heads * head_dim),
                  block_linear(p[4], hidden_), block_linear(p[5], hidden_),
                  block_linear(p[6], std::get<0>(p[4]).size(0))};
      TORCH_CHECK(layer.q.out == heads * head_dim && layer.k.out == kv_heads * head_dim &&
                      layer.v.out == kv_heads * head_dim && layer.o.out == hidden_ &&
                      layer.up.out == layer.gate.out && layer.down.out == hidden_,
                      "a layer's linears do not match the model's shape");
      layers.push_back(std::move(layer));
    }
    head_ = block_linear(head, hidden_);
  }

  // ids int64 [R * T]: each row's T new tokens (T = 1 in a decode step; more in a prefill);
  // mask int64 [R, W]: the attention mask, its last T columns the new tokens' (0 on padding:
  // a prefill's shorter rows are padded on the left); keys/values: each layer's cache buffers
  // [R, kv_heads, capacity, head_dim], holding W - T columns, with room for T more, into which
  // the step writes the new tokens' keys and values. Each new token attends to the columns up
  // to its own. Returns the logits of each row's last token [R, vocab].
  torch::Tensor forward(torch::Tensor ids, torch::Tensor mask, std::vector<torch::Tensor> keys,
                        std::vector<torch::Tensor> values) {
    TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == torch::kInt64 && ids.is_contiguous(),
                "ids must be a contiguous int64 vector");
    TORCH_CHECK(mask.dim() == 2 && mask.scalar_type() == torch::kInt64 && mask.is_contiguous(),
                "the mask must be a contiguous int64 [rows, width] matrix");
    const int64_t R = mask.size(0);
    TORCH_CHECK(R > 0 && ids.size(0) > 0 && ids.size(0) % R == 0,
                "expected the same number of new tokens for every row of the mask");
    const int64_t T = ids.size(0) / R, N = R * T;  // new tokens a row, and in all
    const int64_t W = mask.size(1), first = W - T;   // the first new token's column
    TORCH_CHECK(first >= 0, "the mask is narrower than the new tokens");
    TORCH_CHECK(static_cast<int64_t>(keys.size()) == layers_ && keys.size() == values.size(),
                "expected one key and one value buffer a layer");
    for (int64_t l = 0; l < layers_; ++l)
      for (const auto* t : {&keys[l], &values[l]})
        TORCH_CHECK(t->dim() == 4 && t->scalar_type() == torch::kFloat32 && t->is_contiguous() &&
                        t->size(0) == R && t->size(1) == kv_heads_ && t->size(3) == head_dim_ &&
                        t->size(2) >= W && t->size(2) == keys[0].size(2),
                    "a cache buffer has the wrong shape or no room for the new columns");
    const int64_t capacity = keys[0].size(2);
    const int64_t* token = ids.data_ptr<int64_t>();
    for (int64_t n = 0; n < N; ++n)
      TORCH_CHECK(token[n] >= 0 && token[n] < vocab_, "a token id is outside the vocabulary");

    // Each new token's position (the row's own tokens before it: padding does not count), the
    // rotary table at it, and the mask as 0/1 floats.
    const int64_t half = head_dim_ / 2;
    std::vector<float> cos(N * half), sin(N * half), keep(R * W);
    const int64_t* M = mask.data_ptr<int64_t>();
    const float* freq = inv_freq_.data_ptr<float>();
    for (int64_t r = 0; r < R; ++r) {
      int64_t seen = 0;
      for (int64_t j = 0; j < W; ++j) {
        keep[r * W + j] = M[r * W + j] != 0 ? 1.0f : 0.0f;
        seen += M[r * W + j] != 0;
        if (j < first) continue;
        const int64_t n = r * T + (j - first);
        const float position = static_cast<float>(std::max<int64_t>(seen - 1, 0));
        for (int64_t i = 0; i < half; ++i) {
          const float angle = position * freq[i];
          cos[n * half + i] = std::cos(angle) * rope_scaling_;
          sin[n * half + i] = std::sin(angle) * rope_scaling_;
        }
      }
    }

    const int64_t started = profiling ? now() : 0;
    matmul_ns_ = 0;
    const int64_t H = hidden_, Q = heads_ * head_dim_, KV = kv_heads_ * head_dim_;
    const int64_t I = layers[0].gate.out;
    std::vector<float> x(N * H), h(N * H), q(N * Q), k(N * KV), v(N * KV), attn(N * Q),
        o(N * H), gate(N * I), up(N * I);
    const float* table = embed_.data_ptr<float>();
    for (int64_t n = 0; n < N; ++n)
      std::copy(table + token[n] * H, table + (token[n] + 1) * H, x.data() + n * H);

    // Phases a layer: q, k and v; then rotary, the cache's new columns and attention, a
    // (row, KV head) pair a chunk (its new tokens' keys written before any of them attends);
    // o; gate and up with SiLU; down. The norms and residual adds between them are a few
    // thousand floats a token, left to this thread.
    // The helpers go back to sleep however the step ends (an allocation may throw between
    // phases; the phases themselves never throw, as a helper may hold a chunk of one).
    struct Stepping {
      Crew& crew;
      explicit Stepping(Crew& c) : crew(c) { crew.begin(); }
      ~Stepping() { crew.end(); }
    } stepping(crew_);
    const int64_t q_chunks = chunks_of(Q), kv_chunks = chunks_of(KV);
    for (int64_t l = 0; l < layers_; ++l) {
      const Layer& layer = layers[l];
      rms_norm(x.data(), input_norms_[l].data_ptr<float>(), eps_, N, H, h.data());
      matmuls(q_chunks + 2 * kv_chunks, [&](int64_t c) {
        if (c < q_chunks) return layer.q.apply_chunk(h.data(), N, q.data(), c);
        c -= q_chunks;
        if (c < kv_chunks) return layer.k.apply_chunk(h.data(), N, k.data(), c);
        layer.v.apply_chunk(h.data(), N, v.data(), c - kv_chunks);
      });
      float* key_cache = keys[l].data_ptr<float>();
      float* value_cache = values[l].data_ptr<float>();
      crew_.run(R * kv_heads_, [&](int64_t pair) {
        const int64_t r = pair / kv_heads_, g = pair % kv_heads_, group = heads_ / kv_heads_;
        for (int64_t n = r * T; n < (r + 1) * T; ++n) {
          rotate(q.data() + (n * heads_ + g * group) * head_dim_, group, cos.data() + n * half,
                 sin.data() + n * half);
          rotate(k.data() + n * KV + g * head_dim_, 1, cos.data() + n * half,
                 sin.data() + n * half);
          const int64_t at = ((r * kv_heads_ + g) * capacity + first + n - r * T) * head_dim_;
          std::copy_n(k.data() + n * KV + g * head_dim_, head_dim_, key_cache + at);
          std::copy_n(v.data() + n * KV + g * head_dim_, head_dim_, value_cache + at);
        }
        for (int64_t n = r * T; n < (r + 1) * T; ++n)
          attend(q.data(), key_cache, value_cache, keep.data(), r, n, g, W,
                 first + n - r * T + 1, capacity, attn.data());
      });
      matmuls(chunks_of(H), [&](int64_t c) { layer.o.apply_chunk(attn.data(), N, o.data(), c); });
      for (int64_t i = 0; i < N * H; ++i) x[i] += o[i];

      rms_norm(x.data(), post_norms_[l].data_ptr<float>(), eps_, N, H, h.data());
      matmuls(chunks_of(I), [&](int64_t c) {
        layer.gate.apply_chunk(h.data(), N, gate.data(), c);
        layer.up.apply_chunk(h.data(), N, up.data(), c);
        const int64_t n0 = c * kChunk, n1 = std::min(I, n0 + kChunk);
        for (int64_t n = 0; n < N; ++n)
          silu_times(gate.data() + n * I + n0, up.data() + n * I + n0, n1 - n0);
      });
      matmuls(chunks_of(H), [&](int64_t c) { layer.down.apply_chunk(gate.data(), N, o.data(), c); });
      for (int64_t i = 0; i < N * H; ++i) x[i] += o[i];
    }
    // Only each row's last token is read out.
    if (T > 1)
      for (int64_t r = 0; r < R; ++r)
        std::copy_n(x.data() + (r * T + T - 1) * H, H, x.data() + r * H);
    rms_norm(x.data(), final_norm_.data_ptr<float>(), eps_, R, H, h.data());
    auto logits = torch::empty({R, head_.out}, torch::dtype(torch::kFloat32));
    float* out = logits.data_ptr<float>();
    matmuls(chunks_of(head_.out), [&](int64_t c) { head_.apply_chunk(h.data(), R, out, c); });
    if (profiling) {
      ++profiled_steps;
      profiled_ns += now() - started;
      profiled_matmul_ns += matmul_ns_;
    }
    return logits;
  }

  int helpers() const { return crew_.helpers(); }

  // With `profiling` on, each step adds its nanoseconds, and those inside the block matmuls, to
  // these (bench/scripts/step_profile.py splits a step with them).
  bool profiling = false;
  int64_t profiled_steps = 0, profiled_ns = 0, profiled_matmul_ns = 0;

 private:
  struct Layer {
    BlockLinear q, k, v, o, gate, up, down;
  };

  static int64_t now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // A phase of block matmuls over the crew (timed when profiling).
  template <typename Fn>
  void matmuls(int64_t chunks, const Fn& fn) {
    if (!profiling) return crew_.run(chunks, fn);
    const int64_t started = now();
    crew_.run(chunks, fn);
    matmul_ns_ += now() - started;
  }

  // transformers' rotate-half rotary embedding, in place, on `count` consecutive heads.
  void rotate(float* t, int64_t count, const float* cos, const float* sin) const {
    const int64_t half = head_dim_ / 2;
    for (int64_t n = 0; n < count; ++n) {
      float* a = t + n * head_dim_;
      float* b = a + half;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = a[i], x2 = b[i];
        a[i] = x1 * cos[i] - x2 * sin[i];
        b[i] = x2 * cos[i] + x1 * sin[i];
      }
    }
  }

  // Token n's query heads of KV head g over row r's cached keys (attention.py's grouping), the
  // columns before `visible` (its own and those before it): scores, a softmax over the unmasked
  // ones, and the weighted sum of the values. A padding token (masked itself) attends to
  // nothing: its output is zeros, which no other token reads.
  void attend(const float* q, const float* keys, const float* values, const float* keep, int64_t r,
              int64_t n, int64_t g, int64_t W, int64_t visible, int64_t capacity,
              float* out) const {
    const int64_t group = heads_ / kv_heads_, D = head_dim_;
    const float* mask = keep + r * W;
    if (mask[visible - 1] == 0.0f) {
      std::fill_n(out + (n * heads_ + g * group) * D, group * D, 0.0f);
      return;
    }
    W = visible;
    thread_local std::vector<float> scores;
    scores.resize(W + 8);
    const float* K = keys + (r * kv_heads_ + g) * capacity * D;
    const float* V = values + (r * kv_heads_ + g) * capacity * D;
    for (int64_t i = 0; i < group; ++i) {
      const int64_t head = g * group + i;
      const float* qh = q + (n * heads_ + head) * D;
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < W; ++j) {
        if (mask[j] == 0.0f) {
          scores[j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const float* kj = K + j * D;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 16) {
          a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(kj + d), a0);
          a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d + 8), _mm256_loadu_ps(kj + d + 8), a1);
        }
        scores[j] = hsum8(_mm256_add_ps(a0, a1)) * attention_scale_;
        best = std::max(best, scores[j]);
      }
      // Softmax: exp(s - max) on the unmasked columns, exactly 0 on the masked ones.
      const __m256 shift = _mm256_set1_ps(best);
      __m256 total8 = _mm256_setzero_ps();
      int64_t j = 0;
      for (; j + 8 <= W; j += 8) {
        const __m256 e = _mm256_mul_ps(
            exp8(_mm256_sub_ps(_mm256_loadu_ps(scores.data() + j), shift)),
            _mm256_loadu_ps(mask + j));
        _mm256_storeu_ps(scores.data() + j, e);
        total8 = _mm256_add_ps(total8, e);
      }
      float total = hsum8(total8);
      for (; j < W; ++j) {
        scores[j] = mask[j] != 0.0f ? std::exp(scores[j] - best) : 0.0f;
        total += scores[j];
      }
      const float norm = 1.0f / total;
      float* o = out + (n * heads_ + head) * D;
      for (int64_t d = 0; d < D; d += 16) {
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        for (int64_t jj = 0; jj < W; ++jj) {
          if (scores[jj] == 0.0f) continue;
          const __m256 p = _mm256_set1_ps(scores[jj]);
          s0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(V + jj * D + d), s0);
          s1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(V + jj * D + d + 8), s1);
        }
        _mm256_storeu_ps(o + d, _mm256_mul_ps(s0, _mm256_set1_ps(norm)));
        _mm256_storeu_ps(o + d + 8, _mm256_mul_ps(s1, _mm256_set1_ps(norm)));
      }
    }
  }

  // gate = silu(gate) * up, SiLU being x / (1 + exp(-x)).
  static void silu_times(float* gate, const float* up, int64_t count) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= count; i += 8) {
      const __m256 g = _mm256_loadu_ps(gate + i);
      const __m256 e = exp8(_mm256_sub_ps(zero, g));
      _mm256_storeu_ps(gate + i,
                       _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    for (; i < count; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }

  torch::Tensor embed_, final_norm_, inv_freq_;
  std::vector<torch::Tensor> input_norms_, post_norms_;
  Crew crew_;  // first: the threads go before the tensors they read
  std::vector<Layer> layers;
  BlockLinear head_;
  int64_t heads_, kv_heads_, head_dim_, hidden_ = 0, vocab_ = 0, layers_ = 0, matmul_ns_ = 0;
  float eps_, rope_scaling_, attention_scale_;
};

}  // namespace

void bind_llama_step(pybind11::module& module) {
  using release_gil = pybind11::call_guard<pybind11::gil_scoped_release>;
  pybind11::class_<LlamaStep>(module, "LlamaStep")
      .def(pybind11::init<torch::Tensor, std::vector<torch::Tensor>, std::vector<torch::Tensor>,
                          torch::Tensor, std::vector<LinearParts>, LinearParts, torch::Tensor,
                          int64_t, int64_t, int64_t, double, double, double, int64_t>(),
           pybind11::arg("embed"), pybind11::arg("input_norms"), pybind11::arg("post_norms"),
           pybind11::arg("final_norm"), pybind11::arg("linears"), pybind11::arg("head"),
           pybind11::arg("inv_freq"), pybind11::arg("heads"), pybind11::arg("kv_heads"),
           pybind11::arg("head_dim"), pybind11::arg("eps"), pybind11::arg("rope_scaling"),
           pybind11::arg("attention_scale"), pybind11::arg("helpers") = 0)
      // Lets go of the GIL: the step is most of the engine's time, and the event loop streaming
      // the tokens out runs in the same process.
      .def("forward", &LlamaStep::forward, "one decode step: logits [rows, vocab]",
           pybind11::arg("ids"), pybind11::arg("mask"), pybind11::arg("keys"),
           pybind11::arg("values"), release_gil())
      .def_property_readonly("helpers", &LlamaStep::helpers)
      .def_readwrite("profiling", &LlamaStep::profiling)
      .def_readwrite("profiled_steps", &LlamaStep::profiled_steps)
      .def_readwrite("profiled_ns", &LlamaStep::profiled_ns)
      .def_readwrite("profiled_matmul_ns", &LlamaStep::profiled_matmul_ns);
}

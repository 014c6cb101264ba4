// aiayn's attention kernel for short queries on x86 CPUs with AVX-512 or AVX2: eq. (1) of
// "Attention Is All You Need" (§3.2.1), softmax(scale · Q Kᵀ + bias) V, generalised as in
// aiayn/attention/scaled_dot_product.py (optional additive bias, boolean mask, any scale).
//
// Why it exists: a decoding step attends with one query (or the G beams of a sentence, folded
// into G queries over its source) per head over a few dozen keys, which is a few thousand
// multiply-adds; PyTorch's fused CPU kernel and the three plain operations each cost more in
// set-up per call than that arithmetic (docs/performance.md has the timings). Here one call
// does the scores, the softmax and the weighted sum per query row, with the row's scores in a
// small buffer.
//
// Two builds of one kernel, registered side by side and chosen by the caller
// (aiayn/kernels/attention.py) by the CPU class in force: `attend` (AVX-512F, 16 floats a
// vector) and `attend_avx2` (AVX2 and FMA, 8 floats a vector, no AVX-512 instruction on its
// path). They share everything but the three vector routines of a query row (dots, softmax,
// weighted_sum), which an ISA tag struct (Avx512, Avx2) hands to the templated head loop.
// The library is compiled without -march: each ISA-specific function names its target.
//
// Shape legend:  B batch   H heads   T queries   S keys/values   d query/key size   d_v value size
//
// Operands: query (B, H, T, d), key (B, H, S, d), value (B, H, S, d_v) float32, any strides with
// a unit stride over the last dimension (views of a KV cache narrowed over S included), sizes 1
// broadcast over B and H; mask bool broadcastable to (B, H, T, S), True = may attend; bias
// float32 broadcastable to (B, H, T, S). Output (B, H, T, d_v), contiguous.
// A query row whose keys are all blocked gives zeros (never NaN), as the Python reference.
// The reference's order of rounding is kept where it is cheap: scores = (q·k) / √d (or · scale),
// then + bias; weights = e / Σ e; output = Σ_j weights_j v_j. Sums are in another order
// (vectors), so results agree with it to fp32 summation order.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace {

bool avx512_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

bool avx2_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

#define AVX512 __attribute__((target("avx512f,avx2,fma")))
#define AVX2 __attribute__((target("avx2,fma")))

struct Strides {
  int64_t b, h, t, s;  // element strides over B, H, T (0 for key/value) and S
};

struct Problem {
  const float* q;     // (B, H, T, d)
  const float* k;     // (B, H, S, d)
  const float* v;     // (B, H, S, d_v)
  const bool* mask;   // (B, H, T, S) by its strides, or null
  const float* bias;  // (B, H, T, S) by its strides, or null
  float* out;         // (B, H, T, d_v) contiguous
  Strides sq, sk, sv, sm, sa;
  int64_t heads, t, s, d, dv;
  float scale;
  bool divide;  // scores / scale (the paper's √d) rather than scores · scale
  const int64_t* rows = nullptr;     // (B,) the key/value row of each query row, or null: b
  const int64_t* lengths = nullptr;  // (B,) the keys of each query row, or null: S for all
};

// The sums of the 8 lanes of each of a[0..8): (Σ a[0], ..., Σ a[7]) by a tree of adds (both
// builds: AVX-512 halves its vectors first).
AVX2 inline __m256 sums_of_eight(const __m256 (&a)[8]) {
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);  // 4 sums per 128
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

// ---------------------------------------------------------------------------------------------
// AVX-512F: 16 floats a vector, tails by mask registers.
namespace avx512 {

constexpr int64_t kLanes = 16;  // floats per 512-bit vector
constexpr float kMinExponent = -104.0f;  // e^-104 is below the smallest fp32 denormal: 0

// The lanes of a vector that hold the `left` elements still to do: all 16 when 16 or more
// are left, none when none is.
AVX512 inline __mmask16 lanes(int64_t left) {
  if (left <= 0) return 0;
  return left >= kLanes ? static_cast<__mmask16>(0xFFFF)
                        : static_cast<__mmask16>((1u << left) - 1u);
}

// e^x for x <= 0: x = n ln 2 + r, |r| <= ln 2 / 2, e^r by Cephes' degree-6 polynomial (about
// 1 ulp), times 2^n by scalef (0 once n is below the denormals).
AVX512 inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kMinExponent));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln 2 in two parts
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
                                 _mm512_set1_ps(1.0f));  // 1 + r + r² p(r)
  return _mm512_scalef_ps(y, n);
}

// The sums of the 16 lanes of each of a[0..8): each halved (low half + high half), then summed.
AVX512 inline __m256 sums_of_eight16(const __m512 (&a)[8]) {
  __m256 half[8];
  for (int i = 0; i < 8; ++i)  // 16 lanes -> 8: low half + high half
    half[i] = _mm256_add_ps(_mm512_castps512_ps256(a[i]),
                            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[i]), 1)));
  return sums_of_eight(half);
}

// raw[j] = q · k_j for the S keys (stride ks), eight keys at a time (independent sums).
AVX512 void dots(const float* q, const float* k, int64_t ks, int64_t s, int64_t d, float* raw) {
  int64_t j = 0;
  for (; j + 8 <= s; j += 8) {
    __m512 a[8];
    for (int r = 0; r < 8; ++r) a[r] = _mm512_setzero_ps();
    const float* kj = k + j * ks;
    for (int64_t i = 0; i < d; i += kLanes) {
      const __mmask16 m = lanes(d - i);
      const __m512 qv = _mm512_maskz_loadu_ps(m, q + i);
      for (int r = 0; r < 8; ++r)
        a[r] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, kj + r * ks + i), a[r]);
    }
    _mm256_storeu_ps(raw + j, sums_of_eight16(a));
  }
  for (; j < s; ++j) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += kLanes) {
      const __mmask16 m = lanes(d - i);
      a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i), _mm512_maskz_loadu_ps(m, k + j * ks + i), a);
    }
    raw[j] = _mm512_reduce_add_ps(a);
  }
}

// x[j] = e^(x[j] - max) / Σ e (0 where x[j] is -inf).
AVX512 void softmax(float* x, int64_t s) {
  __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < s; j += kLanes)
    top = _mm512_max_ps(top, _mm512_mask_loadu_ps(top, lanes(s - j), x + j));
  const __m512 peak = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  const __m512 blocked = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < s; j += kLanes) {
    const __mmask16 m = lanes(s - j);
    const __m512 xj = _mm512_maskz_loadu_ps(m, x + j);
    const __mmask16 live = _mm512_mask_cmp_ps_mask(m, xj, blocked, _CMP_NEQ_OQ);
    const __m512 e = _mm512_maskz_mov_ps(live, exp_nonpositive(_mm512_sub_ps(xj, peak)));
    _mm512_mask_storeu_ps(x + j, m, e);
    total = _mm512_add_ps(total, e);
  }
  const __m512 sum = _mm512_set1_ps(_mm512_reduce_add_ps(total));
  for (int64_t j = 0; j < s; j += kLanes) {
    const __mmask16 m = lanes(s - j);
    _mm512_mask_storeu_ps(x + j, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + j), sum));
  }
}

// acc[c] += w · v[c · 16 ..] for the `live` columns' vectors (masks m).
AVX512 inline void add_weighted(__m512 (&acc)[4], float w, const float* v,
                                const __mmask16 (&m)[4]) {
  const __m512 wv = _mm512_set1_ps(w);
  for (int c = 0; c < 4; ++c)
    if (m[c]) acc[c] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m[c], v + c * kLanes), acc[c]);
}

// out = Σ_j w[j] v_j over the S values (stride vs), 64 columns at a time, even and odd keys in
// separate sums (two independent chains), added at the end; zero weights skipped.
AVX512 void weighted_sum(const float* w, const float* v, int64_t vs, int64_t s, int64_t dv,
                         float* out) {
  for (int64_t c = 0; c < dv; c += 4 * kLanes) {
    const __mmask16 m[4] = {lanes(dv - c), lanes(dv - c - kLanes), lanes(dv - c - 2 * kLanes),
                            lanes(dv - c - 3 * kLanes)};
    __m512 even[4], odd[4];
    for (int i = 0; i < 4; ++i) even[i] = odd[i] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 2 <= s; j += 2) {
      if (w[j] != 0.0f) add_weighted(even, w[j], v + j * vs + c, m);
      if (w[j + 1] != 0.0f) add_weighted(odd, w[j + 1], v + (j + 1) * vs + c, m);
    }
    if (j < s && w[j] != 0.0f) add_weighted(even, w[j], v + j * vs + c, m);
    for (int i = 0; i < 4; ++i)
      if (m[i]) _mm512_mask_storeu_ps(out + c + i * kLanes, m[i], _mm512_add_ps(even[i], odd[i]));
  }
}

}  // namespace avx512

// ---------------------------------------------------------------------------------------------
// AVX2 and FMA: 8 floats a vector, tails by maskload/maskstore with an integer lane mask.
namespace avx2 {

constexpr int64_t kLanes = 8;  // floats per 256-bit vector
// ln of the smallest normal float (2^-126 ≈ 1.18e-38), a little above: the exponent stays
// normal. e^x below it is taken as 0 (the reference rounds it to a denormal or 0).
constexpr float kMinNormalExponent = -87.3f;

// The lanes of a vector that hold the `left` elements still to do, as maskload and maskstore
// take them (all bits set where on): all 8 when 8 or more are left, none when none is.
AVX2 inline __m256i lanes(int64_t left) {
  const int32_t n = static_cast<int32_t>(std::clamp<int64_t>(left, 0, kLanes));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The sum of the 8 lanes of a (high half onto low half, then pairs).
AVX2 inline float sum_of(__m256 a) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

// The largest of the 8 lanes of a.
AVX2 inline float max_of(__m256 a) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

// e^x for x <= 0: x = n ln 2 + r, |r| <= ln 2 / 2, e^r by Cephes' degree-6 polynomial (about
// 1 ulp), times 2^n built in the exponent bits, (n + 127) << 23. x is clamped at
// kMinNormalExponent so that 2^n stays a normal float, and lanes below it (-inf included) give 0.
// A NaN stays NaN (max returns its second operand when one is NaN).
AVX2 inline __m256 exp_nonpositive(__m256 x) {
  const __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(kMinNormalExponent), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_set1_ps(kMinNormalExponent), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 in two parts
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
                                 _mm256_set1_ps(1.0f));  // 1 + r + r² p(r)
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  const __m256 two_n = _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23));  // 2^n, n >= -126
  return _mm256_andnot_ps(low, _mm256_mul_ps(y, two_n));
}

// The 8 floats at p: all of them (whole) or the lanes m, 0 elsewhere (nothing read there).
AVX2 inline __m256 load(const float* p, __m256i m, bool whole) {
  return whole ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m);
}

// a[r] += q[i..i+8) · k_r[i..i+8) for the eight keys k_r = k + r·ks (the lanes m unless whole).
AVX2 inline void fma_eight(__m256 (&a)[8], const float* q, const float* k, int64_t ks, int64_t i,
                           __m256i m, bool whole) {
  const __m256 qv = load(q + i, m, whole);
  for (int r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(qv, load(k + r * ks + i, m, whole), a[r]);
}

// raw[j] = q · k_j for the S keys (stride ks), eight keys at a time (independent sums); the
// whole vectors of a row first, then its masked tail.
AVX2 void dots(const float* q, const float* k, int64_t ks, int64_t s, int64_t d, float* raw) {
  const int64_t whole = d - d % kLanes;  // columns in whole vectors
  const __m256i tail = lanes(d - whole);
  int64_t j = 0;
  for (; j + 8 <= s; j += 8) {
    __m256 a[8];
    for (int r = 0; r < 8; ++r) a[r] = _mm256_setzero_ps();
    const float* kj = k + j * ks;
    for (int64_t i = 0; i < whole; i += kLanes) fma_eight(a, q, kj, ks, i, tail, true);
    if (whole < d) fma_eight(a, q, kj, ks, whole, tail, false);
    _mm256_storeu_ps(raw + j, sums_of_eight(a));
  }
  for (; j < s; ++j) {
    const float* kj = k + j * ks;
    __m256 a = _mm256_setzero_ps();
    for (int64_t i = 0; i < whole; i += kLanes)
      a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kj + i), a);
    if (whole < d)
      a = _mm256_fmadd_ps(_mm256_maskload_ps(q + whole, tail), _mm256_maskload_ps(kj + whole, tail), a);
    raw[j] = sum_of(a);
  }
}

// x[j] = e^(x[j] - max) / Σ e (0 where x[j] is -inf: exp_nonpositive gives 0 there).
AVX2 void softmax(float* x, int64_t s) {
  const __m256 blocked = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 top = blocked;
  for (int64_t j = 0; j < s; j += kLanes) {  // lanes past S count as -inf
    const __m256i m = lanes(s - j);
    const __m256 xj = _mm256_blendv_ps(blocked, _mm256_maskload_ps(x + j, m), _mm256_castsi256_ps(m));
    top = _mm256_max_ps(top, xj);
  }
  const __m256 peak = _mm256_set1_ps(max_of(top));
  __m256 total = _mm256_setzero_ps();
  for (int64_t j = 0; j < s; j += kLanes) {  // lanes past S give 0 (whatever their exp)
    const __m256i m = lanes(s - j);
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(m),
                                   exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(x + j, m), peak)));
    _mm256_maskstore_ps(x + j, m, e);
    total = _mm256_add_ps(total, e);
  }
  const __m256 sum = _mm256_set1_ps(sum_of(total));
  for (int64_t j = 0; j < s; j += kLanes) {
    const __m256i m = lanes(s - j);
    _mm256_maskstore_ps(x + j, m, _mm256_div_ps(_mm256_maskload_ps(x + j, m), sum));
  }
}

// acc[c] += w · v[c · 8 ..] for the first `live` of a block's 4 vectors (the lanes m[c] unless
// whole).
AVX2 inline void add_weighted(__m256 (&acc)[4], float w, const float* v, const __m256i (&m)[4],
                              int live, bool whole) {
  const __m256 wv = _mm256_set1_ps(w);
  for (int c = 0; c < 4; ++c)
    if (whole || c < live) acc[c] = _mm256_fmadd_ps(wv, load(v + c * kLanes, m[c], whole), acc[c]);
}

// out[0..n) = Σ_j w[j] v_j[0..n) for one block of n <= 32 columns (whole: n = 32, plain loads),
// even and odd keys in separate sums (two independent chains), added at the end; zero weights
// skipped.
template <bool kWhole>
AVX2 void weighted_block(const float* w, const float* v, int64_t vs, int64_t s, int64_t n,
                         float* out) {
  const __m256i m[4] = {lanes(n), lanes(n - kLanes), lanes(n - 2 * kLanes), lanes(n - 3 * kLanes)};
  const int live = static_cast<int>((n + kLanes - 1) / kLanes);
  __m256 even[4], odd[4];
  for (int i = 0; i < 4; ++i) even[i] = odd[i] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 2 <= s; j += 2) {
    if (w[j] != 0.0f) add_weighted(even, w[j], v + j * vs, m, live, kWhole);
    if (w[j + 1] != 0.0f) add_weighted(odd, w[j + 1], v + (j + 1) * vs, m, live, kWhole);
  }
  if (j < s && w[j] != 0.0f) add_weighted(even, w[j], v + j * vs, m, live, kWhole);
  for (int i = 0; i < live; ++i) {
    const __m256 sum = _mm256_add_ps(even[i], odd[i]);
    if (kWhole) _mm256_storeu_ps(out + i * kLanes, sum);
    else _mm256_maskstore_ps(out + i * kLanes, m[i], sum);
  }
}

// out = Σ_j w[j] v_j over the S values (stride vs), 32 columns at a time, the last block masked.
AVX2 void weighted_sum(const float* w, const float* v, int64_t vs, int64_t s, int64_t dv,
                       float* out) {
  constexpr int64_t kBlock = 4 * kLanes;
  int64_t c = 0;
  for (; c + kBlock <= dv; c += kBlock) weighted_block<true>(w, v + c, vs, s, kBlock, out + c);
  if (c < dv) weighted_block<false>(w, v + c, vs, s, dv - c, out + c);
}

}  // namespace avx2

// ---------------------------------------------------------------------------------------------
// What both builds share: the operands' checks and strides, the scores, the head loop, threads.

// The builds' vector routines, as attend_head calls them, and the CPU check of each.
struct Avx512 {
  static constexpr auto dots = &avx512::dots;
  static constexpr auto softmax = &avx512::softmax;
  static constexpr auto weighted_sum = &avx512::weighted_sum;
  static constexpr auto supported = &avx512_supported;
  static constexpr const char* kNeeds = "AVX-512F";
};

struct Avx2 {
  static constexpr auto dots = &avx2::dots;
  static constexpr auto softmax = &avx2::softmax;
  static constexpr auto weighted_sum = &avx2::weighted_sum;
  static constexpr auto supported = &avx2_supported;
  static constexpr const char* kNeeds = "AVX2 and FMA";
};

// Scores of s keys in place: scaled, biased, -inf where blocked. Returns whether any key is
// allowed.
bool scores(const Problem& p, int64_t s, const bool* mask, const float* bias, float* x) {
  const float inf = std::numeric_limits<float>::infinity();
  bool any = mask == nullptr && s > 0;
  for (int64_t j = 0; j < s; ++j) {
    float score = p.divide ? x[j] / p.scale : x[j] * p.scale;
    if (bias != nullptr) score += bias[j * p.sa.s];
    if (mask != nullptr) {
      const bool allowed = mask[j * p.sm.s];
      any = any || allowed;
      if (!allowed) score = -inf;
    }
    x[j] = score;
  }
  return any;
}

// The T query rows of head (b, h) by the vector routines of Isa; `x` holds S floats. With
// `rows`, query row b reads key/value row rows[b]; with `lengths`, its first lengths[b] keys.
template <typename Isa>
void attend_head(const Problem& p, int64_t b, int64_t h, float* x) {
  const int64_t kb = p.rows ? p.rows[b] : b, s = p.lengths ? p.lengths[b] : p.s;
  const float* k = p.k + kb * p.sk.b + h * p.sk.h;
  const float* v = p.v + kb * p.sv.b + h * p.sv.h;
  for (int64_t t = 0; t < p.t; ++t) {
    const float* q = p.q + b * p.sq.b + h * p.sq.h + t * p.sq.t;
    const bool* mask = p.mask ? p.mask + b * p.sm.b + h * p.sm.h + t * p.sm.t : nullptr;
    const float* bias = p.bias ? p.bias + b * p.sa.b + h * p.sa.h + t * p.sa.t : nullptr;
    float* out = p.out + ((b * p.heads + h) * p.t + t) * p.dv;
    Isa::dots(q, k, p.sk.s, s, p.d, x);
    if (!scores(p, s, mask, bias, x)) {  // no key to attend to: zeros
      std::fill(out, out + p.dv, 0.0f);
      continue;
    }
    Isa::softmax(x, s);
    Isa::weighted_sum(x, v, p.sv.s, s, p.dv, out);
  }
}

// Element strides of `x` (at most 4 dimensions, aligned to the right) over `sizes`, 0 over the
// dimensions it broadcasts (size 1 or missing); with `per_query` false, (B, H, S, ·) as
// (b, h, -, s). Sizes that do not broadcast are refused, naming the operand.
Strides broadcast_strides(const at::Tensor& x, const int64_t (&sizes)[4], bool per_query,
                          const char* name) {
  TORCH_CHECK(x.dim() <= 4, name, ": at most 4 dimensions");
  int64_t st[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < x.dim(); ++i) {
    const int64_t dim = 4 - x.dim() + i, size = x.size(i);
    TORCH_CHECK(size == sizes[dim] || size == 1, name, ": size ", size, " at dimension ", i,
                " does not broadcast to ", sizes[dim]);
    st[dim] = size == 1 ? 0 : x.stride(i);
  }
  return per_query ? Strides{st[0], st[1], st[2], st[3]} : Strides{st[0], st[1], 0, st[2]};
}

// A float32 CPU operand (B|1, H|1, ·, ·) with a unit stride over its last dimension (copied if
// it has none).
at::Tensor unit_last_stride(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == at::kFloat && x.device().is_cpu(), name,
              ": a 4-dimensional float32 CPU tensor");
  return x.stride(3) == 1 || x.size(3) == 1 ? x : x.contiguous();
}

// The mask and bias of `p`, broadcast to (B, H, T, S) by their strides.
void add_mask_and_bias(Problem& p, const std::optional<at::Tensor>& mask,
                       const std::optional<at::Tensor>& bias, const int64_t (&scores)[4]) {
  if (mask.has_value()) {
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->device().is_cpu(), "mask: boolean, CPU");
    p.mask = mask->data_ptr<bool>();
    p.sm = broadcast_strides(*mask, scores, true, "mask");
  }
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->device().is_cpu(), "bias: float32, CPU");
    p.bias = bias->data_ptr<float>();
    p.sa = broadcast_strides(*bias, scores, true, "bias");
  }
}

// Heads [begin, end) of `p` by Isa, with a buffer of S scores (on the stack up to kStackScores).
template <typename Isa>
void attend_heads(const Problem& p, int64_t begin, int64_t end) {
  constexpr int64_t kStackScores = 1024;
  float stack[kStackScores];
  std::vector<float> heap(p.s > kStackScores ? p.s : 0);
  float* x = p.s > kStackScores ? heap.data() : stack;
  for (int64_t i = begin; i < end; ++i) attend_head<Isa>(p, i / p.heads, i % p.heads, x);
}

// The `heads` heads of `p` (about `macs` multiply-adds each), on threads from min_parallel_macs
// multiply-adds in all, each thread with at least half of them.
template <typename Isa>
void run_heads(const Problem& p, int64_t heads, int64_t macs, int64_t min_parallel_macs) {
  if (heads * macs < min_parallel_macs || heads < 2) {
    attend_heads<Isa>(p, 0, heads);  // too little work to share out
    return;
  }
  const int64_t grain = std::max<int64_t>(1, min_parallel_macs / 2 / std::max<int64_t>(macs, 1));
  at::parallel_for(0, heads, grain, [&](int64_t begin, int64_t end) {
    attend_heads<Isa>(p, begin, end);
  });
}

// The operation of both builds (`attend`, `attend_avx2`), on the vector routines of Isa.
template <typename Isa>
at::Tensor attend_with(const at::Tensor& query_in, const at::Tensor& key_in,
                       const at::Tensor& value_in, const std::optional<at::Tensor>& mask,
                       const std::optional<at::Tensor>& bias, std::optional<double> scale,
                       int64_t min_parallel_macs) {
  TORCH_CHECK(Isa::supported(), "this CPU lacks ", Isa::kNeeds);
  const at::Tensor query = unit_last_stride(query_in, "query");
  const at::Tensor key = unit_last_stride(key_in, "key"), value = unit_last_stride(value_in, "value");
  const int64_t b = std::max({query.size(0), key.size(0), value.size(0)});
  const int64_t h = std::max({query.size(1), key.size(1), value.size(1)});
  const int64_t t = query.size(2), s = key.size(2), d = query.size(3), dv = value.size(3);
  TORCH_CHECK(key.size(3) == d && value.size(2) == s, "key (B, H, S, d), value (B, H, S, d_v)");
  const int64_t queries[4] = {b, h, t, d}, keys[4] = {b, h, s, d}, values[4] = {b, h, s, dv};
  const int64_t scores[4] = {b, h, t, s};
  at::Tensor out = at::detail::empty_cpu({b, h, t, dv}, at::kFloat, false, std::nullopt);
  Problem p{query.data_ptr<float>(), key.data_ptr<float>(), value.data_ptr<float>(), nullptr,
            nullptr, out.data_ptr<float>(), broadcast_strides(query, queries, true, "query"),
            broadcast_strides(key, keys, false, "key"),
            broadcast_strides(value, values, false, "value"), {}, {}, h, t, s, d, dv,
            static_cast<float>(scale.has_value() ? *scale : std::sqrt(static_cast<double>(d))),
            !scale.has_value()};
  add_mask_and_bias(p, mask, bias, scores);
  run_heads<Isa>(p, b * h, t * s * (d + dv), min_parallel_macs);
  return out;
}

// Rows of a slot pool (aiayn/attention/slots.py): query (B, H, 1, d) over the first lengths[b]
// keys of key/value row rows[b] of (N, H, C, d) buffers; bias broadcastable to (B, H, 1, S),
// S = max(lengths). Every index is checked before any is read.
template <typename Isa>
at::Tensor attend_rows_with(const at::Tensor& query_in, const at::Tensor& key_in,
                            const at::Tensor& value_in, const at::Tensor& rows,
                            const at::Tensor& lengths, const std::optional<at::Tensor>& bias,
                            std::optional<double> scale, int64_t min_parallel_macs) {
  TORCH_CHECK(Isa::supported(), "this CPU lacks ", Isa::kNeeds);
  const at::Tensor query = unit_last_stride(query_in, "query");
  const at::Tensor key = unit_last_stride(key_in, "key"), value = unit_last_stride(value_in, "value");
  const int64_t b = query.size(0), h = query.size(1), d = query.size(3), dv = value.size(3);
  const int64_t n = key.size(0), c = key.size(2);
  TORCH_CHECK(query.size(2) == 1, "query: one position per row (B, H, 1, d)");
  TORCH_CHECK(key.size(1) == h && value.size(1) == h && key.size(3) == d && value.size(0) == n &&
                  value.size(2) == c, "key (N, H, C, d), value (N, H, C, d_v)");
  for (const at::Tensor* x : {&rows, &lengths})
    TORCH_CHECK(x->scalar_type() == at::kLong && x->dim() == 1 && x->size(0) == b &&
                    x->is_contiguous() && x->device().is_cpu(), "rows, lengths: (B,) int64, CPU");
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  int64_t s = 0;
  for (int64_t i = 0; i < b; ++i) {
    TORCH_CHECK(r[i] >= 0 && r[i] < n, "rows: ", r[i], " outside 0..", n - 1);
    TORCH_CHECK(len[i] >= 0 && len[i] <= c, "lengths: ", len[i], " outside 0..", c);
    s = std::max(s, len[i]);
  }
  const int64_t queries[4] = {b, h, 1, d}, keys[4] = {n, h, c, d}, values[4] = {n, h, c, dv};
  const int64_t scores[4] = {b, h, 1, s};
  at::Tensor out = at::detail::empty_cpu({b, h, 1, dv}, at::kFloat, false, std::nullopt);
  Problem p{query.data_ptr<float>(), key.data_ptr<float>(), value.data_ptr<float>(), nullptr,
            nullptr, out.data_ptr<float>(), broadcast_strides(query, queries, true, "query"),
            broadcast_strides(key, keys, false, "key"),
            broadcast_strides(value, values, false, "value"), {}, {}, h, 1, s, d, dv,
            static_cast<float>(scale.has_value() ? *scale : std::sqrt(static_cast<double>(d))),
            !scale.has_value(), r, len};
  add_mask_and_bias(p, std::nullopt, bias, scores);
  run_heads<Isa>(p, b * h, s * (d + dv), min_parallel_macs);
  return out;
}

}  // namespace

TORCH_LIBRARY(aiayn_attention, m) {
  m.def("supported", &avx512_supported);
  m.def("avx2_supported", &avx2_supported);
  m.def("attend", &attend_with<Avx512>);
  m.def("attend_avx2", &attend_with<Avx2>);
  m.def("attend_rows", &attend_rows_with<Avx512>);
  m.def("attend_rows_avx2", &attend_rows_with<Avx2>);
}

// aiayn's linear kernels for x86 CPUs: int8 and, for a few rows, fp32, each in an AVX-512
// build (int8: VNNI) and an AVX2 + FMA build (the section "AVX2 (+FMA) builds").
//
// int8 (needs VNNI): y = x Wᵀ + b by the W8A8 scheme of
// aiayn/layers/quantized.py (symmetric int8 weights with one scale per output channel,
// activations quantised per row, exact int32 sums), with the activations' quantisation, the
// product and the scaling fused in one call.
//
// Why it exists: with PyTorch operations around a library GEMM, the per-row quantisation and the
// scaling are about ten small calls per layer, which cost more than the product itself when a
// decoding step multiplies a few rows. Here they are one pass over each row and one over the
// weight.
//
// Shape legend:  M rows of the input   K inputs (D_in)   N outputs (D_out)
//                Kp = K rounded up to 4   G = Kp / 4 groups of inputs   NB = ceil(N / 16) blocks
//
// Weight layout (made by aiayn.layers.quantized.vnni_blocks): (NB, G, 16, 4) int8, i.e. for
// each block of 16 output channels and each group of 4 inputs one 64-byte vector, as VNNI's
// u8 x s8 -> s32 instruction (vpdpbusd) reads it; padded with zeros.
// Activations: x_q = round(x / s_x) in [-127, 127], stored as x_q + 128 (unsigned, as vpdpbusd
// wants); the sum then carries 128 * sum_i W[o, i], which `compensation` holds and is subtracted.
// Both sums are exact integers: |sum| <= 255 * 127 * K < 2^31 for K <= 65536 (checked).
// Scaling, in the reference's order and without fused multiply-adds:
//     y = ((float(sum) * s_w[o]) * s_x) + b[o]
// and, where a residual r is given (a sub-layer's residual connection), y + r[o] after that.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kBlock = 16;     // output channels per block: one vector of 16 int32 sums
constexpr int64_t kGroup = 4;      // inputs per vpdpbusd lane
constexpr int64_t kMaxInputs = 65536;
constexpr int kColumns = 4;        // blocks computed together (independent accumulators)
constexpr int kRows = 4;           // rows computed together (each weight vector reused)
constexpr float kQmax = 127.0f;

bool cpu_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni");
}

// One row: s_x = max|x| / 127 (1 for a row of zeros), out[i] = round(x[i] / s_x) + 128, and the
// padding out[K..Kp) = 128 (x_q = 0). Rounding to nearest even, as torch.round.
__attribute__((target("avx512f,avx512bw"))) float quantize_row(
    const float* x, int64_t k, int64_t k_padded, uint8_t* out) {
  __m512 peak = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) peak = _mm512_max_ps(peak, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  float m = _mm512_reduce_max_ps(peak);
  for (; i < k; ++i) m = std::max(m, std::fabs(x[i]));
  const float scale = m > 0.0f ? m / kQmax : 1.0f;
  const __m512 s = _mm512_set1_ps(scale);
  const __m512 lo = _mm512_set1_ps(-kQmax), hi = _mm512_set1_ps(kQmax);
  const __m512i offset = _mm512_set1_epi32(128);
  for (i = 0; i + 16 <= k; i += 16) {
    __m512 q = _mm512_div_ps(_mm512_loadu_ps(x + i), s);
    q = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
    const __m512i u = _mm512_add_epi32(_mm512_cvtps_epi32(q), offset);  // 1..255
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(u));
  }
  for (; i < k; ++i) {
    const float q = std::min(std::max(std::nearbyint(x[i] / scale), -kQmax), kQmax);
    out[i] = static_cast<uint8_t>(static_cast<int>(q) + 128);
  }
  for (; i < k_padded; ++i) out[i] = 128;
  return scale;
}

// Sums of R rows (x, stride kp) against C blocks (w, stride block_bytes) over G groups.
template <int R, int C>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline void tile_sums(
    const uint8_t* x, int64_t kp, const int8_t* w, int64_t block_bytes, int64_t groups,
    __m512i (&acc)[kRows][kColumns]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
  for (int64_t g = 0; g < groups; ++g) {
    __m512i wv[C];
    for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_si512(w + c * block_bytes + g * 64);
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, x + r * kp + g * kGroup, sizeof(four));
      const __m512i a = _mm512_set1_epi32(four);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], a, wv[c]);
    }
  }
}

struct Problem {
  const uint8_t* xu;     // (M, Kp) activations + 128
  const float* sx;       // (M,) activation scales
  const int8_t* w;       // (NB, G, 64) weight blocks
  const int32_t* comp;   // (NB * 16,) 128 * sum_i W[o, i]
  const float* sw;       // (NB * 16,) weight scales
  const float* bias;     // (NB * 16,) or null
  const float* residual; // (M, N) or null: added last
  float* y;              // (M, N)
  int64_t m, n, kp, groups;
};

// y[row0 .. row0+R, blocks b0 .. b0+C) from the int32 sums: the scaling of the reference.
template <int R, int C>
__attribute__((target("avx512f,avx512bw"))) void scale_tile(
    const Problem& p, int64_t row0, int64_t b0, const __m512i (&acc)[kRows][kColumns]) {
  for (int c = 0; c < C; ++c) {
    const int64_t col = (b0 + c) * kBlock;
    const int64_t valid = std::min<int64_t>(kBlock, p.n - col);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
    const __m512i comp = _mm512_loadu_si512(p.comp + col);
    const __m512 sw = _mm512_loadu_ps(p.sw + col);
    for (int r = 0; r < R; ++r) {
      __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][c], comp));
      v = _mm512_mul_ps(v, sw);
      v = _mm512_mul_ps(v, _mm512_set1_ps(p.sx[row0 + r]));
      if (p.bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(p.bias + col));
      const int64_t at = (row0 + r) * p.n + col;
      if (p.residual != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, p.residual + at));
      _mm512_mask_storeu_ps(p.y + at, mask, v);
    }
  }
}

// y[row0 .. row0+R, blocks b0 .. b0+C): the sums, then the scaling.
template <int R, int C>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void tile(
    const Problem& p, int64_t row0, int64_t b0) {
  __m512i acc[kRows][kColumns];
  const int64_t block_bytes = p.groups * 64;
  tile_sums<R, C>(p.xu + row0 * p.kp, p.kp, p.w + b0 * block_bytes, block_bytes, p.groups, acc);
  scale_tile<R, C>(p, row0, b0, acc);
}

template <int C>
void rows_of(const Problem& p, int64_t b0) {
  int64_t r = 0;
  for (; r + kRows <= p.m; r += kRows) tile<kRows, C>(p, r, b0);
  switch (p.m - r) {
    case 3: tile<3, C>(p, r, b0); break;
    case 2: tile<2, C>(p, r, b0); break;
    case 1: tile<1, C>(p, r, b0); break;
    default: break;
  }
}

// Few rows (fewer than kRows): one block at a time, read as one sequential stream, with kLanes
// accumulators per row over interleaved groups (the hardware prefetcher follows one stream
// better than kColumns streams a block apart). Integer sums: the same bits in any order.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void streamed(
    const Problem& p, int64_t b) {
  constexpr int kLanes = 4;
  __m512i acc[R][kLanes];
  for (int r = 0; r < R; ++r)
    for (int a = 0; a < kLanes; ++a) acc[r][a] = _mm512_setzero_si512();
  const int8_t* w = p.w + b * p.groups * 64;
  int64_t g = 0;
  for (; g + kLanes <= p.groups; g += kLanes) {
    for (int a = 0; a < kLanes; ++a) {
      const __m512i wv = _mm512_loadu_si512(w + (g + a) * 64);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, p.xu + r * p.kp + (g + a) * kGroup, sizeof(four));
        acc[r][a] = _mm512_dpbusd_epi32(acc[r][a], _mm512_set1_epi32(four), wv);
      }
    }
  }
  for (; g < p.groups; ++g) {
    const __m512i wv = _mm512_loadu_si512(w + g * 64);
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, p.xu + r * p.kp + g * kGroup, sizeof(four));
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_set1_epi32(four), wv);
    }
  }
  __m512i sums[kRows][kColumns];
  for (int r = 0; r < R; ++r) {
    sums[r][0] = acc[r][0];
    for (int a = 1; a < kLanes; ++a) sums[r][0] = _mm512_add_epi32(sums[r][0], acc[r][a]);
  }
  scale_tile<R, 1>(p, 0, b, sums);
}

void check_operands(const at::Tensor& x, const at::Tensor& blocks, const at::Tensor& comp,
                    const at::Tensor& scales, const std::optional<at::Tensor>& bias, int64_t n) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.is_cpu(),
              "x: a contiguous CPU float32 (M, K) tensor");
  TORCH_CHECK(blocks.dim() == 3 && blocks.size(2) == 64 && blocks.scalar_type() == at::kChar &&
              blocks.is_contiguous(), "blocks: contiguous int8 (NB, G, 64)");
  const int64_t padded = blocks.size(0) * kBlock;
  TORCH_CHECK(n > padded - kBlock && n <= padded, "n does not fit the blocks");
  TORCH_CHECK(x.size(1) <= blocks.size(1) * kGroup && x.size(1) > (blocks.size(1) - 1) * kGroup,
              "x's inputs do not fit the blocks");
  TORCH_CHECK(x.size(1) <= kMaxInputs, "more than 65536 inputs: int32 sums could overflow");
  TORCH_CHECK(comp.scalar_type() == at::kInt && comp.numel() == padded && comp.is_contiguous(),
              "compensation: contiguous int32 (NB * 16,)");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == padded &&
              scales.is_contiguous(), "scales: contiguous float32 (NB * 16,)");
  if (bias.has_value())
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == padded &&
                bias->is_contiguous(), "bias: contiguous float32 (NB * 16,)");
}

void check_residual(const std::optional<at::Tensor>& residual, int64_t m, int64_t n) {
  if (residual.has_value())
    TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->dim() == 2 &&
                residual->size(0) == m && residual->size(1) == n && residual->is_contiguous(),
                "residual: contiguous float32 (M, N)");
}

// (M, K) float32 -> (M, Kp) T and (M,) scales, rows in parallel, each by `row` (x, k, kp, out)
// -> scale: uint8 x_q + 128 (the AVX-512 build) or int8 x_q (the AVX2 build).
template <typename T>
std::tuple<at::Tensor, at::Tensor> quantize_each_row(const at::Tensor& x, int64_t kp,
                                                     at::ScalarType type,
                                                     float (*row)(const float*, int64_t, int64_t, T*)) {
  const int64_t m = x.size(0), k = x.size(1);
  auto xq = at::empty({m, kp}, x.options().dtype(type));
  auto sx = at::empty({m}, x.options());
  const float* src = x.data_ptr<float>();
  T* dst = static_cast<T*>(xq.data_ptr());
  float* scales = sx.data_ptr<float>();
  at::parallel_for(0, m, std::max<int64_t>(1, 4096 / std::max<int64_t>(k, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r)
                       scales[r] = row(src + r * k, k, kp, dst + r * kp);
                   });
  return {xq, sx};
}

// (M, K) float32 -> (M, Kp) uint8 (x_q + 128) and (M,) scales.
std::tuple<at::Tensor, at::Tensor> quantize_padded(const at::Tensor& x, int64_t kp) {
  return quantize_each_row<uint8_t>(x, kp, at::kByte, quantize_row);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& blocks, const at::Tensor& comp,
                  const at::Tensor& scales, const std::optional<at::Tensor>& bias,
                  const std::optional<at::Tensor>& residual, int64_t n) {
  TORCH_CHECK(cpu_supported(), "this CPU lacks AVX-512 VNNI");
  check_operands(x, blocks, comp, scales, bias, n);
  check_residual(residual, x.size(0), n);
  const int64_t m = x.size(0), nb = blocks.size(0), groups = blocks.size(1);
  auto [xu, sx] = quantize_padded(x, groups * kGroup);
  auto y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const Problem p{xu.data_ptr<uint8_t>(), sx.data_ptr<float>(), blocks.data_ptr<int8_t>(),
                  comp.data_ptr<int32_t>(), scales.data_ptr<float>(),
                  bias.has_value() ? bias->data_ptr<float>() : nullptr,
                  residual.has_value() ? residual->data_ptr<float>() : nullptr, y.data_ptr<float>(),
                  m, n, groups * kGroup, groups};
  if (m < kRows) {  // a few rows: each block as one stream
    at::parallel_for(0, nb, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        if (m == 1) streamed<1>(p, b);
        else if (m == 2) streamed<2>(p, b);
        else streamed<3>(p, b);
      }
    });
    return y;
  }
  const int64_t units = (nb + kColumns - 1) / kColumns;  // kColumns blocks per unit
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t b0 = u * kColumns;
      if (b0 + kColumns <= nb) {
        rows_of<kColumns>(p, b0);
      } else {
        for (int64_t b = b0; b < nb; ++b) rows_of<1>(p, b);
      }
    }
  });
  return y;
}

// (M, K) float32 -> (M, K) uint8 holding x_q + 128, and the (M,) scales: the activations of
// the scheme for a library kernel that takes unsigned inputs with zero point 128.
std::tuple<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x) {
  TORCH_CHECK(cpu_supported(), "this CPU lacks AVX-512 VNNI");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.is_cpu(),
              "x: a contiguous CPU float32 (M, K) tensor");
  return quantize_padded(x, x.size(1));
}

// ------------------------------------------------------------------ fp32, for a few rows
// y = x Wᵀ + b (+ r), fp32, for the few rows of a decoding step, where a product reads each
// weight once and its time is the time to read the weight: the weight is laid out so that each
// thread reads one sequential stream. Layout (made by aiayn.kernels.linear.fp32_blocks):
// (NB, K, 16) float32, for each block of 16 output channels input by input the 16 weights,
// zero-padded channels. Per row and block, kLanes partial sums over interleaved inputs (fused
// multiply-adds), added pairwise, then the bias, then the residual r: the same products as
// x Wᵀ, summed in another order (as any BLAS's blocking sums them in its own).

bool fp32_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

struct Fp32Problem {
  const float* x;         // (M, K)
  const float* w;         // (NB, K, 16)
  const float* bias;      // (NB * 16,) or null
  const float* residual;  // (M, N) or null
  float* y;               // (M, N)
  int64_t m, n, k;
};

// Rows row0 .. row0+R of block b.
template <int R>
__attribute__((target("avx512f"))) void fp32_tile(const Fp32Problem& p, int64_t row0, int64_t b) {
  constexpr int kLanes = 4;
  __m512 acc[R][kLanes];
  for (int r = 0; r < R; ++r)
    for (int a = 0; a < kLanes; ++a) acc[r][a] = _mm512_setzero_ps();
  const float* w = p.w + b * p.k * kBlock;
  const float* x = p.x + row0 * p.k;
  int64_t i = 0;
  for (; i + kLanes <= p.k; i += kLanes)
    for (int a = 0; a < kLanes; ++a) {
      const __m512 wv = _mm512_loadu_ps(w + (i + a) * kBlock);
      for (int r = 0; r < R; ++r)
        acc[r][a] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * p.k + i + a]), wv, acc[r][a]);
    }
  for (; i < p.k; ++i) {
    const __m512 wv = _mm512_loadu_ps(w + i * kBlock);
    for (int r = 0; r < R; ++r)
      acc[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * p.k + i]), wv, acc[r][0]);
  }
  const int64_t col = b * kBlock;
  const __mmask16 mask = static_cast<__mmask16>((1u << std::min<int64_t>(kBlock, p.n - col)) - 1u);
  for (int r = 0; r < R; ++r) {
    __m512 v = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
    if (p.bias != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(p.bias + col));
    const int64_t at = (row0 + r) * p.n + col;
    if (p.residual != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, p.residual + at));
    _mm512_mask_storeu_ps(p.y + at, mask, v);
  }
}

void fp32_block(const Fp32Problem& p, int64_t b) {
  int64_t r = 0;
  for (; r + kRows <= p.m; r += kRows) fp32_tile<kRows>(p, r, b);
  switch (p.m - r) {
    case 3: fp32_tile<3>(p, r, b); break;
    case 2: fp32_tile<2>(p, r, b); break;
    case 1: fp32_tile<1>(p, r, b); break;
    default: break;
  }
}


// ------------------------------------------------------------------ AVX2 (+FMA) builds
// The same two products for CPUs with AVX2 but no AVX-512 (AMD Zen 1-3, Intel client CPUs),
// on the same weight layouts.
//
// int8: AVX2's only 8-bit product, vpmaddubsw (u8 x s8, adjacent pairs summed into a saturating
// int16), would saturate on x_q + 128 (255 * 127 * 2 > 32767): that is where library kernels
// built on it lose exactness on such CPUs. Here the product of signed x and w is taken as
// |w| * (x * sign(w)) (vpsignb), whose factors are both within [-127, 127] because the scheme
// never uses -128: a pair sums to at most 2 * 127 * 127 = 32258, which int16 holds. vpmaddwd
// by ones then widens each pair-of-pairs to int32: every sum is exact, so the result has the
// reference's bits. Activations are quantised signed (x_q, padding 0): no compensation.

constexpr int64_t kHalf = 8;  // int32 sums (or floats) per 256-bit vector: half a block

bool avx2_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

#define AVX2 __attribute__((target("avx2,fma")))

// One row: s_x = max|x| / 127 (1 for a row of zeros), out[i] = round(x[i] / s_x) as int8, and
// the padding out[K..Kp) = 0. Rounding to nearest even, as torch.round.
AVX2 float quantize_row_signed(const float* x, int64_t k, int64_t k_padded, int8_t* out) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  __m256 peak = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) peak = _mm256_max_ps(peak, _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(x + i)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, peak);
  float m = 0.0f;
  for (float v : lanes) m = std::max(m, v);
  for (; i < k; ++i) m = std::max(m, std::fabs(x[i]));
  const float scale = m > 0.0f ? m / kQmax : 1.0f;
  const __m256 s = _mm256_set1_ps(scale);
  const __m256 lo = _mm256_set1_ps(-kQmax), hi = _mm256_set1_ps(kQmax);
  for (i = 0; i + 8 <= k; i += 8) {
    __m256 q = _mm256_div_ps(_mm256_loadu_ps(x + i), s);
    q = _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
    const __m256i v = _mm256_cvtps_epi32(q);  // 8 int32 in [-127, 127]
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i w8 = _mm_packs_epi16(w16, w16);  // 8 int8 in the low half
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), w8);
  }
  for (; i < k; ++i)
    out[i] = static_cast<int8_t>(std::min(std::max(std::nearbyint(x[i] / scale), -kQmax), kQmax));
  for (; i < k_padded; ++i) out[i] = 0;
  return scale;
}

// acc += the exact int32 sums of 4 inputs x (broadcast) against 8 channels' 4 weights each.
AVX2 inline __m256i add_group(__m256i acc, __m256i x, __m256i w, __m256i w_abs) {
  const __m256i pairs = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w));  // exact: see above
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

struct SignedProblem {
  const int8_t* xq;       // (M, Kp) activations x_q, padding 0
  const float* sx;        // (M,) activation scales
  const int8_t* w;        // (NB, G, 64) weight blocks
  const float* sw;        // (NB * 16,) weight scales
  const float* bias;      // (NB * 16,) or null
  const float* residual;  // (M, N) or null: added last
  float* y;               // (M, N)
  int64_t m, n, kp, groups;
};

// y[row0 + r, block b] for r < R from the sums acc[r][half]: the scaling of the reference.
template <int R>
AVX2 void scale_block(const SignedProblem& p, int64_t row0, int64_t b, const __m256i (&acc)[4][2]) {
  const int64_t col = b * kBlock, valid = std::min<int64_t>(kBlock, p.n - col);
  for (int r = 0; r < R; ++r) {
    alignas(32) float v[kBlock];
    const __m256 sx = _mm256_set1_ps(p.sx[row0 + r]);
    for (int h = 0; h < 2; ++h) {
      __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][h]), _mm256_loadu_ps(p.sw + col + h * kHalf));
      f = _mm256_mul_ps(f, sx);
      if (p.bias != nullptr) f = _mm256_add_ps(f, _mm256_loadu_ps(p.bias + col + h * kHalf));
      _mm256_store_ps(v + h * kHalf, f);
    }
    float* y = p.y + (row0 + r) * p.n + col;
    const float* res = p.residual != nullptr ? p.residual + (row0 + r) * p.n + col : nullptr;
    for (int64_t c = 0; c < valid; ++c) y[c] = res != nullptr ? v[c] + res[c] : v[c];
  }
}

// Rows row0 .. row0+R of block b: L interleaved sums per row and half (independent chains).
template <int R, int L>
AVX2 void signed_tile(const SignedProblem& p, int64_t row0, int64_t b) {
  __m256i acc[R][L][2];
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < L; ++l) acc[r][l][0] = acc[r][l][1] = _mm256_setzero_si256();
  const int8_t* w = p.w + b * p.groups * 64;
  const int8_t* x = p.xq + row0 * p.kp;
  int64_t g = 0;
  for (; g + L <= p.groups; g += L)
    for (int l = 0; l < L; ++l) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (g + l) * 64));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (g + l) * 64 + 32));
      const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, x + r * p.kp + (g + l) * kGroup, sizeof(four));
        const __m256i xb = _mm256_set1_epi32(four);
        acc[r][l][0] = add_group(acc[r][l][0], xb, w0, a0);
        acc[r][l][1] = add_group(acc[r][l][1], xb, w1, a1);
      }
    }
  for (; g < p.groups; ++g) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64 + 32));
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, x + r * p.kp + g * kGroup, sizeof(four));
      const __m256i xb = _mm256_set1_epi32(four);
      acc[r][0][0] = add_group(acc[r][0][0], xb, w0, _mm256_abs_epi8(w0));
      acc[r][0][1] = add_group(acc[r][0][1], xb, w1, _mm256_abs_epi8(w1));
    }
  }
  __m256i sums[4][2];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      sums[r][h] = acc[r][0][h];
      for (int l = 1; l < L; ++l) sums[r][h] = _mm256_add_epi32(sums[r][h], acc[r][l][h]);
    }
  scale_block<R>(p, row0, b, sums);
}

// Rows [begin, end) of block b, four at a time.
void signed_rows(const SignedProblem& p, int64_t begin, int64_t end, int64_t b) {
  int64_t r = begin;
  for (; r + kRows <= end; r += kRows) signed_tile<kRows, 1>(p, r, b);
  switch (end - r) {
    case 3: signed_tile<3, 1>(p, r, b); break;
    case 2: signed_tile<2, 2>(p, r, b); break;
    case 1: signed_tile<1, 2>(p, r, b); break;
    default: break;
  }
}

// (M, K) float32 -> (M, Kp) int8 x_q (padding 0) and (M,) scales.
std::tuple<at::Tensor, at::Tensor> quantize_signed(const at::Tensor& x, int64_t kp) {
  return quantize_each_row<int8_t>(x, kp, at::kChar, quantize_row_signed);
}

constexpr int64_t kRowChunk = 64;  // rows a thread's share of a block runs over at once

// The int8 product on AVX2: the same operands and result as `linear` (the compensation, which
// this build needs not, is checked and left unused).
at::Tensor linear_avx2(const at::Tensor& x, const at::Tensor& blocks, const at::Tensor& comp,
                       const at::Tensor& scales, const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& residual, int64_t n) {
  TORCH_CHECK(avx2_supported(), "this CPU lacks AVX2 and FMA");
  check_operands(x, blocks, comp, scales, bias, n);
  check_residual(residual, x.size(0), n);
  const int64_t m = x.size(0), nb = blocks.size(0), groups = blocks.size(1);
  auto [xq, sx] = quantize_signed(x, groups * kGroup);
  auto y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const SignedProblem p{xq.data_ptr<int8_t>(), sx.data_ptr<float>(), blocks.data_ptr<int8_t>(),
                        scales.data_ptr<float>(), bias.has_value() ? bias->data_ptr<float>() : nullptr,
                        residual.has_value() ? residual->data_ptr<float>() : nullptr,
                        y.data_ptr<float>(), m, n, groups * kGroup, groups};
  const int64_t chunks = (m + kRowChunk - 1) / kRowChunk;  // units: (chunk, block), block fastest
  at::parallel_for(0, chunks * nb, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t row0 = (u / nb) * kRowChunk;
      signed_rows(p, row0, std::min(m, row0 + kRowChunk), u % nb);
    }
  });
  return y;
}

// fp32, a few rows: rows row0 .. row0+R of block b, L interleaved sums per row and half.
template <int R, int L>
AVX2 void fp32_tile_avx2(const Fp32Problem& p, int64_t row0, int64_t b) {
  __m256 acc[R][L][2];
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < L; ++l) acc[r][l][0] = acc[r][l][1] = _mm256_setzero_ps();
  const float* w = p.w + b * p.k * kBlock;
  const float* x = p.x + row0 * p.k;
  int64_t i = 0;
  for (; i + L <= p.k; i += L)
    for (int l = 0; l < L; ++l) {
      const __m256 w0 = _mm256_loadu_ps(w + (i + l) * kBlock);
      const __m256 w1 = _mm256_loadu_ps(w + (i + l) * kBlock + kHalf);
      for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_set1_ps(x[r * p.k + i + l]);
        acc[r][l][0] = _mm256_fmadd_ps(xv, w0, acc[r][l][0]);
        acc[r][l][1] = _mm256_fmadd_ps(xv, w1, acc[r][l][1]);
      }
    }
  for (; i < p.k; ++i)
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_set1_ps(x[r * p.k + i]);
      acc[r][0][0] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + i * kBlock), acc[r][0][0]);
      acc[r][0][1] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + i * kBlock + kHalf), acc[r][0][1]);
    }
  const int64_t col = b * kBlock, valid = std::min<int64_t>(kBlock, p.n - col);
  for (int r = 0; r < R; ++r) {
    alignas(32) float v[kBlock];
    for (int h = 0; h < 2; ++h) {
      __m256 sum = acc[r][0][h];
      for (int l = 1; l < L; ++l) sum = _mm256_add_ps(sum, acc[r][l][h]);
      if (p.bias != nullptr) sum = _mm256_add_ps(sum, _mm256_loadu_ps(p.bias + col + h * kHalf));
      _mm256_store_ps(v + h * kHalf, sum);
    }
    float* y = p.y + (row0 + r) * p.n + col;
    const float* res = p.residual != nullptr ? p.residual + (row0 + r) * p.n + col : nullptr;
    for (int64_t c = 0; c < valid; ++c) y[c] = res != nullptr ? v[c] + res[c] : v[c];
  }
}

void fp32_block_avx2(const Fp32Problem& p, int64_t b) {
  int64_t r = 0;
  for (; r + 4 <= p.m; r += 4) fp32_tile_avx2<4, 1>(p, r, b);
  switch (p.m - r) {
    case 3: fp32_tile_avx2<3, 1>(p, r, b); break;
    case 2: fp32_tile_avx2<2, 2>(p, r, b); break;
    case 1: fp32_tile_avx2<1, 4>(p, r, b); break;
    default: break;
  }
}


// The fp32 product of either build: `block` computes one block of 16 output channels.
at::Tensor fp32_product(const at::Tensor& x, const at::Tensor& blocks,
                        const std::optional<at::Tensor>& bias,
                        const std::optional<at::Tensor>& residual, int64_t n,
                        void (*block)(const Fp32Problem&, int64_t)) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.is_cpu(),
              "x: a contiguous CPU float32 (M, K) tensor");
  TORCH_CHECK(blocks.dim() == 3 && blocks.size(2) == kBlock && blocks.size(1) == x.size(1) &&
              blocks.scalar_type() == at::kFloat && blocks.is_contiguous(),
              "blocks: contiguous float32 (NB, K, 16) with x's K");
  const int64_t padded = blocks.size(0) * kBlock;
  TORCH_CHECK(n > padded - kBlock && n <= padded, "n does not fit the blocks");
  if (bias.has_value())
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == padded &&
                bias->is_contiguous(), "bias: contiguous float32 (NB * 16,)");
  check_residual(residual, x.size(0), n);
  const int64_t m = x.size(0), k = x.size(1), nb = blocks.size(0);
  auto y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const Fp32Problem p{x.data_ptr<float>(), blocks.data_ptr<float>(),
                      bias.has_value() ? bias->data_ptr<float>() : nullptr,
                      residual.has_value() ? residual->data_ptr<float>() : nullptr,
                      y.data_ptr<float>(), m, n, k};
  // a thread takes at least 64 KiB of weights: smaller shares cost more to hand out than to read
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(k * kBlock * 4, 1));
  at::parallel_for(0, nb, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) block(p, b);
  });
  return y;
}


at::Tensor linear_fp32(const at::Tensor& x, const at::Tensor& blocks,
                       const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& residual, int64_t n) {
  TORCH_CHECK(fp32_supported(), "this CPU lacks AVX-512");
  return fp32_product(x, blocks, bias, residual, n, fp32_block);
}

at::Tensor linear_fp32_avx2(const at::Tensor& x, const at::Tensor& blocks,
                            const std::optional<at::Tensor>& bias,
                            const std::optional<at::Tensor>& residual, int64_t n) {
  TORCH_CHECK(avx2_supported(), "this CPU lacks AVX2 and FMA");
  return fp32_product(x, blocks, bias, residual, n, fp32_block_avx2);
}

bool int8_supported() { return cpu_supported(); }

}  // namespace

TORCH_LIBRARY(aiayn_linear, m) {
  m.def("int8_supported", &int8_supported);
  m.def("fp32_supported", &fp32_supported);
  m.def("linear_fp32", &linear_fp32);
  m.def("linear", &linear);
  m.def("avx2_supported", &avx2_supported);
  m.def("linear_avx2", &linear_avx2);
  m.def("linear_fp32_avx2", &linear_fp32_avx2);
  m.def("quantize_rows", &quantize_rows);
}

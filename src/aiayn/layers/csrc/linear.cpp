// aiayn's linear kernels for x86 CPUs with AVX-512: int8 (VNNI) and, for a few rows, fp32.
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

// (M, K) float32 -> (M, Kp) uint8 (x_q + 128) and (M,) scales, rows in parallel.
std::tuple<at::Tensor, at::Tensor> quantize_padded(const at::Tensor& x, int64_t kp) {
  const int64_t m = x.size(0), k = x.size(1);
  auto xu = at::empty({m, kp}, x.options().dtype(at::kByte));
  auto sx = at::empty({m}, x.options());
  const float* src = x.data_ptr<float>();
  uint8_t* dst = xu.data_ptr<uint8_t>();
  float* scales = sx.data_ptr<float>();
  at::parallel_for(0, m, std::max<int64_t>(1, 4096 / std::max<int64_t>(k, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r)
                       scales[r] = quantize_row(src + r * k, k, kp, dst + r * kp);
                   });
  return {xu, sx};
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
// thread reads one sequential stream. Layout (made by aiayn.layers.native.fp32_blocks):
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

at::Tensor linear_fp32(const at::Tensor& x, const at::Tensor& blocks,
                       const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& residual, int64_t n) {
  TORCH_CHECK(fp32_supported(), "this CPU lacks AVX-512");
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
    for (int64_t b = begin; b < end; ++b) fp32_block(p, b);
  });
  return y;
}

bool int8_supported() { return cpu_supported(); }

}  // namespace

TORCH_LIBRARY(aiayn_linear, m) {
  m.def("int8_supported", &int8_supported);
  m.def("fp32_supported", &fp32_supported);
  m.def("linear_fp32", &linear_fp32);
  m.def("linear", &linear);
  m.def("quantize_rows", &quantize_rows);
}

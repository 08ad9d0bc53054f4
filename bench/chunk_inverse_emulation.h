// The chunk inverse X = (I + L)^{-1} (L = diag(beta) StrictLower(K K^T), one 64-token chunk) as the
// kernels form it (warpgroup_inverse.cuh in v5, chunk_inverse.cuh): the 16 x 16 diagonal blocks by
// fp32 substitution, then the 16 -> 32 and 32 -> 64 merges as tensor-core products in one of the
// formats below with fp32 accumulation, every X entry kept in the format's tile between the steps.
// Emulated in float64 with explicit roundings, for bench/forward_precision.cpp and
// bench/precision_study.cpp.
#pragma once

#include <cmath>
#include <vector>

namespace flashgdn::bench {

constexpr int kInverseChunk = 64;

// x rounded to `bits` significant bits (round to nearest even); beyond `max`, infinity.
inline double round_bits(double x, int bits, double max = 3.0e38) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, bits - e)), e - bits);
  return std::fabs(r) > max ? std::copysign(INFINITY, r) : r;
}
inline double round_fp32(double x) { return static_cast<double>(static_cast<float>(x)); }

// How the merges' operands reach the tensor cores.
struct InverseFormat {
  const char* name;
  int bits;    // significant bits of one part
  double max;  // the format's largest finite value
  bool split;  // hi + lo parts, products hi.hi + hi.lo + lo.hi
  bool exact;  // no emulation: X in float64
};
//   exact    the floor
//   bf16x3   split bf16 products (the fp32 inverse: the backward's, and inverse_fp32=True)
//   bf16x1   single bf16 products
//   fp16x1   single fp16 products (the bf16 inverse's merges since candidate-s35 / s41; range 65504)
constexpr InverseFormat kInverseExact{"exact", 53, 1e308, false, true};
constexpr InverseFormat kInverseBf16x3{"bf16x3", 8, 3.0e38, true, false};
constexpr InverseFormat kInverseBf16x1{"bf16x1", 8, 3.0e38, false, false};
constexpr InverseFormat kInverseFp16x1{"fp16x1", 11, 65504.0, false, false};

struct InverseOperand {
  double hi = 0.0, lo = 0.0;
};
inline InverseOperand inverse_operand(double x, const InverseFormat& f) {
  InverseOperand o;
  o.hi = round_bits(x, f.bits, f.max);
  if (f.split) o.lo = round_bits(x - o.hi, f.bits, f.max);
  return o;
}
inline double operand_product(const InverseOperand& a, const InverseOperand& b) {
  return a.hi * b.hi + a.hi * b.lo + a.lo * b.hi;
}

// X = (I + L)^{-1}, L strictly lower [64][64] row-major (fp32 values; a partial chunk's rows past its
// end zero, as the kernels pad them), in format f (not exact: the caller has the float64 inverse).
inline std::vector<double> emulated_inverse(const std::vector<double>& l, const InverseFormat& f) {
  constexpr int kC = kInverseChunk;
  std::vector<double> x(kC * kC, 0.0);
  auto stored = [&](double v) {  // an X entry as its tile keeps it (what later products read)
    const InverseOperand o = inverse_operand(round_fp32(v), f);
    return o.hi + o.lo;
  };
  // the diagonal blocks: column-oriented substitution in fp32
  for (int w = 0; w < 4; ++w)
    for (int c = 0; c < 16; ++c) {
      float col[16];
      for (int i = 0; i < 16; ++i) col[i] = i == c ? 1.f : 0.f;
      for (int j = 0; j < 15; ++j)
        for (int i = j + 1; i < 16; ++i) col[i] -= static_cast<float>(l[(16 * w + i) * kC + 16 * w + j]) * col[j];
      for (int i = 0; i < 16; ++i) x[(16 * w + i) * kC + 16 * w + c] = stored(col[i]);
    }
  // [rows r0.., cols c0..] @ [rows k0.., cols n0..], k over `depth`: fp32 sums of the operands' products
  auto gemm = [&](const std::vector<double>& a, int r0, int c0, const std::vector<double>& b, int k0, int n0, int rows,
                  int cols, int depth, std::vector<double>& out) {
    out.assign(rows * cols, 0.0);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) {
        double sum = 0.0;
        for (int k = 0; k < depth; ++k)
          sum += operand_product(inverse_operand(a[(r0 + i) * kC + c0 + k], f),
                                 inverse_operand(b[(k0 + k) * kC + n0 + j], f));
        out[i * cols + j] = round_fp32(sum);
      }
  };
  // T as the next product's B operand, from a [rows][cols] scratch into a kC-pitched matrix
  auto as_matrix = [&](const std::vector<double>& t, int rows, int cols) {
    std::vector<double> m(kC * kC, 0.0);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) m[i * kC + j] = t[i * cols + j];
    return m;
  };
  std::vector<double> t, y;
  // 16 -> 32: X_{b,b-1} = -X_bb (L_{b,b-1} X_{b-1,b-1}), b = 1, 3
  for (int b : {1, 3}) {
    const int r0 = 16 * b;
    gemm(l, r0, r0 - 16, x, r0 - 16, r0 - 16, 16, 16, 16, t);
    gemm(x, r0, r0, as_matrix(t, 16, 16), 0, 0, 16, 16, 16, y);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j) x[(r0 + i) * kC + r0 - 16 + j] = stored(-y[i * 16 + j]);
  }
  // 32 -> 64: T = L[32:64, 0:32] X_A; X[32:64, 0:32] = -X_B T
  gemm(l, 32, 0, x, 0, 0, 32, 32, 32, t);
  gemm(x, 32, 32, as_matrix(t, 32, 32), 0, 0, 32, 32, 32, y);
  for (int i = 0; i < 32; ++i)
    for (int j = 0; j < 32; ++j) x[(32 + i) * kC + j] = stored(-y[i * 32 + j]);
  return x;
}

}  // namespace flashgdn::bench

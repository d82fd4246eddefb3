// Stage 07 (new): bfloat16 products, the VNNI-2 layout and the loop nest around
// the bf16 batch-reduce kernel of kernel.h (section 1b).
//
// ---- Why VNNI-2 ----------------------------------------------------------------------
//
// A bf16 dot-product instruction (AVX512-BF16's VDPBF16PS) takes, in each 32-bit lane of its
// two source registers, a PAIR of bf16 values, multiplies the pairs lane by lane and adds both
// products into the lane's fp32 accumulator:
//
//     acc[i] (fp32) += a[i].lo * b.lo + a[i].hi * b.hi        16 lanes: 32 multiply-adds, 1 instr.
//
// So the two values of a pair must be neighbours in memory: the pair is two consecutive k of
// the same row i of A. A column-major A (m x k) holds neighbours in m, not in k; VNNI-2 packs
// it so that A(i, 2p) and A(i, 2p+1) sit side by side, rows of pairs one after another:
//
//     A (m x k), column-major                 VNNI-2: [k/2][m][2]  (lda = m, counted in rows)
//          k=0  k=1  k=2  k=3                 pair row p=0:  a00 a01 | a10 a11 | a20 a21 | ...
//     i=0  a00  a01  a02  a03        -->      pair row p=1:  a02 a03 | a12 a13 | a22 a23 | ...
//     i=1  a10  a11  a12  a13                 one 32-bit lane = one (i, p) pair: a register of 16
//     i=2  a20  a21  a22  a23                 lanes is 16 rows i of one pair row, loaded at once
//
// An odd k gets one zero column (k rounded up to even: vnni_k), and B gets the matching zero row.
// The kernel then loads 16 lanes of A (16 rows, one pair row), broadcasts one pair of B (k = 2p,
// 2p+1 of one column j) to all lanes, and issues VDPBF16PS: 32 multiply-adds per instruction
// against 16 for an fp32 FMA of the same width, hence twice the peak.
//
// Napkin maths for one 128 x 64 tile (the AVX-512 blocking), K = 1024: 2 x 128 x 64 x 1024 =
// 16.8 MFLOP; A's panel is 128 x 1024 x 2 B = 256 KB in bf16 (512 KB in fp32), B's block 128 KB:
// half the bytes of fp32 for the same FLOPs, so the same L2 bandwidth feeds twice the FLOP rate.
// The accumulator stays fp32 (a 32 KB tile, in L1 on Zen 5) and is rounded to bf16 once, at the end.
//
// ---- The loop nest (VnniGemm::run) ------------------------------------------------------
//
// As BlockedGemm (blocked_gemm.h), a tile of the thread's own per C tile, with these differences:
//   - B is read where the caller laid it out (padded to an even number of rows), not packed per
//     thread, and K is not cut into chunks;
//   - a tile's whole k loop is ONE call of a batch-reduce kernel: count = K / bk blocks of A and
//     B at fixed strides, added into one fp32 tile; a tail k block (K not a multiple of bk) is a
//     second call with count 1;
//   - the tile is fp32 (zeroed first), and the epilogue adds the bias in fp32 and rounds to bf16
//     once, writing the output tile.
// The kernel is either LIBXSMM's JIT code or reference_batch_reduce below, plain C++ loops that read
// the same packed panels and accumulate in fp32 (not bit for bit in VDPBF16PS's order): the "reference" path runs the
// whole layout, loop nest and rounding on any CPU (tests), at scalar speed.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <vector>

#include "kernel.h"

namespace tpp {

using bf16 = c10::BFloat16;  // the same 16 bits as libxsmm_bfloat16: the top half of an fp32
static_assert(sizeof(bf16) == sizeof(libxsmm_bfloat16), "bf16 is 2 bytes");

// ---- 2b. VNNI-2 packing ---------------------------------------------------------------

inline idx vnni_k(idx i_k) { return i_k + (i_k & 1); }  // k rounded up to even

// Packs A (M x K) into panels of bm rows, each panel VNNI-2 [vnni_k(K)/2][bm][2]:
//   packed[mb][p][i][t] = A(mb*bm + i, 2p + t), zero where 2p + t >= K or mb*bm + i >= M.
// A is read where it lies: A(i, k) = i_src[i * i_stride_i + k * i_stride_k]. Returns the
// number of elements written: ceil(M / bm) * bm * vnni_k(K).
inline idx pack_vnni2(const bf16* i_src, idx M, idx K, idx i_stride_i, idx i_stride_k, idx i_bm, bf16* o_dst) {
  const idx l_pairs = vnni_k(K) / 2, l_panels = (M + i_bm - 1) / i_bm;
  at::parallel_for(/*begin=*/0, /*end=*/l_panels, /*grain_size=*/1, [&](idx i_first, idx i_last) {
    for (idx l_mb = i_first; l_mb < i_last; l_mb++) {
      bf16* l_panel = o_dst + l_mb * i_bm * 2 * l_pairs;
      const idx l_rows = std::min(i_bm, M - l_mb * i_bm);
      for (idx l_i = 0; l_i < i_bm; l_i++) {
        const bf16* l_row = i_src + (l_mb * i_bm + l_i) * i_stride_i;
        for (idx l_k = 0; l_k < 2 * l_pairs; l_k++) {
          const bool l_inside = l_i < l_rows && l_k < K;
          l_panel[((l_k / 2) * i_bm + l_i) * 2 + (l_k & 1)] = l_inside ? l_row[l_k * i_stride_k] : bf16(0.0f);
        }
      }
    }
  });
  return l_panels * i_bm * 2 * l_pairs;
}

// ---- 2c. The reference micro-kernel: what the JIT kernel computes, in plain C++ --------

// C (m x n, fp32, ldc) += sum_r A_r . B_r, A_r VNNI-2 (lda rows), B_r column-major bf16 (ldb);
// every product and sum in fp32, each pair summed before it is added to C. VDPBF16PS adds the
// two products to C one after the other and flushes denormals, so the last bits may differ from
// the JIT kernel's; the tests compare within fp32 rounding. k is even.
inline void reference_batch_reduce(const Bf16KernelShape& s, const bf16* a, const bf16* b, float* c, idx i_count) {
  for (idx l_r = 0; l_r < i_count; l_r++) {
    const bf16* l_a = a + l_r * s.stride_a;
    const bf16* l_b = b + l_r * s.stride_b;
    for (idx l_j = 0; l_j < s.n; l_j++) {
      for (idx l_p = 0; l_p < s.k / 2; l_p++) {
        const float l_b0 = l_b[2 * l_p + l_j * s.ldb], l_b1 = l_b[2 * l_p + 1 + l_j * s.ldb];
        const bf16* l_pair = l_a + l_p * s.lda * 2;
        for (idx l_i = 0; l_i < s.m; l_i++) {
          c[l_i + l_j * s.ldc] += float(l_pair[2 * l_i]) * l_b0 + float(l_pair[2 * l_i + 1]) * l_b1;
        }
      }
    }
  }
}

// One kernel of the loop nest: LIBXSMM's JIT code, or (jit == nullptr) the reference.
struct Bf16Kernel {
  Bf16Fn jit = nullptr;
  Bf16KernelShape shape{};
  void operator()(const bf16* a, const bf16* b, float* c, idx i_count) const {
    if (jit != nullptr) {
      const unsigned long long l_count = i_count;
      jit(reinterpret_cast<const libxsmm_bfloat16*>(a), reinterpret_cast<const libxsmm_bfloat16*>(b), c, &l_count);
    } else {
      reference_batch_reduce(shape, a, b, c, i_count);
    }
  }
};

// ---- 2d. The bf16 loop nest ---------------------------------------------------------------

// C (M x N, bf16, ldc) = A (M x K) . B (K x N) (+ bias per row), column-major. A: VNNI-2 panels
// of bm rows (pack_vnni2); B: column-major bf16 with ldb, K rows rounded up to even (zero row).
struct VnniGemm {
  idx M = 0, N = 0, K = 0;     // K: already rounded up to even
  idx bm = 1, bn = 1, bk = 2;  // bk even
  idx nM = 0, nN = 0, nK_full = 0, k_tail = 0;
  idx ldb = 0, ldc = 0;
  bool n_outer = false;
  Bf16Kernel kernels[2][2][2] = {};  // [row tail][column tail][0: bk-deep blocks, 1: the k tail]

  // i_kernel(Bf16KernelShape) -> Bf16Kernel: the state's cached lookup (JIT or reference).
  template <typename GetKernel>
  VnniGemm(idx i_M, idx i_N, idx i_K, Blocking i_blocking, bool i_n_outer, idx i_ldb, idx i_ldc, GetKernel&& i_kernel)
      : M(i_M), N(i_N), K(vnni_k(i_K)), ldb(i_ldb), ldc(i_ldc), n_outer(i_n_outer) {
    bm = std::clamp<idx>(i_blocking.bm, 1, std::max<idx>(1, M));
    bn = std::clamp<idx>(i_blocking.bn, 1, std::max<idx>(1, N));
    const idx l_bk = i_blocking.bk > 0 ? i_blocking.bk : (K <= 1024 ? K : 256);
    bk = vnni_k(std::clamp<idx>(l_bk, 2, std::max<idx>(2, K)));  // VNNI-2: whole pairs
    nM = (M + bm - 1) / bm;
    nN = (N + bn - 1) / bn;
    nK_full = K / bk;
    k_tail = K - nK_full * bk;  // even
    if (M == 0 || N == 0 || K == 0) return;
    const idx l_size_m[2] = {bm, M - (nM - 1) * bm}, l_size_n[2] = {bn, N - (nN - 1) * bn};
    for (int l_tm = 0; l_tm < 2; l_tm++) {
      for (int l_tn = 0; l_tn < 2; l_tn++) {
        for (int l_tk = 0; l_tk < 2; l_tk++) {
          const idx l_k = l_tk ? k_tail : bk;
          if (l_k == 0 || (l_tk == 0 && nK_full == 0)) continue;  // never called
          // A blocks: bk/2 pair rows of bm pairs apart; B blocks: bk rows apart; C: the fp32 tile.
          kernels[l_tm][l_tn][l_tk] = i_kernel(Bf16KernelShape{l_size_m[l_tm], l_size_n[l_tn], l_k, /*lda=*/bm,
                                                               ldb, /*ldc=*/bm, /*stride_a=*/bk * bm, /*stride_b=*/bk});
        }
      }
    }
  }

  idx rows(idx i_mb) const { return std::min(bm, M - i_mb * bm); }
  idx columns(idx i_nb) const { return std::min(bn, N - i_nb * bn); }

  // Every tile: zero an fp32 tile, one batch-reduce call over the bk-deep blocks, one for the k
  // tail, then C = bf16(tile + bias), the only rounding. i_bias: fp32, M values, or nullptr.
  void run(const bf16* i_panels, const bf16* i_b, bf16* o_c, const float* i_bias) const {
    if (M == 0 || N == 0) return;
    at::parallel_for(/*begin=*/0, /*end=*/nM * nN, /*grain_size=*/1, [&](idx i_first, idx i_last) {
      std::vector<float> l_tile(bm * bn);  // this thread's accumulator, ld = bm
      for (idx l_t = i_first; l_t < i_last; l_t++) {
        const idx l_mb = n_outer ? l_t % nM : l_t / nN, l_nb = n_outer ? l_t / nM : l_t % nN;
        const int l_tm = l_mb == nM - 1 && rows(l_mb) != bm, l_tn = l_nb == nN - 1 && columns(l_nb) != bn;
        std::fill(l_tile.begin(), l_tile.end(), 0.0f);
        const bf16* l_a = i_panels + l_mb * bm * K;  // panel mb: K/2 pair rows of bm pairs
        const bf16* l_b = i_b + l_nb * bn * ldb;
        if (nK_full > 0) kernels[l_tm][l_tn][0](l_a, l_b, l_tile.data(), nK_full);
        if (k_tail > 0) kernels[l_tm][l_tn][1](l_a + nK_full * bk * bm, l_b + nK_full * bk, l_tile.data(), 1);
        for (idx l_j = 0; l_j < columns(l_nb); l_j++) {
          bf16* l_c = o_c + (l_nb * bn + l_j) * ldc + l_mb * bm;
          const float* l_acc = l_tile.data() + l_j * bm;
          for (idx l_i = 0; l_i < rows(l_mb); l_i++) {
            l_c[l_i] = bf16(l_acc[l_i] + (i_bias ? i_bias[l_mb * bm + l_i] : 0.0f));  // rounds once
          }
        }
      }
    });
  }
};

}  // namespace tpp

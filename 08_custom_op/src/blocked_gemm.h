// Stage 08, file 2 of 5 (stage 06's, renamed): a blocked GEMM, the loop nest around the JIT kernels of kernel.h.
//
// One product C (M x N) (+)= A (M x K) . op(B) is cut into bm x bn tiles of C, each reduced
// over K in bk-deep steps, one kernel call per step; at::parallel_for spreads the tiles over
// the threads. Nothing here knows about the layer: linear_state.h builds one BlockedGemm per
// product and batch size (a plan), FunctionCpp.cpp runs them. The picture of the loop nest is
// at the top of FunctionCpp.cpp.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>

#include "kernel.h"

namespace linear_op {

// ---- 2. A blocked GEMM: the loop nest around the kernels ---------------------------

// The three products of the layer, as indices into the state's tables.
enum Product : int { kForward = 0, kGradInput = 1, kGradWeight = 2 };
inline const char* const kProductNames[] = {"forward", "grad_input", "grad_weight"};

// The block sizes of one product: C tiles of bm x bn, the reduction in steps of bk
// (bk = 0: automatic, the whole K in one step up to K = 1024, beyond that 256-deep steps).
struct Blocking {
  idx bm, bn, bk;
};

// C (M x N) (+)= A (M x K) . op(B), column-major, cut into bm x bn tiles reduced in bk steps.
template <typename T>
struct BlockedGemm {
  using Fn = typename Xsmm<T>::Fn;
  idx M = 0, N = 0, K = 0;     // the whole product
  idx bm = 1, bn = 1, bk = 1;  // block sizes, clamped to the matrix
  idx nM = 0, nN = 0, nK = 0;  // block counts; the last block of each may be a smaller tail
  idx ldc = 0;                 // leading dimension of C
  bool n_outer = false;        // tile order: column blocks outermost (true) or row blocks (false)
  Fn kernels[2][2][2][2] = {};  // [last row block is a tail][column tail][k tail][beta = 0]

  // i_kernel(KernelShape) returns the kernel for one tile variant (the state's cached lookup).
  // i_may_prefill: run() may be asked to pre-fill tiles (the forward's bias), so the k step 0
  // also needs beta = 1 kernels.
  template <typename GetKernel>
  BlockedGemm(idx i_M, idx i_N, idx i_K, Blocking i_blocking, bool i_n_outer, idx i_lda, idx i_ldb, idx i_ldc,
              int i_flags, bool i_may_prefill, GetKernel&& i_kernel)
      : M(i_M), N(i_N), K(i_K), ldc(i_ldc), n_outer(i_n_outer) {
    bm = std::clamp<idx>(i_blocking.bm, 1, std::max<idx>(1, M));
    bn = std::clamp<idx>(i_blocking.bn, 1, std::max<idx>(1, N));
    const idx l_bk = i_blocking.bk > 0 ? i_blocking.bk : (K <= 1024 ? K : 256);
    bk = std::clamp<idx>(l_bk, 1, std::max<idx>(1, K));
    nM = (M + bm - 1) / bm;
    nN = (N + bn - 1) / bn;
    nK = (K + bk - 1) / bk;
    if (M == 0 || N == 0 || K == 0) return;  // nothing to multiply: no kernel (see run)

    const idx l_size_m[2] = {bm, M - (nM - 1) * bm};  // [full, tail]; the tail may be full-sized
    const idx l_size_n[2] = {bn, N - (nN - 1) * bn};
    const idx l_size_k[2] = {bk, K - (nK - 1) * bk};
    const bool l_need_beta_1 = nK > 1 || i_may_prefill;  // C += A B: later k steps, pre-filled tiles
    for (int l_tm = 0; l_tm < 2; l_tm++) {
      for (int l_tn = 0; l_tn < 2; l_tn++) {
        for (int l_tk = 0; l_tk < 2; l_tk++) {
          for (int l_beta0 = 0; l_beta0 < 2; l_beta0++) {
            // A tail of full size is no variant of its own: its slot gets the full kernel.
            const int l_m = l_tm && l_size_m[1] != bm, l_n = l_tn && l_size_n[1] != bn, l_k = l_tk && l_size_k[1] != bk;
            if (!l_beta0 && !l_need_beta_1) continue;  // never called: leave the slot empty
            kernels[l_tm][l_tn][l_tk][l_beta0] =
                i_kernel(KernelShape{l_size_m[l_m], l_size_n[l_n], l_size_k[l_k], i_lda, i_ldb, i_ldc,
                                     i_flags | (l_beta0 ? LIBXSMM_GEMM_FLAG_BETA_0 : 0)});
          }
        }
      }
    }
  }

  idx rows(idx i_mb) const { return std::min(bm, M - i_mb * bm); }     // rows of row block mb
  idx columns(idx i_nb) const { return std::min(bn, N - i_nb * bn); }  // columns of column block nb

  // Runs every tile. The callables give block pointers: a(mb, kb) and b(kb, nb) the operand
  // blocks of k step kb, c(mb, nb) the tile; prefill(mb, nb) may fill the tile first and returns
  // true if it did (then every k step accumulates, beta = 1).
  template <typename BlockA, typename BlockB, typename BlockC, typename Prefill>
  void run(BlockA&& a, BlockB&& b, BlockC&& c, Prefill&& prefill) const {
    if (M == 0 || N == 0) return;
    at::parallel_for(/*begin=*/0, /*end=*/nM * nN, /*grain_size=*/1, [&](idx i_first, idx i_last) {
      for (idx l_tile = i_first; l_tile < i_last; l_tile++) {
        const idx l_mb = n_outer ? l_tile % nM : l_tile / nN;
        const idx l_nb = n_outer ? l_tile / nM : l_tile % nN;
        const bool l_prefilled = prefill(l_mb, l_nb);
        T* l_c = c(l_mb, l_nb);
        if (K == 0) {  // an empty sum: C = 0, unless prefill wrote the bias
          if (!l_prefilled) {
            for (idx l_j = 0; l_j < columns(l_nb); l_j++) std::fill_n(l_c + l_j * ldc, rows(l_mb), T(0));
          }
          continue;
        }
        const int l_tm = l_mb == nM - 1, l_tn = l_nb == nN - 1;  // last blocks: the tail slots
        for (idx l_kb = 0; l_kb < nK; l_kb++) {
          const int l_beta0 = !l_prefilled && l_kb == 0;  // C = A B, then C += A B
          kernels[l_tm][l_tn][l_kb == nK - 1][l_beta0](a(l_mb, l_kb), b(l_kb, l_nb), l_c);
        }
      }
    });
  }
};

}  // namespace linear_op

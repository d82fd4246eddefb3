// Stage 06, file 2 of 5: a blocked GEMM, the loop nest around the JIT kernels of kernel.h.
//
// One product C (M x N) = A (M x K) . B (K x N) is cut into bm x bn tiles of C, each reduced
// over K in bk-deep steps, one kernel call per step; at::parallel_for spreads the tiles over
// the threads. Every kernel call reads and writes contiguous blocks, as the peak probe does:
//   - A is packed by the caller into panels (bm x K, column-major, lda = bm) before the loop;
//   - B is packed by each thread into its own buffer, one column block (K x bn) at a time, and
//     reused for every tile of that column block;
//   - each tile is accumulated in a bm x bn buffer of the thread's own (ldc = bm), then stored
//     into C once, the bias added on the way.
// Nothing here knows about the layer: linear_state.h builds one BlockedGemm per product and
// batch size (a plan), FunctionCpp.cpp runs them. The picture of the loop nest is at the top of
// FunctionCpp.cpp.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "kernel.h"

namespace linear_tpp {

// ---- 2. A blocked GEMM: the loop nest around the kernels ---------------------------

// The three products of the layer, as indices into the state's tables.
enum Product : int { kForward = 0, kGradInput = 1, kGradWeight = 2 };
inline const char* const kProductNames[] = {"forward", "grad_input", "grad_weight"};

// The block sizes of one product: C tiles of bm x bn, the reduction in steps of bk
// (bk = 0: the whole K in one step).
struct Blocking {
  idx bm, bn, bk;
};

// C (M x N) = A (M x K) . B (K x N), column-major, cut into bm x bn tiles reduced in bk steps.
template <typename T>
struct BlockedGemm {
  using Fn = typename Xsmm<T>::Fn;
  idx M = 0, N = 0, K = 0;     // the whole product
  idx bm = 1, bn = 1, bk = 1;  // block sizes, clamped to the matrix
  idx nM = 0, nN = 0, nK = 0;  // block counts; the last block of each may be a smaller tail
  bool n_outer = false;        // tile order: column blocks outermost (true) or row blocks (false)
  Fn kernels[2][2][2][2] = {};  // [last row block is a tail][column tail][k tail][beta = 0]

  // i_kernel(KernelShape) returns the kernel for one tile variant (the state's cached lookup).
  // i_lda: the leading dimension of the caller's A panels. B blocks (ldb = bk) and the tile
  // buffer (ldc = bm) are this loop nest's own.
  template <typename GetKernel>
  BlockedGemm(idx i_M, idx i_N, idx i_K, Blocking i_blocking, bool i_n_outer, idx i_lda, GetKernel&& i_kernel)
      : M(i_M), N(i_N), K(i_K), n_outer(i_n_outer) {
    bm = std::clamp<idx>(i_blocking.bm, 1, std::max<idx>(1, M));
    bn = std::clamp<idx>(i_blocking.bn, 1, std::max<idx>(1, N));
    bk = std::clamp<idx>(i_blocking.bk > 0 ? i_blocking.bk : K, 1, std::max<idx>(1, K));
    nM = (M + bm - 1) / bm;
    nN = (N + bn - 1) / bn;
    nK = (K + bk - 1) / bk;
    if (M == 0 || N == 0 || K == 0) return;  // nothing to multiply: no kernel (see run)

    const idx l_size_m[2] = {bm, M - (nM - 1) * bm};  // [full, tail]; the tail may be full-sized
    const idx l_size_n[2] = {bn, N - (nN - 1) * bn};
    const idx l_size_k[2] = {bk, K - (nK - 1) * bk};
    for (int l_tm = 0; l_tm < 2; l_tm++) {
      for (int l_tn = 0; l_tn < 2; l_tn++) {
        for (int l_tk = 0; l_tk < 2; l_tk++) {
          for (int l_beta0 = 0; l_beta0 < 2; l_beta0++) {
            // A tail of full size is no variant of its own: its slot gets the full kernel.
            const int l_m = l_tm && l_size_m[1] != bm, l_n = l_tn && l_size_n[1] != bn, l_k = l_tk && l_size_k[1] != bk;
            if (!l_beta0 && nK == 1) continue;  // one k step: only C = A B is ever called
            kernels[l_tm][l_tn][l_tk][l_beta0] =
                i_kernel(KernelShape{l_size_m[l_m], l_size_n[l_n], l_size_k[l_k], i_lda, /*ldb=*/bk, /*ldc=*/bm,
                                     l_beta0 ? LIBXSMM_GEMM_FLAG_BETA_0 : 0});
          }
        }
      }
    }
  }

  idx rows(idx i_mb) const { return std::min(bm, M - i_mb * bm); }     // rows of row block mb
  idx columns(idx i_nb) const { return std::min(bn, N - i_nb * bn); }  // columns of column block nb
  idx depth(idx i_kb) const { return std::min(bk, K - i_kb * bk); }    // k of k step kb

  // Elements of one thread's buffer for a packed B column block: nK blocks of bk x bn.
  idx packed_b_size() const { return nK * bk * bn; }

  // Runs every tile. The callables:
  //   a(mb, kb)                A block of k step kb: bm x bk, column-major, lda as planned;
  //   pack_b(mb, nb, buffer)   writes column block nb of B into the thread's buffer: block kb
  //                            at buffer + kb * bk * bn, column-major (bk x bn), ldb = bk. mb is
  //                            the tile that asked: exactly one pack per column block has mb == 0
  //                            (a caller may do once-per-column work there, as grad_bias);
  //   store(mb, nb, tile)      writes the finished tile (rows(mb) x columns(nb), ld bm) into C.
  template <typename BlockA, typename PackB, typename Store>
  void run(BlockA&& a, PackB&& pack_b, Store&& store) const {
    if (M == 0 || N == 0) return;
    at::parallel_for(/*begin=*/0, /*end=*/nM * nN, /*grain_size=*/1, [&](idx i_first, idx i_last) {
      // This thread's B column block and C tile: uninitialised, 64-byte aligned (at::empty).
      const auto l_options = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
      const at::Tensor l_b_buffer = at::empty({K == 0 ? 0 : packed_b_size()}, l_options);
      const at::Tensor l_tile_buffer = at::empty({bm * bn}, l_options);
      T* l_b = l_b_buffer.mutable_data_ptr<T>();
      T* l_tile = l_tile_buffer.mutable_data_ptr<T>();
      idx l_packed_nb = -1;  // the column block l_b holds
      for (idx l_tile_index = i_first; l_tile_index < i_last; l_tile_index++) {
        const idx l_mb = n_outer ? l_tile_index % nM : l_tile_index / nN;
        const idx l_nb = n_outer ? l_tile_index / nM : l_tile_index % nN;
        if (K == 0) {  // an empty sum: C = 0 (plus the bias, which store adds)
          std::fill_n(l_tile, bm * bn, T(0));
          store(l_mb, l_nb, l_tile);
          continue;
        }
        if (l_nb != l_packed_nb) {  // column-block order: once per column block and thread
          pack_b(l_mb, l_nb, l_b);
          l_packed_nb = l_nb;
        }
        const int l_tm = l_mb == nM - 1, l_tn = l_nb == nN - 1;  // last blocks: the tail slots
        for (idx l_kb = 0; l_kb < nK; l_kb++) {
          kernels[l_tm][l_tn][l_kb == nK - 1][/*beta0=*/l_kb == 0](a(l_mb, l_kb), l_b + l_kb * bk * bn, l_tile);
        }
        store(l_mb, l_nb, l_tile);
      }
    });
  }
};

}  // namespace linear_tpp

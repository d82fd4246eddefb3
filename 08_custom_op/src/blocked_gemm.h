// Stage 06, and stages 07 and 08 unchanged: a blocked GEMM, the loop nest around the JIT kernels of kernel.h.
//
// One product C (M x N) = A (M x K) . B (K x N) is cut into bm x bn tiles of C, each reduced
// over K in bk-deep steps, one kernel call per step; at::parallel_for spreads the tiles over
// the threads. Every kernel call reads and writes contiguous blocks, as the peak probe does:
//   - A is packed by the caller into panels (bm x K, column-major, lda = bm) before the loop;
//   - B is packed by each thread into its own buffer, one column block at a time, in chunks of
//     k steps small enough to stay in L2, and reused for every tile of that column block;
//   - each tile is accumulated in a bm x bn buffer of the thread's own (ldc = bm) over a chunk,
//     then stored into C (the first chunk, the bias added on the way) or added to it (the rest).
// Nothing here knows about the layer: linear_state.h builds one BlockedGemm per product and
// batch size (a plan), products.h runs them. The picture of the loop nest:
//
// ---- The loop nest (BlockedGemm::run) --------------------------------------------------
//
//               n: bn-wide blocks (N: the batch for forward and grad_input)
//             +--------+--------+--------+----+
//   m:        | (0, 0) | (0, 1) | (0, 2) |    |   C tile (mb, nb), bm x bn: one thread owns it.
//   bm-high   +--------+--------+--------+----+   A run: a thread's tiles of one column block nb.
//   blocks    | (1, 0) | (1, 1) |  ...   |    |   for each chunk of k steps (<= 256 KB of B):
//             +--------+--------+--------+----+     pack B(chunk, nb) into the thread's buffer
//             |  tail row: the last block is  |     for each tile of the run:
//             +--- smaller, and so its kernel +       tile  = A(mb, kb0) . B(kb0, nb)   beta = 0
//                                 ^ tail column       tile += A(mb, kb) . B(kb, nb)     beta = 1
//                                                     C(mb, nb) = tile + bias (first chunk)
//                                                           or += tile (later chunks)
//
//   at::parallel_for over the nM * nN tiles: each thread takes a contiguous range of tiles,
//   in column-block order (n_outer, the default: long runs) or row-block order.
//
// A tile's kernel depends on whether its row block, column block and k step are full or the
// smaller last one (the tail), and on beta: 2 x 2 x 2 x 2 = at most 16 kernels per product,
// dispatched once and looked up by index in the loop (BlockedGemm::kernels).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "kernel.h"

namespace tpp {

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
            if (!l_beta0 && std::min(nK, chunk_steps()) == 1) continue;  // one k step a chunk: only C = A B
            kernels[l_tm][l_tn][l_tk][l_beta0] =
                i_kernel(KernelShape{l_size_m[l_m], l_size_n[l_n], l_size_k[l_k], i_lda, /*ldb=*/bk, /*ldc=*/bm,
                                     l_beta0 ? LIBXSMM_GEMM_FLAG_BETA_0 : 0});
          }
        }
      }
    }
  }

  // A thread's scratch memory: T[size], 64-byte aligned, freed by the unique_ptr.
  struct Free {
    void operator()(T* i_p) const { std::free(i_p); }
  };
  using Buffer = std::unique_ptr<T[], Free>;
  static Buffer aligned_buffer(idx i_size) {
    const size_t l_bytes = (std::max<idx>(1, i_size) * sizeof(T) + 63) / 64 * 64;  // a multiple of the alignment
    T* l_p = static_cast<T*>(std::aligned_alloc(64, l_bytes));
    TORCH_CHECK(l_p != nullptr, kStage, ": the GEMM's scratch buffer: out of memory for ", l_bytes, " bytes");
    return Buffer(l_p);
  }

  idx rows(idx i_mb) const { return std::min(bm, M - i_mb * bm); }     // rows of row block mb
  idx columns(idx i_nb) const { return std::min(bn, N - i_nb * bn); }  // columns of column block nb
  idx depth(idx i_kb) const { return std::min(bk, K - i_kb * bk); }    // k of k step kb

  // B is packed one chunk of k steps at a time, so that the chunk stays in L2 while every row
  // tile of the column block runs over it (GotoBLAS's kc loop): about 256 KB of B per chunk.
  static constexpr idx kChunkBytes = 256 * 1024;
  idx chunk_steps() const { return std::max<idx>(1, kChunkBytes / idx(bk * bn * sizeof(T))); }

  // Runs every tile. The callables:
  //   a(mb, kb)                      A block of k step kb: bm x bk, column-major, lda as planned;
  //   pack_b(mb, nb, kb0, kb1, buf)  writes k steps kb0 .. kb1-1 of column block nb of B into the
  //                                  thread's buffer: step kb at buf + (kb - kb0) * bk * bn,
  //                                  column-major (bk x bn), ldb = bk. mb is the row block of the
  //                                  first tile of the run that asked: exactly one run per
  //                                  column block starts at mb == 0 (a caller may do once-per-
  //                                  column work there, as grad_bias), and it packs kb0 = 0
  //                                  first. Never called when K == 0;
  //   store(mb, nb, tile, add)       writes the tile (rows(mb) x columns(nb), ld bm) into C, or
  //                                  adds it to what an earlier chunk stored (add = true).
  template <typename BlockA, typename PackB, typename Store>
  void run(BlockA&& a, PackB&& pack_b, Store&& store) const {
    if (M == 0 || N == 0) return;
    at::parallel_for(/*begin=*/0, /*end=*/nM * nN, /*grain_size=*/1, [&](idx i_first, idx i_last) {
      // This thread's B chunk and C tile: plain memory, uninitialised, 64-byte aligned (a cache
      // line), freed when the thread's share is done.
      const idx l_steps = chunk_steps();
      const Buffer l_b_buffer = aligned_buffer(std::min(l_steps, nK) * bk * bn);
      const Buffer l_tile_buffer = aligned_buffer(bm * bn);
      T* l_b = l_b_buffer.get();
      T* l_tile = l_tile_buffer.get();
      auto l_mb = [&](idx i_tile) { return n_outer ? i_tile % nM : i_tile / nN; };
      auto l_nb = [&](idx i_tile) { return n_outer ? i_tile / nM : i_tile % nN; };
      for (idx l_run = i_first; l_run < i_last;) {
        // A run: this thread's consecutive tiles of one column block. With column blocks
        // outermost (the default) a run holds many row tiles; in row-block order, one tile.
        const idx l_col = l_nb(l_run);
        idx l_run_end = l_run + 1;
        while (l_run_end < i_last && l_nb(l_run_end) == l_col) l_run_end++;
        if (K == 0) {  // an empty sum: C = 0 (plus the bias, which store adds)
          std::fill_n(l_tile, bm * bn, T(0));
          for (idx l_t = l_run; l_t < l_run_end; l_t++) store(l_mb(l_t), l_col, l_tile, /*add=*/false);
        }
        for (idx l_kb0 = 0; l_kb0 < nK; l_kb0 += l_steps) {  // the chunks of k steps
          const idx l_kb1 = std::min(nK, l_kb0 + l_steps);
          pack_b(l_mb(l_run), l_col, l_kb0, l_kb1, l_b);
          for (idx l_t = l_run; l_t < l_run_end; l_t++) {
            const idx l_row = l_mb(l_t);
            const int l_tm = l_row == nM - 1, l_tn = l_col == nN - 1;  // last blocks: the tail slots
            for (idx l_kb = l_kb0; l_kb < l_kb1; l_kb++) {
              kernels[l_tm][l_tn][l_kb == nK - 1][/*beta0=*/l_kb == l_kb0](a(l_row, l_kb), l_b + (l_kb - l_kb0) * bk * bn,
                                                                          l_tile);
            }
            store(l_row, l_col, l_tile, /*add=*/l_kb0 > 0);
          }
        }
        l_run = l_run_end;
      }
    });
  }
};

}  // namespace tpp

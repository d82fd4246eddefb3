// Stage 07: the tools, bound for the tests, the benchmark and the notebook: a dispatch probe and
// the float32 peak probe, as in stage 06; new: the bf16 peak probe and the VNNI-2 packing of a
// small matrix. They use the layer's kernels and are not part of it.
#include <ATen/Parallel.h>

#include <chrono>
#include <vector>

#include "FunctionCpp.h"

namespace tpp {

// ---- 7. Tools: a dispatch probe, the peak probes, the VNNI-2 packing ----------------

// Dispatches one kernel, C(m x n) (+)= A(m x k) op(B) with tight leading dimensions, through the
// same checked path as the layer; returns True, or raises naming the request (a NULL kernel).
bool dispatch_check(int64_t i_m, int64_t i_n, int64_t i_k, int i_flags, at::ScalarType i_dtype) {
  libxsmm_init();
  TORCH_CHECK(i_dtype == at::kFloat || i_dtype == at::kDouble, kStage, ": expected dtype Float or Double, got ", i_dtype);
  const bool l_trans_a = i_flags & LIBXSMM_GEMM_FLAG_TRANS_A, l_trans_b = i_flags & LIBXSMM_GEMM_FLAG_TRANS_B;
  const KernelShape l_shape{i_m, i_n, i_k, /*lda=*/l_trans_a ? i_k : i_m, /*ldb=*/l_trans_b ? i_n : i_k, /*ldc=*/i_m, i_flags};
  if (i_dtype == at::kFloat) dispatch_kernel<float>(l_shape);
  else dispatch_kernel<double>(l_shape);
  return true;
}

// The machine's practical float32 peak: every thread (at::get_num_threads(), which is
// torch.get_num_threads()) runs one m x n x k kernel over its own small buffers (48 KB at
// 64 x 64 x 64: A in L1, B and C in L1/L2) for i_seconds; returns the GFLOP/s of all threads
// together. No loop nest, no traffic beyond the core's caches: a practical peak, which deeper
// kernels can match or pass slightly.
double peak_gflops(int64_t i_m, int64_t i_n, int64_t i_k, double i_seconds) {
  libxsmm_init();
  const auto l_kernel = dispatch_kernel<float>(KernelShape{i_m, i_n, i_k, i_m, i_k, i_m, /*flags=*/0});
  const int l_threads = at::get_num_threads();
  std::vector<double> l_gflops(l_threads, 0.0);
  at::parallel_for(/*begin=*/0, /*end=*/l_threads, /*grain_size=*/1, [&](idx i_first, idx i_last) {
    for (idx l_t = i_first; l_t < i_last; l_t++) {
      std::vector<float> l_a(i_m * i_k, 0.5f), l_b(i_k * i_n, 0.25f), l_c(i_m * i_n, 0.0f);
      using Clock = std::chrono::steady_clock;
      const auto l_start = Clock::now();
      int64_t l_calls = 0;
      double l_elapsed = 0;
      do {  // the clock read every 256 calls costs nothing against 256 kernels
        for (int l_i = 0; l_i < 256; l_i++) l_kernel(l_a.data(), l_b.data(), l_c.data());
        l_calls += 256;
        l_elapsed = std::chrono::duration<double>(Clock::now() - l_start).count();
      } while (l_elapsed < i_seconds);
      l_gflops[l_t] = 2.0 * i_m * i_n * i_k * l_calls / l_elapsed * 1e-9;
    }
  });
  double l_total = 0;
  for (double l_g : l_gflops) l_total += l_g;
  return l_total;
}

// The machine's practical bf16 peak, as peak_gflops but with the bf16 batch-reduce kernel
// (m x n x k, count 1, fp32 C) on VNNI-packed in-cache buffers. Raises where there are no bf16
// kernels (a CPU without AVX-512): there is no bf16 peak to measure then. On AVX-512 CPUs without
// AVX512-BF16 it measures LIBXSMM's emulated bf16 kernels.
double peak_gflops_bf16(int64_t i_m, int64_t i_n, int64_t i_k, double i_seconds) {
  libxsmm_init();
  TORCH_CHECK(bf16_kernels_available(), kStage, ": no bf16 kernels on this CPU (LIBXSMM target ",
              libxsmm_get_target_arch(), ", no AVX-512): no bf16 peak to probe");
  TORCH_CHECK(i_k % 2 == 0, kStage, ": the bf16 peak probe needs an even k, got ", i_k);
  const Bf16Fn l_kernel = dispatch_bf16_kernel(Bf16KernelShape{i_m, i_n, i_k, i_m, i_k, i_m, i_m * i_k, i_k * i_n});
  const int l_threads = at::get_num_threads();
  std::vector<double> l_gflops(l_threads, 0.0);
  at::parallel_for(/*begin=*/0, /*end=*/l_threads, /*grain_size=*/1, [&](idx i_first, idx i_last) {
    for (idx l_t = i_first; l_t < i_last; l_t++) {
      std::vector<libxsmm_bfloat16> l_a(i_m * i_k, 0x3f00), l_b(i_k * i_n, 0x3e80);  // 0.5 and 0.25
      std::vector<float> l_c(i_m * i_n, 0.0f);
      const unsigned long long l_count = 1;
      using Clock = std::chrono::steady_clock;
      const auto l_start = Clock::now();
      int64_t l_calls = 0;
      double l_elapsed = 0;
      do {
        for (int l_i = 0; l_i < 256; l_i++) l_kernel(l_a.data(), l_b.data(), l_c.data(), &l_count);
        l_calls += 256;
        l_elapsed = std::chrono::duration<double>(Clock::now() - l_start).count();
      } while (l_elapsed < i_seconds);
      l_gflops[l_t] = 2.0 * i_m * i_n * i_k * l_calls / l_elapsed * 1e-9;
    }
  });
  double l_total = 0;
  for (double l_g : l_gflops) l_total += l_g;
  return l_total;
}

// A (M x K, bf16, row-major as PyTorch holds it) packed VNNI-2 into panels of bm rows: a tensor
// (panels, vnni_k(K) / 2, bm, 2), element [mb][p][i][t] = A[mb*bm + i][2p + t] or 0 (padding).
torch::Tensor pack_vnni2_matrix(torch::Tensor i_matrix, int64_t i_bm) {
  TORCH_CHECK(i_matrix.dim() == 2 && i_matrix.scalar_type() == torch::kBFloat16 && i_matrix.device().is_cpu(),
              kStage, ": pack_vnni2 expected a 2-d BFloat16 CPU tensor, got ", i_matrix.dim(), "-d ",
              i_matrix.scalar_type(), " on ", i_matrix.device());
  TORCH_CHECK(i_bm >= 1, kStage, ": pack_vnni2 expected bm >= 1, got ", i_bm);
  const torch::Tensor l_a = i_matrix.contiguous();
  const idx M = l_a.size(0), K = l_a.size(1), l_panels = (M + i_bm - 1) / i_bm;
  torch::Tensor l_packed = torch::empty({l_panels, vnni_k(K) / 2, i_bm, 2}, l_a.options());
  pack_vnni2(l_a.const_data_ptr<bf16>(), M, K, /*stride_i=*/K, /*stride_k=*/1, i_bm,
                              l_packed.mutable_data_ptr<bf16>());
  return l_packed;
}

}  // namespace tpp

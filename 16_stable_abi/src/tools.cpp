// Stage 16: the tools, registered as ops for the tests, the tour and the notebook: a dispatch probe and
// the float32 peak probe. They use the layer's kernels and are not part of it.
#include <torch/csrc/stable/ops.h>  // torch::stable::parallel_for, get_num_threads

#include <chrono>
#include <vector>

#include "FunctionCpp.h"

namespace tpp {

// ---- 7. Tools: a dispatch probe, the peak probe ------------------------------------

// Dispatches one kernel, C(m x n) (+)= A(m x k) op(B) with tight leading dimensions, through the
// same checked path as the layer; returns True, or raises naming the request (a NULL kernel).
bool dispatch_check(int64_t i_m, int64_t i_n, int64_t i_k, int i_flags, ScalarType i_dtype) {
  libxsmm_init();
  TPP_CHECK(i_dtype == kFloat || i_dtype == kDouble, kStage, ": expected dtype Float or Double, got ", i_dtype);
  const bool l_trans_a = i_flags & LIBXSMM_GEMM_FLAG_TRANS_A, l_trans_b = i_flags & LIBXSMM_GEMM_FLAG_TRANS_B;
  const KernelShape l_shape{i_m, i_n, i_k, /*lda=*/l_trans_a ? i_k : i_m, /*ldb=*/l_trans_b ? i_n : i_k, /*ldc=*/i_m, i_flags};
  if (i_dtype == kFloat) dispatch_kernel<float>(l_shape);
  else dispatch_kernel<double>(l_shape);
  return true;
}

// The machine's practical float32 peak: every thread (torch::stable::get_num_threads(), which is
// torch.get_num_threads()) runs one m x n x k kernel over its own small buffers (48 KB at
// 64 x 64 x 64: A in L1, B and C in L1/L2) for i_seconds; returns the GFLOP/s of all threads
// together. No loop nest, no traffic beyond the core's caches: a practical peak, which deeper
// kernels can match or pass slightly.
double peak_gflops(int64_t i_m, int64_t i_n, int64_t i_k, double i_seconds) {
  libxsmm_init();
  const auto l_kernel = dispatch_kernel<float>(KernelShape{i_m, i_n, i_k, i_m, i_k, i_m, /*flags=*/0});
  const int l_threads = static_cast<int>(torch::stable::get_num_threads());
  std::vector<double> l_gflops(l_threads, 0.0);
  torch::stable::parallel_for(/*begin=*/0, /*end=*/l_threads, /*grain_size=*/1, [&](idx i_first, idx i_last) {
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

}  // namespace tpp

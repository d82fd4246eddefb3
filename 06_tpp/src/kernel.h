// Stage 06, and stage 08 with its own kStage: one JIT kernel. How LIBXSMM 1.17 is asked for a GEMM kernel of fixed
// sizes, and how a NULL answer becomes a Python error instead of a crash.
//
// A TPP (tensor processing primitive) is a small kernel for one fixed job, here the GEMM block
//     C (m x n)  (+)=  A (m x k) . op(B)       column-major, alpha = 1, beta = 0 or 1
// that LIBXSMM writes as machine code at run time for those exact sizes, leading dimensions and
// the instruction set of the CPU it runs on (libxsmm_get_target_arch(): AVX-512 or AVX2).
// Read next: blocked_gemm.h (the loop nest around these kernels).
#pragma once

#include <ATen/ATen.h>

#include <libxsmm.h>

#include <climits>
#include <string>
#include <tuple>
#include <utility>

// The GEMM calls below are LIBXSMM 1.17's (libxsmm_smmdispatch and friends); LIBXSMM 2.x
// replaced them with another API. Fail at compile time, with the reason, on any other version.
#if LIBXSMM_VERSION_MAJOR != 1 || LIBXSMM_VERSION_MINOR < 17
#error "this stage needs LIBXSMM 1.17 (Debian: sudo apt-get install -y libxsmm-dev)"
#endif

namespace tpp {  // the same in every stage built on TPPs, so that their diffs show only what changed

// The stage's name, the first word of every error message, so that a user knows which extension
// complained: the one line that names the stage.
inline constexpr const char* kStage = "linear_tpp";

using idx = int64_t;

// ---- 1. One JIT kernel --------------------------------------------------------------

// The description of one kernel: C(m x n) (+)= A(m x k) . op(B), leading dimensions, flags.
// It is the key under which a LinearState keeps the kernel's function pointer.
struct KernelShape {
  idx m, n, k, lda, ldb, ldc;
  int flags;  // LIBXSMM_GEMM_FLAG_*: TRANS_B, BETA_0 (C = A B instead of C += A B)
  auto key() const { return std::make_tuple(m, n, k, lda, ldb, ldc, flags); }
};

// LIBXSMM's flags by name, for error messages: "TRANS_A|BETA_0".
inline std::string flag_names(int i_flags) {
  const std::pair<int, const char*> l_names[] = {
      {LIBXSMM_GEMM_FLAG_TRANS_A, "TRANS_A"}, {LIBXSMM_GEMM_FLAG_TRANS_B, "TRANS_B"}, {LIBXSMM_GEMM_FLAG_BETA_0, "BETA_0"}};
  std::string l_text;
  int l_rest = i_flags;
  for (const auto& [l_bit, l_name] : l_names) {
    if (i_flags & l_bit) {
      l_text += (l_text.empty() ? "" : "|") + std::string(l_name);
      l_rest &= ~l_bit;
    }
  }
  if (l_rest) l_text += (l_text.empty() ? "" : "|") + std::to_string(l_rest);
  return l_text.empty() ? "none" : l_text;
}

// Per element type: the kernel's function-pointer type and LIBXSMM's dispatch for it.
// alpha is always 1; beta is 0 with the BETA_0 flag, else 1 (the only values 1.17 supports).
template <typename T>
struct Xsmm;
template <>
struct Xsmm<float> {
  using Fn = libxsmm_smmfunction;  // void (*)(const float* a, const float* b, float* c, ...)
  static constexpr const char* kName = "float32";
  static Fn dispatch(libxsmm_blasint m, libxsmm_blasint n, libxsmm_blasint k, libxsmm_blasint lda,
                     libxsmm_blasint ldb, libxsmm_blasint ldc, int flags) {
    const float l_alpha = 1.0f, l_beta = (flags & LIBXSMM_GEMM_FLAG_BETA_0) ? 0.0f : 1.0f;
    const int l_prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
    return libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &l_alpha, &l_beta, &flags, &l_prefetch);
  }
};
template <>
struct Xsmm<double> {
  using Fn = libxsmm_dmmfunction;
  static constexpr const char* kName = "float64";
  static Fn dispatch(libxsmm_blasint m, libxsmm_blasint n, libxsmm_blasint k, libxsmm_blasint lda,
                     libxsmm_blasint ldb, libxsmm_blasint ldc, int flags) {
    const double l_alpha = 1.0, l_beta = (flags & LIBXSMM_GEMM_FLAG_BETA_0) ? 0.0 : 1.0;
    const int l_prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
    return libxsmm_dmmdispatch(m, n, k, &lda, &ldb, &ldc, &l_alpha, &l_beta, &flags, &l_prefetch);
  }
};

// Asks LIBXSMM for one kernel. LIBXSMM generates it on the first request and returns the same
// code from its registry afterwards; the code lives as long as the process. A NULL pointer
// means "no kernel for this request" and would crash when called: it becomes a Python
// RuntimeError that names the request.
template <typename T>
typename Xsmm<T>::Fn dispatch_kernel(const KernelShape& i_shape) {
  const idx l_values[] = {i_shape.m, i_shape.n, i_shape.k, i_shape.lda, i_shape.ldb, i_shape.ldc};
  for (idx l_value : l_values) {  // libxsmm_blasint is a 32-bit int in Debian's build
    TORCH_CHECK(l_value <= INT_MAX, kStage, ": a GEMM size or leading dimension of ", l_value,
                " does not fit LIBXSMM's 32-bit integers");
  }
  auto l_kernel = Xsmm<T>::dispatch(i_shape.m, i_shape.n, i_shape.k, i_shape.lda, i_shape.ldb, i_shape.ldc,
                                    i_shape.flags);
  TORCH_CHECK(l_kernel != nullptr, kStage, ": LIBXSMM ", LIBXSMM_CONFIG_VERSION, " returned no kernel (NULL) for the ",
              Xsmm<T>::kName, " GEMM C(m x n) = A(m x k) B(k x n) with m=", i_shape.m, " n=", i_shape.n, " k=", i_shape.k,
              " lda=", i_shape.lda, " ldb=", i_shape.ldb, " ldc=", i_shape.ldc, " flags=", i_shape.flags, " (",
              flag_names(i_shape.flags), "); LIBXSMM 1.17 generates none for TRANS_A, for alpha other than 1, for beta "
              "other than 0 or 1, or for a size of 0");
  return l_kernel;
}

}  // namespace tpp

// Stage 07: one JIT kernel. How LIBXSMM 1.17 is asked for a GEMM kernel of fixed
// sizes, and how a NULL answer becomes a Python error instead of a crash. New in stage 07:
// section 1b, the bfloat16 batch-reduce kernel (VNNI-2 packed A, fp32 accumulation), and the
// run-time probe that says whether this CPU has one at all.
//
// A TPP (tensor processing primitive) is a small kernel for one fixed job, here the GEMM block
//     C (m x n)  (+)=  A (m x k) . op(B)       column-major, alpha = 1, beta = 0 or 1
// that LIBXSMM writes as machine code at run time for those exact sizes, leading dimensions and
// the instruction set of the CPU it runs on (libxsmm_get_target_arch(): AVX-512 or AVX2).
// Read next: blocked_gemm.h (the loop nest around these kernels), then vnni_gemm.h (bfloat16).
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
inline constexpr const char* kStage = "linear_tpp_bf16";

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

// ---- 1b. The bfloat16 batch-reduce kernel (new in stage 07) -------------------------

// One bf16 TPP: C (m x n, fp32) += sum over r < count of A_r (m x k) . B_r (k x n), A_r and B_r
// bf16, A_r = a + r * stride_a, B_r = b + r * stride_b, all products summed in fp32.
// A is packed VNNI-2 (vnni_gemm.h): pairs of consecutive k interleaved, lda counts rows (m).
// LIBXSMM 1.17 generates such a kernel only with LIBXSMM_GEMM_FLAG_VNNI_A, and only for AVX-512
// targets: native code where the CPU has AVX512-BF16 (Cooper Lake, Sapphire Rapids, AMD Zen 4 and
// later: target "cpx", LIBXSMM 1.17's newest), an emulation on other AVX-512 CPUs (exact, but slower than the
// float32 kernels), NULL on AVX2 ("hsw"). Where it is NULL or emulated, a new layer takes the
// float32 path (FunctionCpp.cpp, section 5b; linear_state.h, the bf16 path).
using Bf16Fn = libxsmm_bsmmfunction_reducebatch_strd;  // void (*)(a, b, c, const unsigned long long* count, ...)

struct Bf16KernelShape {
  idx m, n, k, lda, ldb, ldc, stride_a, stride_b;  // strides in elements (bf16)
  auto key() const { return std::make_tuple(m, n, k, lda, ldb, ldc, stride_a, stride_b); }
};

// Asks LIBXSMM for one bf16 batch-reduce kernel, beta = 1 (the loop nest zeroes C itself).
// i_required: NULL becomes a RuntimeError naming the request; else NULL is returned (the probe).
inline Bf16Fn dispatch_bf16_kernel(const Bf16KernelShape& i_shape, bool i_required = true) {
  const idx l_values[] = {i_shape.m, i_shape.n, i_shape.k, i_shape.lda, i_shape.ldb, i_shape.ldc,
                          2 * i_shape.stride_a, 2 * i_shape.stride_b};
  for (idx l_value : l_values) {
    TORCH_CHECK(l_value <= INT_MAX, kStage, ": a bf16 GEMM size, leading dimension or stride of ", l_value,
                " does not fit LIBXSMM's 32-bit integers");
  }
  const libxsmm_blasint l_lda = i_shape.lda, l_ldb = i_shape.ldb, l_ldc = i_shape.ldc;
  const float l_alpha = 1.0f, l_beta = 1.0f;
  const int l_flags = LIBXSMM_GEMM_FLAG_VNNI_A, l_prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
  // LIBXSMM 1.17 takes the strides between the batch's blocks in bytes.
  Bf16Fn l_kernel = libxsmm_bsmmdispatch_reducebatch_strd(
      i_shape.m, i_shape.n, i_shape.k, 2 * i_shape.stride_a, 2 * i_shape.stride_b, &l_lda, &l_ldb, &l_ldc, &l_alpha,
      &l_beta, &l_flags, &l_prefetch);
  TORCH_CHECK(l_kernel != nullptr || !i_required, kStage, ": LIBXSMM ", LIBXSMM_CONFIG_VERSION,
              " returned no kernel (NULL) for the bfloat16 batch-reduce GEMM with m=", i_shape.m, " n=", i_shape.n,
              " k=", i_shape.k, " lda=", i_shape.lda, " ldb=", i_shape.ldb, " ldc=", i_shape.ldc, " (VNNI_A); it "
              "generates bf16 kernels only for AVX-512 targets (this one: ", libxsmm_get_target_arch(), ")");
  return l_kernel;
}

// Does this CPU get bf16 kernels? Asked once per process: a 32 x 32 x 32 batch-reduce kernel is
// requested and NULL means no. The answer says whether the "vnni" path can be chosen at all;
// bf16_kernels_native() below picks each new layer's default path (linear_state.h).
inline bool bf16_kernels_available() {
  static const bool s_available = [] {
    libxsmm_init();
    return dispatch_bf16_kernel(Bf16KernelShape{32, 32, 32, 32, 32, 32, 32 * 32, 32}, /*i_required=*/false) != nullptr;
  }();
  return s_available;
}

// True where LIBXSMM's target executes bf16 dot products natively (AVX512-BF16: target "cpx",
// LIBXSMM 1.17's newest, or a newer one in a later LIBXSMM), so that its bf16 kernels run at twice the float32 rate rather than emulated.
inline bool bf16_kernels_native() {
  libxsmm_init();
  return bf16_kernels_available() && libxsmm_get_target_archid() >= LIBXSMM_X86_AVX512_CPX;
}

}  // namespace tpp

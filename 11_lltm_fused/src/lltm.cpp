// Stage 11: the LLTM cell with its element-wise work fused into one pass each way (CPU).
//
// What this stage teaches: fusion. Stage 10 runs each element-wise op of the cell as its own
// ATen call: ~10 passes over (B, S) arrays in the forward, ~20 in the backward, each with its
// own dispatch and its own temporary. Here one loop nest does all of it:
//
//   forward:  gates = [old_h, input] W^T + b               (ATen GEMM, MKL)
//             one pass over the rows: sigmoid, sigmoid, elu, new_cell, new_h   (sections 3, 4)
//   backward: one pass over the rows: every element-wise derivative -> d_gates  (sections 3, 5)
//             d_weights = d_gates^T X, d_X = d_gates W, d_bias = sum of rows   (ATen)
//
//   forward(input, weights, bias, old_h, old_cell) -> [new_h, new_cell, gates]
//   cell(input, weights, bias, old_h, old_cell) -> [new_h, new_cell]   (one autograd node, section 6)
//   forward_pass(gates, old_cell) -> [new_h, new_cell]     (the fused pass alone, to time it)
//   backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights, need_d_X, need_d_weights)
//     -> [d_old_h, d_input, d_weights, d_bias (1, 3S), d_old_cell]
//   simd_path() -> str, set_simd_path(str)                (which float32 copy runs, section 3b)
//
// What changed since stage 10: the forward returns 3 tensors, not 7. Saved for the backward are
// only the pre-activation gates (B, 3S) beside tensors that exist anyway (the inputs, new_cell):
// input_gate, output_gate and candidate_cell are recomputed from the gates inside the fused
// backward pass (a few exp per element, cheaper than storing and re-reading them), and X is
// rebuilt by one copy. The rows are shared between threads by at::parallel_for (compile with
// -fopenmp); the loop over a row's S elements runs on restrict pointers, without calls and
// without branches the compiler cannot turn into selects, so that it vectorises (section 2);
// the float32 loops are compiled twice, for any x86-64 (SSE2) and for AVX2 + FMA, and the CPU
// picks the copy at run time (section 3b). Section 6 is new too: the whole cell as one C++
// autograd node (cell), which LLTM.forward calls; LLTMFunction keeps the recipe in Python. The
// checks ask for CPU tensors (section 1 says why).
// Build: pip install --no-build-isolation ./11_lltm_fused   (or JIT: eml.lltm_fused.jit.build())

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// The stage's name, the first word of every error message: the one line that names the stage.
static const char* const kStage = "lltm_fused";

// ---- 1. The checks: every input error is a clear message naming the value ----

static void check_inputs(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                         const at::Tensor& old_h, const at::Tensor& old_cell) {
  const std::pair<const char*, const at::Tensor*> tensors[] = {
      {"input", &input}, {"weights", &weights}, {"bias", &bias}, {"old_h", &old_h}, {"old_cell", &old_cell}};
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(tensor->scalar_type() == at::kFloat || tensor->scalar_type() == at::kDouble,
                kStage, ": ", name, " must be float32 or float64, got ", tensor->scalar_type());
  }
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(tensor->scalar_type() == input.scalar_type(),
                kStage, ": ", name, " is ", tensor->scalar_type(), " but input is ", input.scalar_type());
    // Unlike stage 10, not device-generic: the fused passes read the data pointers on the host.
    TORCH_CHECK(tensor->device().is_cpu(), kStage, ": ", name, " must be a CPU tensor, got device ", tensor->device());
  }
  TORCH_CHECK(input.dim() == 2, kStage, ": input must be 2-D (batch, features), got shape ", input.sizes());
  TORCH_CHECK(weights.dim() == 2 && weights.size(0) % 3 == 0,
              kStage, ": weights must be 2-D (3 * state, state + features), got shape ", weights.sizes());
  const int64_t batch = input.size(0), features = input.size(1), state = weights.size(0) / 3;
  for (const auto& [name, tensor] : {std::pair{"old_h", &old_h}, std::pair{"old_cell", &old_cell}}) {
    TORCH_CHECK(tensor->dim() == 2, kStage, ": ", name, " must be 2-D (batch, state), got shape ", tensor->sizes());
    TORCH_CHECK(tensor->size(0) == batch,
                kStage, ": ", name, " has batch size ", tensor->size(0), " but input has ", batch);
    TORCH_CHECK(tensor->size(1) == state, kStage, ": ", name, " must have shape [", batch, ", ", state,
                "] (weights have 3 * ", state, " rows), got ", tensor->sizes());
  }
  TORCH_CHECK(weights.size(1) == state + features, kStage, ": input has ", features,
              " features, so weights must have shape [", 3 * state, ", ", state + features, "], got ", weights.sizes());
  TORCH_CHECK((bias.dim() == 1 && bias.size(0) == 3 * state) ||
                  (bias.dim() == 2 && bias.size(0) == 1 && bias.size(1) == 3 * state),
              kStage, ": bias must have shape (", 3 * state, ") or (1, ", 3 * state, "), got ", bias.sizes());
}

// ---- 2. The activations of one element, written so that the compiler can vectorise them ----

// std::exp is a call into libm: a loop that calls it stays scalar. In float32 the cell uses
// this exp instead, plain arithmetic that gcc turns into SIMD code (SSE2, 4 floats at a time,
// on any x86-64): e^x = 2^n e^r with n = round(x / ln 2) and |r| <= ln(2) / 2, e^r by a degree-7
// polynomial (Cephes' expf coefficients), 2^n by writing n into the exponent bits.
// Relative error below 1e-7 on [-87, 88]; x is clamped to that range (e^-87 ~ 1.6e-38).
// The compiler needs -fno-trapping-math to turn the clamps and selects into SIMD min/max and masked selects.
static inline float exp_simd(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2): 1.5 * 2^23 trick
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;               // x - n ln 2, ln 2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  return p * __builtin_bit_cast(float, bits);
}

// float64 keeps libm's exact functions: the tests hold it to 1e-10.
static inline double exp_simd(double x) { return std::exp(x); }

// sigmoid(z) = 1 / (1 + e^-z)
template <typename scalar_t>
static inline scalar_t sigmoid(scalar_t z) {
  return scalar_t(1) / (scalar_t(1) + exp_simd(-z));
}

// elu(z) = z if z > 0 else alpha (e^z - 1), alpha = 1; both sides computed, then one select
template <typename scalar_t>
static inline scalar_t elu(scalar_t z) {
  const scalar_t negative = exp_simd(z < scalar_t(0) ? z : scalar_t(0)) - scalar_t(1);
  return z > scalar_t(0) ? z : negative;
}

// tanh(u) = 1 - 2 / (e^{2u} + 1) in float32 (absolute error ~1e-7 near 0); libm's in float64
static inline float tanh_simd(float u) { return 1.0f - 2.0f / (exp_simd(2.0f * u) + 1.0f); }
static inline double tanh_simd(double u) { return std::tanh(u); }

// A chunk of at least ~4096 elements per thread: below that, waking a thread costs more than
// the microseconds of exp and tanh it would take over (1 to 9 ns per element, by CPU and copy: README).
static int64_t grain_rows(int64_t state) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(state, 1)); }

// ---- 3. One row of the forward and of the backward: the fused element-wise passes ----

// gates = [input | output | candidate] (3S pre-activations) -> new_cell, new_h (S each)
template <typename scalar_t>
static void forward_row(const scalar_t* __restrict__ g, const scalar_t* __restrict__ c, scalar_t* __restrict__ h_row,
                        scalar_t* __restrict__ c_row, int64_t state) {
  for (int64_t j = 0; j < state; ++j) {
    const scalar_t input_gate = sigmoid(g[j]);
    const scalar_t output_gate = sigmoid(g[state + j]);
    const scalar_t candidate_cell = elu(g[2 * state + j]);
    const scalar_t cell = c[j] + candidate_cell * input_gate;
    c_row[j] = cell;
    h_row[j] = tanh_simd(cell) * output_gate;
  }
}

// gates, grad_h, grad_cell, new_cell -> d_gates (3S), d_old_cell (S); the activations are
// recomputed from the saved pre-activation gates instead of saved by the forward
template <typename scalar_t>
static void backward_row(const scalar_t* __restrict__ g, const scalar_t* __restrict__ gh,
                         const scalar_t* __restrict__ gc, const scalar_t* __restrict__ c, scalar_t* __restrict__ dg,
                         scalar_t* __restrict__ dc, int64_t state) {
  for (int64_t j = 0; j < state; ++j) {
    const scalar_t input_gate = sigmoid(g[j]);
    const scalar_t output_gate = sigmoid(g[state + j]);
    const scalar_t z = g[2 * state + j];
    const scalar_t candidate_cell = elu(z);
    const scalar_t d_elu = z > scalar_t(0) ? scalar_t(1) : candidate_cell + scalar_t(1);  // elu'(z) = e^z = elu(z) + 1 for z <= 0
    const scalar_t tanh_cell = tanh_simd(c[j]);
    // new_h = tanh(new_cell) * output_gate; tanh'(z) = 1 - tanh^2(z)
    const scalar_t d_new_cell = gh[j] * output_gate * (scalar_t(1) - tanh_cell * tanh_cell) + gc[j];
    dc[j] = d_new_cell;  // new_cell = old_cell + ...: d_old_cell = d_new_cell
    // sigmoid'(z) = sigmoid(z) (1 - sigmoid(z))
    dg[j] = d_new_cell * candidate_cell * input_gate * (scalar_t(1) - input_gate);
    dg[state + j] = gh[j] * tanh_cell * output_gate * (scalar_t(1) - output_gate);
    dg[2 * state + j] = d_new_cell * input_gate * d_elu;
  }
}

// ---- 3b. The row loops, compiled twice: for any x86-64 CPU and for AVX2 + FMA ----

// -O3 alone compiles for every x86-64 CPU: SSE2, 4 floats per instruction, no fused
// multiply-add. The same loops compiled a second time for AVX2 + FMA (8 floats, a*b+c in one
// instruction) run the float32 passes ~3-3.8x faster per element on Zen 3 (README: measured).
// `flatten` inlines the row function (and its exp) into each copy, so each copy's code is
// generated for its own target; the CPU is asked once, when the module loads, which copy to run.
template <typename scalar_t>
static void forward_rows(const scalar_t* g, const scalar_t* c, scalar_t* h, scalar_t* c_out, int64_t state,
                         int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    forward_row(g + row * 3 * state, c + row * state, h + row * state, c_out + row * state, state);
  }
}

template <typename scalar_t>
static void backward_rows(const scalar_t* g, const scalar_t* gh, const scalar_t* gc, const scalar_t* c, scalar_t* dg,
                          scalar_t* dc, int64_t state, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    backward_row(g + row * 3 * state, gh + row * state, gc + row * state, c + row * state, dg + row * 3 * state,
                 dc + row * state, state);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"), flatten)) static void forward_rows_avx2(const float* g, const float* c, float* h,
                                                                           float* c_out, int64_t state, int64_t begin,
                                                                           int64_t end) {
  forward_rows<float>(g, c, h, c_out, state, begin, end);
}
__attribute__((target("avx2,fma"), flatten)) static void backward_rows_avx2(const float* g, const float* gh,
                                                                            const float* gc, const float* c, float* dg,
                                                                            float* dc, int64_t state, int64_t begin,
                                                                            int64_t end) {
  backward_rows<float>(g, gh, gc, c, dg, dc, state, begin, end);
}
static bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#else
static bool cpu_has_avx2_fma() { return false; }
#endif

// Which copy runs the float32 passes: "avx2+fma" where the CPU has them, else "sse2"; the
// tests switch to "sse2" to check that both copies compute the same cell. Atomic: the worker
// threads of at::parallel_for read it while Python may set it from another thread.
static std::atomic<bool> use_avx2{cpu_has_avx2_fma()};

static std::string simd_path() { return use_avx2.load() ? "avx2+fma" : "sse2"; }

static void set_simd_path(const std::string& path) {
  TORCH_CHECK(path == "sse2" || path == "avx2+fma", kStage, ": simd path must be 'sse2' or 'avx2+fma', got '", path, "'");
  TORCH_CHECK(path == "sse2" || cpu_has_avx2_fma(), kStage, ": this CPU has no AVX2 + FMA: the 'avx2+fma' path cannot run");
  use_avx2.store(path == "avx2+fma");
}

template <typename scalar_t>
static void run_forward_rows(const scalar_t* g, const scalar_t* c, scalar_t* h, scalar_t* c_out, int64_t state,
                             int64_t begin, int64_t end) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (use_avx2.load(std::memory_order_relaxed)) return forward_rows_avx2(g, c, h, c_out, state, begin, end);
  }
#endif
  forward_rows(g, c, h, c_out, state, begin, end);  // float64 (libm's exp) and CPUs without AVX2
}

template <typename scalar_t>
static void run_backward_rows(const scalar_t* g, const scalar_t* gh, const scalar_t* gc, const scalar_t* c,
                              scalar_t* dg, scalar_t* dc, int64_t state, int64_t begin, int64_t end) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (use_avx2.load(std::memory_order_relaxed)) return backward_rows_avx2(g, gh, gc, c, dg, dc, state, begin, end);
  }
#endif
  backward_rows(g, gh, gc, c, dg, dc, state, begin, end);
}

// ---- 4. Forward: one GEMM, then the fused pass over the rows ----

// The fused pass alone: gates (B, 3S) from the GEMM and old_cell (B, S) -> new_h, new_cell.
// Bound as _C.forward_pass too, so that the notebook can time the pass without the GEMM.
std::vector<at::Tensor> forward_pass(const at::Tensor& gates, const at::Tensor& old_cell) {
  TORCH_CHECK(old_cell.dim() == 2 && gates.dim() == 2 && gates.is_contiguous() && gates.size(0) == old_cell.size(0) &&
                  gates.size(1) == 3 * old_cell.size(1),
              kStage, ": gates must be a contiguous (B, 3S) tensor for old_cell (B, S), got gates ", gates.sizes(),
              " and old_cell ", old_cell.sizes());
  TORCH_CHECK(gates.scalar_type() == old_cell.scalar_type() && gates.device().is_cpu() && old_cell.device().is_cpu(),
              kStage, ": gates and old_cell must be CPU tensors of one dtype, got ", gates.scalar_type(), " on ",
              gates.device(), " and ", old_cell.scalar_type(), " on ", old_cell.device());
  const int64_t batch = old_cell.size(0), state = old_cell.size(1);
  const auto old_cell_c = old_cell.contiguous();  // a named local: its data_ptr stays valid
  auto new_h = at::empty({batch, state}, old_cell.options());
  auto new_cell = at::empty({batch, state}, old_cell.options());

  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lltm_forward", [&] {
    const scalar_t* __restrict__ g_all = gates.data_ptr<scalar_t>();
    const scalar_t* __restrict__ c_all = old_cell_c.data_ptr<scalar_t>();
    scalar_t* __restrict__ h_out = new_h.data_ptr<scalar_t>();
    scalar_t* __restrict__ c_out = new_cell.data_ptr<scalar_t>();
    at::parallel_for(0, batch, grain_rows(state), [&](int64_t begin, int64_t end) {
      run_forward_rows(g_all, c_all, h_out, c_out, state, begin, end);
    });
  });
  return {new_h, new_cell};
}

std::vector<at::Tensor> lltm_forward(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                                     const at::Tensor& old_h, const at::Tensor& old_cell) {
  check_inputs(input, weights, bias, old_h, old_cell);
  // X lives only for the GEMM: the backward rebuilds it rather than keeping B x (S + F) alive.
  const auto X = at::cat({old_h, input}, /*dim=*/1);
  const auto gates = at::addmm(bias.reshape({1, -1}), X, weights.transpose(0, 1));  // (B, 3S), contiguous
  auto new_h_and_cell = forward_pass(gates, old_cell);
  return {new_h_and_cell[0], new_h_and_cell[1], gates};
}

// ---- 5. Backward: the fused pass for d_gates, then the GEMMs ----

std::vector<at::Tensor> lltm_backward(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                      const at::Tensor& new_cell, const at::Tensor& gates, const at::Tensor& input,
                                      const at::Tensor& old_h, const at::Tensor& weights, bool need_d_X,
                                      bool need_d_weights) {
  TORCH_CHECK(grad_h.sizes() == new_cell.sizes() && grad_cell.sizes() == new_cell.sizes(),
              kStage, ": grad_h and grad_cell must have new_cell's shape ", new_cell.sizes(), ", got ",
              grad_h.sizes(), " and ", grad_cell.sizes());
  TORCH_CHECK(gates.is_contiguous() && gates.size(0) == new_cell.size(0) && gates.size(1) == 3 * new_cell.size(1),
              kStage, ": gates must be the contiguous (B, 3S) tensor forward returned, got ", gates.sizes());
  const int64_t batch = new_cell.size(0), state = new_cell.size(1);
  const auto grad_h_c = grad_h.contiguous(), grad_cell_c = grad_cell.contiguous(), new_cell_c = new_cell.contiguous();
  auto d_gates = at::empty({batch, 3 * state}, gates.options());
  auto d_old_cell = at::empty({batch, state}, gates.options());

  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lltm_backward", [&] {
    const scalar_t* __restrict__ g_all = gates.data_ptr<scalar_t>();
    const scalar_t* __restrict__ gh_all = grad_h_c.data_ptr<scalar_t>();
    const scalar_t* __restrict__ gc_all = grad_cell_c.data_ptr<scalar_t>();
    const scalar_t* __restrict__ c_all = new_cell_c.data_ptr<scalar_t>();
    scalar_t* __restrict__ dg_all = d_gates.data_ptr<scalar_t>();
    scalar_t* __restrict__ dc_all = d_old_cell.data_ptr<scalar_t>();
    at::parallel_for(0, batch, grain_rows(state), [&](int64_t begin, int64_t end) {
      run_backward_rows(g_all, gh_all, gc_all, c_all, dg_all, dc_all, state, begin, end);
    });
  });

  auto d_bias = d_gates.sum(/*dim=*/0, /*keepdim=*/true);  // (1, 3S)
  at::Tensor d_weights, d_old_h, d_input;
  if (need_d_weights) {
    d_weights = d_gates.t().mm(at::cat({old_h, input}, /*dim=*/1));  // X rebuilt: one copy
  }
  if (need_d_X) {
    const auto d_X = d_gates.mm(weights);
    d_old_h = d_X.slice(/*dim=*/1, 0, state);  // X = [old_h, input]: old_h's S columns,
    d_input = d_X.slice(/*dim=*/1, state);     // then the input's F (F != S in general)
  }
  return {d_old_h, d_input, d_weights, d_bias, d_old_cell};
}

// ---- 6. The whole cell as one autograd node, in C++ ----
//
// lltm.py's LLTMFunction does the same in Python: at (16, 32, 128) it adds about 10 us per step (Zen 5)
// over this node (README: where the time goes). A torch::autograd::Function is the same recipe in
// C++: the module makes one call per step (_C.cell), and autograd's engine calls
// backward() without entering Python at all.

// What a second backward would reach: the gradients of a once-differentiable backward are made
// to require grad through this node, which refuses (as Python's @once_differentiable does).
struct OnceDifferentiable : public torch::autograd::Function<OnceDifferentiable> {
  // A TensorList, not a std::vector: Function::apply counts the tensors of a TensorList as inputs.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext*, at::TensorList grads) {
    torch::autograd::variable_list aliases;
    for (const auto& grad : grads) {  // aliases: an output must not be an input itself
      aliases.push_back(grad.defined() ? grad.view_as(grad) : at::Tensor());
    }
    return aliases;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    TORCH_CHECK(false, kStage, ": trying to differentiate twice the LLTM's backward, which is once_differentiable");
  }
};

struct LLTMCell : public torch::autograd::Function<LLTMCell> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                                                const at::Tensor& weights, const at::Tensor& bias,
                                                const at::Tensor& old_h, const at::Tensor& old_cell) {
    auto outputs = lltm_forward(input, weights, bias, old_h, old_cell);  // {new_h, new_cell, gates}
    ctx->save_for_backward({outputs[1], outputs[2], input, old_h, weights});  // as LLTMFunction saves
    ctx->saved_data["bias_sizes"] = bias.sizes().vec();  // d_bias goes back in the bias's own shape
    return {outputs[0], outputs[1]};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool need_d_X = ctx->needs_input_grad(0) || ctx->needs_input_grad(3), need_d_weights = ctx->needs_input_grad(1);
    // grads[i] is zeros when its output was unused (materialize_grads, the default).
    auto d = lltm_backward(grads[0].contiguous(), grads[1].contiguous(), saved[0], saved[1], saved[2], saved[3],
                           saved[4], need_d_X, need_d_weights);  // {d_old_h, d_input, d_weights, d_bias, d_old_cell}
    torch::autograd::variable_list result = {
        ctx->needs_input_grad(0) ? d[1] : at::Tensor(), ctx->needs_input_grad(1) ? d[2] : at::Tensor(),
        ctx->needs_input_grad(2) ? d[3].reshape(ctx->saved_data["bias_sizes"].toIntVector()) : at::Tensor(),
        ctx->needs_input_grad(3) ? d[0] : at::Tensor(), ctx->needs_input_grad(4) ? d[4] : at::Tensor()};
    if (!torch::GradMode::is_enabled()) return result;  // the usual case: create_graph=False
    // create_graph=True: the fused passes are invisible to autograd, so a second backward through
    // these gradients would silently miss terms. Route them through OnceDifferentiable instead.
    for (auto& grad : result) {
      if (grad.defined()) grad = grad.detach().requires_grad_();
    }
    return OnceDifferentiable::apply(at::TensorList(result));
  }
};

// (new_h, new_cell), differentiable: what LLTM.forward calls.
std::vector<at::Tensor> lltm_cell(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                                  const at::Tensor& old_h, const at::Tensor& old_cell) {
  return LLTMCell::apply(input, weights, bias, old_h, old_cell);
}

// ---- 7. The binding ----

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cell", &lltm_cell, "the LLTM cell as one autograd node: (new_h, new_cell), backward in C++");
  m.def("forward", &lltm_forward, "LLTM forward (one GEMM, one fused element-wise pass)");
  m.def("backward", &lltm_backward, "LLTM backward (one fused element-wise pass, then the GEMMs)");
  m.def("forward_pass", &forward_pass, "the forward's fused pass alone: (gates, old_cell) -> [new_h, new_cell]");
  m.def("simd_path", &simd_path, "which compiled copy runs the float32 passes: 'avx2+fma' or 'sse2'");
  m.def("set_simd_path", &set_simd_path, "choose the copy ('sse2' or 'avx2+fma'; tests compare the two)");
}

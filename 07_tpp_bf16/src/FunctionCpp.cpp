// Stage 07 of "From PyTorch to Machine Code": the linear layer in bfloat16 on LIBXSMM's kernels.
//
// What this stage teaches: the last step of the layer's way to the machine, low precision.
// bfloat16 (bf16) is the top 16 bits of a float32, rounded to nearest even from the full float32
// (not cut off: rounding is what bounds the error at 2^-8): the same 8-bit exponent (the same
// range), 8 bits of significand instead of 24 (about 2-3 decimal digits). CPUs with AVX512-BF16
// multiply bf16 pairs at twice the float32 rate, and mixed-precision training runs on them.
// What it takes to use them right:
//   - the VNNI-2 layout: the bf16 dot-product instruction wants pairs of consecutive k side by
//     side, so the A operand is packed into [k/2][m][2] panels (vnni_gemm.h draws it);
//   - fp32 accumulation and ONE rounding: products and sums in fp32, the output tile rounded
//     to bf16 once at the end; the bias added in fp32 first, grad_bias summed in fp32;
//   - the batch-reduce GEMM: one kernel call adds a whole k loop of blocks into one fp32 tile;
//   - a run-time decision: LIBXSMM 1.17 generates bf16 kernels only for AVX-512 CPUs, native
//     with AVX512-BF16 and emulated (slower than fp32) without. The layer asks once
//     (bf16_kernels_native()) and otherwise takes the fp32 path, which stays correct: bf16
//     converted to fp32, stage 06's fp32 kernels, one rounding at the end;
//   - autocast like torch.nn.Linear (layer.py): float32 parameters, bf16 compute, float32 grads.
//
//   forward:   y           = x W^T + b          (N, in) x (in, out)  -> (N, out)
//   backward:  grad_input  = grad_output W      (N, out) x (out, in) -> (N, in)
//              grad_weight = grad_output^T x    (out, N) x (N, in)   -> (out, in)
//              grad_bias   = sum_N grad_output                        -> (out)
//
// The files, in reading order (each opens with what it holds):
//   kernel.h         1. one JIT kernel (as stage 06); 1b. the bf16 batch-reduce kernel, the probe
//   blocked_gemm.h   2. the loop nest around the fp32/fp64 kernels (as stage 06), with its picture
//   vnni_gemm.h      2b-2d. VNNI-2 packing, the reference micro-kernel, the bf16 loop nest (new)
//   linear_state.h   3. the layer's state: kernels, plans, packed weight, and its bf16 path
//   FunctionCpp.cpp  4. input checks, 5b. bfloat16 (new), 6. forward and backward (this file)
//   products.h       5. the fp32/fp64 products on raw pointers (06's; forward_tpp takes W as a callable)
//   tools.cpp        7. tools: dispatch probe, peak probes, VNNI-2 packing (new: the bf16 ones)
//   FunctionCpp.h    the functions Python calls (declarations)
//   bindings.cpp     the pybind11 module: the only file that sees Python
//
// What changed since stage 06: check_inputs accepts BFloat16; forward and backward send bf16
// to section 5b, which runs the layer's bf16 path ("vnni", "reference" or "fp32", a property of
// the LinearState); the pack cache's key has a pack kind (fp32 panels or VNNI-2 panels) and
// packs only on a miss; new tools: pack_vnni2, peak_gflops_bf16, bf16_kernels_available.
// float32 and float64 run exactly as in stage 06.
// Build and test (LIBXSMM first: `sudo apt-get install -y libxsmm-dev`, or `make` at the root):
//   pip install --no-build-isolation .   then   pytest tests
#include <ATen/Parallel.h>

#include <optional>
#include <vector>

#include "FunctionCpp.h"
#include "products.h"

namespace tpp {

// Section 4 is internal to this file: the anonymous namespace keeps its names out of the symbols
// the module exports.
namespace {

// ---- 4. Input checks, shapes ----------------------------------------------------------

// The stage's one place for input validation; forward and backward call it before anything
// else, the state included. TORCH_CHECK raises a Python RuntimeError whose message names the
// problem and the offending value. An absent tensor (std::nullopt) is not checked: the bias
// when there is none, grad_output in the forward, and in the backward the input or the weight
// when no requested gradient needs it (grad_input needs the weight, grad_weight the input).
void check_inputs(const std::optional<torch::Tensor>& i_input,
                  const std::optional<torch::Tensor>& i_weight,
                  const std::optional<torch::Tensor>& i_bias,
                  const std::optional<torch::Tensor>& i_grad_output = std::nullopt,
                  bool i_need_grad_input = false,
                  bool i_need_grad_weights = false) {
  TORCH_CHECK(i_weight || !i_need_grad_input, kStage, ": grad_input needs the weight, got None");
  TORCH_CHECK(i_input || !i_need_grad_weights, kStage, ": grad_weight needs the input, got None");

  // Device and dtype: CPU tensors, Float, Double or BFloat16 (new: section 5b), all of the
  // first one's dtype (the weight's). A bf16 input to a float32 layer is refused here, as
  // torch.nn.Linear refuses it; under torch.autocast, layer.py casts all three to bf16 first.
  const std::pair<const char*, const std::optional<torch::Tensor>*> l_tensors[] = {
      {"weight", &i_weight}, {"input", &i_input}, {"bias", &i_bias}, {"grad_output", &i_grad_output}};
  const char* l_dtype_from = nullptr;
  torch::ScalarType l_dtype = torch::kFloat;
  for (const auto& [l_name, l_tensor] : l_tensors) {
    if (!l_tensor->has_value()) continue;
    const torch::Tensor& l_t = l_tensor->value();
    TORCH_CHECK(l_t.device().is_cpu(), kStage, ": expected the ", l_name, " on the CPU, got device ", l_t.device());
    TORCH_CHECK(l_t.scalar_type() == torch::kFloat || l_t.scalar_type() == torch::kDouble ||
                    l_t.scalar_type() == torch::kBFloat16,
                kStage, ": expected a Float, Double or BFloat16 ", l_name, " dtype, got ", l_t.scalar_type());
    if (l_dtype_from == nullptr) {
      l_dtype_from = l_name;
      l_dtype = l_t.scalar_type();
    }
    TORCH_CHECK(l_t.scalar_type() == l_dtype, kStage, ": expected the ", l_name, " dtype ", l_dtype,
                " (the ", l_dtype_from, "'s), got ", l_t.scalar_type());
  }

  // Ranks: weight (out_features, in_features), input and grad_output (*, features).
  if (i_weight) {
    TORCH_CHECK(i_weight->dim() == 2, kStage, ": expected a 2-d weight (out_features, in_features), got ",
                i_weight->dim(), " dimension(s): ", i_weight->sizes());
  }
  if (i_input) {
    TORCH_CHECK(i_input->dim() >= 1, kStage, ": expected an input with at least 1 dimension (*, in_features), got a 0-d tensor");
  }
  if (i_grad_output) {
    TORCH_CHECK(i_grad_output->dim() >= 1, kStage, ": expected a grad_output with at least 1 dimension (*, out_features), got a 0-d tensor");
  }

  // Sizes: the feature counts agree with the weight, the batch dimensions with each other.
  // The kernels trust these sizes: a wrong one here would be a read out of bounds there.
  if (i_input && i_weight) {
    TORCH_CHECK(i_input->size(-1) == i_weight->size(1), kStage, ": expected ", i_weight->size(1),
                " input features in the last dimension (the weight's in_features), got ", i_input->size(-1),
                " (input shape ", i_input->sizes(), ")");
  }
  if (i_bias && i_weight) {
    TORCH_CHECK(i_bias->dim() == 1 && i_bias->size(0) == i_weight->size(0), kStage, ": expected a bias of shape [",
                i_weight->size(0), "] (the weight's out_features), got shape ", i_bias->sizes());
  }
  if (i_grad_output && i_weight) {
    TORCH_CHECK(i_grad_output->size(-1) == i_weight->size(0), kStage, ": expected ", i_weight->size(0),
                " output features in grad_output's last dimension (the weight's out_features), got ",
                i_grad_output->size(-1), " (grad_output shape ", i_grad_output->sizes(), ")");
  }
  if (i_grad_output && i_input) {
    const auto l_batch = i_input->sizes().slice(/*start=*/0, /*length=*/i_input->dim() - 1);
    const auto l_batch_grad = i_grad_output->sizes().slice(/*start=*/0, /*length=*/i_grad_output->dim() - 1);
    TORCH_CHECK(l_batch == l_batch_grad, kStage, ": expected grad_output's leading dimensions ", l_batch,
                " (the input's), got ", l_batch_grad, " (grad_output shape ", i_grad_output->sizes(), ")");
  }
}

// The caller's state, checked against the layer's sizes, or (state None) a temporary one for
// this call, made in o_temporary. Called after check_inputs: the sizes are valid by then.
LinearState& state_for(LinearState* i_state, int64_t i_in_features, int64_t i_out_features,
                       std::optional<LinearState>& o_temporary) {
  if (i_state == nullptr) return o_temporary.emplace(i_in_features, i_out_features);
  TORCH_CHECK(i_state->in_features() == i_in_features && i_state->out_features() == i_out_features,
              kStage, ": the LinearState was made for in_features=", i_state->in_features(), " and out_features=",
              i_state->out_features(), ", got a weight with in_features=", i_in_features, " and out_features=",
              i_out_features);
  return *i_state;
}

// (*, features) -> (N, features), N the product of the leading sizes (1 for a 1-d tensor).
// A view where the strides allow it, else a copy; flatten handles 0-size dimensions too.
torch::Tensor flatten_to_2d(const torch::Tensor& i_tensor) {
  return i_tensor.dim() == 1 ? i_tensor.unsqueeze(/*dim=*/0) : i_tensor.flatten(/*start_dim=*/0, /*end_dim=*/-2);
}

// (N, features) -> (*, features): the leading sizes of i_like, the last size of i_tensor_2d.
torch::Tensor unflatten_like(const torch::Tensor& i_tensor_2d, const torch::Tensor& i_like) {
  std::vector<int64_t> l_sizes = i_like.sizes().vec();
  l_sizes.back() = i_tensor_2d.size(/*dim=*/1);
  return i_tensor_2d.reshape(l_sizes);
}

// ---- 5b. bfloat16: the VNNI path and the fp32 fallback --------------------------------
//
// Every bf16 product is C (bf16) = A . B with fp32 accumulation and ONE rounding at the end;
// the bias is added in fp32 before it, grad_bias is summed in fp32. Two ways to get there:
//   kVnni, kReference  A packed VNNI-2 (vnni_gemm.h), B column-major with an even number of
//                      rows, VnniGemm's loop nest; the kernel is LIBXSMM's (kVnni) or the plain
//                      C++ reference (kReference)
//   kFp32              the path for CPUs without native bf16 kernels (AVX2 CPUs such as Zen 3,
//                      where LIBXSMM has none, and AVX-512 CPUs without AVX512-BF16, where its
//                      bf16 kernels are emulated and slower than the fp32 ones):
//                      the operands converted to fp32 once (exact: a bf16 is an fp32 with the
//                      low 16 bits zero), section 5's fp32 products, the result rounded once.
//                      Costs one pass over each operand, a few % of a large GEMM.
//
// The three products as VNNI GEMMs (column-major, A(i, k) read at src[i * s_i + k * s_k]):
//   forward      y^T  = W . x^T        A = W:   s_i = in, s_k = 1   B = x, ld in (+1 if odd)
//   grad_input   gx^T = W^T . gy^T     A = W^T: s_i = 1, s_k = in   B = gy, ld out (+1 if odd)
//   grad_weight  gw^T = x^T . gy       A = x^T: s_i = 1, s_k = in   B = gy^T, copied, ld N (+1)
// grad_weight's B must run over the batch contiguously: gy is transposed once (the bf16
// kernels take no TRANS_B here).

// (rows, k) row-major bf16 -> the same with an even k: a zero column appended when k is odd,
// so that a VNNI pair never reads past a row. The tensor itself when k is even.
at::Tensor pad_to_even(const at::Tensor& i_rows) {
  return i_rows.size(1) % 2 ? at::constant_pad_nd(i_rows, {0, 1}, 0).contiguous() : i_rows;
}

// A (M x K) packed VNNI-2 into panels of bm rows, in a new bf16 tensor (pack_vnni2's layout).
at::Tensor vnni_panels(const bf16* i_src, idx M, idx K, idx i_stride_i, idx i_stride_k, idx i_bm) {
  at::Tensor l_packed = at::empty({std::max<idx>(1, (M + i_bm - 1) / i_bm * i_bm * vnni_k(K))}, at::kBFloat16);
  pack_vnni2(i_src, M, K, i_stride_i, i_stride_k, i_bm, l_packed.mutable_data_ptr<bf16>());
  return l_packed;
}

// y (N, out) in bf16 from bf16 x (N, in), W (out, in), b (out) or undefined.
at::Tensor forward_bf16(LinearState& io_state, const at::Tensor& i_weight, const at::Tensor& i_x,
                        const at::Tensor& i_w, const at::Tensor& i_b, bool i_cache_weight) {
  const idx N = i_x.size(0), l_in = i_w.size(1), l_out = i_w.size(0);
  const at::Tensor l_b32 = i_b.defined() ? i_b.to(at::kFloat) : at::Tensor();  // the bias, in fp32
  if (io_state.bf16_path() == kFp32) {
    const at::Tensor l_x32 = i_x.to(at::kFloat);
    at::Tensor l_y32 = at::empty({N, l_out}, l_x32.options());
    forward_tpp<float>(io_state, i_weight, [&] { return i_w.to(at::kFloat); }, l_x32.const_data_ptr<float>(),
                       l_b32.defined() ? l_b32.const_data_ptr<float>() : nullptr, l_y32.mutable_data_ptr<float>(), N,
                       l_in, l_out, i_cache_weight);
    return l_y32.to(at::kBFloat16);  // the one rounding
  }
  at::Tensor l_y = at::empty({N, l_out}, i_x.options());
  if (N == 0 || l_out == 0) return l_y;
  const at::Tensor l_xp = pad_to_even(i_x);  // B = x^T, ld = in rounded up to even
  const VnniGemm l_gemm = io_state.vnni_plan(kForward, N, /*ldb=*/l_xp.size(1));
  const at::Tensor l_panels = io_state.packed_weight(i_weight, l_gemm.bm, kVnniPanels, i_cache_weight, [&](bool) {
    return vnni_panels(i_w.const_data_ptr<bf16>(), l_out, l_in, /*s_i=*/l_in, /*s_k=*/1, l_gemm.bm);
  });
  l_gemm.run(l_panels.const_data_ptr<bf16>(), l_xp.const_data_ptr<bf16>(), l_y.mutable_data_ptr<bf16>(),
             l_b32.defined() ? l_b32.const_data_ptr<float>() : nullptr);
  return l_y;
}

// gx (N, in) = gy (N, out) W, in bf16.
at::Tensor grad_input_bf16(LinearState& io_state, const at::Tensor& i_gy, const at::Tensor& i_w) {
  const idx N = i_gy.size(0), l_in = i_w.size(1), l_out = i_w.size(0);
  if (io_state.bf16_path() == kFp32) {
    const at::Tensor l_gy32 = i_gy.to(at::kFloat), l_w32 = i_w.to(at::kFloat);
    at::Tensor l_gx32 = at::empty({N, l_in}, l_gy32.options());
    grad_input_tpp<float>(io_state, l_gy32.const_data_ptr<float>(), l_w32.const_data_ptr<float>(),
                          l_gx32.mutable_data_ptr<float>(), N, l_in, l_out);
    return l_gx32.to(at::kBFloat16);
  }
  at::Tensor l_gx = at::empty({N, l_in}, i_gy.options());
  const at::Tensor l_gyp = pad_to_even(i_gy);  // B = gy^T, ld = out rounded up to even
  const VnniGemm l_gemm = io_state.vnni_plan(kGradInput, N, /*ldb=*/l_gyp.size(1));
  const at::Tensor l_panels = vnni_panels(i_w.const_data_ptr<bf16>(), l_in, l_out, /*s_i=*/1, /*s_k=*/l_in, l_gemm.bm);
  l_gemm.run(l_panels.const_data_ptr<bf16>(), l_gyp.const_data_ptr<bf16>(), l_gx.mutable_data_ptr<bf16>(), nullptr);
  return l_gx;
}

// gw (out, in) = gy^T x, in bf16.
at::Tensor grad_weight_bf16(LinearState& io_state, const at::Tensor& i_gy, const at::Tensor& i_x) {
  const idx N = i_gy.size(0), l_in = i_x.size(1), l_out = i_gy.size(1);
  if (io_state.bf16_path() == kFp32) {
    const at::Tensor l_gy32 = i_gy.to(at::kFloat), l_x32 = i_x.to(at::kFloat);
    at::Tensor l_gw32 = at::empty({l_out, l_in}, l_gy32.options());
    grad_weight_tpp<float>(io_state, l_gy32.const_data_ptr<float>(), l_x32.const_data_ptr<float>(),
                           l_gw32.mutable_data_ptr<float>(), /*o_gb=*/nullptr, N, l_in, l_out);
    return l_gw32.to(at::kBFloat16);
  }
  at::Tensor l_gw = at::empty({l_out, l_in}, i_gy.options());
  const at::Tensor l_gyt = pad_to_even(i_gy.t().contiguous());  // B = gy as column-major (N x out): gy^T's rows
  const VnniGemm l_gemm = io_state.vnni_plan(kGradWeight, N, /*ldb=*/l_gyt.size(1));
  const at::Tensor l_panels = vnni_panels(i_x.const_data_ptr<bf16>(), l_in, N, /*s_i=*/1, /*s_k=*/l_in, l_gemm.bm);
  l_gemm.run(l_panels.const_data_ptr<bf16>(), l_gyt.const_data_ptr<bf16>(), l_gw.mutable_data_ptr<bf16>(), nullptr);
  return l_gw;
}

// gb = sum_N gy, summed in fp32 (column_sums on an fp32 copy), rounded to bf16 once.
at::Tensor grad_bias_bf16(const at::Tensor& i_gy) {
  const at::Tensor l_gy32 = i_gy.to(at::kFloat);
  at::Tensor l_gb32 = at::empty({i_gy.size(1)}, l_gy32.options());
  grad_bias_tpp<float>(l_gy32.const_data_ptr<float>(), l_gb32.mutable_data_ptr<float>(), i_gy.size(0), i_gy.size(1));
  return l_gb32.to(at::kBFloat16);
}

}  // namespace

// ---- 6. The bound functions -----------------------------------------------------------

// y = x W^T + b for x of shape (*, in); without a bias, y = x W^T. i_state: the layer's state
// (None: a temporary one). i_cache_weight: may reuse and keep the packed W (see packed_weight).
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight, std::optional<torch::Tensor> i_bias,
                      LinearState* i_state, bool i_cache_weight) {
  check_inputs(i_input, i_weight, i_bias);  // first: the state is only touched with valid inputs
  std::optional<LinearState> l_temporary;
  LinearState& l_state = state_for(i_state, i_weight.size(1), i_weight.size(0), l_temporary);
  // Row-major data, each in a named local: a data pointer into a temporary would dangle.
  // contiguous() returns the tensor itself when it is already contiguous, else a copy.
  const torch::Tensor l_input = flatten_to_2d(i_input).contiguous();             // (N, in)
  const torch::Tensor l_weight = i_weight.contiguous();                          // (out, in)
  const torch::Tensor l_bias = i_bias ? i_bias->contiguous() : torch::Tensor();  // (out), or undefined
  const int64_t l_n = l_input.size(0), l_in = l_weight.size(1), l_out = l_weight.size(0);
  if (l_input.scalar_type() == torch::kBFloat16) {  // new: section 5b
    return unflatten_like(forward_bf16(l_state, i_weight, l_input, l_weight, l_bias, i_cache_weight), i_input);
  }
  torch::Tensor l_output = torch::empty({l_n, l_out}, l_input.options());  // every element is written

  // scalar_t is float for a Float input, double for a Double one.
  AT_DISPATCH_FLOATING_TYPES(l_input.scalar_type(), "tpp::forward", [&] {
    // The pack cache keys on the weight as the caller holds it (i_weight), not on a copy.
    forward_tpp<scalar_t>(l_state, i_weight, [&] { return l_weight; }, l_input.const_data_ptr<scalar_t>(),
                          l_bias.defined() ? l_bias.const_data_ptr<scalar_t>() : nullptr,
                          l_output.mutable_data_ptr<scalar_t>(), l_n, l_in, l_out, i_cache_weight);
  });
  return unflatten_like(l_output, i_input);  // (*, out)
}

torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight) {
  return forward(i_input, i_weight, /*i_bias=*/std::nullopt, /*i_state=*/nullptr, /*i_cache_weight=*/false);
}

// The gradients of y = x W^T + b: {grad_input, grad_weight, grad_bias}, each computed only
// when asked for; one that is not comes back undefined, which Python receives as None.
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output,
                                    std::optional<torch::Tensor> i_input,
                                    std::optional<torch::Tensor> i_weights,
                                    bool i_need_grad_input,
                                    bool i_need_grad_weights,
                                    bool i_need_grad_bias,
                                    LinearState* i_state) {
  check_inputs(i_input, i_weights, /*i_bias=*/std::nullopt, i_grad_output, i_need_grad_input, i_need_grad_weights);
  const torch::Tensor l_grad_output = flatten_to_2d(i_grad_output).contiguous();  // (N, out)
  const int64_t l_n = l_grad_output.size(0), l_out = l_grad_output.size(1);
  // in_features from whichever of weight and input is there (grad_bias alone needs neither).
  const int64_t l_in = i_weights ? i_weights->size(1) : i_input ? i_input->size(-1) : 0;
  std::optional<LinearState> l_temporary;
  LinearState* l_state = nullptr;  // grad_bias alone needs no kernel, so no state
  if (i_need_grad_input || i_need_grad_weights) l_state = &state_for(i_state, l_in, l_out, l_temporary);
  torch::Tensor l_grad_input, l_grad_weights, l_grad_bias;  // undefined until computed
  if (l_grad_output.scalar_type() == torch::kBFloat16) {  // new: section 5b
    if (i_need_grad_input) l_grad_input = unflatten_like(grad_input_bf16(*l_state, l_grad_output, i_weights->contiguous()), i_grad_output);
    if (i_need_grad_weights) l_grad_weights = grad_weight_bf16(*l_state, l_grad_output, flatten_to_2d(*i_input).contiguous());
    if (i_need_grad_bias) l_grad_bias = grad_bias_bf16(l_grad_output);
    return {l_grad_input, l_grad_weights, l_grad_bias};
  }

  AT_DISPATCH_FLOATING_TYPES(l_grad_output.scalar_type(), "tpp::backward", [&] {
    const scalar_t* l_gy = l_grad_output.const_data_ptr<scalar_t>();
    if (i_need_grad_input) {
      // grad_input = grad_output W: (N, out) x (out, in) -> (N, in), then (*, in)
      const torch::Tensor l_weights = i_weights->contiguous();  // (out, in)
      torch::Tensor l_gx = torch::empty({l_n, l_in}, l_grad_output.options());
      grad_input_tpp<scalar_t>(*l_state, l_gy, l_weights.const_data_ptr<scalar_t>(), l_gx.mutable_data_ptr<scalar_t>(),
                               l_n, l_in, l_out);
      l_grad_input = unflatten_like(l_gx, i_grad_output);
    }
    if (i_need_grad_bias) l_grad_bias = torch::empty({l_out}, l_grad_output.options());
    scalar_t* l_gb = i_need_grad_bias ? l_grad_bias.mutable_data_ptr<scalar_t>() : nullptr;
    bool l_bias_done = false;
    if (i_need_grad_weights) {
      // grad_weight = grad_output^T x: (out, N) x (N, in) -> (out, in); grad_bias in the same pass
      const torch::Tensor l_input = flatten_to_2d(*i_input).contiguous();  // (N, in)
      l_grad_weights = torch::empty({l_out, l_in}, l_grad_output.options());
      l_bias_done = grad_weight_tpp<scalar_t>(*l_state, l_gy, l_input.const_data_ptr<scalar_t>(),
                                              l_grad_weights.mutable_data_ptr<scalar_t>(), l_gb, l_n, l_in, l_out);
    }
    if (i_need_grad_bias && !l_bias_done) {
      // grad_bias = sum over the N rows of grad_output -> (out), when grad_weight did not sum it
      grad_bias_tpp<scalar_t>(l_gy, l_gb, l_n, l_out);
    }
  });
  return {l_grad_input, l_grad_weights, l_grad_bias};
}

std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, torch::Tensor i_input, torch::Tensor i_weights) {
  std::vector<torch::Tensor> l_grads = backward(i_grad_output, i_input, i_weights, /*i_need_grad_input=*/true,
                                                /*i_need_grad_weights=*/true, /*i_need_grad_bias=*/false,
                                                /*i_state=*/nullptr);
  return {l_grads[0], l_grads[1]};  // {grad_input, grad_weight}
}

}  // namespace tpp

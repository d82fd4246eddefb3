// Stage 16 of "From PyTorch to Machine Code": stage 08's registered operators on LibTorch's
// stable ABI (torch/csrc/stable), so that one compiled module keeps working when torch moves on:
// it calls libtorch only through a C shim, never through a libtorch C++ symbol.
//
// What stage 06 taught, and this file still does: how a fast matrix product is put together from TPPs (tensor
// processing primitives): small kernels for one fixed job, here the GEMM block
//
//     C (m x n)  (+)=  A (m x k) . B (k x n)        64 x 128 x 64 by default on AVX2
//
// that LIBXSMM writes as machine code at run time (JIT) for those exact sizes and the CPU it
// runs on. Where the data lives while a kernel runs, for the 64 x 128 tiles of AVX2 (128 x 64
// on AVX-512):
//   - registers: the kernel holds a small block of C (a few columns of up to 64 rows) in vector
//     registers while it runs over k, loading a column of A and broadcasting elements of B.
//     A whole 64 x 128 float32 tile cannot stay there: it is 32 KB, and all the vector registers
//     together hold 2 KB (32 x 64 B, AVX-512) or 512 B (16 x 32 B, AVX2);
//   - L1 (32-48 KB per core): the A block (16 KB on AVX2), which the kernel reads again for
//     every few columns of B, and the B and C columns in use;
//   - L2 (512 KB-1 MB per core): the thread's chunk of packed B (at most 256 KB) and its C tile,
//     read and written once per kernel call.
// Our job is the loop nest around the kernels: cut each of the layer's three products into
// tiles, reduce every tile in k steps, spread the tiles over the threads, and prepare once
// everything that can be prepared once (the kernels, the plans).
//
//   forward:   y           = x W^T + b          (N, in) x (in, out)  -> (N, out)
//   backward:  grad_input  = grad_output W      (N, out) x (out, in) -> (N, in)
//              grad_weight = grad_output^T x    (out, N) x (N, in)   -> (out, in)
//              grad_bias   = sum_N grad_output                        -> (out)
//
// The files, in reading order (each opens with what it holds):
//   kernel.h         1. one JIT kernel: asking LIBXSMM for it, the NULL check
//   blocked_gemm.h   2. the loop nest around the kernels (BlockedGemm), with its picture
//   linear_state.h   3. the state: kernels, plans, the weight packed per call
//   FunctionCpp.cpp  4. input checks and the process-wide states, 6. forward and backward
//                    (bfloat16 too) (this file)
//   products.h       5. the three products on raw pointers, and why every operand is packed
//   tools.cpp        7. tools: a dispatch probe, the peak probe
//   FunctionCpp.h    the functions the operators run (declarations)
//   bindings.cpp     the operator schemas and registrations (STABLE_TORCH_LIBRARY), loading by
//                    path, and the empty Python module whose import runs them
//
// What changed since stage 08: torch::stable::Tensor and the ops of torch/csrc/stable/ops.h
// (contiguous, flatten, unsqueeze, reshape, to, empty, parallel_for) for ATen's, each a call
// through the C shim (all but parallel_for into libtorch's dispatcher); TPP_CHECK (kernel.h) for
// TORCH_CHECK; the dtype switch built from torch/headeronly's THO_ macros for
// AT_DISPATCH_FLOATING_TYPES; no pack cache (linear_state.h). The kernels, the loop nest and
// the checks are 08's. Messages start with
// "linear_stable:".
// Build and test (LIBXSMM first: `sudo apt-get install -y libxsmm-dev`, or `make` at the root):
//   pip install --no-build-isolation .   then   pytest tests
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/core/Dispatch.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "FunctionCpp.h"
#include "products.h"

namespace tpp {

// Section 4 is internal to this file but for state_for (FunctionCpp.h declares it): the anonymous
// namespace keeps the other names out of the symbols the module exports.
namespace {

// ---- 4. Input checks, shapes ----------------------------------------------------------

// The stage's one place for input validation; forward and backward call it before anything
// else, the state included. TPP_CHECK raises a Python RuntimeError whose message names the
// problem and the offending value. An absent tensor (std::nullopt) is not checked: the bias
// when there is none, grad_output in the forward, and in the backward the input or the weight
// when no requested gradient needs it (grad_input needs the weight, grad_weight the input).
void check_inputs(const std::optional<torch::stable::Tensor>& i_input,
                  const std::optional<torch::stable::Tensor>& i_weight,
                  const std::optional<torch::stable::Tensor>& i_bias,
                  const std::optional<torch::stable::Tensor>& i_grad_output = std::nullopt,
                  bool i_need_grad_input = false,
                  bool i_need_grad_weights = false) {
  TPP_CHECK(i_weight || !i_need_grad_input, kStage, ": grad_input needs the weight, got None");
  TPP_CHECK(i_input || !i_need_grad_weights, kStage, ": grad_weight needs the input, got None");

  // Device and dtype: CPU tensors, Float or Double (the two types LIBXSMM's GEMMs are built
  // for here) or BFloat16 (computed on the float32 kernels: section 6), all of the first one's
  // dtype (the weight's).
  const std::pair<const char*, const std::optional<torch::stable::Tensor>*> l_tensors[] = {
      {"weight", &i_weight}, {"input", &i_input}, {"bias", &i_bias}, {"grad_output", &i_grad_output}};
  const char* l_dtype_from = nullptr;
  ScalarType l_dtype = kFloat;
  for (const auto& [l_name, l_tensor] : l_tensors) {
    if (!l_tensor->has_value()) continue;
    const torch::stable::Tensor& l_t = l_tensor->value();
    TPP_CHECK(l_t.is_cpu(), kStage, ": expected the ", l_name, " on the CPU, got device ", device_text(l_t));
    TPP_CHECK(l_t.scalar_type() == kFloat || l_t.scalar_type() == kDouble ||
                  l_t.scalar_type() == kBFloat16,
                kStage, ": expected a Float, Double or BFloat16 ", l_name, " dtype, got ", l_t.scalar_type());
    if (l_dtype_from == nullptr) {
      l_dtype_from = l_name;
      l_dtype = l_t.scalar_type();
    }
    TPP_CHECK(l_t.scalar_type() == l_dtype, kStage, ": expected the ", l_name, " dtype ", l_dtype,
                " (the ", l_dtype_from, "'s), got ", l_t.scalar_type());
  }

  // Ranks: weight (out_features, in_features), input and grad_output (*, features).
  if (i_weight) {
    TPP_CHECK(i_weight->dim() == 2, kStage, ": expected a 2-d weight (out_features, in_features), got ",
                i_weight->dim(), " dimension(s): ", shape_text(i_weight->sizes()));
  }
  if (i_input) {
    TPP_CHECK(i_input->dim() >= 1, kStage, ": expected an input with at least 1 dimension (*, in_features), got a 0-d tensor");
  }
  if (i_grad_output) {
    TPP_CHECK(i_grad_output->dim() >= 1, kStage, ": expected a grad_output with at least 1 dimension (*, out_features), got a 0-d tensor");
  }

  // Sizes: the feature counts agree with the weight, the batch dimensions with each other.
  // The kernels trust these sizes: a wrong one here would be a read out of bounds there.
  if (i_input && i_weight) {
    TPP_CHECK(i_input->size(-1) == i_weight->size(1), kStage, ": expected ", i_weight->size(1),
                " input features in the last dimension (the weight's in_features), got ", i_input->size(-1),
                " (input shape ", shape_text(i_input->sizes()), ")");
  }
  if (i_bias && i_weight) {
    TPP_CHECK(i_bias->dim() == 1 && i_bias->size(0) == i_weight->size(0), kStage, ": expected a bias of shape [",
                i_weight->size(0), "] (the weight's out_features), got shape ", shape_text(i_bias->sizes()));
  }
  if (i_grad_output && i_weight) {
    TPP_CHECK(i_grad_output->size(-1) == i_weight->size(0), kStage, ": expected ", i_weight->size(0),
                " output features in grad_output's last dimension (the weight's out_features), got ",
                i_grad_output->size(-1), " (grad_output shape ", shape_text(i_grad_output->sizes()), ")");
  }
  if (i_grad_output && i_input) {
    const auto l_batch = i_input->sizes().slice(/*start=*/0, /*length=*/i_input->dim() - 1);
    const auto l_batch_grad = i_grad_output->sizes().slice(/*start=*/0, /*length=*/i_grad_output->dim() - 1);
    TPP_CHECK(l_batch.equals(l_batch_grad), kStage, ": expected grad_output's leading dimensions ", shape_text(l_batch),
              " (the input's), got ", shape_text(l_batch_grad), " (grad_output shape ",
              shape_text(i_grad_output->sizes()), ")");
  }
}

}  // namespace

// New in 08: the state of every (in_features, out_features) pair, process-wide. A registered
// operator's schema has no type for a pybind11 object: no Layer can hand it a LinearState (06's pybind11
// object). The first call with a pair makes its state (its kernels and plans); every later call,
// from any layer, thread, compiled graph or exported program, finds it here. A state holds
// kernels and plans only (the weight is packed per call): one per pair, never freed, a few KB
// each. Called after check_inputs: the sizes are valid by then.
LinearState& state_for(int64_t i_in_features, int64_t i_out_features) {
  static std::mutex s_mutex;
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<LinearState>> s_states;
  std::lock_guard<std::mutex> l_lock(s_mutex);
  auto& l_state = s_states[{i_in_features, i_out_features}];
  if (!l_state) l_state = std::make_unique<LinearState>(i_in_features, i_out_features);
  return *l_state;
}

namespace {

// New in 16: every tensor op of torch/csrc/stable/ops.h that this stage calls (empty,
// contiguous, flatten, unsqueeze, reshape, to) is a boxed call through the dispatcher (README,
// "08 against 16"), even when it has nothing to do. The three helpers below skip the call when
// the answer is the tensor itself: a 2-d tensor needs no flatten or reshape, a contiguous one no
// copy (is_contiguous() asks the shim, not the dispatcher).

// (*, features) -> (N, features), N the product of the leading sizes (1 for a 1-d tensor).
// A view where the strides allow it, else a copy; flatten handles 0-size dimensions too.
torch::stable::Tensor flatten_to_2d(const torch::stable::Tensor& i_tensor) {
  if (i_tensor.dim() == 2) return i_tensor;
  return i_tensor.dim() == 1 ? torch::stable::unsqueeze(i_tensor, /*dim=*/0)
                             : torch::stable::flatten(i_tensor, /*start_dim=*/0, /*end_dim=*/-2);
}

// (N, features) -> (*, features): the leading sizes of i_like, the last size of i_tensor_2d.
torch::stable::Tensor unflatten_like(const torch::stable::Tensor& i_tensor_2d, const torch::stable::Tensor& i_like) {
  if (i_like.dim() == 2) return i_tensor_2d;
  std::vector<int64_t> l_sizes = i_like.sizes().vec();
  l_sizes.back() = i_tensor_2d.size(/*dim=*/1);
  return torch::stable::reshape(i_tensor_2d, l_sizes);
}

// Row-major data: the tensor itself when it is already contiguous, else a contiguous copy.
torch::stable::Tensor as_contiguous(const torch::stable::Tensor& i_tensor) {
  return i_tensor.is_contiguous() ? i_tensor : torch::stable::contiguous(i_tensor);
}

// ATen's AT_DISPATCH_FLOATING_TYPES, built from torch/headeronly's THO_ macros: the lambda runs
// with scalar_t = float for a Float tensor, double for a Double one; any other dtype raises.
#define DISPATCH_FLOAT_AND_DOUBLE(TYPE, NAME, ...)                                \
  THO_DISPATCH_SWITCH(TYPE, NAME, THO_DISPATCH_CASE(torch::headeronly::ScalarType::Float, __VA_ARGS__) \
                                      THO_DISPATCH_CASE(torch::headeronly::ScalarType::Double, __VA_ARGS__))

// BFloat16 operands, as float32 (exact: every bfloat16 is a float32). The kernels below then
// accumulate in float32 and the caller rounds each result to bfloat16 once.
std::optional<torch::stable::Tensor> to_float(const std::optional<torch::stable::Tensor>& i_tensor) {
  if (!i_tensor) return std::nullopt;
  return torch::stable::to(*i_tensor, kFloat);
}

}  // namespace

// ---- 6. The functions the operators run (bindings.cpp registers them) ------------------
//
// bfloat16: LIBXSMM 1.17 generates bfloat16 GEMMs only for AVX-512 CPUs, native with AVX512-BF16
// and emulated (slower than its float32 kernels) without, and only with the A operand in VNNI
// pairs (stage 07). This stage runs everywhere instead: bfloat16 operands are
// widened to float32, the float32 kernels run, and each result is rounded to bfloat16 once
// (grad_bias is summed in float32 too). A VNNI path would slot in at the two `kBFloat16` tests
// below; stage 08's README, "Timing" (the compiled bfloat16 MLP on Zen 5), says what it would buy.

// y = x W^T + b for x of shape (*, in); without a bias, y = x W^T. The state comes from the
// process-wide table (state_for); the weight is packed for this call.
torch::stable::Tensor forward(torch::stable::Tensor i_input, torch::stable::Tensor i_weight,
                              std::optional<torch::stable::Tensor> i_bias) {
  check_inputs(i_input, i_weight, i_bias);  // first: the state is only touched with valid inputs
  if (i_input.scalar_type() == kBFloat16) {  // the fallback (above): float32 kernels, one rounding
    return torch::stable::to(forward(*to_float(i_input), *to_float(i_weight), to_float(i_bias)),
                             kBFloat16);
  }
  LinearState& l_state = state_for(i_weight.size(1), i_weight.size(0));
  // Row-major data, each in a named local: a data pointer into a temporary would dangle.
  const torch::stable::Tensor l_input = as_contiguous(flatten_to_2d(i_input));  // (N, in)
  const torch::stable::Tensor l_weight = as_contiguous(i_weight);            // (out, in)
  const std::optional<torch::stable::Tensor> l_bias =                                       // (out), or none
      i_bias ? std::optional(as_contiguous(*i_bias)) : std::nullopt;
  const int64_t l_n = l_input.size(0), l_in = l_weight.size(1), l_out = l_weight.size(0);
  // every element is written; empty's device is the CPU by default
  torch::stable::Tensor l_output = torch::stable::empty({l_n, l_out}, l_input.scalar_type());

  // scalar_t is float for a Float input, double for a Double one.
  DISPATCH_FLOAT_AND_DOUBLE(l_input.scalar_type(), "tpp::forward", [&] {
    forward_tpp<scalar_t>(l_state, l_weight, l_input.const_data_ptr<scalar_t>(),
                          l_bias ? l_bias->const_data_ptr<scalar_t>() : nullptr,
                          l_output.mutable_data_ptr<scalar_t>(), l_n, l_in, l_out);
  });
  return unflatten_like(l_output, i_input);  // (*, out)
}

torch::stable::Tensor forward(torch::stable::Tensor i_input, torch::stable::Tensor i_weight) {
  return forward(i_input, i_weight, /*i_bias=*/std::nullopt);
}

// The gradients of y = x W^T + b: {grad_input, grad_weight, grad_bias}, each computed only
// when asked for; one that is not comes back undefined, which Python receives as None.
std::vector<torch::stable::Tensor> backward(torch::stable::Tensor i_grad_output,
                                            std::optional<torch::stable::Tensor> i_input,
                                            std::optional<torch::stable::Tensor> i_weights,
                                            bool i_need_grad_input,
                                            bool i_need_grad_weights,
                                            bool i_need_grad_bias) {
  check_inputs(i_input, i_weights, /*i_bias=*/std::nullopt, i_grad_output, i_need_grad_input, i_need_grad_weights);
  if (i_grad_output.scalar_type() == kBFloat16) {  // the fallback (section 6): float32, one rounding
    std::vector<torch::stable::Tensor> l_grads = backward(*to_float(i_grad_output), to_float(i_input),
                                                          to_float(i_weights), i_need_grad_input, i_need_grad_weights,
                                                          i_need_grad_bias);
    for (auto& l_grad : l_grads) {
      if (l_grad.defined()) l_grad = torch::stable::to(l_grad, kBFloat16);
    }
    return l_grads;
  }
  const torch::stable::Tensor l_grad_output = as_contiguous(flatten_to_2d(i_grad_output));  // (N, out)
  const int64_t l_n = l_grad_output.size(0), l_out = l_grad_output.size(1);
  // in_features from whichever of weight and input is there (grad_bias alone needs neither).
  const int64_t l_in = i_weights ? i_weights->size(1) : i_input ? i_input->size(-1) : 0;
  LinearState* l_state = nullptr;  // grad_bias alone needs no kernel, so no state
  if (i_need_grad_input || i_need_grad_weights) l_state = &state_for(l_in, l_out);
  torch::stable::Tensor l_grad_input, l_grad_weights, l_grad_bias;  // undefined until computed

  DISPATCH_FLOAT_AND_DOUBLE(l_grad_output.scalar_type(), "tpp::backward", [&] {
    const scalar_t* l_gy = l_grad_output.const_data_ptr<scalar_t>();
    if (i_need_grad_input) {
      // grad_input = grad_output W: (N, out) x (out, in) -> (N, in), then (*, in)
      const torch::stable::Tensor l_weights = as_contiguous(*i_weights);  // (out, in)
      torch::stable::Tensor l_gx = torch::stable::empty({l_n, l_in}, l_grad_output.scalar_type());
      grad_input_tpp<scalar_t>(*l_state, l_gy, l_weights.const_data_ptr<scalar_t>(), l_gx.mutable_data_ptr<scalar_t>(),
                               l_n, l_in, l_out);
      l_grad_input = unflatten_like(l_gx, i_grad_output);
    }
    if (i_need_grad_bias) l_grad_bias = torch::stable::empty({l_out}, l_grad_output.scalar_type());
    scalar_t* l_gb = i_need_grad_bias ? l_grad_bias.mutable_data_ptr<scalar_t>() : nullptr;
    bool l_bias_done = false;
    if (i_need_grad_weights) {
      // grad_weight = grad_output^T x: (out, N) x (N, in) -> (out, in); grad_bias in the same pass
      const torch::stable::Tensor l_input = as_contiguous(flatten_to_2d(*i_input));  // (N, in)
      l_grad_weights = torch::stable::empty({l_out, l_in}, l_grad_output.scalar_type());
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

std::vector<torch::stable::Tensor> backward(torch::stable::Tensor i_grad_output, torch::stable::Tensor i_input,
                                            torch::stable::Tensor i_weights) {
  std::vector<torch::stable::Tensor> l_grads = backward(i_grad_output, i_input, i_weights, /*i_need_grad_input=*/true,
                                                        /*i_need_grad_weights=*/true, /*i_need_grad_bias=*/false);
  return {l_grads[0], l_grads[1]};  // {grad_input, grad_weight}
}

}  // namespace tpp

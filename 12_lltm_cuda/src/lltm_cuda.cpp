// Stage 12: the LLTM cell on a GPU. This file (host C++) checks the inputs, runs the matrix
// products on cuBLAS through ATen, and calls the fused element-wise kernels of
// lltm_cuda_kernel.cu; pybind11 binds them for lltm.py, with the whole cell as one C++ autograd
// node (cell, section 6) as in stage 11.
//
// What this stage teaches: a CUDA extension is two files, a .cpp for the host compiler (checks,
// ATen calls, the binding) and a .cu for nvcc (the kernels and their launches).
// What changed since stage 11's lltm.cpp: the fused passes over the rows (its sections 2, 3 and
// 3b: the activations, the row functions, the SSE2 and AVX2 copies) left for the .cu file, where
// each is one kernel; this file keeps 11's interface and its two lessons: the forward returns
// only the pre-activation gates for the backward, and the backward runs only the GEMMs autograd
// asks for (need_d_X, need_d_weights). The inputs must be CUDA tensors on one device, and the
// backward checks the device and dtype of what it is given (a kernel reads raw device memory).
// Build: pip install --no-build-isolation ./12_lltm_cuda   (a CUDA build of torch and nvcc;
// see ../README.md), or JIT: eml.lltm_cuda.jit.build().
//
//   cell(input, weights, bias, old_h, old_cell) -> [new_h, new_cell]   (one autograd node, section 6)
//   forward(input, weights, bias, old_h, old_cell) -> [new_h, new_cell, gates]
//   backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights, need_d_X, need_d_weights)
//     -> [d_old_h, d_input, d_weights, d_bias (1, 3S), d_old_cell]
//
//   X = [old_h, input]                         (B, S + F)
//   gates = X W^T + b                          W: (3S, S + F), b: (3S) or (1, 3S)
//   input_gate, output_gate = sigmoid(gates[:, 0:S]), sigmoid(gates[:, S:2S])
//   candidate_cell = elu(gates[:, 2S:3S])
//   new_cell = old_cell + candidate_cell * input_gate
//   new_h = tanh(new_cell) * output_gate

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>  // c10::cuda::OptionalCUDAGuard: launch on the inputs' device

#include <utility>
#include <vector>

// The stage's name, the first word of every error message: the one line that names the stage.
static const char* const kStage = "lltm_cuda";

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
    TORCH_CHECK(tensor->device().is_cuda(), kStage, ": ", name, " must be a CUDA tensor, got device ", tensor->device(),
                " (move it with .cuda(); stages 09-11 run on the CPU)");
    TORCH_CHECK(tensor->device() == input.device(),
                kStage, ": ", name, " is on ", tensor->device(), " but input is on ", input.device());
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

// ---- 2-3b. The fused passes: two CUDA kernels, defined in lltm_cuda_kernel.cu ----

// gates (B, 3S), old_cell (B, S) -> new_h, new_cell
std::vector<at::Tensor> lltm_cuda_forward_elementwise(const at::Tensor& gates, const at::Tensor& old_cell);

// grad_h, grad_cell, new_cell (B, S), gates (B, 3S) -> d_old_cell (B, S), d_gates (B, 3S)
std::vector<at::Tensor> lltm_cuda_backward_elementwise(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                                       const at::Tensor& new_cell, const at::Tensor& gates);

// ---- 4. Forward: one GEMM (cuBLAS, through ATen), then the fused kernel ----

std::vector<at::Tensor> lltm_forward(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                                     const at::Tensor& old_h, const at::Tensor& old_cell) {
  check_inputs(input, weights, bias, old_h, old_cell);
  const c10::cuda::OptionalCUDAGuard device_guard(input.device());  // kernels go to the inputs' GPU
  // X lives only for the GEMM: the backward rebuilds it rather than keeping B x (S + F) alive.
  const auto X = at::cat({old_h, input}, /*dim=*/1);
  const auto gates = at::addmm(bias.reshape({1, -1}), X, weights.transpose(0, 1));  // (B, 3S), contiguous
  auto new_h_and_cell = lltm_cuda_forward_elementwise(gates, old_cell.contiguous());
  return {new_h_and_cell[0], new_h_and_cell[1], gates};
}

// ---- 5. Backward: the fused kernel for d_gates, then the GEMMs ----

std::vector<at::Tensor> lltm_backward(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                      const at::Tensor& new_cell, const at::Tensor& gates, const at::Tensor& input,
                                      const at::Tensor& old_h, const at::Tensor& weights, bool need_d_X,
                                      bool need_d_weights) {
  TORCH_CHECK(grad_h.sizes() == new_cell.sizes() && grad_cell.sizes() == new_cell.sizes(),
              kStage, ": grad_h and grad_cell must have new_cell's shape ", new_cell.sizes(), ", got ",
              grad_h.sizes(), " and ", grad_cell.sizes());
  TORCH_CHECK(gates.is_contiguous() && gates.size(0) == new_cell.size(0) && gates.size(1) == 3 * new_cell.size(1),
              kStage, ": gates must be the contiguous (B, 3S) tensor forward returned, got ", gates.sizes());
  // New on the GPU: a kernel reads raw device memory, so every tensor must be a CUDA tensor on
  // new_cell's device, in its dtype (on the CPU, stage 11 reads what it is given).
  TORCH_CHECK(new_cell.is_cuda(), kStage, ": new_cell must be a CUDA tensor, got device ", new_cell.device());
  const std::pair<const char*, const at::Tensor*> tensors[] = {
      {"grad_h", &grad_h}, {"grad_cell", &grad_cell}, {"gates", &gates}, {"input", &input}, {"old_h", &old_h},
      {"weights", &weights}};
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(tensor->device() == new_cell.device() && tensor->device().is_cuda(), kStage, ": ", name, " is on ",
                tensor->device(), " but new_cell is on ", new_cell.device(), "; both must be one CUDA device");
    TORCH_CHECK(tensor->scalar_type() == new_cell.scalar_type(),
                kStage, ": ", name, " is ", tensor->scalar_type(), " but new_cell is ", new_cell.scalar_type());
  }
  const int64_t state = new_cell.size(1);
  const c10::cuda::OptionalCUDAGuard device_guard(new_cell.device());
  const auto grad_h_c = grad_h.contiguous(), grad_cell_c = grad_cell.contiguous(), new_cell_c = new_cell.contiguous();
  auto d_old_cell_and_gates = lltm_cuda_backward_elementwise(grad_h_c, grad_cell_c, new_cell_c, gates);
  const auto d_old_cell = d_old_cell_and_gates[0], d_gates = d_old_cell_and_gates[1];

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
// Stage 11's node, unchanged: lltm.py's LLTMFunction does the same in Python, and adds about
// 10 us per step at (16, 32, 128) on a Zen 5 CPU (11's README: where the time goes). On a GPU that
// is host time in which no kernel is launched. The module makes one call per step
// (_C.cell), and autograd's engine calls backward() without entering Python at all.

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
  m.def("cell", &lltm_cell, "the LLTM cell as one autograd node: (new_h, new_cell), backward in C++ and CUDA");
  m.def("forward", &lltm_forward, "LLTM forward on CUDA (one GEMM, one fused element-wise kernel)");
  m.def("backward", &lltm_backward, "LLTM backward on CUDA (one fused element-wise kernel, then the GEMMs)");
}

// Stage 12: the LLTM cell on a GPU. This file (host C++) checks the inputs, runs the matrix
// products on cuBLAS through ATen, and calls the fused element-wise kernels of
// lltm_cuda_kernel.cu; pybind11 binds them for lltm.py, with the whole cell as one C++ autograd
// node (cell, section 5) as in stage 11.
//
// What this stage teaches: a CUDA extension is two files, a .cpp for the host compiler (checks,
// ATen calls, the binding) and a .cu for nvcc (the kernels and their launches).
// What changed since stage 11's lltm.cpp: the fused passes over the rows (its sections 2, 3 and
// 3b: the activations, the row functions, the SSE2 and AVX2 copies) left for the .cu file, where
// each is one kernel; this file keeps 11's interface and its two lessons: the forward returns
// only the pre-activation gates for the backward, and the backward runs only the GEMMs autograd
// asks for (need_d_X, need_d_weights). The inputs must be CUDA tensors on one device.
// Build: pip install --no-build-isolation ./12_lltm_cuda   (a CUDA build of torch and nvcc;
// see ../README.md), or JIT: eml.lltm_cuda.jit.build().
//
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

#include <vector>

// The stage's name, the first word of every error message: the one line that names the stage.
static const char* const kStage = "lltm_cuda";

// ---- 1. The two fused kernels, defined in lltm_cuda_kernel.cu ----

// gates (B, 3S), old_cell (B, S) -> new_h, new_cell
std::vector<at::Tensor> lltm_cuda_forward_elementwise(const at::Tensor& gates, const at::Tensor& old_cell);

// grad_h, grad_cell, new_cell (B, S), gates (B, 3S) -> d_old_cell (B, S), d_gates (B, 3S)
std::vector<at::Tensor> lltm_cuda_backward_elementwise(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& gates);

namespace {

// ---- 2. Input checks: a clear Python RuntimeError naming the problem and the value ----

// Every tensor: a CUDA tensor, on the first tensor's device, float32 or float64 like the first.
void check_tensor(const at::Tensor& tensor, const char* name, const at::Tensor& first, const char* first_name) {
  TORCH_CHECK(tensor.defined(), kStage, ": ", name, " is None; it must be a tensor");
  TORCH_CHECK(tensor.is_cuda(), kStage, ": ", name, " must be a CUDA tensor, got device ", tensor.device(),
              " (move it with .cuda(); stages 09-11 run on the CPU)");
  TORCH_CHECK(tensor.device() == first.device(), kStage, ": ", name, " is on ", tensor.device(), " but ",
              first_name, " is on ", first.device(), "; all tensors must be on one device");
  TORCH_CHECK(tensor.scalar_type() == at::kFloat || tensor.scalar_type() == at::kDouble, kStage, ": ", name,
              " must be float32 or float64, got ", tensor.scalar_type());
  TORCH_CHECK(tensor.scalar_type() == first.scalar_type(), kStage, ": ", name, " is ", tensor.scalar_type(),
              " but ", first_name, " is ", first.scalar_type(), "; all tensors must have one dtype");
}

void check_shape(const at::Tensor& tensor, const char* name, at::IntArrayRef expected) {
  TORCH_CHECK(tensor.sizes() == expected, kStage, ": ", name, " must have shape ", expected, ", got ",
              tensor.sizes());
}

// input (B, F), weights (3S, S + F), bias (3S) or (1, 3S), old_h (B, S), old_cell (B, S).
// The state size S comes from the weights, B from the input: every message names both sides.
void check_forward_inputs(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                          const at::Tensor& old_h, const at::Tensor& old_cell) {
  check_tensor(input, "input", input, "input");
  check_tensor(weights, "weights", input, "input");
  check_tensor(bias, "bias", input, "input");
  check_tensor(old_h, "old_h", input, "input");
  check_tensor(old_cell, "old_cell", input, "input");
  TORCH_CHECK(input.dim() == 2, kStage, ": input must be 2-D (batch, features), got shape ", input.sizes());
  TORCH_CHECK(weights.dim() == 2 && weights.size(0) % 3 == 0,
              kStage, ": weights must be 2-D (3 * state, state + features), got shape ", weights.sizes());
  const int64_t batch_size = input.size(0);
  const int64_t features = input.size(1);
  const int64_t state_size = weights.size(0) / 3;
  const struct { const at::Tensor& tensor; const char* name; } states[] = {{old_h, "old_h"}, {old_cell, "old_cell"}};
  for (const auto& item : states) {
    TORCH_CHECK(item.tensor.dim() == 2, kStage, ": ", item.name, " must be 2-D (batch, state), got shape ",
                item.tensor.sizes());
    TORCH_CHECK(item.tensor.size(0) == batch_size, kStage, ": ", item.name, " has batch size ",
                item.tensor.size(0), " but input has ", batch_size);
    TORCH_CHECK(item.tensor.size(1) == state_size, kStage, ": ", item.name, " must have shape [", batch_size, ", ",
                state_size, "] (weights have 3 * ", state_size, " rows), got ", item.tensor.sizes());
  }
  TORCH_CHECK(weights.size(1) == state_size + features, kStage, ": input has ", features,
              " features, so weights must have shape [", 3 * state_size, ", ", state_size + features, "], got ",
              weights.sizes());
  TORCH_CHECK(bias.sizes() == at::IntArrayRef({3 * state_size}) || bias.sizes() == at::IntArrayRef({1, 3 * state_size}),
              kStage, ": bias must have shape (", 3 * state_size, ") or (1, ", 3 * state_size, "), got ", bias.sizes());
}

}  // namespace

// ---- 3. Forward: one GEMM on cuBLAS, then one fused kernel ----
// Returns new_h, new_cell and the pre-activation gates, the one tensor the backward needs
// beyond those that exist anyway (stage 11's choice: lltm.py saves gates, not five activations).
std::vector<at::Tensor> lltm_forward(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                                     const at::Tensor& old_h, const at::Tensor& old_cell) {
  check_forward_inputs(input, weights, bias, old_h, old_cell);
  const c10::cuda::OptionalCUDAGuard device_guard(input.device());  // kernels go to the inputs' GPU
  // X lives only for the GEMM: the backward rebuilds it rather than keeping B x (S + F) alive.
  const at::Tensor X = at::cat({old_h, input}, /*dim=*/1);
  // gates = b + X W^T in one cuBLAS call (addmm broadcasts a (3S) or (1, 3S) bias): (B, 3S), contiguous.
  const at::Tensor gates = at::addmm(bias, X, weights.t());
  const at::Tensor old_cell_contiguous = old_cell.contiguous();
  std::vector<at::Tensor> outputs = lltm_cuda_forward_elementwise(gates, old_cell_contiguous);
  outputs.push_back(gates);
  return outputs;
}

// ---- 4. Backward: one fused kernel, then the GEMMs on cuBLAS that autograd asks for ----
// Returns d_old_h, d_input, d_weights, d_bias (shape (1, 3S)), d_old_cell; d_old_h and d_input
// are undefined (None in Python) unless need_d_X, d_weights unless need_d_weights.
std::vector<at::Tensor> lltm_backward(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                      const at::Tensor& new_cell, const at::Tensor& gates, const at::Tensor& input,
                                      const at::Tensor& old_h, const at::Tensor& weights, bool need_d_X,
                                      bool need_d_weights) {
  check_tensor(new_cell, "new_cell", new_cell, "new_cell");
  TORCH_CHECK(new_cell.dim() == 2, kStage, ": new_cell must be 2-D (batch, state), got shape ", new_cell.sizes());
  const int64_t batch_size = new_cell.size(0);
  const int64_t state_size = new_cell.size(1);
  const struct { const at::Tensor& tensor; const char* name; } state_shaped[] = {
      {grad_h, "grad_h"}, {grad_cell, "grad_cell"}, {old_h, "old_h"}};
  for (const auto& item : state_shaped) {
    check_tensor(item.tensor, item.name, new_cell, "new_cell");
    check_shape(item.tensor, item.name, {batch_size, state_size});
  }
  check_tensor(gates, "gates", new_cell, "new_cell");
  check_shape(gates, "gates", {batch_size, 3 * state_size});
  check_tensor(input, "input", new_cell, "new_cell");
  check_tensor(weights, "weights", new_cell, "new_cell");
  TORCH_CHECK(input.dim() == 2 && input.size(0) == batch_size,
              kStage, ": input must have shape (", batch_size, ", features), got ", input.sizes());
  check_shape(weights, "weights", {3 * state_size, state_size + input.size(1)});
  const c10::cuda::OptionalCUDAGuard device_guard(new_cell.device());

  // Contiguous named locals: the kernel's accessors index them as dense matrices.
  const at::Tensor grad_h_c = grad_h.contiguous();
  const at::Tensor grad_cell_c = grad_cell.contiguous();
  const at::Tensor new_cell_c = new_cell.contiguous();
  const at::Tensor gates_c = gates.contiguous();
  const std::vector<at::Tensor> elementwise =
      lltm_cuda_backward_elementwise(grad_h_c, grad_cell_c, new_cell_c, gates_c);
  const at::Tensor& d_old_cell = elementwise[0];
  const at::Tensor& d_gates = elementwise[1];  // (B, 3S)

  const at::Tensor d_bias = d_gates.sum(/*dim=*/0, /*keepdim=*/true);  // (1, 3S)
  at::Tensor d_weights, d_old_h, d_input;
  if (need_d_weights) {
    d_weights = d_gates.t().mm(at::cat({old_h, input}, /*dim=*/1));  // (3S, S + F); X rebuilt: one copy
  }
  if (need_d_X) {
    const at::Tensor d_X = d_gates.mm(weights);  // (B, S + F)
    // X = [old_h, input]: the first S columns are old_h's, the rest input's. (Splitting with
    // split(S) would be wrong whenever the feature count F differs from S.)
    d_old_h = d_X.slice(/*dim=*/1, /*start=*/0, /*end=*/state_size);
    d_input = d_X.slice(/*dim=*/1, /*start=*/state_size);
  }
  return {d_old_h, d_input, d_weights, d_bias, d_old_cell};
}

// ---- 5. The whole cell as one autograd node, in C++ (as in stage 11) ----
//
// Stage 11's node, unchanged: lltm.py's LLTMFunction does the same in Python, and costs tens of
// microseconds per step around the C++ it calls (11's README: where the time goes). On a GPU
// that is host time in which no kernel is launched. The module makes one call per step
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

// ---- 6. The binding: eml.lltm_cuda._C.cell, .forward and .backward ----
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cell", &lltm_cell, "the LLTM cell as one autograd node: (new_h, new_cell), backward in C++ and CUDA");
  m.def("forward", &lltm_forward, "LLTM forward on CUDA: new_h, new_cell, gates (one GEMM, one fused kernel)",
        py::arg("input"), py::arg("weights"), py::arg("bias"), py::arg("old_h"), py::arg("old_cell"));
  m.def("backward", &lltm_backward,
        "LLTM backward on CUDA: d_old_h, d_input, d_weights, d_bias, d_old_cell (one fused kernel, then the "
        "GEMMs asked for)",
        py::arg("grad_h"), py::arg("grad_cell"), py::arg("new_cell"), py::arg("gates"), py::arg("input"),
        py::arg("old_h"), py::arg("weights"), py::arg("need_d_X"), py::arg("need_d_weights"));
}

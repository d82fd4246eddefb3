// Stage 10: the LLTM cell's forward and backward in C++, on ATen (the tutorial's lltm.cpp today).
//
// What this stage teaches: stage 09's two Python functions, forward and backward, written in
// C++ op for op on ATen and bound with pybind11. The maths is the same, so is the number of
// ATen calls: C++ saves the Python interpreter's overhead per op, not one pass over memory.
// (Stage 11 fuses the element-wise work; that is where the speed is.)
//
//   forward(input, weights, bias, old_h, old_cell)
//     -> [new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights]
//   backward(grad_h, grad_cell, new_cell, input_gate, output_gate, candidate_cell, X,
//            gate_weights, weights)
//     -> [d_old_h, d_input, d_weights, d_bias (1, 3S), d_old_cell]
//
// What changed since stage 09: this file replaces lltm.py's check_inputs, d_sigmoid, d_tanh,
// d_elu, forward and backward; checks are TORCH_CHECK (a Python RuntimeError), never assert().
// d_X is cut at column S (old_h's S columns, then the input's F), as the tutorial does, not
// into pieces of S with split(S, dim=1), which is wrong whenever F > S.
// Build: pip install --no-build-isolation ./10_lltm_cpp   (or JIT: eml.lltm_cpp.jit.build())

#include <torch/extension.h>

#include <utility>
#include <vector>

// The stage's name, the first word of every error message: the one line that names the stage.
static const char* const kStage = "lltm_cpp";

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
    // ATen's ops run wherever the tensors are (CPU, CUDA, ...): this file is device-generic, as
    // the tutorial's was, so it asks only that all five tensors be on one device.
    TORCH_CHECK(tensor->device() == input.device(), kStage, ": ", name, " is on device ", tensor->device(),
                " but input is on ", input.device(), " (all five tensors must be on one device)");
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

// ---- 2. The derivatives, one line each ----

// sigmoid'(z) = sigmoid(z) (1 - sigmoid(z))
static at::Tensor d_sigmoid(const at::Tensor& z) {
  const auto s = at::sigmoid(z);
  return (1 - s) * s;
}

// tanh'(z) = 1 - tanh^2(z)
static at::Tensor d_tanh(const at::Tensor& z) { return 1 - z.tanh().pow(2); }

// elu'(z) = 1 if z > 0 else alpha e^z
static at::Tensor d_elu(const at::Tensor& z, double alpha = 1.0) {
  return at::where(z > 0, at::ones_like(z), alpha * z.exp());
}

// ---- 3. Forward: the same ops as stage 09's forward, one ATen call each ----

std::vector<at::Tensor> lltm_forward(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                                     const at::Tensor& old_h, const at::Tensor& old_cell) {
  check_inputs(input, weights, bias, old_h, old_cell);
  auto X = at::cat({old_h, input}, /*dim=*/1);
  auto gate_weights = at::addmm(bias.reshape({1, -1}), X, weights.transpose(0, 1));
  const auto gates = gate_weights.chunk(3, /*dim=*/1);  // (B, S) each: input, output, candidate

  auto input_gate = at::sigmoid(gates[0]);
  auto output_gate = at::sigmoid(gates[1]);
  auto candidate_cell = at::elu(gates[2], /*alpha=*/1.0);

  auto new_cell = old_cell + candidate_cell * input_gate;
  auto new_h = at::tanh(new_cell) * output_gate;
  return {new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights};
}

// ---- 4. Backward: the chain rule through stage 09's backward, op for op ----

std::vector<at::Tensor> lltm_backward(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                      const at::Tensor& new_cell, const at::Tensor& input_gate,
                                      const at::Tensor& output_gate, const at::Tensor& candidate_cell,
                                      const at::Tensor& X, const at::Tensor& gate_weights, const at::Tensor& weights) {
  TORCH_CHECK(grad_h.sizes() == new_cell.sizes() && grad_cell.sizes() == new_cell.sizes(),
              kStage, ": grad_h and grad_cell must have new_cell's shape ", new_cell.sizes(), ", got ",
              grad_h.sizes(), " and ", grad_cell.sizes());
  const int64_t state = new_cell.size(1);
  auto d_output_gate = at::tanh(new_cell) * grad_h;
  auto d_tanh_new_cell = output_gate * grad_h;
  auto d_new_cell = d_tanh(new_cell) * d_tanh_new_cell + grad_cell;

  auto d_old_cell = d_new_cell;
  auto d_candidate_cell = input_gate * d_new_cell;
  auto d_input_gate = candidate_cell * d_new_cell;

  const auto gates = gate_weights.chunk(3, /*dim=*/1);
  d_input_gate *= d_sigmoid(gates[0]);
  d_output_gate *= d_sigmoid(gates[1]);
  d_candidate_cell *= d_elu(gates[2]);
  auto d_gates = at::cat({d_input_gate, d_output_gate, d_candidate_cell}, /*dim=*/1);

  auto d_weights = d_gates.t().mm(X);
  auto d_bias = d_gates.sum(/*dim=*/0, /*keepdim=*/true);  // (1, 3S)

  auto d_X = d_gates.mm(weights);
  auto d_old_h = d_X.slice(/*dim=*/1, 0, state);  // X = [old_h, input]: old_h's S columns,
  auto d_input = d_X.slice(/*dim=*/1, state);     // then the input's F (F != S in general)
  return {d_old_h, d_input, d_weights, d_bias, d_old_cell};
}

// ---- 5. The binding ----

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &lltm_forward, "LLTM forward (ATen ops)");
  m.def("backward", &lltm_backward, "LLTM backward (ATen ops)");
}

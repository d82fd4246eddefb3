// Stage 04 of "From PyTorch to Machine Code": the linear layer's forward and backward in C++.
//
// What this stage teaches: the course's two C++ functions, bound to Python with pybind11 and
// called from a torch.autograd.Function (layer.py). ATen, PyTorch's C++ tensor library, does
// the matrix products, as torch.matmul did in stage 02:
//
//   forward:   y           = x W^T + b          (N, in) x (in, out)  -> (N, out)
//   backward:  grad_input  = grad_output W      (N, out) x (out, in) -> (N, in)
//              grad_weight = grad_output^T x    (out, N) x (N, in)   -> (out, in)
//              grad_bias   = sum_N grad_output                        -> (out)
//
// N is the product of the leading dimensions: this file flattens (*, in) to (N, in) and
// restores (*, out) afterwards, so layer.py passes tensors of any shape straight through.
// What changed since stage 02: the maths and the input checks moved from layer.py to here;
// the backward is C++ and once differentiable, the contract of the pybind11 C++ stages (README: why).
// Build and test:  pip install --no-build-isolation .   then   pytest tests
#include <torch/extension.h>

#include <optional>
#include <vector>

// The course's two declarations, verbatim: no bias, and both gradients always.
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight);
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, torch::Tensor i_input, torch::Tensor i_weights);

// Beside them, two overloads that layer.py calls: the bias (None in Python, std::nullopt
// here), and needs_input_grad, so that no gradient is computed that nobody asked for.
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight, std::optional<torch::Tensor> i_bias);
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output,
                                    std::optional<torch::Tensor> i_input,
                                    std::optional<torch::Tensor> i_weights,
                                    bool i_need_grad_input,
                                    bool i_need_grad_weights,
                                    bool i_need_grad_bias);

// Every error message starts with the stage's name, as the Python stages' messages do.
const char* const kStage = "linear_cpp";

// The stage's one place for input validation; forward and backward call it before anything
// else. TORCH_CHECK raises a Python RuntimeError whose message names the problem and the
// offending value. An absent tensor (std::nullopt) is not checked: the bias when there is
// none, grad_output in the forward, and in the backward the input or the weight when no
// requested gradient needs it (grad_input needs the weight, grad_weight the input).
void check_inputs(const std::optional<torch::Tensor>& i_input,
                  const std::optional<torch::Tensor>& i_weight,
                  const std::optional<torch::Tensor>& i_bias,
                  const std::optional<torch::Tensor>& i_grad_output = std::nullopt,
                  bool i_need_grad_input = false,
                  bool i_need_grad_weights = false) {
  TORCH_CHECK(i_weight || !i_need_grad_input, kStage, ": grad_input needs the weight, got None");
  TORCH_CHECK(i_input || !i_need_grad_weights, kStage, ": grad_weight needs the input, got None");

  // Device and dtype: CPU tensors, floating point, all of the first one's dtype (the weight's).
  const std::pair<const char*, const std::optional<torch::Tensor>*> l_tensors[] = {
      {"weight", &i_weight}, {"input", &i_input}, {"bias", &i_bias}, {"grad_output", &i_grad_output}};
  const char* l_dtype_from = nullptr;
  torch::ScalarType l_dtype = torch::kFloat;
  for (const auto& [l_name, l_tensor] : l_tensors) {
    if (!l_tensor->has_value()) continue;
    const torch::Tensor& l_t = l_tensor->value();
    TORCH_CHECK(l_t.device().is_cpu(), kStage, ": expected the ", l_name, " on the CPU, got device ", l_t.device());
    TORCH_CHECK(l_t.is_floating_point(), kStage, ": expected a floating-point ", l_name, " dtype, got ", l_t.scalar_type());
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

// y = x W^T + b for x of shape (*, in); without a bias, y = x W^T.
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight, std::optional<torch::Tensor> i_bias) {
  check_inputs(i_input, i_weight, i_bias);
  torch::Tensor l_input = flatten_to_2d(i_input);  // (N, in)
  torch::Tensor l_output = i_bias ? at::addmm(*i_bias, l_input, i_weight.t())  // b + x W^T in one call
                                  : at::mm(l_input, i_weight.t());             // x W^T
  return unflatten_like(l_output, i_input);                                    // (*, out)
}

torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight) {
  return forward(i_input, i_weight, /*i_bias=*/std::nullopt);
}

// The gradients of y = x W^T + b: {grad_input, grad_weight, grad_bias}, each computed only
// when asked for; one that is not comes back undefined, which Python receives as None.
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output,
                                    std::optional<torch::Tensor> i_input,
                                    std::optional<torch::Tensor> i_weights,
                                    bool i_need_grad_input,
                                    bool i_need_grad_weights,
                                    bool i_need_grad_bias) {
  check_inputs(i_input, i_weights, /*i_bias=*/std::nullopt, i_grad_output, i_need_grad_input, i_need_grad_weights);
  torch::Tensor l_grad_output = flatten_to_2d(i_grad_output);  // (N, out)
  torch::Tensor l_grad_input, l_grad_weights, l_grad_bias;     // undefined until computed

  if (i_need_grad_input) {
    // grad_input = grad_output W: (N, out) x (out, in) -> (N, in), then (*, in)
    l_grad_input = unflatten_like(at::mm(l_grad_output, *i_weights), i_grad_output);
  }
  if (i_need_grad_weights) {
    // grad_weight = grad_output^T x: (out, N) x (N, in) -> (out, in)
    l_grad_weights = at::mm(l_grad_output.t(), flatten_to_2d(*i_input));
  }
  if (i_need_grad_bias) {
    // grad_bias = sum over the N rows of grad_output -> (out)
    l_grad_bias = l_grad_output.sum(/*dim=*/0);
  }
  return {l_grad_input, l_grad_weights, l_grad_bias};
}

std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, torch::Tensor i_input, torch::Tensor i_weights) {
  std::vector<torch::Tensor> l_grads = backward(i_grad_output, i_input, i_weights, /*i_need_grad_input=*/true,
                                                /*i_need_grad_weights=*/true, /*i_need_grad_bias=*/false);
  return {l_grads[0], l_grads[1]};  // {grad_input, grad_weight}
}

// TORCH_EXTENSION_NAME is set by torch.utils.cpp_extension to the module's name ("_C").
// Each name is bound twice; pybind11 picks the overload whose arguments fit the call.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Stage 04: the linear layer's forward and backward in C++, the products by ATen";
  m.def("forward", py::overload_cast<torch::Tensor, torch::Tensor>(&forward),
        "The course's forward: y = x W^T for x of shape (*, in)", py::arg("input"), py::arg("weight"));
  m.def("backward", py::overload_cast<torch::Tensor, torch::Tensor, torch::Tensor>(&backward),
        "The course's backward: [grad_input, grad_weight] of y = x W^T",
        py::arg("grad_output"), py::arg("input"), py::arg("weights"));
  m.def("forward", py::overload_cast<torch::Tensor, torch::Tensor, std::optional<torch::Tensor>>(&forward),
        "y = x W^T + b; bias=None leaves b out", py::arg("input"), py::arg("weight"), py::arg("bias"));
  m.def("backward",
        py::overload_cast<torch::Tensor, std::optional<torch::Tensor>, std::optional<torch::Tensor>, bool, bool, bool>(&backward),
        "[grad_input, grad_weight, grad_bias] of y = x W^T + b, None for each one not asked for; "
        "input and weights may be None where no requested gradient needs them",
        py::arg("grad_output"), py::arg("input"), py::arg("weights"),
        py::arg("need_grad_input"), py::arg("need_grad_weights"), py::arg("need_grad_bias"));
}

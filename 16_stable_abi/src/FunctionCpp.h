// Stage 16: what FunctionCpp.cpp offers to bindings.cpp, the functions the
// registered operators run. A plain C++ header: no pybind11 and no Python.h anywhere in the
// compute code (Python.h only in bindings.cpp: the empty module's init and the import of ops.py).
// What changed since stage 08: torch::stable::Tensor for ATen's torch::Tensor, and the stable
// headers' ScalarType (torch/headeronly) for ATen's: no libtorch C++ type is left.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <optional>
#include <vector>

#include "linear_state.h"

namespace tpp {

// y = x W^T + b for x of shape (*, in); bias may be absent. Float, Double or BFloat16.
torch::stable::Tensor forward(torch::stable::Tensor i_input, torch::stable::Tensor i_weight,
                              std::optional<torch::stable::Tensor> i_bias);
// {grad_input, grad_weight, grad_bias}, each computed only when asked for, else undefined.
std::vector<torch::stable::Tensor> backward(torch::stable::Tensor i_grad_output,
                                            std::optional<torch::stable::Tensor> i_input,
                                            std::optional<torch::stable::Tensor> i_weights, bool i_need_grad_input,
                                            bool i_need_grad_weights, bool i_need_grad_bias);
// The course's two declarations, on stable tensors: no bias, both gradients.
torch::stable::Tensor forward(torch::stable::Tensor i_input, torch::stable::Tensor i_weight);
std::vector<torch::stable::Tensor> backward(torch::stable::Tensor i_grad_output, torch::stable::Tensor i_input,
                                            torch::stable::Tensor i_weights);

// The process-wide state of one (in_features, out_features) pair: made at its first use, kept.
LinearState& state_for(int64_t i_in_features, int64_t i_out_features);

// Tools: dispatch one kernel through the checked path; the in-cache float32 peak probe.
bool dispatch_check(int64_t i_m, int64_t i_n, int64_t i_k, int i_flags, ScalarType i_dtype);
double peak_gflops(int64_t i_m, int64_t i_n, int64_t i_k, double i_seconds);

}  // namespace tpp

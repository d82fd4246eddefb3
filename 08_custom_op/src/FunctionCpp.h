// Stage 08: what FunctionCpp.cpp offers to bindings.cpp, the functions the
// registered operators run. A plain C++ header: no pybind11 and no Python.h anywhere in the
// compute code (in stage 08 not even in bindings.cpp, apart from the empty module's init).
// What changed since stage 06: no LinearState* argument (a schema cannot take a pybind11
// object; the state comes from state_for), no cache_weight (no pack cache, by choice: README),
// bfloat16 accepted.
#pragma once

#include <torch/types.h>

#include <optional>
#include <vector>

#include "linear_state.h"

namespace tpp {

// y = x W^T + b for x of shape (*, in); bias may be absent. Float, Double or BFloat16.
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight, std::optional<torch::Tensor> i_bias);
// {grad_input, grad_weight, grad_bias}, each computed only when asked for, else undefined.
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, std::optional<torch::Tensor> i_input,
                                    std::optional<torch::Tensor> i_weights, bool i_need_grad_input,
                                    bool i_need_grad_weights, bool i_need_grad_bias);
// The course's two declarations, verbatim: no bias, both gradients.
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight);
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, torch::Tensor i_input, torch::Tensor i_weights);

// The process-wide state of one (in_features, out_features) pair: made at its first use, kept.
LinearState& state_for(int64_t i_in_features, int64_t i_out_features);

// Tools: dispatch one kernel through the checked path; the in-cache float32 peak probe.
bool dispatch_check(int64_t i_m, int64_t i_n, int64_t i_k, int i_flags, at::ScalarType i_dtype);
double peak_gflops(int64_t i_m, int64_t i_n, int64_t i_k, double i_seconds);

}  // namespace tpp

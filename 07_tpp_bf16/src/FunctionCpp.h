// Stage 07: what FunctionCpp.cpp offers to bindings.cpp, the functions Python
// calls. Keeping them in a plain C++ header keeps pybind11 (and Python.h) out of the compute
// code: only bindings.cpp includes <torch/extension.h>.
#pragma once

#include <torch/types.h>

#include <optional>
#include <vector>

#include "linear_state.h"

namespace tpp {

// y = x W^T + b for x of shape (*, in); bias may be absent. Float, Double or BFloat16 (new). i_state: the layer's state (nullptr:
// a temporary one). i_cache_weight: may reuse and keep the packed W (LinearState::packed_weight).
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight, std::optional<torch::Tensor> i_bias,
                      LinearState* i_state, bool i_cache_weight);
// {grad_input, grad_weight, grad_bias}, each computed only when asked for, else undefined (None).
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, std::optional<torch::Tensor> i_input,
                                    std::optional<torch::Tensor> i_weights, bool i_need_grad_input,
                                    bool i_need_grad_weights, bool i_need_grad_bias, LinearState* i_state);
// The course's two declarations, verbatim: no bias, both gradients, a temporary state.
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight);
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, torch::Tensor i_input, torch::Tensor i_weights);

// Tools: dispatch one kernel through the checked path; the in-cache float32 peak probe.
bool dispatch_check(int64_t i_m, int64_t i_n, int64_t i_k, int i_flags, at::ScalarType i_dtype);
double peak_gflops(int64_t i_m, int64_t i_n, int64_t i_k, double i_seconds);
// New in stage 07: the bf16 peak probe (only where bf16 kernels exist); the VNNI-2 packing of
// a small (M x K) bf16 matrix into panels of bm rows, as the bf16 path packs its A operands.
double peak_gflops_bf16(int64_t i_m, int64_t i_n, int64_t i_k, double i_seconds);
torch::Tensor pack_vnni2_matrix(torch::Tensor i_matrix, int64_t i_bm);

}  // namespace tpp

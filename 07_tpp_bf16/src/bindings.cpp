// Stage 07: the bindings. pybind11 exposes FunctionCpp.h's functions and the
// LinearState class to Python as the package's module _C. This is the only file that
// includes <torch/extension.h> (pybind11 and Python.h): the compute code never sees Python.
#include <torch/extension.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "FunctionCpp.h"

using namespace tpp;

// TORCH_EXTENSION_NAME is set by torch.utils.cpp_extension to the module's name ("_C").
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Stage 07: the linear layer's forward and backward on LIBXSMM's JIT kernels, in float32, float64 and bfloat16";

  // The layer's state. pybind11 owns the C++ object: it lives as long as a Python reference
  // (the Layer's self.state, an autograd ctx) and is deleted with the last one. module_local:
  // pybind11 registers a class under its C++ name, tpp::LinearState, and stages 06 and 07 both have
  // one; local to this module, each stage's class may live beside the other's in one process.
  py::class_<LinearState>(m, "LinearState",
                          "JIT kernels, per-batch plans and the packed weight of one linear layer", py::module_local())
      .def(py::init<int64_t, int64_t>(), py::arg("in_features"), py::arg("out_features"))
      .def_property_readonly("in_features", &LinearState::in_features)
      .def_property_readonly("out_features", &LinearState::out_features)
      .def("set_config", &LinearState::set_config,
           "Blocking (bm, bn, bk) of forward, grad_input and grad_weight (bk 0: the whole K; the VNNI path: up to 1024) and their tile orders",
           py::arg("forward"), py::arg("grad_input"), py::arg("grad_weight"), py::arg("n_outer"))
      .def_property_readonly("config", &LinearState::config, "(forward, grad_input, grad_weight, n_outer)")
      .def_property("bf16_path", &LinearState::bf16_path_name, &LinearState::set_bf16_path,
                    "how bfloat16 is computed: \"vnni\" (LIBXSMM's bf16 kernels), \"reference\" (the same "
                    "packing and loop nest, plain C++ micro-kernel) or \"fp32\" (fallback: fp32 kernels, one rounding)")
      .def("invalidate", &LinearState::invalidate, "Forget the packed weight (after writing W through .data)")
      .def_property_readonly("kernels", &LinearState::kernel_count, "JIT kernels in this state's table")
      .def_property_readonly("plans", &LinearState::plan_count, "plans made: one per product, batch size, dtype")
      .def_property_readonly("packs", &LinearState::pack_count, "times the weight was packed")
      .def_property_readonly("packed_bytes", &LinearState::packed_bytes, "bytes of the cached packed weight")
      .def("__repr__",
           [](const LinearState& i_state) {
             return "LinearState(in_features=" + std::to_string(i_state.in_features()) +
                    ", out_features=" + std::to_string(i_state.out_features()) +
                    ", kernels=" + std::to_string(i_state.kernel_count()) + ", bf16_path=" + i_state.bf16_path_name() + ")";
           })
      // copy.deepcopy(layer) and torch.save(layer) pickle the state: sizes and blocking travel,
      // kernels and packed weight are made again; the bf16 path too, where this CPU has it.
      .def(py::pickle([](const LinearState& i_state) {
                        return py::make_tuple(i_state.in_features(), i_state.out_features(), i_state.config(),
                                              i_state.bf16_path_name());
                      },
                      [](py::tuple i_saved) {
                        auto l_state = std::make_unique<LinearState>(i_saved[0].cast<int64_t>(), i_saved[1].cast<int64_t>());
                        auto [l_forward, l_grad_input, l_grad_weight, l_n_outer] = i_saved[2].cast<
                            std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<bool>>>();
                        l_state->set_config(l_forward, l_grad_input, l_grad_weight, l_n_outer);
                        const auto l_path = i_saved[3].cast<std::string>();
                        if (l_path != "vnni" || bf16_kernels_available()) l_state->set_bf16_path(l_path);
                        return l_state;
                      }));

  m.def("forward", py::overload_cast<torch::Tensor, torch::Tensor>(&forward),
        "The course's forward: y = x W^T for x of shape (*, in)", py::arg("input"), py::arg("weight"));
  m.def("backward", py::overload_cast<torch::Tensor, torch::Tensor, torch::Tensor>(&backward),
        "The course's backward: [grad_input, grad_weight] of y = x W^T",
        py::arg("grad_output"), py::arg("input"), py::arg("weights"));
  m.def("forward", py::overload_cast<torch::Tensor, torch::Tensor, std::optional<torch::Tensor>, LinearState*, bool>(&forward),
        "y = x W^T + b; bias=None leaves b out; state=None uses a temporary state; cache_weight: "
        "reuse and keep the packed weight while the weight is unchanged (no gradient recorded for it)",
        py::arg("input"), py::arg("weight"), py::arg("bias"), py::arg("state") = static_cast<LinearState*>(nullptr),
        py::arg("cache_weight") = false);
  m.def("backward",
        py::overload_cast<torch::Tensor, std::optional<torch::Tensor>, std::optional<torch::Tensor>, bool, bool, bool,
                          LinearState*>(&backward),
        "[grad_input, grad_weight, grad_bias] of y = x W^T + b, None for each one not asked for; "
        "input and weights may be None where no requested gradient needs them",
        py::arg("grad_output"), py::arg("input"), py::arg("weights"), py::arg("need_grad_input"),
        py::arg("need_grad_weights"), py::arg("need_grad_bias"), py::arg("state") = static_cast<LinearState*>(nullptr));

  m.def("dispatch_check", &dispatch_check,
        "Dispatch one LIBXSMM kernel (tight leading dimensions); True, or a RuntimeError naming the request",
        py::arg("m"), py::arg("n"), py::arg("k"), py::arg("flags") = 0, py::arg("dtype") = at::kFloat);
  m.def("peak_gflops", &peak_gflops, "float32 GFLOP/s of an in-cache m x n x k kernel loop on every thread",
        py::arg("m") = 64, py::arg("n") = 64, py::arg("k") = 64, py::arg("seconds") = 0.1);
  m.def("peak_gflops_bf16", &peak_gflops_bf16,
        "bfloat16 GFLOP/s of an in-cache m x n x k bf16 kernel loop on every thread (needs bf16 kernels)",
        py::arg("m") = 64, py::arg("n") = 64, py::arg("k") = 64, py::arg("seconds") = 0.1);
  m.def("bf16_kernels_available", &bf16_kernels_available,
        "True where LIBXSMM generates bf16 kernels (AVX-512 CPUs; emulated without AVX512-BF16)");
  m.def("bf16_kernels_native", &bf16_kernels_native,
        "True where LIBXSMM's bf16 kernels run natively (AVX512-BF16): new layers then take the \"vnni\" bf16 path");
  m.def("pack_vnni2", &pack_vnni2_matrix, "A (M x K, bf16) packed VNNI-2 into panels of bm rows: (panels, K/2 rounded up, bm, 2)",
        py::arg("matrix"), py::arg("bm"));
  m.def("target_arch", [] { libxsmm_init(); return std::string(libxsmm_get_target_arch()); },
        "the instruction set LIBXSMM generates code for on this CPU");
  m.def("live_states", [] { return g_live_states.load(); }, "LinearState objects alive now");
  m.attr("LIBXSMM_VERSION") = LIBXSMM_CONFIG_VERSION;
  m.attr("FLAG_TRANS_A") = int(LIBXSMM_GEMM_FLAG_TRANS_A);
  m.attr("FLAG_TRANS_B") = int(LIBXSMM_GEMM_FLAG_TRANS_B);
  m.attr("FLAG_BETA_0") = int(LIBXSMM_GEMM_FLAG_BETA_0);
}
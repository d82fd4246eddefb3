// Stage 08: the registrations. Where stage 06 had a pybind11 module (PYBIND11_MODULE,
// a py::class_ for the state), this file declares PyTorch operators in the namespace `eml` with a
// schema each (TORCH_LIBRARY) and gives them CPU kernels (TORCH_LIBRARY_IMPL). The dispatcher
// then knows what each op takes and returns, so torch.compile, torch.export, vmap and autocast can
// reason about it; their Python halves (fake kernels, autograd, autocast, vmap) are in ops.py.
//
// No pybind11 and no libtorch_python: the module is built against Python's limited API
// (setup.py: py_limited_api=True), so one compiled file, _C.abi3.so, loads in every CPython >= 3.10
// with this torch. Python only has to import it once, which runs the static initialisers below:
// PyInit__C at the bottom makes an empty module for that.
// Run it: pip install --no-build-isolation .   then   python -c "import torch, eml.linear_op; print(torch.ops.eml.linear)"
#include <Python.h>  // the limited API only: -DPy_LIMITED_API is set by setup.py's py_limited_api=True

#include <torch/library.h>

#include <optional>
#include <string>

#include "FunctionCpp.h"

using namespace tpp;

namespace {

// ---- 1. The kernels behind the schemas --------------------------------------------------
// Each backward product is an operator of its own: autograd (ops.py) calls only the ones whose
// gradient is needed, and each has a schema that says exactly what it reads and returns.

at::Tensor linear_cpu(const at::Tensor& i_input, const at::Tensor& i_weight, const std::optional<at::Tensor>& i_bias) {
  return forward(i_input, i_weight, i_bias);
}

// grad_input = grad_output W: (*, out) x (out, in) -> (*, in)
at::Tensor linear_grad_input_cpu(const at::Tensor& i_grad_output, const at::Tensor& i_weight) {
  return backward(i_grad_output, /*i_input=*/std::nullopt, i_weight, /*need_grad_input=*/true,
                  /*need_grad_weights=*/false, /*need_grad_bias=*/false)[0];
}

// grad_weight = grad_output^T x: (out, N) x (N, in) -> (out, in), N all leading dimensions
at::Tensor linear_grad_weight_cpu(const at::Tensor& i_grad_output, const at::Tensor& i_input) {
  return backward(i_grad_output, i_input, /*i_weights=*/std::nullopt, /*need_grad_input=*/false,
                  /*need_grad_weights=*/true, /*need_grad_bias=*/false)[1];
}

// grad_bias = grad_output summed over all leading dimensions -> (out)
at::Tensor linear_grad_bias_cpu(const at::Tensor& i_grad_output) {
  return backward(i_grad_output, std::nullopt, std::nullopt, /*need_grad_input=*/false, /*need_grad_weights=*/false,
                  /*need_grad_bias=*/true)[2];
}

}  // namespace

// ---- 2. The schemas: one TORCH_LIBRARY per namespace in the whole process ------------------
// A schema is the op's contract: argument types, which are optional ("Tensor?"), and that no
// argument is mutated or aliased (no "(a!)" annotations): the ops are functional, which is what
// lets torch.compile and torch.export move them around freely.
TORCH_LIBRARY(eml, m) {
  m.def("linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor");
  m.def("linear_grad_input(Tensor grad_output, Tensor weight) -> Tensor");
  m.def("linear_grad_weight(Tensor grad_output, Tensor input) -> Tensor");
  m.def("linear_grad_bias(Tensor grad_output) -> Tensor");

  // Tools, with no tensor argument: schema and kernel in one call (a kernel for every backend).
  m.def("tpp_peak_gflops(int m=64, int n=64, int k=64, float seconds=0.1) -> float",
        [](int64_t i_m, int64_t i_n, int64_t i_k, double i_seconds) { return peak_gflops(i_m, i_n, i_k, i_seconds); });
  m.def("tpp_dispatch_check(int m, int n, int k, int flags, ScalarType dtype) -> bool",
        [](int64_t i_m, int64_t i_n, int64_t i_k, int64_t i_flags, at::ScalarType i_dtype) {
          return dispatch_check(i_m, i_n, i_k, static_cast<int>(i_flags), i_dtype);
        });
  m.def("tpp_target_arch() -> str", []() {
    libxsmm_init();
    return std::string(libxsmm_get_target_arch());
  });
  m.def("tpp_states() -> int", []() { return g_live_states.load(); });  // (in, out) pairs seen so far
}

// ---- 3. The CPU kernels ------------------------------------------------------------------
// Registered for the CPU dispatch key only: a tensor on another device reaches no kernel of ours
// (the fake kernel, ops.py, serves torch.compile's fake tensors and the meta device).
TORCH_LIBRARY_IMPL(eml, CPU, m) {
  m.impl("linear", &linear_cpu);
  m.impl("linear_grad_input", &linear_grad_input_cpu);
  m.impl("linear_grad_weight", &linear_grad_weight_cpu);
  m.impl("linear_grad_bias", &linear_grad_bias_cpu);
}

// ---- 4. The empty Python module ----------------------------------------------------------
// `import eml.linear_op._C` loads this .so, which runs TORCH_LIBRARY's static initialisers; Python
// then asks for PyInit__C, which returns a module with nothing in it. Everything is reached
// through torch.ops.eml.* instead. PyMODINIT_FUNC: extern "C", and exported although setup.py
// hides the module's other functions (-fvisibility=hidden).
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef s_module = {
      PyModuleDef_HEAD_INIT,
      "_C",  // m_name
      "Stage 08: importing this module registers the eml:: operators (torch.ops.eml)",  // m_doc
      -1,    // m_size: no per-interpreter state
      nullptr,  // m_methods: none
  };
  return PyModule_Create(&s_module);
}

// Stage 16: the registrations, on the stable ABI. Stage 08 declared its operators with
// TORCH_LIBRARY and gave them CPU kernels with TORCH_LIBRARY_IMPL; this file does the same with
// STABLE_TORCH_LIBRARY and STABLE_TORCH_LIBRARY_IMPL (torch/csrc/stable/library.h), in the
// namespace `eml_stable` (08's `eml` stays 08's: one process may load both). Their Python halves
// (fake kernels, autograd, autocast, vmap) are in ops.py, as in 08.
//
// What changed since stage 08:
//   - a kernel is registered boxed: TORCH_BOX(&linear_cpu) wraps the typed function into one
//     that takes its arguments from a stack of StableIValues, the only calling convention the
//     C shim knows (08's m.impl unboxed them in libtorch's C++ templates);
//   - def() takes a schema only: the tools, which 08 defined with a lambda as a catch-all
//     kernel, get theirs from STABLE_TORCH_LIBRARY_IMPL(..., CompositeExplicitAutograd, ..);
//   - m.set_python_module names the Python module that holds the Python halves, so that a user
//     who loads this file with torch.ops.load_library gets them too (ops.py, README);
//   - no <torch/library.h>: the module imports no libtorch C++ symbol (tests: the nm check).
// Run it: pip install --no-build-isolation .   then   python -c "import torch, eml.linear_stable; print(torch.ops.eml_stable.linear)"
#include <Python.h>  // the limited API only: -DPy_LIMITED_API is set by setup.py's py_limited_api=True

#include <torch/csrc/stable/library.h>

#include <dlfcn.h>  // dlsym: is there a Python in this process? (section 5)

#include <cstdio>
#include <optional>
#include <string>

#include "FunctionCpp.h"

using namespace tpp;

// The Python module that registers the ops' fake, autograd, autocast and vmap rules (ops.py):
// recorded with the ops (section 2), imported when the library is loaded by path (section 5).
// A test checks it against ops.py's own __name__, so that a renamed package cannot miss it.
static constexpr const char* kPythonHalves = "eml.linear_stable.ops";

namespace {

// ---- 1. The kernels behind the schemas --------------------------------------------------
// Each backward product is an operator of its own: autograd (ops.py) calls only the ones whose
// gradient is needed, and each has a schema that says exactly what it reads and returns.

torch::stable::Tensor linear_cpu(torch::stable::Tensor i_input, torch::stable::Tensor i_weight,
                                 std::optional<torch::stable::Tensor> i_bias) {
  return forward(i_input, i_weight, i_bias);
}

// grad_input = grad_output W: (*, out) x (out, in) -> (*, in)
torch::stable::Tensor linear_grad_input_cpu(torch::stable::Tensor i_grad_output, torch::stable::Tensor i_weight) {
  return backward(i_grad_output, /*i_input=*/std::nullopt, i_weight, /*need_grad_input=*/true,
                  /*need_grad_weights=*/false, /*need_grad_bias=*/false)[0];
}

// grad_weight = grad_output^T x: (out, N) x (N, in) -> (out, in), N all leading dimensions
torch::stable::Tensor linear_grad_weight_cpu(torch::stable::Tensor i_grad_output, torch::stable::Tensor i_input) {
  return backward(i_grad_output, i_input, /*i_weights=*/std::nullopt, /*need_grad_input=*/false,
                  /*need_grad_weights=*/true, /*need_grad_bias=*/false)[1];
}

// grad_bias = grad_output summed over all leading dimensions -> (out)
torch::stable::Tensor linear_grad_bias_cpu(torch::stable::Tensor i_grad_output) {
  return backward(i_grad_output, std::nullopt, std::nullopt, /*need_grad_input=*/false, /*need_grad_weights=*/false,
                  /*need_grad_bias=*/true)[2];
}

// The tools: plain functions, since TORCH_BOX takes a function, not a lambda.
double tpp_peak_gflops(int64_t i_m, int64_t i_n, int64_t i_k, double i_seconds) {
  return peak_gflops(i_m, i_n, i_k, i_seconds);
}
bool tpp_dispatch_check(int64_t i_m, int64_t i_n, int64_t i_k, int64_t i_flags, ScalarType i_dtype) {
  return dispatch_check(i_m, i_n, i_k, static_cast<int>(i_flags), i_dtype);
}
std::string tpp_target_arch() {
  libxsmm_init();
  return std::string(libxsmm_get_target_arch());
}
int64_t tpp_states() { return g_live_states.load(); }  // (in, out) pairs seen so far

}  // namespace

// ---- 2. The schemas: one STABLE_TORCH_LIBRARY per namespace in the whole process -----------
// A schema is the op's contract: argument types, which are optional ("Tensor?"), and that no
// argument is mutated or aliased (no "(a!)" annotations): the ops are functional, which is what
// lets torch.compile and torch.export move them around freely.
STABLE_TORCH_LIBRARY(eml_stable, m) {
  m.set_python_module(kPythonHalves);  // where the ops' Python halves live
  m.def("linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor");
  m.def("linear_grad_input(Tensor grad_output, Tensor weight) -> Tensor");
  m.def("linear_grad_weight(Tensor grad_output, Tensor input) -> Tensor");
  m.def("linear_grad_bias(Tensor grad_output) -> Tensor");

  // Tools, with no tensor argument (their kernels: section 4).
  m.def("tpp_peak_gflops(int m=64, int n=64, int k=64, float seconds=0.1) -> float");
  m.def("tpp_dispatch_check(int m, int n, int k, int flags, ScalarType dtype) -> bool");
  m.def("tpp_target_arch() -> str");
  m.def("tpp_states() -> int");
}

// ---- 3. The CPU kernels ------------------------------------------------------------------
// Registered for the CPU dispatch key only: a tensor on another device reaches no kernel of ours
// (the fake kernel, ops.py, serves torch.compile's fake tensors and the meta device).
STABLE_TORCH_LIBRARY_IMPL(eml_stable, CPU, m) {
  m.impl("linear", TORCH_BOX(&linear_cpu));
  m.impl("linear_grad_input", TORCH_BOX(&linear_grad_input_cpu));
  m.impl("linear_grad_weight", TORCH_BOX(&linear_grad_weight_cpu));
  m.impl("linear_grad_bias", TORCH_BOX(&linear_grad_bias_cpu));
}

// ---- 4. The tools' kernels ---------------------------------------------------------------
// An op without a tensor argument has no device to dispatch on: its kernel is registered for
// CompositeExplicitAutograd, which serves every backend. (08's m.def(schema, lambda) registered
// a catch-all kernel, which the dispatcher files under CompositeImplicitAutograd.)
STABLE_TORCH_LIBRARY_IMPL(eml_stable, CompositeExplicitAutograd, m) {
  m.impl("tpp_peak_gflops", TORCH_BOX(&tpp_peak_gflops));
  m.impl("tpp_dispatch_check", TORCH_BOX(&tpp_dispatch_check));
  m.impl("tpp_target_arch", TORCH_BOX(&tpp_target_arch));
  m.impl("tpp_states", TORCH_BOX(&tpp_states));
}

// ---- 5. Loading by path -----------------------------------------------------------------
// New in 16. A user may load this file without importing the package:
//     torch.ops.load_library(".../eml/linear_stable/_C.abi3.so")
// That runs the registrations above, but not ops.py's Python halves: no fake kernel (so no
// torch.compile), no autograd (backward() warns and returns no gradient), no autocast, no vmap.
// m.set_python_module (section 2) is torch's mechanism for this: it records where the Python
// halves live, and torch 2.13 names that module in its errors ("you may need to import the
// 'eml.linear_stable.ops' Python module") but does not import it. So this library imports it
// itself, once the ops are registered: the statics of this file are initialised in order, and
// this one comes last. It runs Python code while the dynamic loader loads this file, so it does
// as little as it can: nothing when the process has no Python (a C++ program: Py_IsInitialized
// is looked up, not linked, and the Python functions below are bound only when first called:
// lazy binding, the dynamic loader's default, which RTLD_NOW or LD_BIND_NOW=1 would turn off),
// nothing when the import of the package is what loads this file (ops.py is then in
// sys.modules, half-way through), and a warning with the cause when the import fails.
namespace {
void import_python_halves() {
  using IsInitialized = int (*)();
  const auto l_is_initialized = reinterpret_cast<IsInitialized>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
  if (l_is_initialized == nullptr || !l_is_initialized()) return;
  const PyGILState_STATE l_gil = PyGILState_Ensure();
  PyObject* l_modules = PySys_GetObject("modules");  // borrowed
  PyObject* l_name = PyUnicode_FromString(kPythonHalves);
  if (l_modules != nullptr && l_name != nullptr && PyDict_Contains(l_modules, l_name) == 0) {
    PyObject* l_ops = PyImport_Import(l_name);
    if (l_ops == nullptr) {  // say what is missing, and why, instead of failing the load
      PyObject *l_type, *l_value, *l_traceback;
      PyErr_Fetch(&l_type, &l_value, &l_traceback);
      std::string l_why = "no exception";
      if (PyObject* l_text = l_value ? PyObject_Str(l_value) : nullptr) {
        if (const char* l_utf8 = PyUnicode_AsUTF8AndSize(l_text, nullptr)) l_why = l_utf8;
        Py_DECREF(l_text);
      }
      Py_XDECREF(l_type);
      Py_XDECREF(l_value);
      Py_XDECREF(l_traceback);
      const std::string l_message = std::string(kStage) + ": loaded by path, but the Python module " + kPythonHalves +
                                    " could not be imported (" + l_why +
                                    "): torch.ops.eml_stable.* have no fake kernel, autograd, autocast or vmap rule";
      // category nullptr: RuntimeWarning. Under `python -W error` the warning is an exception,
      // which must not escape into dlopen: the message goes to stderr instead.
      if (PyErr_WarnEx(nullptr, l_message.c_str(), 1) < 0) {
        PyErr_Clear();
        std::fprintf(stderr, "%s\n", l_message.c_str());
      }
    }
    Py_XDECREF(l_ops);
  }
  Py_XDECREF(l_name);
  PyErr_Clear();  // nothing of this reaches the caller of dlopen
  PyGILState_Release(l_gil);
}

struct ImportPythonHalves {
  ImportPythonHalves() { import_python_halves(); }
};
const ImportPythonHalves g_import_python_halves;
}  // namespace

// ---- 6. The empty Python module ----------------------------------------------------------
// `import eml.linear_stable._C` loads this .so, which runs the static initialisers above; Python
// then asks for PyInit__C, which returns a module with nothing in it. Everything is reached
// through torch.ops.eml_stable.* instead. PyMODINIT_FUNC: extern "C", and exported although
// setup.py hides every other symbol (-fvisibility=hidden).
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef s_module = {
      PyModuleDef_HEAD_INIT,
      "_C",  // m_name
      "Stage 16: importing this module registers the eml_stable:: operators (torch.ops.eml_stable)",  // m_doc
      -1,    // m_size: no per-interpreter state
      nullptr,  // m_methods: none
  };
  return PyModule_Create(&s_module);
}

// Stage 03: the first C++ extension, a hello() bound to Python with pybind11.
//
// What this stage teaches: how a C++ function becomes a Python function. PYBIND11_MODULE
// defines the module's init function; m.def binds hello(). Built ahead of time by setup.py
// (CppExtension + BuildExtension), or just in time by torch.utils.cpp_extension.load (jit.py).
// What changed since stage 02: Python -> C++; nothing about the linear layer yet.
// Only pybind11 is included (not <torch/extension.h>): hello() needs no tensors, and the file
// builds in about 10 s (notebook 03, Zen 3) instead of the ~30 s that parsing torch/extension.h
// alone costs there. Stage 04 includes torch/extension.h.
// Run it: pip install --no-build-isolation .  then  python -c "from eml.hello_cpp import hello; hello()"
#include <pybind11/pybind11.h>

#include <iostream>

// Prints through C++'s std::cout, i.e. straight to file descriptor 1: Python's sys.stdout
// never sees it (pytest needs capfd, not capsys, to capture it).
void hello() {
  std::cout << "Hello World!" << std::endl;  // std::endl flushes, so the line is out before we return
}

// TORCH_EXTENSION_NAME is set by torch.utils.cpp_extension to the module's name
// ("_C" for setup.py, "hello_cpp_jit" for jit.py): one source serves both routes.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Stage 03: hello() from C++";
  m.def("hello", &hello, "Print 'Hello World!' from C++");
}

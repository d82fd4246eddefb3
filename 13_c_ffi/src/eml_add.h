/* Stage 13: a plain C library, reached from Python through ctypes (eml.c_ffi).
 *
 * What this stage teaches: PyTorch can call any C library on a tensor's memory, with no copy
 * and no C++ extension: the library knows nothing of PyTorch (no header of it is included);
 * it sees raw arrays and sizes. Python (src/clib.py) checks shape, dtype, contiguity and
 * device BEFORE it passes a pointer, because C cannot check what it is given.
 * What changed: this is a new route, not a copy of an earlier stage. It replaces the removed
 * torch.utils.ffi example (my_lib_add_forward / my_lib_add_backward on TH tensors).
 * Build: setup.py compiles eml_add.c into libeml_add.so next to the Python package.
 *
 * Conventions: every array is dense and row-major (C order); n, rows, in and out are element
 * counts; no function allocates, keeps a pointer after it returns, or touches global state
 * other than the call counter. Every entry point exists for float (_f32) and double (_f64).
 */
#ifndef EML_ADD_H
#define EML_ADD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a signature below changes: Python refuses a library of another version. */
#define EML_ADD_ABI_VERSION 1
int64_t eml_abi_version(void);

/* How many computing entry points ran since the library was loaded (or the last reset).
 * The tests use it to prove that a bad input never reached C. */
int64_t eml_calls(void);
void eml_reset_calls(void);

/* out[i] = a[i] + b[i] for i < n. */
void eml_add_forward_f32(const float* a, const float* b, float* out, int64_t n);
void eml_add_forward_f64(const double* a, const double* b, double* out, int64_t n);

/* d(a + b)/da = d(a + b)/db = 1: grad_a[i] = grad_b[i] = grad_out[i] for i < n.
 * (The old torch.utils.ffi example returned a gradient for one input only.) */
void eml_add_backward_f32(const float* grad_out, float* grad_a, float* grad_b, int64_t n);
void eml_add_backward_f64(const double* grad_out, double* grad_a, double* grad_b, int64_t n);

/* y = x W^T + b: x is rows x in, w is out x in, bias has out elements or is NULL (no bias),
 * y is rows x out. */
void eml_linear_forward_f32(const float* x, const float* w, const float* bias, float* y,
                            int64_t rows, int64_t in, int64_t out);
void eml_linear_forward_f64(const double* x, const double* w, const double* bias, double* y,
                            int64_t rows, int64_t in, int64_t out);

#ifdef __cplusplus
}
#endif

#endif /* EML_ADD_H */

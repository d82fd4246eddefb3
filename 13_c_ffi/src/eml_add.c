/* Stage 13: the C library behind eml.c_ffi (declarations and conventions: eml_add.h).
 *
 * What this stage teaches: the C side of a foreign-function interface is plain C on raw
 * arrays; everything PyTorch-specific (checks, autograd, torch.compile) stays in Python.
 * What changed: a new route, not a copy of an earlier stage (README: torch.utils.ffi).
 * Build: setup.py compiles this file into libeml_add.so; test: pytest 13_c_ffi/tests.
 */
#include "eml_add.h"

#include <stddef.h>

/* ---- 1. Version and the call counter ---------------------------------------------------- */
static int64_t g_calls = 0; /* not atomic: the tests call from one thread */

int64_t eml_abi_version(void) { return EML_ADD_ABI_VERSION; }
int64_t eml_calls(void) { return g_calls; }
void eml_reset_calls(void) { g_calls = 0; }

/* ---- 2. add: forward and backward -------------------------------------------------------- */
/* One body per element type, written once as a macro so float and double cannot drift apart. */
#define EML_ADD_FORWARD(SUFFIX, T)                                               \
    void eml_add_forward_##SUFFIX(const T* a, const T* b, T* out, int64_t n) {   \
        ++g_calls;                                                               \
        for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];                    \
    }

/* y = a + b, so dy/da = 1 and dy/db = 1: both gradients are copies of grad_out. */
#define EML_ADD_BACKWARD(SUFFIX, T)                                                       \
    void eml_add_backward_##SUFFIX(const T* grad_out, T* grad_a, T* grad_b, int64_t n) {  \
        ++g_calls;                                                                        \
        for (int64_t i = 0; i < n; ++i) {                                                 \
            grad_a[i] = grad_out[i];                                                      \
            grad_b[i] = grad_out[i];                                                      \
        }                                                                                 \
    }

EML_ADD_FORWARD(f32, float)
EML_ADD_FORWARD(f64, double)
EML_ADD_BACKWARD(f32, float)
EML_ADD_BACKWARD(f64, double)

/* ---- 3. linear forward: y = x W^T + b ----------------------------------------------------- */
/* y[r][o] = bias[o] + sum_k x[r][k] * w[o][k]. Both x and w are read along k, their rows are
 * contiguous, so the inner loop walks memory in order (the loop order of stage 05's textbook
 * forward, in C; here the sum starts from the bias, where 05 adds the bias after the sum). */
#define EML_LINEAR_FORWARD(SUFFIX, T)                                                     \
    void eml_linear_forward_##SUFFIX(const T* x, const T* w, const T* bias, T* y,         \
                                     int64_t rows, int64_t in, int64_t out) {             \
        ++g_calls;                                                                        \
        for (int64_t r = 0; r < rows; ++r) {                                              \
            const T* x_row = x + r * in;                                                  \
            for (int64_t o = 0; o < out; ++o) {                                           \
                const T* w_row = w + o * in;                                              \
                T sum = (bias != NULL) ? bias[o] : (T)0;                                  \
                for (int64_t k = 0; k < in; ++k) sum += x_row[k] * w_row[k];              \
                y[r * out + o] = sum;                                                     \
            }                                                                             \
        }                                                                                 \
    }

EML_LINEAR_FORWARD(f32, float)
EML_LINEAR_FORWARD(f64, double)

// Stage 11: the LLTM cell with its element-wise work fused into one pass each way (CPU).
//
// What this stage teaches: fusion. Stage 10 runs each element-wise op of the cell as its own
// ATen call: ~10 passes over (B, S) arrays in the forward, ~20 in the backward, each with its
// own dispatch and its own temporary. Here one loop nest does all of it:
//
//   forward:  gates = [old_h, input] W^T + b               (ATen GEMM, MKL)
//             one pass over the rows: sigmoid, sigmoid, elu, new_cell, new_h   (section 3)
//   backward: one pass over the rows: every element-wise derivative -> d_gates  (section 4)
//             d_weights = d_gates^T X, d_X = d_gates W, d_bias = sum of rows   (ATen)
//
//   forward(input, weights, bias, old_h, old_cell) -> [new_h, new_cell, gates]
//   backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights, need_d_X, need_d_weights)
//     -> [d_old_h, d_input, d_weights, d_bias (1, 3S), d_old_cell]
//
// What changed since stage 10: the forward returns 3 tensors, not 7. Saved for the backward are
// only the pre-activation gates (B, 3S) beside tensors that exist anyway (the inputs, new_cell):
// input_gate, output_gate and candidate_cell are recomputed from the gates inside the fused
// backward pass (a few exp per element, cheaper than storing and re-reading them), and X is
// rebuilt by one copy. The rows are shared between threads by at::parallel_for (compile with
// -fopenmp); the loop over a row's S elements runs on restrict pointers without branches the
// compiler cannot turn into selects.
// Build: pip install --no-build-isolation ./11_lltm_fused   (or JIT: eml.lltm_fused.jit.build())

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

// ---- 1. The checks: every input error is a clear message naming the value ----

static void check_inputs(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                         const at::Tensor& old_h, const at::Tensor& old_cell) {
  const std::pair<const char*, const at::Tensor*> tensors[] = {
      {"input", &input}, {"weights", &weights}, {"bias", &bias}, {"old_h", &old_h}, {"old_cell", &old_cell}};
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(tensor->scalar_type() == at::kFloat || tensor->scalar_type() == at::kDouble,
                "lltm_fused: ", name, " must be float32 or float64, got ", tensor->scalar_type());
  }
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(tensor->scalar_type() == input.scalar_type(),
                "lltm_fused: ", name, " is ", tensor->scalar_type(), " but input is ", input.scalar_type());
    TORCH_CHECK(tensor->device().is_cpu(), "lltm_fused: ", name, " must be a CPU tensor, got device ", tensor->device());
  }
  TORCH_CHECK(input.dim() == 2, "lltm_fused: input must be 2-D (batch, features), got shape ", input.sizes());
  TORCH_CHECK(weights.dim() == 2 && weights.size(0) % 3 == 0,
              "lltm_fused: weights must be 2-D (3 * state, state + features), got shape ", weights.sizes());
  const int64_t batch = input.size(0), features = input.size(1), state = weights.size(0) / 3;
  for (const auto& [name, tensor] : {std::pair{"old_h", &old_h}, std::pair{"old_cell", &old_cell}}) {
    TORCH_CHECK(tensor->dim() == 2, "lltm_fused: ", name, " must be 2-D (batch, state), got shape ", tensor->sizes());
    TORCH_CHECK(tensor->size(0) == batch,
                "lltm_fused: ", name, " has batch size ", tensor->size(0), " but input has ", batch);
    TORCH_CHECK(tensor->size(1) == state, "lltm_fused: ", name, " must have shape [", batch, ", ", state,
                "] (weights have 3 * ", state, " rows), got ", tensor->sizes());
  }
  TORCH_CHECK(weights.size(1) == state + features, "lltm_fused: input has ", features,
              " features, so weights must have shape [", 3 * state, ", ", state + features, "], got ", weights.sizes());
  TORCH_CHECK((bias.dim() == 1 && bias.size(0) == 3 * state) ||
                  (bias.dim() == 2 && bias.size(0) == 1 && bias.size(1) == 3 * state),
              "lltm_fused: bias must have shape (", 3 * state, ") or (1, ", 3 * state, "), got ", bias.sizes());
}

// ---- 2. The activations of one element, and how many rows a thread takes at least ----

// sigmoid(z) = 1 / (1 + e^-z)
template <typename scalar_t>
static inline scalar_t sigmoid(scalar_t z) {
  return scalar_t(1) / (scalar_t(1) + std::exp(-z));
}

// elu(z) = z if z > 0 else alpha (e^z - 1), alpha = 1; expm1 keeps the digits near z = 0
template <typename scalar_t>
static inline scalar_t elu(scalar_t z) {
  return z > scalar_t(0) ? z : std::expm1(z);
}

// A chunk of at least ~1024 elements per thread: below that, waking a thread costs more than
// the few microseconds of exp and tanh it would take over.
static int64_t grain_rows(int64_t state) { return std::max<int64_t>(1, 1024 / std::max<int64_t>(state, 1)); }

// ---- 3. Forward: one GEMM, then one fused pass over the rows ----

std::vector<at::Tensor> lltm_forward(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                                     const at::Tensor& old_h, const at::Tensor& old_cell) {
  check_inputs(input, weights, bias, old_h, old_cell);
  const int64_t batch = input.size(0), state = old_h.size(1);
  // X lives only for the GEMM: the backward rebuilds it rather than keeping B x (S + F) alive.
  const auto X = at::cat({old_h, input}, /*dim=*/1);
  const auto gates = at::addmm(bias.reshape({1, -1}), X, weights.transpose(0, 1));  // (B, 3S), contiguous
  const auto old_cell_c = old_cell.contiguous();  // a named local: its data_ptr stays valid
  auto new_h = at::empty({batch, state}, input.options());
  auto new_cell = at::empty({batch, state}, input.options());

  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "lltm_fused_forward", [&] {
    const scalar_t* __restrict__ g_all = gates.data_ptr<scalar_t>();
    const scalar_t* __restrict__ c_all = old_cell_c.data_ptr<scalar_t>();
    scalar_t* __restrict__ h_out = new_h.data_ptr<scalar_t>();
    scalar_t* __restrict__ c_out = new_cell.data_ptr<scalar_t>();
    at::parallel_for(0, batch, grain_rows(state), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const scalar_t* __restrict__ g = g_all + row * 3 * state;  // [input | output | candidate]
        const scalar_t* __restrict__ c = c_all + row * state;
        scalar_t* __restrict__ h_row = h_out + row * state;
        scalar_t* __restrict__ c_row = c_out + row * state;
        for (int64_t j = 0; j < state; ++j) {
          const scalar_t input_gate = sigmoid(g[j]);
          const scalar_t output_gate = sigmoid(g[state + j]);
          const scalar_t candidate_cell = elu(g[2 * state + j]);
          const scalar_t cell = c[j] + candidate_cell * input_gate;
          c_row[j] = cell;
          h_row[j] = std::tanh(cell) * output_gate;
        }
      }
    });
  });
  return {new_h, new_cell, gates};
}

// ---- 4. Backward: one fused pass for d_gates, then the GEMMs ----

std::vector<at::Tensor> lltm_backward(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                      const at::Tensor& new_cell, const at::Tensor& gates, const at::Tensor& input,
                                      const at::Tensor& old_h, const at::Tensor& weights, bool need_d_X,
                                      bool need_d_weights) {
  TORCH_CHECK(grad_h.sizes() == new_cell.sizes() && grad_cell.sizes() == new_cell.sizes(),
              "lltm_fused: grad_h and grad_cell must have new_cell's shape ", new_cell.sizes(), ", got ",
              grad_h.sizes(), " and ", grad_cell.sizes());
  TORCH_CHECK(gates.is_contiguous() && gates.size(0) == new_cell.size(0) && gates.size(1) == 3 * new_cell.size(1),
              "lltm_fused: gates must be the contiguous (B, 3S) tensor forward returned, got ", gates.sizes());
  const int64_t batch = new_cell.size(0), state = new_cell.size(1);
  const auto grad_h_c = grad_h.contiguous(), grad_cell_c = grad_cell.contiguous(), new_cell_c = new_cell.contiguous();
  auto d_gates = at::empty({batch, 3 * state}, gates.options());
  auto d_old_cell = at::empty({batch, state}, gates.options());

  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lltm_fused_backward", [&] {
    const scalar_t* __restrict__ g_all = gates.data_ptr<scalar_t>();
    const scalar_t* __restrict__ gh_all = grad_h_c.data_ptr<scalar_t>();
    const scalar_t* __restrict__ gc_all = grad_cell_c.data_ptr<scalar_t>();
    const scalar_t* __restrict__ c_all = new_cell_c.data_ptr<scalar_t>();
    scalar_t* __restrict__ dg_all = d_gates.data_ptr<scalar_t>();
    scalar_t* __restrict__ dc_all = d_old_cell.data_ptr<scalar_t>();
    at::parallel_for(0, batch, grain_rows(state), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const scalar_t* __restrict__ g = g_all + row * 3 * state;
        const scalar_t* __restrict__ gh = gh_all + row * state;
        const scalar_t* __restrict__ gc = gc_all + row * state;
        const scalar_t* __restrict__ c = c_all + row * state;
        scalar_t* __restrict__ dg = dg_all + row * 3 * state;
        scalar_t* __restrict__ dc = dc_all + row * state;
        for (int64_t j = 0; j < state; ++j) {
          // recomputed from the saved pre-activation gates instead of saved by the forward
          const scalar_t input_gate = sigmoid(g[j]);
          const scalar_t output_gate = sigmoid(g[state + j]);
          const scalar_t z = g[2 * state + j];
          const scalar_t candidate_cell = elu(z);
          const scalar_t d_elu = z > scalar_t(0) ? scalar_t(1) : candidate_cell + scalar_t(1);  // elu'(z) = e^z = elu(z) + 1 for z <= 0
          const scalar_t tanh_cell = std::tanh(c[j]);
          // new_h = tanh(new_cell) * output_gate; tanh'(z) = 1 - tanh^2(z)
          const scalar_t d_new_cell = gh[j] * output_gate * (scalar_t(1) - tanh_cell * tanh_cell) + gc[j];
          dc[j] = d_new_cell;  // new_cell = old_cell + ...: d_old_cell = d_new_cell
          // sigmoid'(z) = sigmoid(z) (1 - sigmoid(z))
          dg[j] = d_new_cell * candidate_cell * input_gate * (scalar_t(1) - input_gate);
          dg[state + j] = gh[j] * tanh_cell * output_gate * (scalar_t(1) - output_gate);
          dg[2 * state + j] = d_new_cell * input_gate * d_elu;
        }
      }
    });
  });

  auto d_bias = d_gates.sum(/*dim=*/0, /*keepdim=*/true);  // (1, 3S)
  at::Tensor d_weights, d_old_h, d_input;
  if (need_d_weights) {
    d_weights = d_gates.t().mm(at::cat({old_h, input}, /*dim=*/1));  // X rebuilt: one copy
  }
  if (need_d_X) {
    const auto d_X = d_gates.mm(weights);
    d_old_h = d_X.slice(/*dim=*/1, 0, state);  // X = [old_h, input]: old_h's S columns,
    d_input = d_X.slice(/*dim=*/1, state);     // then the input's F (F != S in general)
  }
  return {d_old_h, d_input, d_weights, d_bias, d_old_cell};
}

// ---- 5. The binding ----

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &lltm_forward, "LLTM forward (one GEMM, one fused element-wise pass)");
  m.def("backward", &lltm_backward, "LLTM backward (one fused element-wise pass, then the GEMMs)");
}

// Stage 05 of "From PyTorch to Machine Code": the linear layer's matrix products as our own loops.
//
// What this stage teaches: what ATen's matrix multiplication hid in stage 04. The three
// products of a linear layer become loops over raw pointers into row-major memory, threaded
// with at::parallel_for, each in two loop orders:
//
//   forward:   y           = x W^T + b          y[n][o]  = sum_k x[n][k]  w[o][k] + b[o]
//   backward:  grad_input  = grad_output W      gx[n][k] = sum_o gy[n][o] w[o][k]
//              grad_weight = grad_output^T x    gw[o][k] = sum_n gy[n][o] x[n][k]
//              grad_bias   = sum_N grad_output  gb[o]    = sum_n gy[n][o]
//
//   textbook:    one dot product per output element (the formulas above, read left to right);
//   cache_aware: a row of the result accumulates whole rows of an operand (add_scaled_rows):
//                the innermost loop walks contiguous memory in every array it touches, so
//                each cache line is used whole and the compiler vectorises the loop (SIMD).
//
// N is the product of the leading dimensions: this file flattens (*, in) to (N, in) and
// restores (*, out) afterwards, as stage 04 did.
// What changed since stage 04: no ATen matrix product is left (tests/ grep this file for
// them); inputs are made contiguous into named locals and read through raw pointers;
// AT_DISPATCH_FLOATING_TYPES instantiates each loop for float and double; a loop_order
// argument picks the loops; check_inputs also accepts only Float and Double.
// Build and test:  pip install --no-build-isolation .   then   pytest tests
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

// The course's two declarations, verbatim: no bias, both gradients, the default loop order.
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight);
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, torch::Tensor i_input, torch::Tensor i_weights);

// Beside them, two overloads that layer.py calls: the bias (None in Python, std::nullopt
// here), needs_input_grad, so that no gradient is computed that nobody asked for, and the
// loop order.
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight, std::optional<torch::Tensor> i_bias,
                      std::string i_loop_order);
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output,
                                    std::optional<torch::Tensor> i_input,
                                    std::optional<torch::Tensor> i_weights,
                                    bool i_need_grad_input,
                                    bool i_need_grad_weights,
                                    bool i_need_grad_bias,
                                    std::string i_loop_order);

// The two loop orders; the first is the default. cache_aware is the default because it is the
// fast one: its innermost loops run along contiguous rows, so every byte brought into the
// cache is used and the compiler emits SIMD instructions, where the textbook order waits on a
// chain of dependent additions (one dot product) or strides down a column. Both compute the
// same sums in the same order; the tour times both (README.md has the numbers). The textbook
// order stays as the one to compare with.
const char* const kLoopOrders[] = {"cache_aware", "textbook"};

// Every error message starts with the stage's name, as the Python stages' messages do.
const char* const kStage = "linear_cpp_naive";

// The stage's one place for input validation; forward and backward call it before anything
// else. TORCH_CHECK raises a Python RuntimeError whose message names the problem and the
// offending value. An absent tensor (std::nullopt) is not checked: the bias when there is
// none, grad_output in the forward, and in the backward the input or the weight when no
// requested gradient needs it (grad_input needs the weight, grad_weight the input).
void check_inputs(const std::string& i_loop_order,
                  const std::optional<torch::Tensor>& i_input,
                  const std::optional<torch::Tensor>& i_weight,
                  const std::optional<torch::Tensor>& i_bias,
                  const std::optional<torch::Tensor>& i_grad_output = std::nullopt,
                  bool i_need_grad_input = false,
                  bool i_need_grad_weights = false) {
  TORCH_CHECK(i_loop_order == kLoopOrders[0] || i_loop_order == kLoopOrders[1], kStage, ": expected loop_order \"",
              kLoopOrders[0], "\" or \"", kLoopOrders[1], "\", got \"", i_loop_order, "\"");
  TORCH_CHECK(i_weight || !i_need_grad_input, kStage, ": grad_input needs the weight, got None");
  TORCH_CHECK(i_input || !i_need_grad_weights, kStage, ": grad_weight needs the input, got None");

  // Device and dtype: CPU tensors, Float or Double (the two types the loops are built for),
  // all of the first one's dtype (the weight's).
  const std::pair<const char*, const std::optional<torch::Tensor>*> l_tensors[] = {
      {"weight", &i_weight}, {"input", &i_input}, {"bias", &i_bias}, {"grad_output", &i_grad_output}};
  const char* l_dtype_from = nullptr;
  torch::ScalarType l_dtype = torch::kFloat;
  for (const auto& [l_name, l_tensor] : l_tensors) {
    if (!l_tensor->has_value()) continue;
    const torch::Tensor& l_t = l_tensor->value();
    TORCH_CHECK(l_t.device().is_cpu(), kStage, ": expected the ", l_name, " on the CPU, got device ", l_t.device());
    TORCH_CHECK(l_t.scalar_type() == torch::kFloat || l_t.scalar_type() == torch::kDouble,
                kStage, ": expected a Float or Double ", l_name, " dtype, got ", l_t.scalar_type());
    if (l_dtype_from == nullptr) {
      l_dtype_from = l_name;
      l_dtype = l_t.scalar_type();
    }
    TORCH_CHECK(l_t.scalar_type() == l_dtype, kStage, ": expected the ", l_name, " dtype ", l_dtype,
                " (the ", l_dtype_from, "'s), got ", l_t.scalar_type());
  }

  // Ranks: weight (out_features, in_features), input and grad_output (*, features).
  if (i_weight) {
    TORCH_CHECK(i_weight->dim() == 2, kStage, ": expected a 2-d weight (out_features, in_features), got ",
                i_weight->dim(), " dimension(s): ", i_weight->sizes());
  }
  if (i_input) {
    TORCH_CHECK(i_input->dim() >= 1, kStage, ": expected an input with at least 1 dimension (*, in_features), got a 0-d tensor");
  }
  if (i_grad_output) {
    TORCH_CHECK(i_grad_output->dim() >= 1, kStage, ": expected a grad_output with at least 1 dimension (*, out_features), got a 0-d tensor");
  }

  // Sizes: the feature counts agree with the weight, the batch dimensions with each other.
  // The loops below trust these sizes: a wrong one here would be a read out of bounds there.
  if (i_input && i_weight) {
    TORCH_CHECK(i_input->size(-1) == i_weight->size(1), kStage, ": expected ", i_weight->size(1),
                " input features in the last dimension (the weight's in_features), got ", i_input->size(-1),
                " (input shape ", i_input->sizes(), ")");
  }
  if (i_bias && i_weight) {
    TORCH_CHECK(i_bias->dim() == 1 && i_bias->size(0) == i_weight->size(0), kStage, ": expected a bias of shape [",
                i_weight->size(0), "] (the weight's out_features), got shape ", i_bias->sizes());
  }
  if (i_grad_output && i_weight) {
    TORCH_CHECK(i_grad_output->size(-1) == i_weight->size(0), kStage, ": expected ", i_weight->size(0),
                " output features in grad_output's last dimension (the weight's out_features), got ",
                i_grad_output->size(-1), " (grad_output shape ", i_grad_output->sizes(), ")");
  }
  if (i_grad_output && i_input) {
    const auto l_batch = i_input->sizes().slice(/*start=*/0, /*length=*/i_input->dim() - 1);
    const auto l_batch_grad = i_grad_output->sizes().slice(/*start=*/0, /*length=*/i_grad_output->dim() - 1);
    TORCH_CHECK(l_batch == l_batch_grad, kStage, ": expected grad_output's leading dimensions ", l_batch,
                " (the input's), got ", l_batch_grad, " (grad_output shape ", i_grad_output->sizes(), ")");
  }
}

// (*, features) -> (N, features), N the product of the leading sizes (1 for a 1-d tensor).
// A view where the strides allow it, else a copy; flatten handles 0-size dimensions too.
torch::Tensor flatten_to_2d(const torch::Tensor& i_tensor) {
  return i_tensor.dim() == 1 ? i_tensor.unsqueeze(/*dim=*/0) : i_tensor.flatten(/*start_dim=*/0, /*end_dim=*/-2);
}

// (N, features) -> (*, features): the leading sizes of i_like, the last size of i_tensor_2d.
torch::Tensor unflatten_like(const torch::Tensor& i_tensor_2d, const torch::Tensor& i_like) {
  std::vector<int64_t> l_sizes = i_like.sizes().vec();
  l_sizes.back() = i_tensor_2d.size(/*dim=*/1);
  return i_tensor_2d.reshape(l_sizes);
}

// at::parallel_for(begin, end, grain, f) splits [begin, end) into one chunk per thread and
// calls f(first, last) on each; it stays on one thread when end - begin <= grain. The grain:
// enough rows for 32768 multiply-adds (ATen's own grain size), so tiny layers stay serial.
int64_t grain_rows(int64_t i_work_per_row) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, i_work_per_row));
}

// All matrices are row-major: element [r][c] of an (R, C) matrix a is a[r * C + c].
// Each thread writes whole rows of the output, so no two threads write the same element and
// each element is summed in the same order on any number of threads: the results are
// bitwise the same on 1 and 2 threads.

// The cache-aware building block, one row of a result at a time:
//   o_row[:] += sum_j i_scales[j * i_scale_stride] * i_rows[j * i_row_stride + :]   (j < i_count)
// The innermost loop walks o_row and the rows, all contiguous, with independent iterations,
// so -O3 vectorises it (SIMD). It takes four rows per pass over o_row: one load and one store
// of o_row serve four multiply-adds instead of one. The additions stay in j order, so the
// result is bitwise that of one row per pass. inline: each caller gets its own copy, compiled
// for its own arguments (a scale stride of 1, say).
template <typename T>
inline void add_scaled_rows(T* o_row, const T* i_scales, int64_t i_scale_stride, const T* i_rows,
                            int64_t i_row_stride, int64_t i_count, int64_t i_length) {
  int64_t l_j = 0;
  for (; l_j + 4 <= i_count; l_j += 4) {
    const T l_a0 = i_scales[l_j * i_scale_stride];
    const T l_a1 = i_scales[(l_j + 1) * i_scale_stride];
    const T l_a2 = i_scales[(l_j + 2) * i_scale_stride];
    const T l_a3 = i_scales[(l_j + 3) * i_scale_stride];
    const T* l_r0 = i_rows + l_j * i_row_stride;
    const T* l_r1 = l_r0 + i_row_stride;
    const T* l_r2 = l_r1 + i_row_stride;
    const T* l_r3 = l_r2 + i_row_stride;
    for (int64_t l_i = 0; l_i < i_length; l_i++) {
      o_row[l_i] = o_row[l_i] + l_a0 * l_r0[l_i] + l_a1 * l_r1[l_i] + l_a2 * l_r2[l_i] + l_a3 * l_r3[l_i];
    }
  }
  for (; l_j < i_count; l_j++) {  // the last i_count % 4 rows, one per pass
    const T l_a = i_scales[l_j * i_scale_stride];
    const T* l_r = i_rows + l_j * i_row_stride;
    for (int64_t l_i = 0; l_i < i_length; l_i++) {
      o_row[l_i] += l_a * l_r[l_i];
    }
  }
}

// ---- forward: y (N, out) = x (N, in) W^T + b -----------------------------------------

// textbook: y[n][o] = sum_k x[n][k] w[o][k] + b[o]. Both rows are contiguous in k, but the sum is
// one chain of additions that the compiler may not reorder (that would change the rounding):
// each addition waits for the result of the one before it, a few cycles, SIMD or not.
template <typename T>
void forward_textbook(const T* i_x, const T* i_w, const T* i_b, T* o_y, int64_t i_n, int64_t i_in, int64_t i_out) {
  at::parallel_for(/*begin=*/0, /*end=*/i_n, grain_rows(i_in * i_out), [&](int64_t i_first, int64_t i_last) {
    for (int64_t l_n = i_first; l_n < i_last; l_n++) {
      for (int64_t l_o = 0; l_o < i_out; l_o++) {
        T l_sum = 0;
        for (int64_t l_k = 0; l_k < i_in; l_k++) {
          l_sum += i_x[l_n * i_in + l_k] * i_w[l_o * i_in + l_k];
        }
        o_y[l_n * i_out + l_o] = i_b ? l_sum + i_b[l_o] : l_sum;
      }
    }
  });
}

// cache_aware: y[n][:] = sum_k x[n][k] * wt[k][:] + b, loop order n, k, o, over wt = W^T (in, out):
// the rows of wt are contiguous in o, those of W are not. W is transposed once, in*out copies
// against N*in*out multiply-adds.
template <typename T>
void forward_cache_aware(const T* i_x, const T* i_w, const T* i_b, T* o_y, int64_t i_n, int64_t i_in, int64_t i_out) {
  std::vector<T> l_wt(i_in * i_out);  // wt[k][o] = w[o][k]
  at::parallel_for(/*begin=*/0, /*end=*/i_in, grain_rows(i_out), [&](int64_t i_first, int64_t i_last) {
    for (int64_t l_k = i_first; l_k < i_last; l_k++) {
      for (int64_t l_o = 0; l_o < i_out; l_o++) {
        l_wt[l_k * i_out + l_o] = i_w[l_o * i_in + l_k];
      }
    }
  });
  at::parallel_for(/*begin=*/0, /*end=*/i_n, grain_rows(i_in * i_out), [&](int64_t i_first, int64_t i_last) {
    for (int64_t l_n = i_first; l_n < i_last; l_n++) {
      T* l_y = o_y + l_n * i_out;  // row n of y
      std::fill(l_y, l_y + i_out, T(0));
      // y[n][:] += x[n][k] * wt[k][:] for every k
      add_scaled_rows(l_y, /*i_scales=*/i_x + l_n * i_in, /*i_scale_stride=*/1, /*i_rows=*/l_wt.data(),
                      /*i_row_stride=*/i_out, /*i_count=*/i_in, /*i_length=*/i_out);
      if (i_b) {
        for (int64_t l_o = 0; l_o < i_out; l_o++) {
          l_y[l_o] += i_b[l_o];
        }
      }
    }
  });
}

// ---- grad_input: gx (N, in) = gy (N, out) W (out, in) --------------------------------

// textbook: gx[n][k] = sum_o gy[n][o] w[o][k]: a dot product down column k of W, one element
// per row, i_in elements apart: each load touches a different cache line.
template <typename T>
void grad_input_textbook(const T* i_gy, const T* i_w, T* o_gx, int64_t i_n, int64_t i_in, int64_t i_out) {
  at::parallel_for(/*begin=*/0, /*end=*/i_n, grain_rows(i_in * i_out), [&](int64_t i_first, int64_t i_last) {
    for (int64_t l_n = i_first; l_n < i_last; l_n++) {
      for (int64_t l_k = 0; l_k < i_in; l_k++) {
        T l_sum = 0;
        for (int64_t l_o = 0; l_o < i_out; l_o++) {
          l_sum += i_gy[l_n * i_out + l_o] * i_w[l_o * i_in + l_k];
        }
        o_gx[l_n * i_in + l_k] = l_sum;
      }
    }
  });
}

// cache_aware: gx[n][:] = sum_o gy[n][o] * w[o][:], loop order n, o, k: W's rows are contiguous
// in k already, so no transpose is needed.
template <typename T>
void grad_input_cache_aware(const T* i_gy, const T* i_w, T* o_gx, int64_t i_n, int64_t i_in, int64_t i_out) {
  at::parallel_for(/*begin=*/0, /*end=*/i_n, grain_rows(i_in * i_out), [&](int64_t i_first, int64_t i_last) {
    for (int64_t l_n = i_first; l_n < i_last; l_n++) {
      T* l_gx = o_gx + l_n * i_in;  // row n of gx
      std::fill(l_gx, l_gx + i_in, T(0));
      // gx[n][:] += gy[n][o] * w[o][:] for every o
      add_scaled_rows(l_gx, /*i_scales=*/i_gy + l_n * i_out, /*i_scale_stride=*/1, /*i_rows=*/i_w,
                      /*i_row_stride=*/i_in, /*i_count=*/i_out, /*i_length=*/i_in);
    }
  });
}

// ---- grad_weight: gw (out, in) = gy^T (out, N) x (N, in) -----------------------------

// textbook: gw[o][k] = sum_n gy[n][o] x[n][k]: a dot product down column o of gy and column k
// of x, both strided.
template <typename T>
void grad_weight_textbook(const T* i_gy, const T* i_x, T* o_gw, int64_t i_n, int64_t i_in, int64_t i_out) {
  at::parallel_for(/*begin=*/0, /*end=*/i_out, grain_rows(i_n * i_in), [&](int64_t i_first, int64_t i_last) {
    for (int64_t l_o = i_first; l_o < i_last; l_o++) {
      for (int64_t l_k = 0; l_k < i_in; l_k++) {
        T l_sum = 0;
        for (int64_t l_n = 0; l_n < i_n; l_n++) {
          l_sum += i_gy[l_n * i_out + l_o] * i_x[l_n * i_in + l_k];
        }
        o_gw[l_o * i_in + l_k] = l_sum;
      }
    }
  });
}

// cache_aware: gw[o][:] = sum_n gy[n][o] * x[n][:], loop order o, n, k: the rows of x are
// contiguous in k; the scales gy[n][o] walk down a column of gy, one per row of x.
template <typename T>
void grad_weight_cache_aware(const T* i_gy, const T* i_x, T* o_gw, int64_t i_n, int64_t i_in, int64_t i_out) {
  at::parallel_for(/*begin=*/0, /*end=*/i_out, grain_rows(i_n * i_in), [&](int64_t i_first, int64_t i_last) {
    for (int64_t l_o = i_first; l_o < i_last; l_o++) {
      T* l_gw = o_gw + l_o * i_in;  // row o of gw
      std::fill(l_gw, l_gw + i_in, T(0));
      // gw[o][:] += gy[n][o] * x[n][:] for every n
      add_scaled_rows(l_gw, /*i_scales=*/i_gy + l_o, /*i_scale_stride=*/i_out, /*i_rows=*/i_x,
                      /*i_row_stride=*/i_in, /*i_count=*/i_n, /*i_length=*/i_in);
    }
  });
}

// ---- grad_bias: gb (out) = sum over n of gy[n][:] --------------------------------------

// A sum, not a matrix product: one loop order for both settings. Each thread owns a range of
// o and adds the rows of gy into it, the innermost loop contiguous.
template <typename T>
void grad_bias(const T* i_gy, T* o_gb, int64_t i_n, int64_t i_out) {
  at::parallel_for(/*begin=*/0, /*end=*/i_out, grain_rows(i_n), [&](int64_t i_first, int64_t i_last) {
    std::fill(o_gb + i_first, o_gb + i_last, T(0));
    for (int64_t l_n = 0; l_n < i_n; l_n++) {
      for (int64_t l_o = i_first; l_o < i_last; l_o++) {
        o_gb[l_o] += i_gy[l_n * i_out + l_o];
      }
    }
  });
}

// ---- the bound functions -------------------------------------------------------------

// y = x W^T + b for x of shape (*, in); without a bias, y = x W^T.
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight, std::optional<torch::Tensor> i_bias,
                      std::string i_loop_order) {
  check_inputs(i_loop_order, i_input, i_weight, i_bias);
  // Row-major data, each in a named local: a data pointer into a temporary would dangle.
  // contiguous() returns the tensor itself when it is already contiguous, else a copy.
  const torch::Tensor l_input = flatten_to_2d(i_input).contiguous();             // (N, in)
  const torch::Tensor l_weight = i_weight.contiguous();                          // (out, in)
  const torch::Tensor l_bias = i_bias ? i_bias->contiguous() : torch::Tensor();  // (out), or undefined
  const int64_t l_n = l_input.size(0), l_in = l_weight.size(1), l_out = l_weight.size(0);
  torch::Tensor l_output = torch::empty({l_n, l_out}, l_input.options());  // every element is written

  // scalar_t is float for a Float input, double for a Double one.
  AT_DISPATCH_FLOATING_TYPES(l_input.scalar_type(), "linear_cpp_naive::forward", [&] {
    auto l_loops = i_loop_order == "textbook" ? forward_textbook<scalar_t> : forward_cache_aware<scalar_t>;
    l_loops(l_input.const_data_ptr<scalar_t>(), l_weight.const_data_ptr<scalar_t>(),
            l_bias.defined() ? l_bias.const_data_ptr<scalar_t>() : nullptr, l_output.mutable_data_ptr<scalar_t>(),
            l_n, l_in, l_out);
  });
  return unflatten_like(l_output, i_input);  // (*, out)
}

torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight) {
  return forward(i_input, i_weight, /*i_bias=*/std::nullopt, /*i_loop_order=*/kLoopOrders[0]);
}

// The gradients of y = x W^T + b: {grad_input, grad_weight, grad_bias}, each computed only
// when asked for; one that is not comes back undefined, which Python receives as None.
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output,
                                    std::optional<torch::Tensor> i_input,
                                    std::optional<torch::Tensor> i_weights,
                                    bool i_need_grad_input,
                                    bool i_need_grad_weights,
                                    bool i_need_grad_bias,
                                    std::string i_loop_order) {
  check_inputs(i_loop_order, i_input, i_weights, /*i_bias=*/std::nullopt, i_grad_output, i_need_grad_input,
               i_need_grad_weights);
  const bool l_textbook = i_loop_order == "textbook";
  const torch::Tensor l_grad_output = flatten_to_2d(i_grad_output).contiguous();  // (N, out)
  const int64_t l_n = l_grad_output.size(0), l_out = l_grad_output.size(1);
  torch::Tensor l_grad_input, l_grad_weights, l_grad_bias;  // undefined until computed

  AT_DISPATCH_FLOATING_TYPES(l_grad_output.scalar_type(), "linear_cpp_naive::backward", [&] {
    const scalar_t* l_gy = l_grad_output.const_data_ptr<scalar_t>();
    if (i_need_grad_input) {
      // grad_input = grad_output W: (N, out) x (out, in) -> (N, in), then (*, in)
      const torch::Tensor l_weights = i_weights->contiguous();  // (out, in)
      const int64_t l_in = l_weights.size(1);
      torch::Tensor l_gx = torch::empty({l_n, l_in}, l_grad_output.options());
      auto l_loops = l_textbook ? grad_input_textbook<scalar_t> : grad_input_cache_aware<scalar_t>;
      l_loops(l_gy, l_weights.const_data_ptr<scalar_t>(), l_gx.mutable_data_ptr<scalar_t>(), l_n, l_in, l_out);
      l_grad_input = unflatten_like(l_gx, i_grad_output);
    }
    if (i_need_grad_weights) {
      // grad_weight = grad_output^T x: (out, N) x (N, in) -> (out, in)
      const torch::Tensor l_input = flatten_to_2d(*i_input).contiguous();  // (N, in)
      const int64_t l_in = l_input.size(1);
      l_grad_weights = torch::empty({l_out, l_in}, l_grad_output.options());
      auto l_loops = l_textbook ? grad_weight_textbook<scalar_t> : grad_weight_cache_aware<scalar_t>;
      l_loops(l_gy, l_input.const_data_ptr<scalar_t>(), l_grad_weights.mutable_data_ptr<scalar_t>(), l_n, l_in, l_out);
    }
    if (i_need_grad_bias) {
      // grad_bias = sum over the N rows of grad_output -> (out)
      l_grad_bias = torch::empty({l_out}, l_grad_output.options());
      grad_bias(l_gy, l_grad_bias.mutable_data_ptr<scalar_t>(), l_n, l_out);
    }
  });
  return {l_grad_input, l_grad_weights, l_grad_bias};
}

std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, torch::Tensor i_input, torch::Tensor i_weights) {
  std::vector<torch::Tensor> l_grads = backward(i_grad_output, i_input, i_weights, /*i_need_grad_input=*/true,
                                                /*i_need_grad_weights=*/true, /*i_need_grad_bias=*/false,
                                                /*i_loop_order=*/kLoopOrders[0]);
  return {l_grads[0], l_grads[1]};  // {grad_input, grad_weight}
}

// TORCH_EXTENSION_NAME is set by torch.utils.cpp_extension to the module's name ("_C").
// Each name is bound twice; pybind11 picks the overload whose arguments fit the call.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Stage 05: the linear layer's forward and backward as C++ loops, in two loop orders";
  m.attr("LOOP_ORDERS") = py::make_tuple(kLoopOrders[0], kLoopOrders[1]);  // the first is the default
  m.def("forward", py::overload_cast<torch::Tensor, torch::Tensor>(&forward),
        "The course's forward: y = x W^T for x of shape (*, in), cache-aware loops", py::arg("input"), py::arg("weight"));
  m.def("backward", py::overload_cast<torch::Tensor, torch::Tensor, torch::Tensor>(&backward),
        "The course's backward: [grad_input, grad_weight] of y = x W^T, cache-aware loops",
        py::arg("grad_output"), py::arg("input"), py::arg("weights"));
  m.def("forward", py::overload_cast<torch::Tensor, torch::Tensor, std::optional<torch::Tensor>, std::string>(&forward),
        "y = x W^T + b; bias=None leaves b out; loop_order 'cache_aware' or 'textbook'",
        py::arg("input"), py::arg("weight"), py::arg("bias"), py::arg("loop_order") = kLoopOrders[0]);
  m.def("backward",
        py::overload_cast<torch::Tensor, std::optional<torch::Tensor>, std::optional<torch::Tensor>, bool, bool, bool,
                          std::string>(&backward),
        "[grad_input, grad_weight, grad_bias] of y = x W^T + b, None for each one not asked for; "
        "input and weights may be None where no requested gradient needs them",
        py::arg("grad_output"), py::arg("input"), py::arg("weights"), py::arg("need_grad_input"),
        py::arg("need_grad_weights"), py::arg("need_grad_bias"), py::arg("loop_order") = kLoopOrders[0]);
}

// The one torch binding, shared by every kernel step.
//
// It does everything a step must not repeat: checks the tensors (device, dtype, rank, sizes,
// contiguity, no grad to keep, no output over an input), allocates the stacked (B, S, 2, H, hd) output with `empty` (every element is the
// kernel's to write), picks the inputs' GPU and torch's current stream (so CUDA-graph capture and
// user streams work), calls the step's `mla_launch` and turns its error code into an exception.
// A launcher that answers cudaErrorNotSupported (a fast path that does not take these inputs) is
// followed by its fallback step's launcher. Steps are plain CUDA libraries; mla_lab/steps.py
// passes the addresses of their entry points.
// Compiled once per torch version: torch's headers dominate its build time, and no step needs them.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "mla_launch.h"

namespace {

using Launcher = cudaError_t (*)(const MlaProblem*, cudaStream_t);
using WorkspaceSize = size_t (*)(const MlaProblem*);  // mla_workspace_bytes, and mla_prepared_bytes
using Preparer = cudaError_t (*)(const MlaProblem*, void*, cudaStream_t);

// Numbers in messages are formatted with std::to_string, never streamed: on torch 2.11 (the H200
// machine's) streaming an integer into an error message from this library crashed the process.
std::string num(int64_t value) { return std::to_string(value); }

std::string shape_of(c10::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + num(sizes[i]);
  return text + "]";
}

std::string shape_of(const at::Tensor& t) { return shape_of(t.sizes()); }

void check_contiguous(const std::string& step, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.is_contiguous(), step, ": ", name,
              " is not contiguous (a transpose or a strided slice?); pass ", name,
              ".contiguous()");
}

// Device, dtype and layout of a tensor that travels with `first` (hidden, or w_down for prepare).
void check_like(const std::string& step, const char* name, const at::Tensor& t, const at::Tensor& first,
                const char* first_name) {
  TORCH_CHECK(t.device() == first.device(), step, ": ", name, " is on ", t.device(),
              " but ", first_name, " is on ", first.device(), "; put all inputs on one GPU");
  TORCH_CHECK(t.scalar_type() == first.scalar_type(), step, ": ", name, " is ",
              t.scalar_type(), " but ", first_name, " is ", first.scalar_type(),
              "; convert all inputs to one dtype");
  check_contiguous(step, name, t);
}

void check_matrix(const std::string& step, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 2, step, ": ", name, " must be a matrix, got shape ",
              shape_of(t));
}

void check_weight(const std::string& step, const char* name, const at::Tensor& t, const at::Tensor& first,
                  const char* first_name) {
  check_like(step, name, t, first, first_name);
  check_matrix(step, name, t);
}

void check_on_gpu(const std::string& step, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.is_cuda(), step, ": ", name, " is on ", t.device(),
              "; these kernels run on a CUDA GPU: move the inputs there with .cuda()");
  const auto dtype = t.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, step, ": ", name, " is ", dtype,
              "; supported dtypes are float32 and bfloat16 (use .float() or .bfloat16())");
}

// The up-projections against w_down, and heads against their width: the head_dim they give.
int64_t check_up_weights(const std::string& step, const at::Tensor& w_down, const at::Tensor& w_up_k,
                         const at::Tensor& w_up_v, int64_t heads) {
  const int64_t rank = w_down.size(1), width = w_up_k.size(1);
  TORCH_CHECK(w_up_k.size(0) == rank, step, ": w_up_k is ", shape_of(w_up_k),
              " but w_down has rank=", num(rank), "; w_up_k must be (rank, heads*head_dim)");
  TORCH_CHECK(w_up_v.sizes() == w_up_k.sizes(), step, ": w_up_v is ", shape_of(w_up_v),
              " but w_up_k is ", shape_of(w_up_k), "; they must have the same shape");
  TORCH_CHECK(heads >= 1, step, ": heads must be >= 1, got ", num(heads));
  TORCH_CHECK(width % heads == 0, step, ": heads=", num(heads),
              " does not divide the up-projection width ", num(width),
              "; the width must be heads*head_dim");
  return width / heads;
}

at::Tensor project(int64_t launcher_address, int64_t workspace_address, int64_t fallback_launcher_address,
                   int64_t fallback_workspace_address, std::string step, const at::Tensor& hidden,
                   const at::Tensor& w_down, const at::Tensor& w_up_k, const at::Tensor& w_up_v,
                   int64_t heads, const std::optional<at::Tensor>& out,
                   const std::optional<at::Tensor>& prepared) {
  // Two calls that would otherwise return as if they had worked: a result that autograd cannot
  // differentiate, and an output written over the inputs it is computed from.
  const at::Tensor* inputs[] = {&hidden, &w_down, &w_up_k, &w_up_v};
  const char* names[] = {"hidden", "w_down", "w_up_k", "w_up_v"};
  for (int i = 0; i < 4; ++i) {
    TORCH_CHECK(!(at::GradMode::is_enabled() && inputs[i]->requires_grad()), step, ": ", names[i],
                " requires grad, and these kernels have no backward; call them under torch.no_grad() "
                "or pass ", names[i], ".detach()");
    if (out.has_value()) {
      const auto overlap = at::get_overlap_status(*out, *inputs[i]);
      TORCH_CHECK(overlap != at::MemOverlapStatus::Full && overlap != at::MemOverlapStatus::Partial, step,
                  ": out overlaps ", names[i], " in memory, so writing it would overwrite the input; "
                  "pass an out of its own (torch.empty)");
    }
  }
  check_on_gpu(step, "hidden", hidden);
  const auto dtype = hidden.scalar_type();
  TORCH_CHECK(hidden.dim() == 3, step, ": hidden must be (batch, seq, d_model), got shape ",
              shape_of(hidden));
  check_contiguous(step, "hidden", hidden);
  check_weight(step, "w_down", w_down, hidden, "hidden");
  check_weight(step, "w_up_k", w_up_k, hidden, "hidden");
  check_weight(step, "w_up_v", w_up_v, hidden, "hidden");

  const int64_t batch = hidden.size(0), seq = hidden.size(1), d_model = hidden.size(2);
  const int64_t rank = w_down.size(1), width = w_up_k.size(1);
  TORCH_CHECK(d_model >= 1 && rank >= 1 && width >= 1, step,
              ": d_model, rank and the up-projection width must be >= 1, got hidden ",
              shape_of(hidden), ", w_down ", shape_of(w_down), ", w_up_k ",
              shape_of(w_up_k));
  TORCH_CHECK(w_down.size(0) == d_model, step, ": w_down is ", shape_of(w_down),
              " but hidden has d_model=", num(d_model), "; w_down must be (d_model, rank)");
  const int64_t head_dim = check_up_weights(step, w_down, w_up_k, w_up_v, heads);

  const std::vector<int64_t> out_shape{batch, seq, 2, heads, head_dim};
  at::Tensor result;
  if (out.has_value()) {
    result = *out;
    TORCH_CHECK(result.sizes() == c10::IntArrayRef(out_shape), step, ": out is ",
                shape_of(result), " but must be ", shape_of(out_shape));
    check_like(step, "out", result, hidden, "hidden");
  } else {
    result = at::empty(out_shape, hidden.options());
  }
  if (batch * seq == 0) return result;

  const c10::cuda::CUDAGuard device_guard(hidden.device());
  MlaProblem problem{hidden.data_ptr(), w_down.data_ptr(), w_up_k.data_ptr(),
                     w_up_v.data_ptr(), result.data_ptr(), batch * seq, d_model, rank,
                     heads, head_dim, dtype == at::kFloat ? MLA_FLOAT32 : MLA_BFLOAT16, nullptr, nullptr};
  const void* prepared_weights = nullptr;  // mla_lab.steps checked that they are these weights'
  if (prepared.has_value() && prepared->numel() > 0) {
    TORCH_CHECK(prepared->device() == hidden.device(), step, ": the prepared weights are on ",
                prepared->device(), " but hidden is on ", hidden.device(), "; prepare them on hidden's GPU");
    TORCH_CHECK(prepared->is_contiguous(), step,
                ": the prepared weights are not contiguous; pass the tensor prepare returned, as it is");
    prepared_weights = prepared->data_ptr();
  }
  at::Tensor workspace;  // freed on return: the caching allocator keeps it for this stream's order
  const auto launch = [&](int64_t launcher, int64_t workspace_function, const void* weights_layout) {
    problem.workspace = nullptr;
    problem.prepared = weights_layout;
    if (workspace_function != 0) {
      const size_t bytes = reinterpret_cast<WorkspaceSize>(workspace_function)(&problem);
      if (bytes > 0) {
        workspace = at::empty({static_cast<int64_t>(bytes)}, hidden.options().dtype(at::kByte));
        problem.workspace = workspace.data_ptr();
      }
    }
    return reinterpret_cast<Launcher>(launcher)(&problem, c10::cuda::getCurrentCUDAStream().stream());
  };
  cudaError_t err = launch(launcher_address, workspace_address, prepared_weights);
  if (err == cudaErrorNotSupported && fallback_launcher_address != launcher_address) {
    err = launch(fallback_launcher_address, fallback_workspace_address, nullptr);  // the layout is not the fallback's
  }
  TORCH_CHECK(err == cudaSuccess, step, ": kernel launch failed: ", cudaGetErrorString(err));
  return result;
}

// A step's own layout of the weights (mla_prepare), in a byte tensor on their GPU: empty where the
// step's kernel does not take these weights (its fallback reads them as they are).
at::Tensor prepare(int64_t bytes_address, int64_t prepare_address, std::string step, const at::Tensor& w_down,
                   const at::Tensor& w_up_k, const at::Tensor& w_up_v, int64_t heads) {
  check_on_gpu(step, "w_down", w_down);
  check_contiguous(step, "w_down", w_down);
  check_matrix(step, "w_down", w_down);
  check_weight(step, "w_up_k", w_up_k, w_down, "w_down");
  check_weight(step, "w_up_v", w_up_v, w_down, "w_down");
  const int64_t d_model = w_down.size(0), rank = w_down.size(1), width = w_up_k.size(1);
  TORCH_CHECK(d_model >= 1 && rank >= 1 && width >= 1, step,
              ": d_model, rank and the up-projection width must be >= 1, got w_down ", shape_of(w_down),
              ", w_up_k ", shape_of(w_up_k));
  const int64_t head_dim = check_up_weights(step, w_down, w_up_k, w_up_v, heads);
  const c10::cuda::CUDAGuard device_guard(w_down.device());
  const MlaProblem problem{nullptr, w_down.data_ptr(), w_up_k.data_ptr(), w_up_v.data_ptr(), nullptr, 0, d_model,
                           rank, heads, head_dim, w_down.scalar_type() == at::kFloat ? MLA_FLOAT32 : MLA_BFLOAT16,
                           nullptr, nullptr};
  const size_t bytes = reinterpret_cast<WorkspaceSize>(bytes_address)(&problem);
  at::Tensor result = at::empty({static_cast<int64_t>(bytes)}, w_down.options().dtype(at::kByte));
  if (bytes == 0) return result;
  const cudaError_t err = reinterpret_cast<Preparer>(prepare_address)(
      &problem, result.data_ptr(), c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, step, ": preparing the weights failed: ", cudaGetErrorString(err));
  return result;
}

}  // namespace

// Registered as a torch operator (not a pybind module): torch/library.h parses in about a third
// of the time torch/extension.h takes, which keeps a cold build of the course near 25 s.
TORCH_LIBRARY(mla_lab, m) {
  m.def(
      "project(int launcher_address, int workspace_address, int fallback_launcher_address, "
      "int fallback_workspace_address, str step, Tensor hidden, Tensor w_down, Tensor w_up_k, "
      "Tensor w_up_v, int heads, Tensor? out=None, Tensor? prepared=None) -> Tensor",
      &project);
  m.def(
      "prepare(int bytes_address, int prepare_address, str step, Tensor w_down, Tensor w_up_k, Tensor w_up_v, "
      "int heads) -> Tensor",
      &prepare);
}

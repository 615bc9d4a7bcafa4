"""C++ glue that :mod:`dsa_ops.tools.build_vllm_topk` compiles next to vLLM's unchanged
top-k sources. Written for dsa-ops; it holds no vLLM code, only:

* ``COMPAT_H``: declarations of the two stable-ABI shim functions that vLLM 0.33.0's
  ``csrc/torch_utils.h`` calls and torch 2.11's headers do not declare
  (``aoti_torch_get_current_cuda_stream``, ``torch_get_current_cuda_blas_handle``). It is
  force-included (``-include``) in every translation unit, so the sources stay unchanged.
* ``SHIMS_CPP``: definitions of those two functions on top of c10 / ATen (compiled
  against the full, non-stable torch headers). Where the installed libtorch exports them
  too, both definitions do the same thing, so it does not matter which one binds.
* ``REGISTER_CPP``: the four op schemas (as vLLM 0.33.0 declares them) in the ``_C``
  namespace, their CUDA kernels bound to vLLM's host functions, and the Python module
  entry point that lets ``import vllm._C_stable_libtorch`` load the library.
"""

from __future__ import annotations

COMPAT_H = r"""
// dsa-ops build glue: declare the stable-ABI shims torch 2.11 does not declare.
#pragma once
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
int32_t aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);
int32_t torch_get_current_cuda_blas_handle(void** ret_handle);
#ifdef __cplusplus
}
#endif
"""

SHIMS_CPP = r"""
// dsa-ops build glue: the two shim functions, on the non-stable c10 / ATen API.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>
#include <exception>
#include <stdint.h>

namespace {
constexpr int32_t kOk = 0;      // AOTI_TORCH_SUCCESS
constexpr int32_t kFailed = 1;  // AOTI_TORCH_FAILURE
}  // namespace

extern "C" __attribute__((visibility("default"))) int32_t
aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream) {
  try {
    c10::DeviceIndex dev = device_index < 0 ? c10::cuda::current_device()
                                            : static_cast<c10::DeviceIndex>(device_index);
    *ret_stream = static_cast<void*>(c10::cuda::getCurrentCUDAStream(dev).stream());
    return kOk;
  } catch (const std::exception&) {
    return kFailed;
  }
}

extern "C" __attribute__((visibility("default"))) int32_t
torch_get_current_cuda_blas_handle(void** ret_handle) {
  try {
    *ret_handle = static_cast<void*>(at::cuda::getCurrentCUDABlasHandle());
    return kOk;
  } catch (const std::exception&) {
    return kFailed;
  }
}
"""

REGISTER_CPP = r"""
// dsa-ops build glue: register vLLM's four indexer top-k ops under torch.ops._C.
#include <Python.h>
#include <torch/csrc/stable/library.h>
#include "ops.h"

STABLE_TORCH_LIBRARY_FRAGMENT(_C, m) {
  m.def("top_k_per_row_prefill(Tensor logits, Tensor rowStarts, Tensor rowEnds, "
        "Tensor! indices, int numRows, int stride0, int stride1, int topK) -> ()");
  m.def("top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, "
        "Tensor! indices, int numRows, int stride0, int stride1, int topK) -> ()");
  m.def("persistent_topk(Tensor logits, Tensor lengths, Tensor! output, "
        "Tensor workspace, int k, int max_seq_len) -> ()");
  m.def("cooperative_topk(Tensor logits, Tensor lengths, Tensor! output, "
        "Tensor workspace, int k, int max_seq_len) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, m) {
  m.impl("top_k_per_row_prefill", TORCH_BOX(&top_k_per_row_prefill));
  m.impl("top_k_per_row_decode", TORCH_BOX(&top_k_per_row_decode));
  m.impl("persistent_topk", TORCH_BOX(&persistent_topk));
  m.impl("cooperative_topk", TORCH_BOX(&cooperative_topk));
}

static PyModuleDef dsa_ops_vllm_topk_module = {
    PyModuleDef_HEAD_INIT, "_C_stable_libtorch",
    "vLLM 0.33.0's indexer top-k ops, built by dsa_ops.tools.build_vllm_topk",
    -1, nullptr};

extern "C" __attribute__((visibility("default"))) PyObject* PyInit__C_stable_libtorch() {
  return PyModule_Create(&dsa_ops_vllm_topk_module);
}
"""

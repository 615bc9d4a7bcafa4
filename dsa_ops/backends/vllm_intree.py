"""Backend ``vllm``: vLLM's in-tree CUDA/HIP kernels ``torch.ops._C.top_k_per_row_*``.

Schemas, as registered by vLLM 0.33.0 (``_C_stable_libtorch`` on CUDA, ``_C`` on ROCm)::

    top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, Tensor! indices,
                         int numRows, int stride0, int stride1, int topK) -> ()
    top_k_per_row_prefill(Tensor logits, Tensor rowStarts, Tensor rowEnds, Tensor! indices,
                          int numRows, int stride0, int stride1, int topK) -> ()

Adapters (contract §2.2, §3.2, §5):

* Decode: the kernel reads any 2-D ``seq_lens`` per row and a 1-D one per request, and
  clamps at 0 but not to the width. We pass one length per row, clamped to [0, W], as a
  1-D int32 tensor with next_n = 1, so both readings agree and no row is read past W.
* Prefill: the output is already sequence-local; the kernel clamps nothing, and an end
  before its start writes before the row's output. We clamp the windows first.
* ``rows == 0``: a no-op here; the kernel would launch a zero-size grid (an invalid
  configuration error that surfaces at a later launch check).

Known defect, documented rather than refused (contract §8 item 10): for widths
W >= 200000 the kernel's generic split path pads with -FLT_MAX, so a valid -inf logit can
lose to padding and a row can get fewer than min(L, k) valid indices. The insertion-sort
path (W < 12288) also places NaN arbitrarily. Hence ``exact=False``. Measured on the H200
(vLLM 0.33.0 built from source, ``lab.vllm_real_check``): contract-exact on
finite logits, heavy ties included, at 1-80 rows, W 133120 and 1M; with special values
(NaN, -0, +-inf, denormals) it fails 20 of 24 cases, at W = 133120 too, and leaves valid
slots at -1 (7929 in that sweep). Whether to route
such shapes here is the policy's (the user's) choice.

vLLM is imported lazily, inside the probe only; the writers look the ops up at call time.
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from dsa_ops.backends.base import YES, Backend, Query, Support, module_version
from dsa_ops.backends.rows import prefill_windows, row_pitch
from dsa_ops.backends.vllm_prep import ends_and_fill

# The op namespace; tests point it at a namespace holding test doubles with these schemas.
NAMESPACE = "_C"
DECODE_OP = "top_k_per_row_decode"
PREFILL_OP = "top_k_per_row_prefill"
# vLLM 0.33.0 registers the ops from _C_stable_libtorch on CUDA and from _C on ROCm.
_EXTENSIONS = ("vllm._C_stable_libtorch", "vllm._C")


def _op(name: str):
    return getattr(getattr(torch.ops, NAMESPACE), name)


def decode(logits: Tensor, lengths: Tensor, k: int, next_n: int, stable: bool, out: Tensor) -> None:
    """Decode writer: per-row lengths clamped to [0, W], 1-D, next_n = 1."""
    rows = logits.shape[0]
    if rows == 0:
        return
    ends = ends_and_fill(logits, lengths, next_n, None)  # one launch on CUDA
    _op(DECODE_OP)(logits, 1, ends, out, rows, row_pitch(logits), int(logits.stride(1)), k)


def prefill(logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int, stable: bool, out: Tensor) -> None:
    """Prefill writer: windows clamped to 0 <= s <= e <= W; output is already local."""
    rows = logits.shape[0]
    if rows == 0:
        return
    s, e = prefill_windows(logits, row_starts, row_ends, torch.int32)
    _op(PREFILL_OP)(logits, s, e, out, rows, row_pitch(logits), int(logits.stride(1)), k)


def probe_compiled_ops(names: tuple[str, ...], namespace: str = NAMESPACE) -> Support:
    """Whether one of vLLM's compiled extensions imports and registers ``names`` under
    ``torch.ops.<namespace>`` (shared by the vLLM-backed backends)."""
    errors = []
    for ext in _EXTENSIONS:
        try:
            importlib.import_module(ext)
        except Exception as exc:  # ImportError, or an ABI / driver mismatch
            errors.append(f"{ext}: {exc!r}")
    if len(errors) == len(_EXTENSIONS):
        return Support(False, "vLLM's compiled ops do not import (" + "; ".join(errors) + ")")
    missing = [n for n in names if not hasattr(getattr(torch.ops, namespace), n)]
    if missing:
        return Support(False, f"torch.ops.{namespace} has no {', '.join(missing)} (vLLM build without them)")
    return YES


def _available() -> Support:
    if not torch.cuda.is_available():
        return Support(False, "no CUDA or ROCm GPU is visible (torch.cuda.is_available() is False)")
    return probe_compiled_ops((DECODE_OP, PREFILL_OP))


def _supports(query: Query) -> Support:
    if query.device_type != "cuda":
        return Support(False, f"vLLM's in-tree top-k runs on CUDA/ROCm GPUs, got device type {query.device_type!r}")
    if query.stable:
        return Support(False, "the in-tree kernel has no stable mode (ties are taken in atomic order)")
    return YES


BACKEND = Backend(
    name="vllm",
    decode=decode,
    prefill=prefill,
    available=_available,
    supports=_supports,
    version=lambda: module_version("vllm"),
    description="vLLM in-tree torch.ops._C.top_k_per_row_* (CUDA/ROCm); -inf defect at W >= 200000",
    exact=False,
)

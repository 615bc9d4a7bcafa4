"""Eager routing of stock vLLM 0.33.0's DSA indexer top-k through dsa-ops.

vLLM 0.33.0 never torch.compiles ``DeepseekV32ForCausalLM`` / ``GlmMoeDsaForCausalLM``
(their configs end at compilation mode NONE), so :class:`passes.IndexerTopKPass` never
sees them. Their top-k runs inside ``sparse_attn_indexer`` (CUDA) and
``rocm_aiter_sparse_attn_indexer`` (ROCm), plain Python that looks a few names up at
call time. Opted in (``DSA_OPS_VLLM_ROUTE=1``), :func:`install` replaces those names:

* layers: ``SparseAttnIndexer.__init__`` is wrapped. A layer with k = 2048,
  compress_ratio 1, no candidate blocks and top-k backend "auto" (DeepSeek-V3.2, GLM-5)
  is marked; every other layer (DeepSeek-V4, HY-V4, deep_select, ...) stays stock. On
  CUDA the mark is the layer's ``topk_backend`` string (:data:`MARK`), which vLLM passes
  into ``sparse_attn_indexer``; on ROCm it is the layer's K-cache prefix.
* CUDA decode: ``sparse_attn_indexer.get_indexer_topk`` (the consumer module's name)
  returns our router for :data:`MARK` and vLLM's dispatcher for anything else.
* CUDA prefill: ``vllm._custom_ops.top_k_per_row_prefill`` routes when called from
  ``sparse_attn_indexer`` for a marked layer. The logits are compressed there (row
  starts are zero, width = ``chunk.max_seqlen_k``), so the width is the exact host int
  the prefill threshold needs.
* ROCm: ``rocm_aiter_ops.is_indexer_top_k_supported`` answers yes for a marked layer's
  call from ``rocm_aiter_sparse_attn_indexer``; the launchers it then takes
  (``rocm_aiter_ops.indexer_top_k_decode`` and
  ``rocm_aiter_mla_sparse._launch_aiter_top_k_per_row_prefill``) run dsa-ops instead.
  dsa-ops' prefill output is already sequence-local, so vLLM's ``_localize`` (inside
  the stock launcher) does not run on it.

Any other caller of those names gets vLLM's function unchanged. A routed call is one call
of the public :func:`dsa_ops.topk_decode` / :func:`dsa_ops.topk_prefill` (``out=`` vLLM's
buffer), whose backend comes from ``dsa_ops.policy.current()`` and host facts only (the
call's row count included, so a row-banded policy picks per batch size), chosen and checked
once per host facts and cached there. One exception, CUDA decode: where the policy picks one
of vLLM's radix kernels for the call, the route calls that kernel as stock vLLM does (its
``max_seq_len``, into its -1 filled buffer; :func:`route_decode`), so it costs what stock costs.
:func:`install` refuses (one warning, nothing patched) on an untested vLLM version or
when a seam is missing or no longer referenced by the function that calls it.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
import threading
from typing import Any, Callable, Optional

import torch
from torch import Tensor

import dsa_ops
from dsa_ops.backends import vllm_radix

ENV_VAR = "DSA_OPS_VLLM_ROUTE"
TESTED_VLLM = ("0.33.0",)
MARK = "dsa_ops"  # a routed CUDA layer's topk_backend
K = 2048
PLATFORMS = ("cuda", "rocm")
log = logging.getLogger("dsa_ops.vllm_route")

SAI = "vllm.model_executor.layers.sparse_attn_indexer"
ROCM_SPARSE = "vllm.v1.attention.ops.rocm_aiter_mla_sparse"
CUSTOM_OPS = "vllm._custom_ops"
AITER_OPS = "vllm._aiter_ops"


def env_switch(var: str) -> bool:
    """An opt-in environment switch: "1" is on; unset, "" or "0" is off; anything else a
    ValueError naming the variable."""
    value = os.environ.get(var, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ValueError(f"{var}: expected 0 or 1, got {value!r}")


def opted_in() -> bool:
    """Whether ``DSA_OPS_VLLM_ROUTE`` asks for routing ("1": yes; unset, "" or "0": no)."""
    return env_switch(ENV_VAR)


# ---------------------------------------------------------------- the routed calls

calls = {"decode": 0, "prefill": 0, "vllm_call": 0}  # routed calls in this process (read by tests)

# The policy's vLLM backends whose kernel the CUDA decode route calls the way stock vLLM does.
VLLM_CALLS = {"vllm_cooperative": "cooperative_topk", "vllm_persistent": "persistent_topk"}
COOPERATIVE_MAX_ROWS = vllm_radix.COOPERATIVE_MAX_ROWS  # as stock vLLM and the vllm_cooperative adapter: more rows run persistent_topk
VLLM_CALL_DEVICES = ("cuda",)  # where vLLM's radix kernels run (tests widen it to "cpu" with stand-in kernels)
_vllm_call: dict[tuple, Optional[str]] = {}


def vllm_kernel(logits: Tensor, k: int, policy: Any) -> Optional[str]:
    """The vLLM kernel the route calls itself for this call (cached per host facts), or None
    when the policy's backend for it is not one of vLLM's radix kernels (:data:`VLLM_CALLS`)."""
    key = (tuple(logits.shape), logits.stride(), logits.dtype, logits.device, k, id(policy))
    if key in _vllm_call:
        return _vllm_call[key]
    from dsa_ops import policy as P

    rows, width = logits.shape
    kernel = None
    if logits.device.type in VLLM_CALL_DEVICES and not torch.version.hip and logits.dtype == torch.float32 \
            and logits.stride(1) == 1:
        facts = P.facts_for(logits.device, k, 1, int(width), policy.stable, rows=int(rows))
        kernel = VLLM_CALLS.get(policy.choose("decode", facts).backend)
        if kernel == "cooperative_topk" and (rows > COOPERATIVE_MAX_ROWS or logits.stride(0) % 4):
            kernel = "persistent_topk"
    if len(_vllm_call) > 4096:
        _vllm_call.clear()
    _vllm_call[key] = kernel
    return kernel


def route_decode(logits: Tensor, seq_lens: Tensor, next_n: int, out: Tensor, k: int,
                 max_seq_len: Optional[int] = None) -> None:
    """Decode top-k of vLLM's paged logits into ``out`` (vLLM's ``topk_indices`` view).

    ``seq_lens`` is vLLM's: one length per row ((R,), (B, next_n), or the ROCm path's
    flattened (R,)), or one per request ((B,) / (B, 1)) with R = B * next_n. The backend
    is the policy's, chosen and cached by :func:`dsa_ops.topk_decode` per host facts.

    ``max_seq_len`` (CUDA: vLLM's host bound on the step's longest length): where the policy
    picks one of vLLM's radix kernels for this call (``vllm_cooperative`` / ``vllm_persistent``)
    and the lengths are per row, the route makes stock vLLM's own call of that kernel (its
    length bound, its workspace size, into vLLM's buffer, which vLLM's indexer has -1 filled
    before the top-k), so routing costs nothing where vLLM's kernel is the policy's choice.
    The adapter would clamp and fill again and bound the lengths by the width.
    """
    rows, n = logits.shape[0], seq_lens.numel()
    if max_seq_len is not None and n == rows and seq_lens.dtype == torch.int32:
        kernel = vllm_kernel(logits, k, dsa_ops.policy.current())
        if kernel is not None:
            ops = getattr(torch.ops, vllm_radix.NAMESPACE)
            getattr(ops, kernel)(logits, seq_lens, out, vllm_radix.workspace(logits.device), k, int(max_seq_len))
            calls["decode"] += 1
            calls["vllm_call"] += 1
            return
    if n == rows:
        per_row_next_n = 1
    else:
        if n == 0 or rows % n:
            raise ValueError(f"seq_lens: expected {rows} per-row lengths or one per request, got {n}")
        per_row_next_n, seq_lens = rows // n, seq_lens.reshape(-1)
    target = out if out.is_contiguous() else torch.empty((rows, k), dtype=torch.int32, device=out.device)
    dsa_ops.topk_decode(logits, seq_lens, k, per_row_next_n, out=target)
    if target is not out:
        out.copy_(target)
    calls["decode"] += 1


def route_prefill(logits: Tensor, row_starts: Tensor, row_ends: Tensor, out: Tensor, k: int,
                  max_seqlen_k: int) -> None:
    """Prefill top-k over windows [row_starts, row_ends) into ``out``, sequence-local;
    ``max_seqlen_k`` (a host int) decides the side of the policy's prefill threshold."""
    target = out if out.is_contiguous() else torch.empty((logits.shape[0], k), dtype=torch.int32, device=out.device)
    dsa_ops.topk_prefill(logits, row_starts, row_ends, k, max_seqlen_k=max_seqlen_k, out=target)
    if target is not out:
        out.copy_(target)
    calls["prefill"] += 1


class DecodeRouter:
    """What the patched ``get_indexer_topk(MARK)`` returns: vLLM's decode top-k call shape."""

    def __call__(self, logits: Tensor, seq_lens: Tensor, next_n: int, topk_indices: Tensor, topk_tokens: int,
                 max_seq_len: int) -> None:
        route_decode(logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len)


# ---------------------------------------------------------------- seams and checks

def _inner(fn: Callable) -> Callable:
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _need(missing: list[str], obj: Any, attr: str, where: str) -> Any:
    value = getattr(obj, attr, None)
    if value is None:
        missing.append(f"{where}.{attr} is gone")
    return value


def _refers(missing: list[str], fn: Any, names: tuple[str, ...], varnames: tuple[str, ...] = ()) -> None:
    code = getattr(_inner(fn), "__code__", None) if fn is not None else None
    if code is None:
        return
    where = f"{code.co_filename.rsplit('site-packages/', 1)[-1]}:{code.co_name}"
    for n in names:
        if n not in code.co_names:
            missing.append(f"{where} no longer calls {n}")
    for n in varnames:
        if n not in code.co_varnames:
            missing.append(f"{where} has no local {n!r}")


def check_seams(platform: str, version: Optional[str] = None) -> list[str]:
    """Why routing cannot be installed on ``platform`` ("cuda" or "rocm"); [] if it can."""
    if platform not in PLATFORMS:
        raise ValueError(f"platform: expected one of {PLATFORMS}, got {platform!r}")
    if version is None:
        import vllm

        version = vllm.__version__
    if version not in TESTED_VLLM:
        return [f"vLLM {version} is not a tested version (tested: {', '.join(TESTED_VLLM)})"]
    missing: list[str] = []
    sai = importlib.import_module(SAI)
    layer = _need(missing, sai, "SparseAttnIndexer", SAI)
    if layer is not None:
        _refers(missing, layer.__init__, ("topk_tokens", "compress_ratio", "candidate_blocks", "topk_backend", "k_cache"))
    if platform == "cuda":
        fn = _need(missing, sai, "sparse_attn_indexer", SAI)
        _need(missing, sai, "get_indexer_topk", SAI)
        _need(missing, importlib.import_module(CUSTOM_OPS), "top_k_per_row_prefill", CUSTOM_OPS)
        _refers(missing, fn, ("get_indexer_topk", "ops", "top_k_per_row_prefill"), ("topk_backend", "logits"))
        if layer is not None:
            _refers(missing, layer.forward_cuda, ("topk_backend",))
    else:
        rocm = importlib.import_module(ROCM_SPARSE)
        aiter_ops = _need(missing, importlib.import_module(AITER_OPS), "rocm_aiter_ops", AITER_OPS)
        fn = _need(missing, rocm, "rocm_aiter_sparse_attn_indexer", ROCM_SPARSE)
        _need(missing, rocm, "_launch_aiter_top_k_per_row_prefill", ROCM_SPARSE)
        if aiter_ops is not None:
            _need(missing, aiter_ops, "is_indexer_top_k_supported", "rocm_aiter_ops")
            _need(missing, aiter_ops, "indexer_top_k_decode", "rocm_aiter_ops")
        _refers(missing, fn, ("is_indexer_top_k_supported", "indexer_top_k_decode",
                              "_launch_aiter_top_k_per_row_prefill"),
                ("k_cache_prefix", "candidate_blocks", "logits"))
    return missing


# ---------------------------------------------------------------- install

class _State:
    def __init__(self) -> None:
        self.platform: Optional[str] = None
        self.undo: list[tuple[Any, str, Any]] = []  # (owner, attr, original value in owner.__dict__)
        self.layers: dict[str, str] = {}  # k-cache prefix -> "dsa_ops" or why it stays stock
        self.warned: set[str] = set()
        self.pending = threading.local()  # ROCm: the gate's decision for the launcher that follows

    def patch(self, owner: Any, attr: str, value: Any) -> None:
        self.undo.append((owner, attr, owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)))
        setattr(owner, attr, value)


_state = _State()


def installed() -> Optional[str]:
    """The platform routing is installed for, or None."""
    return _state.platform


def layers() -> dict[str, str]:
    """Indexer layers built since :func:`install`: prefix -> "dsa_ops" or why it stays stock."""
    return dict(_state.layers)


def _warn_once(msg: str) -> None:
    if msg not in _state.warned:
        _state.warned.add(msg)
        log.warning(msg)


def eligible(layer: Any) -> str:
    """"" if a ``SparseAttnIndexer`` layer is routed, else why it stays stock."""
    why = []
    if getattr(layer, "topk_tokens", None) != K:
        why.append(f"k={getattr(layer, 'topk_tokens', None)}")
    if getattr(layer, "compress_ratio", 1) != 1:
        why.append(f"compress_ratio={layer.compress_ratio}")
    if getattr(layer, "candidate_blocks", None) is not None:
        why.append("candidate blocks")
    if getattr(layer, "topk_backend", "auto") != "auto":
        why.append(f"topk backend {layer.topk_backend!r}")
    return ", ".join(why)


def _wrap_layer_init(layer_cls: type, platform: str) -> None:
    original = layer_cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        prefix = str(getattr(getattr(self, "k_cache", None), "prefix", ""))
        why = eligible(self)
        _state.layers[prefix] = why or MARK
        if not why and platform == "cuda":
            self.topk_backend = MARK

    _state.patch(layer_cls, "__init__", __init__)


def _install_cuda() -> None:
    sai = importlib.import_module(SAI)
    custom_ops = importlib.import_module(CUSTOM_OPS)
    caller = _inner(sai.sparse_attn_indexer).__code__
    stock_get = sai.get_indexer_topk
    stock_prefill = custom_ops.top_k_per_row_prefill
    router = DecodeRouter()

    def get_indexer_topk(backend: str) -> Any:
        return router if backend == MARK else stock_get(backend)

    def top_k_per_row_prefill(logits: Tensor, row_starts: Tensor, row_ends: Tensor, topk_indices: Tensor,
                              num_rows: int, stride0: int, stride1: int, topk_tokens: int) -> None:
        frame = sys._getframe(1)
        if frame.f_code is caller and frame.f_locals.get("topk_backend") == MARK:
            # Compressed logits: width == chunk.max_seqlen_k, the exact host bound.
            route_prefill(logits, row_starts, row_ends, topk_indices, topk_tokens, int(logits.shape[1]))
            return
        stock_prefill(logits, row_starts, row_ends, topk_indices, num_rows, stride0, stride1, topk_tokens)

    _state.patch(sai, "get_indexer_topk", get_indexer_topk)
    _state.patch(custom_ops, "top_k_per_row_prefill", top_k_per_row_prefill)


def _install_rocm() -> None:
    rocm = importlib.import_module(ROCM_SPARSE)
    aiter_ops = importlib.import_module(AITER_OPS).rocm_aiter_ops
    caller = _inner(rocm.rocm_aiter_sparse_attn_indexer).__code__
    stock_gate = aiter_ops.is_indexer_top_k_supported  # bound classmethod
    stock_decode = aiter_ops.indexer_top_k_decode
    stock_prefill = rocm._launch_aiter_top_k_per_row_prefill
    pending = _state.pending

    def is_indexer_top_k_supported(*, is_prefill: bool, compress_ratio: int, num_rows: int,
                                   max_valid_seq_len: Optional[int] = None, topk_tokens: Optional[int] = None) -> bool:
        frame = sys._getframe(1)
        if frame.f_code is caller and compress_ratio == 1 and topk_tokens == K:
            local = frame.f_locals
            if local.get("candidate_blocks") is None and _state.layers.get(local.get("k_cache_prefix")) == MARK:
                pending.call = ("prefill" if is_prefill else "decode", max_valid_seq_len)
                return True
        pending.call = None
        return stock_gate(is_prefill=is_prefill, compress_ratio=compress_ratio, num_rows=num_rows,
                          max_valid_seq_len=max_valid_seq_len, topk_tokens=topk_tokens)

    def _take(family: str) -> Optional[tuple]:
        call = getattr(pending, "call", None)
        if call is None or call[0] != family or sys._getframe(2).f_code is not caller:
            return None
        pending.call = None
        return call

    def indexer_top_k_decode(logits: Tensor, next_n: int, seq_lens: Tensor, topk_indices: Tensor,
                             topk_tokens: int) -> None:
        if _take("decode") is None:
            return stock_decode(logits, next_n, seq_lens, topk_indices, topk_tokens)
        route_decode(logits, seq_lens, next_n, topk_indices, topk_tokens)

    def _launch_aiter_top_k_per_row_prefill(logits: Tensor, row_starts: Tensor, row_ends: Tensor,
                                            indices: Tensor, topk_tokens: int) -> None:
        call = _take("prefill")
        if call is None:
            return stock_prefill(logits, row_starts, row_ends, indices, topk_tokens)
        # dsa-ops returns j - row_starts[r] already: vLLM's _localize must not run again.
        route_prefill(logits, row_starts, row_ends, indices, topk_tokens,
                      int(call[1]) if call[1] is not None else int(logits.shape[1]))

    _state.patch(aiter_ops, "is_indexer_top_k_supported", staticmethod(is_indexer_top_k_supported))
    _state.patch(aiter_ops, "indexer_top_k_decode", staticmethod(indexer_top_k_decode))
    _state.patch(rocm, "_launch_aiter_top_k_per_row_prefill", _launch_aiter_top_k_per_row_prefill)


def install(platform: str, version: Optional[str] = None) -> bool:
    """Patch vLLM's top-k seams for ``platform`` ("cuda" or "rocm"); True if installed.

    Refuses, with one warning and nothing patched, when :func:`check_seams` finds a
    problem (``version`` overrides ``vllm.__version__``, for tests). A second call is a
    no-op. Layers built before the call stay stock.
    """
    if _state.platform is not None:
        return _state.platform == platform
    problems = check_seams(platform, version)
    if problems:
        _warn_once(f"{ENV_VAR}=1: not routing vLLM's indexer top-k through dsa-ops, stock path kept: "
                   + "; ".join(problems))
        return False
    sai = importlib.import_module(SAI)
    try:
        _wrap_layer_init(sai.SparseAttnIndexer, platform)
        (_install_cuda if platform == "cuda" else _install_rocm)()
    except Exception:
        uninstall()
        raise
    _state.platform = platform
    log.info("dsa-ops routes vLLM's DSA indexer top-k (%s; k=%d, compress_ratio 1 layers)", platform, K)
    return True


def uninstall() -> None:
    """Restore every patched name (layers already marked keep their mark)."""
    while _state.undo:
        owner, attr, value = _state.undo.pop()
        setattr(owner, attr, value)
    _state.platform = None
    _state.layers.clear()
    _state.pending.call = None


def current_platform_name() -> str:
    """vLLM's platform as "cuda", "rocm" or its device name."""
    from vllm.platforms import current_platform

    if current_platform.is_cuda():
        return "cuda"
    if current_platform.is_rocm():
        return "rocm"
    return str(getattr(current_platform, "device_type", "") or type(current_platform).__name__)


def install_for_current_platform() -> bool:
    """The plugin's call: install for vLLM's platform, or warn once that it has no seams."""
    platform = current_platform_name()
    if platform not in PLATFORMS:
        _warn_once(f"{ENV_VAR}=1: vLLM's platform is {platform!r}; dsa-ops routes only CUDA and ROCm, "
                   f"stock path kept")
        return False
    return install(platform)


__all__ = ["ENV_VAR", "MARK", "TESTED_VLLM", "opted_in", "check_seams", "install", "uninstall", "installed",
           "layers", "eligible", "route_decode", "route_prefill", "install_for_current_platform"]

"""Backends ``vllm_persistent`` / ``vllm_cooperative``: vLLM's CUDA radix top-k kernels.

Both wrap an op that vLLM 0.33.0 registers from ``_C_stable_libtorch`` (CUDA builds only;
on ROCm the ops exist but raise), with one schema (lab/notes/vllm-integration-notes.md §5)::

    persistent_topk(Tensor logits, Tensor lengths, Tensor! output, Tensor workspace,
                    int k, int max_seq_len) -> ()
    cooperative_topk(<same>) -> ()

They are decode-only: there is no window start, so no prefill. Adapters (contract §2.3,
§2.3a, §5):

* ``lengths``: the kernels want numel == R (no next_n), int32. ``persistent_topk``'s
  paths for <= 32 rows and for sampled long rows clamp every length to [0, W] themselves
  (given max_seq_len = W), so a per-row int32 contiguous ``lengths`` goes in untouched
  there; otherwise, and always for cooperative (it clamps at 0 only), one Triton launch
  writes per-row lengths clamped to [0, W] (:mod:`dsa_ops.backends.vllm_prep`), which for
  cooperative also does the -1 fill. No row is ever read past W.
* ``max_seq_len``: a host bound on every row's length. It must not be too small: in the
  GitHub-indexed ``persistent_topk.cuh`` a row longer than 32768 under a bound <= 32768 would wait
  at a barrier the other CTAs of its group have left. We pass W, the only bound that
  holds for every replay of a captured graph (our op has no host max-length argument).
  Cost: vLLM (``indexer_topk.py:334-338``) notes that a bound this loose enables
  persistent's long-row (multi-CTA) configuration even when every live row is short, so
  short-context batches run slower than with vLLM's exact per-step bound. Never wrong.
* ``workspace``: see :func:`workspace`. vLLM's schema declares it unmutated
  (``Tensor workspace``) although both kernels write it; harmless here, because the
  buffer is private to this module and the ops are called inside our own opaque op.
* ``rows == 0``: a no-op here; the kernels are never launched.
* ``k``: the kernels are instantiated for 512, 1024 and 2048 only; ``stable`` is refused.

``vllm_cooperative`` (thread-block clusters + TMA) adds, per vLLM's own checks
(``indexer_topk.py:255-276`` and the kernel's host entry):

* SM90 or newer, excluding the SM12x family: refused in :func:`_supports_cooperative`.
* rows <= 64 (:data:`COOPERATIVE_MAX_ROWS`): R is a host int, fixed for a captured graph,
  so a call with more rows runs ``persistent_topk`` instead (same contract, same
  workspace). The choice is per call and graph-safe.
* ``logits.stride(0) % 4 == 0`` and a 16-byte aligned base: TMA copies rows in 16-byte
  units. The query carries only the width, so the writer checks this on every call, for
  any R (so whether a call raises never depends on the batch size), with a ValueError
  naming ``logits``. TMA also fetches up to 3 columns past L (rounded up to 16 bytes,
  never past the row pitch); those values are loaded but never ranked.
* Not exact (``exact=False``), measured on the H200 with vLLM 0.33.0's kernels built from
  source (``lab.vllm_real_check``, docs/vllm-kernels.md): both backends meet
  the contract on finite logits at every tested shape, heavy ties included (all-equal
  rows, 4 distinct values, the fp16 grid; 1-80 rows, L 3K-128K, W 133120 and 1M, graph
  replay), and no slot was left unwritten. With special values (NaN of both signs, -0,
  +-inf, denormals) they rank some keys off the contract's order (§1.1): persistent at 64
  and 80 rows (its FilteredTopK / sampled paths; exact at 1 row), cooperative at 1, 64
  and 80 rows.
* **Faults on legal input** (:data:`FAULT`): rows of -inf holding fewer than k finite keys
  and thousands of sign-set NaNs end the process with an illegal memory access inside
  vLLM's kernel (the raw op does it too; a larger workspace does not help). The record's
  ``faults`` says so, so no policy picks this backend; ``backend="vllm_cooperative"``
  still runs it for whoever asks by name. ``vllm_persistent`` and ``vllm`` are safe on the
  same rows.
* vLLM's own caller (``candidate_topk.py``) warns that cooperative may leave slots
  unwritten when a boundary bin overflows its tie buffer; we never saw it, but still fill
  ``out`` with -1 first, so such a slot would read -1, never stale data.

vLLM is imported lazily, inside the probe only; the writers look the ops up at call time.
"""

from __future__ import annotations


import torch
from torch import Tensor

from dsa_ops.backends.base import YES, Backend, Query, Support, module_version
from dsa_ops.backends import vllm_intree, vllm_prep
from dsa_ops.policy import device_platform
from dsa_ops.backends.vllm_intree import probe_compiled_ops

# The op namespace; tests point it at a namespace holding test doubles with these schemas.
NAMESPACE = "_C"
PERSISTENT_OP = "persistent_topk"
COOPERATIVE_OP = "cooperative_topk"
KS = (512, 1024, 2048)  # the only instantiations (both kernels raise on any other k)
# vLLM's RADIX_TOPK_WORKSPACE_SIZE (indexer_topk.py:15). Big enough for both kernels:
# persistent needs one 3088-byte RadixRowState per row group; cooperative needs 8 bytes
# per tie slot, R x max(k, 1024) slots, i.e. exactly 1 MiB at R = 64, k = 2048.
WORKSPACE_BYTES = 1 << 20
# AUTO_COOPERATIVE_MAX_ROWS (indexer_topk.py:21); the 0.33.0 binary raises above it.
COOPERATIVE_MAX_ROWS = 64
_TMA_ALIGN_BYTES = 16
# CUDA vLLM 0.33.0 registers these ops from _C_stable_libtorch; _C is tried as well, as
# the in-tree backend does, in case a build registers them there.
_EXTENSIONS = vllm_intree._EXTENSIONS  # the same compiled extensions

_WORKSPACES: dict[tuple[str, int], Tensor] = {}


# Measured on an H100 with vLLM 0.33.0's ops built from source (lab/vllm_coop_fault.py,
# docs/vllm-kernels.md "A fault on legal input"): the raw op faults, so no adapter can avoid it.
FAULT = ("vLLM 0.33.0's cooperative_topk ends the process with an illegal memory access (an out-of-bounds "
         "shared-memory write in its overflow recovery, found by compute-sanitizer) on rows of -inf that hold fewer "
         "than k finite keys and thousands of sign-set NaNs (measured on an H100 at 1-9 rows, L 16K-128K); "
         "the raw op faults too, so dsa-ops cannot make the call safe")


def _op(name: str):
    return getattr(getattr(torch.ops, NAMESPACE), name)


def workspace(device: torch.device) -> Tensor:
    """The 1 MiB uint8 scratch both kernels take, one per (device, current stream).

    Allocated on the first call for that pair and kept for the life of the process, so
    every later call (and every replay of a graph captured after a warm-up call) uses a
    fixed address. One per stream because two streams running the kernels at once
    would otherwise share the barrier / tie state. Never zeroed, by design:
    ``persistent_topk`` issues its own ``cudaMemsetAsync`` of the state it uses on every
    call (a node of any captured graph), and ``cooperative_topk`` writes its tie slots
    before reading them. A first call made during graph capture allocates from the
    graph's private pool; the cache keeps that block alive, so replays stay valid.
    """
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0
    key = (str(device), int(stream))
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _WORKSPACES[key] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return ws


def _check_tma(logits: Tensor) -> None:
    """cooperative_topk's row layout requirements (16-byte TMA copies), as a ValueError."""
    pitch = int(logits.stride(0))
    if pitch % 4:
        raise ValueError(
            f"logits: backend 'vllm_cooperative' copies rows with 16-byte TMA loads, so the row "
            f"pitch logits.stride(0) must be a multiple of 4; got {pitch} (width {logits.shape[1]}). "
            f"Pad the logits workspace width to a multiple of 4, or use backend 'vllm_persistent'"
        )
    if logits.data_ptr() % _TMA_ALIGN_BYTES:
        raise ValueError(
            f"logits: backend 'vllm_cooperative' needs a 16-byte aligned base address for its TMA "
            f"loads; got data_ptr() % 16 = {logits.data_ptr() % _TMA_ALIGN_BYTES} (a view starting "
            f"mid-row?). Use backend 'vllm_persistent' for such views"
        )


def _persistent(logits: Tensor, lengths: Tensor, k: int, next_n: int, out: Tensor) -> None:
    """``persistent_topk`` with max_seq_len = W; lengths go in untouched where its own path
    clamps them (:func:`vllm_prep.kernel_reads_as_is`), else clamped in one launch."""
    rows, width = logits.shape
    if vllm_prep.kernel_reads_as_is(lengths, rows, width, k):
        ends = lengths
    else:
        ends = vllm_prep.ends_and_fill(logits, lengths, next_n, None)
    # max_seq_len = W: bounds every clamped length on every replay (see module docstring).
    _op(PERSISTENT_OP)(logits, ends, out, workspace(logits.device), k, int(width))


def decode_persistent(logits: Tensor, lengths: Tensor, k: int, next_n: int, stable: bool, out: Tensor) -> None:
    """Decode writer for ``vllm_persistent``: per-row clamped lengths, max_seq_len = W."""
    if logits.shape[0] == 0:
        return
    _persistent(logits, lengths, k, next_n, out)


def decode_cooperative(logits: Tensor, lengths: Tensor, k: int, next_n: int, stable: bool, out: Tensor) -> None:
    """Decode writer for ``vllm_cooperative``; more than 64 rows run ``persistent_topk``."""
    rows, width = logits.shape
    if rows == 0:
        return
    _check_tma(logits)
    if rows > COOPERATIVE_MAX_ROWS:
        # R is fixed per capture, so this branch is taken identically on every replay.
        _persistent(logits, lengths, k, next_n, out)
        return
    # One launch: clamped int32 lengths (the kernel clamps at 0 only) and the -1 fill
    # (the kernel may leave slots unwritten, module docstring).
    ends = vllm_prep.ends_and_fill(logits, lengths, next_n, out)
    # The kernel ignores max_seq_len (kept for parity with persistent); pass the same W.
    _op(COOPERATIVE_OP)(logits, ends, out, workspace(logits.device), k, int(width))


def _platform(device_type: str) -> tuple[str, str]:
    return device_platform(device_type)


def _sm(arch: str) -> tuple[int, int] | None:
    """(major, minor) of "sm_90" / "sm_100" / "sm_121"; None if unparsable."""
    digits = arch[3:] if arch.startswith("sm_") else ""
    if len(digits) < 2 or not digits.isdigit():
        return None
    return int(digits[:-1]), int(digits[-1])


def _available() -> Support:
    if torch.version.hip:
        return Support(False, "ROCm build of torch: vLLM builds persistent_topk / cooperative_topk for CUDA only")
    if not torch.cuda.is_available():
        return Support(False, "no CUDA GPU is visible (torch.cuda.is_available() is False)")
    return probe_compiled_ops((PERSISTENT_OP, COOPERATIVE_OP), NAMESPACE)


def _supports_persistent(query: Query) -> Support:
    if query.device_type != "cuda":
        return Support(False, f"vLLM's radix top-k runs on CUDA GPUs, got device type {query.device_type!r}")
    platform, _ = _platform(query.device_type)
    if platform == "rocm":
        return Support(False, "vLLM's radix top-k kernels are CUDA-only (they raise on ROCm)")
    if query.k not in KS:
        return Support(False, f"k must be one of {KS} (the kernel's instantiations), got {query.k}")
    if query.stable:
        return Support(False, "no stable mode (ties are taken in atomic order)")
    return YES


def _supports_cooperative(query: Query) -> Support:
    sup = _supports_persistent(query)
    if not sup:
        return sup
    _, arch = _platform(query.device_type)
    sm = _sm(arch)
    if sm is None:
        return Support(False, f"cannot tell the CUDA arch ({arch!r}); cooperative_topk needs SM90+ (not SM12x)")
    if sm[0] < 9 or sm[0] == 12:
        return Support(False, f"cooperative_topk needs SM90 or newer excluding the SM12x family, got {arch}")
    return YES


def _version() -> str:
    return module_version("vllm")


PERSISTENT = Backend(
    name="vllm_persistent",
    decode=decode_persistent,
    prefill=None,
    available=_available,
    supports=_supports_persistent,
    version=_version,
    description="vLLM torch.ops._C.persistent_topk (CUDA, decode, k in 512/1024/2048)",
    exact=False,  # special values off the key order at 64 / 80 rows (module docstring; measured)
)

COOPERATIVE = Backend(
    name="vllm_cooperative",
    decode=decode_cooperative,
    prefill=None,
    available=_available,
    supports=_supports_cooperative,
    version=_version,
    description="vLLM torch.ops._C.cooperative_topk (CUDA SM90+, decode, <= 64 rows else persistent)",
    exact=False,  # special values off the key order (module docstring; measured)
    faults=FAULT,
)

BACKENDS = (PERSISTENT, COOPERATIVE)

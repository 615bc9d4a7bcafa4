"""Test-only stand-in backends (for backends that cannot run here, e.g. AITER)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from dsa_ops.backends import BACKENDS, reference, register
from dsa_ops.backends.base import YES, Backend, Support


@contextlib.contextmanager
def standin_backend(name: str, available: bool = True) -> Iterator[str]:
    """Register (once) a test-only backend that computes the reference; yield its name.

    Its ops stay registered (torch.library cannot unregister cleanly mid-process) but the
    registry entry is removed on exit, so nothing else sees it.
    """
    probe = (lambda: YES) if available else (lambda: Support(False, "stand-in marked unavailable"))
    backend = Backend(name, reference.decode, reference.prefill, probe, lambda q: YES, lambda: "standin",
                      description="test-only stand-in computing the reference", test_only=True)
    BACKENDS.pop(name, None)
    register(backend)
    try:
        yield name
    finally:
        BACKENDS.pop(name, None)


_FAKE_NS = "dsa_ops_stock_test"
_fake_ran: list[str] = []
_fake_lib = None


@contextlib.contextmanager
def fake_vllm_kernels() -> Iterator[list[str]]:
    """vLLM's three stock decode kernels as reference stand-ins in a namespace of their own
    (``torch.ops._C`` is left alone, so the vllm backends stay unavailable): ``cooperative_topk``
    and ``top_k_per_row_decode`` write only each row's valid prefix (the caller's -1 fill does
    the rest, as in vLLM). Yields the list of kernels run."""
    import torch

    from dsa_ops.backends import vllm_intree, vllm_radix

    global _fake_lib
    if _fake_lib is None:
        _fake_lib = torch.library.Library(_FAKE_NS, "FRAGMENT")

        def prefix_only(logits, lengths, k, out):
            tmp = torch.empty_like(out)
            reference.decode(logits, lengths.reshape(-1), k, 1, False, tmp)
            for r in range(out.shape[0]):
                m = min(int(lengths.reshape(-1)[r]), k)
                out[r, :m] = tmp[r, :m]

        for name in ("cooperative_topk", "persistent_topk"):
            _fake_lib.define(f"{name}(Tensor logits, Tensor lengths, Tensor(a!) output, Tensor workspace, int k, "
                             f"int max_seq_len) -> ()")

            def radix(logits, lengths, output, workspace, k, max_seq_len, name=name):
                assert max_seq_len == int(lengths.max())  # stock passes the step's longest length
                _fake_ran.append(name)
                if name == "persistent_topk":
                    reference.decode(logits, lengths, k, 1, False, output)
                else:
                    prefix_only(logits, lengths, k, output)

            _fake_lib.impl(name, radix, "CPU")
        _fake_lib.define(f"{vllm_intree.DECODE_OP}(Tensor logits, int next_n, Tensor seq_lens, Tensor(a!) indices, "
                         f"int numRows, int stride0, int stride1, int topK) -> ()")

        def per_row(logits, next_n, seq_lens, indices, rows, s0, s1, k):
            _fake_ran.append("per_row")
            prefix_only(logits, seq_lens, k, indices)

        _fake_lib.impl(vllm_intree.DECODE_OP, per_row, "CPU")
    _fake_ran.clear()
    saved, vllm_radix.NAMESPACE = vllm_radix.NAMESPACE, _FAKE_NS
    try:
        yield _fake_ran
    finally:
        vllm_radix.NAMESPACE = saved

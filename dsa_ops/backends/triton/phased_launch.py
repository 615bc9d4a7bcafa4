"""Host side of the phased prefill (``kernels_phased``): three launches a chunk.

Workspace (cached per device, stream and sizes, see ``launch.cached_workspace``):
``prm`` int32 (R, 4), the rows' brackets; ``reg`` int64 (R, (lcap + 1) x LN), a lane
region a row, sized like the fused row mode's (:func:`radix_launch.lane_bound` of
:func:`radix_launch.window_bound`); ``ws`` int32 (G, NBW + 2 cap) zeros, the select
programs' window bins (restored to zero by every row) and rank buffers. The regions are
the price: ~8 bytes a window key a row, 1.3-2 GB for a 16384-row chunk at 128K columns
(the chunk's logits are 8.6 GB). No plan or grid reads device data.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_ops.backends.triton.launch import _num_sms, cached_workspace
from dsa_ops.backends.triton.radix_launch import CT, NBW, RT, lane_bound, window_bound

SAMP = 512  # samples a row (the fused row mode's SAMP_ROW)
READ_SHAPE = (4, 1024, 128, 4, 4)  # read: warps, block, registers, programs a multiprocessor, blocks a step
SELECT_SHAPE = (4, 1024, 64, 8)  # select: warps, block (emit tile), registers, programs a multiprocessor
RANK_CAP = 2048  # bin keys a select program ranks at most (cb^2 <= RANK_BUDGET)
RANK_BUDGET = 1 << 21
BC, BS = 512, 1024  # the exact fallback's blocks (kernels_select)


def lane_rows(width: int, k: int, samp: int, lanes: int) -> int:
    """Rows of a lane region that hold a row's window w.h.p. (at least 2)."""
    return max(2, -(-lane_bound(window_bound(width, k, samp), lanes) // lanes))


def launch(logits: Tensor, starts: Tensor, ends: Tensor, k: int, out: Tensor, samp: int = SAMP,
           read_shape: tuple = READ_SHAPE, select_shape: tuple = SELECT_SHAPE, lane_prefetch: bool = True,
           stats: Tensor | None = None, stop_after: int = 3, read_knobs: dict | None = None) -> None:
    """Fill ``out`` (R, k) int32 with the top k of each prefill row [starts[r], ends[r])
    (non-stable; any conforming choice of ties). ``stats``: an int32 (R, 2) tensor that
    receives each row's path (1 settled from its region, 3 the exact fallback) and window
    size (rows of L > k only). ``read_knobs`` (probes): the read kernel's EV / SEV (eviction
    policies of its loads and stores), ST (False: count, store nothing) and REUSE (True: a
    region a program, so the select cannot run: use with stop_after=2). ``stop_after`` (probes: 1 or 2) launches only the first
    kernels, so that a phase's time is a difference of totals; ``out`` is then not filled."""
    from dsa_ops.backends.triton.kernels_phased import read_kernel, sample_kernel, select_kernel

    if samp not in (256, 512, 1024, 2048):
        raise ValueError(f"samp must be 256, 512, 1024 or 2048 (samples a row), got {samp}")
    rows, width = logits.shape
    if rows == 0:
        return
    dev = logits.device
    cuda = dev.type == "cuda" and torch.version.hip is None
    if stats is not None and (stats.dtype != torch.int32 or tuple(stats.shape) != (rows, 2) or stats.device != dev
                              or not stats.is_contiguous()):
        raise ValueError(f"stats must be a contiguous int32 ({rows}, 2) tensor on {dev}, got {stats.dtype} "
                         f"{tuple(stats.shape)} on {stats.device}")
    rw, rblock, rregs, rper, rstep = read_shape
    sw, sblock, sregs, sper = select_shape
    ln = 32 * rw
    if 32 * sw != ln or rblock % ln or sblock % ln:
        raise ValueError(f"the read and select programs must have the same lanes (32 x warps) dividing their "
                         f"blocks: read {read_shape}, select {select_shape}")
    lcap = lane_rows(width, k, samp, ln)
    reg_stride = (lcap + 1) * ln
    sms = _num_sms(dev.type, dev.index or 0)
    g_read = max(1, min(rows, sms * rper))
    g_sel = max(1, min(rows, sms * sper))
    ws_stride = NBW + 2 * RANK_CAP
    prm = cached_workspace(dev, ("phased-prm", rows), lambda d: torch.zeros((rows, 4), dtype=torch.int32, device=d))
    reg = cached_workspace(dev, ("phased-reg", rows, reg_stride),
                           lambda d: torch.empty((rows, reg_stride), dtype=torch.int64, device=d))
    ws = cached_workspace(dev, ("phased-ws", g_sel, ws_stride),
                          lambda d: torch.zeros((g_sel, ws_stride), dtype=torch.int32, device=d))
    stride = logits.stride(0)
    sample_kernel[(rows,)](logits, stride, starts, ends, prm, rows, width, k, 4 * samp, SAMP=samp, NBW=NBW,
                           num_warps=4)
    if stop_after < 2:
        return
    read_kernel[(g_read,)](logits, stride, starts, ends, prm, reg, rows, width, k, lcap, reg_stride,
                           BLOCK=rblock, LN=ln, LU=rstep, LPF=bool(lane_prefetch), num_warps=rw, **(read_knobs or {}),
                           **({"maxnreg": rregs} if cuda else {}))
    if stop_after < 3:
        return
    select_kernel[(g_sel,)](logits, stride, starts, ends, out, prm, reg, ws, out if stats is None else stats,
                            rows, width, k, lcap, reg_stride, ws_stride, RANK_CAP, RANK_BUDGET,
                            int(stats is not None), BLOCK=sblock, LN=ln, NBW=NBW, RT=RT, CT=CT, BC=BC, BS=BS,
                            num_warps=sw, **({"maxnreg": sregs} if cuda else {}))

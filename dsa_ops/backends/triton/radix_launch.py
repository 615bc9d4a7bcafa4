"""Host side of the cooperative radix kernel (``kernels_radix.py``): plan and workspace.

Graph safety: the grid, slices and workspace depend only on host ints (R, W, k) and the
device's multiprocessor count. Co-residency: in split mode (more than one program per
row) the grid holds at most ``per_sm`` programs per multiprocessor, and the launch caps
registers (``maxnreg``) so that that many always fit (ROCm: one per multiprocessor), so
every program of a row is resident while the others spin at a row barrier. Row mode (one program per row) has
no waiting barrier and may use more programs than multiprocessors.

Workspace: one int32 buffer per (device, stream), grown to the largest (slots, stride)
asked for and cut to each launch's slots (the kernel addresses slots by the buffer's row
stride; every plan's head region sits at a slot's start), zeroed when allocated (outside
any graph pool, see :func:`workspace.cached_workspace`) and restored to zero by every
launch, so graph replays need no memset. A first use inside a capture that the cached
buffer cannot hold allocates a zeroed temporary from the graph's pool instead.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor

from dsa_ops.backends.triton.workspace import cached_workspace, num_sms

BLOCK = 2048  # columns per iteration of a pass (8 per thread at 8 warps)
NUM_WARPS = 8
MAXNREG = 128  # CUDA: caps registers so that PER_SM programs are always co-resident
PER_SM = 2  # split-mode programs per multiprocessor (65536 regs >= 2 x 256 threads x 128)
MIN_SLICE = 2048  # columns per program at least (short rows: fewer programs, fewer barriers)
MAX_ACT = 32  # programs per row at most (more only add barrier arrivals; see the notes)
RB = 512  # keys per iteration over the gathered candidates
RT, CT = 16, 512  # candidate rank tile: RT candidates x CT columns per compare
RANK_BUDGET = 4096  # early exit when (bin size)^2 <= RANK_BUDGET x programs of the row (~362 at 32)
PMAX = 256  # most programs per row (per-program counts of the stable emission)
CAND_SPLIT = 8192  # candidate buffer at least, split mode: gathers of up to 4096 keys + the rank's half
CAND_ROW = 2048  # candidate buffer at least, row mode (cb * cb <= ROW_RANK_BUDGET)
HALF_MAX_SPLIT = 32768  # gathered keys at most (half the buffer), split mode: few slots
HALF_MAX_ROW = 16384  # row mode: up to 2 slots per program per multiprocessor
ROW_RANK_BUDGET = 1 << 21  # one program ranks up to ~1448 candidates (~8K compares a thread)
ROW_PROGRAMS_PER_SM = 1  # one wave of persistent programs (the bracket buffers make slots large)
# row mode (CUDA): no program waits on another, so registers are traded for programs: 8 four-warp
# programs a multiprocessor at 64 registers instead of 4 at 128 (80 x 6 took C = 128K from
# 6.75 to 6.30 ms; with the warp-aggregated slots and packed stores: 64 x 8 was the fastest at every C,
# 1.08 / 1.78 / 3.13 / 5.71 ms against 1.12 / 1.99 / 3.61 / 6.66 at 80 x 6; 1056 slots on an H200, docs/design.md)
ROW_MAXNREG, ROW_PER_SM = 64, 8
# lane regions (``kernels_bracket._lane_pass``: slots counted in registers, no slot atomics) in row
# mode, measured on the H200: a row's read is 17-46 % shorter, but its emit
# reads the lanes' holes too, so a multiprocessor full of programs gains only on wide rows.
# Rows of one program each (rows <= row-mode slots, e.g. 512 decode rows at 128K: 337 -> 230 us)
# always take them; more rows (a prefill chunk), from LANES_WIDE columns, with LANE_ROW_SHAPE
# (registers, programs a multiprocessor), LANE_ROW_STEP blocks a read step and the bins counted
# after the read. A profile: the lane read waits on its loads (long scoreboard, 62-76 % of
# its stall samples) with one 4 KB block in flight a program, so wide rows read four blocks a step
# at 128 registers (C = 128K: 5.42 -> 4.88 ms, the read phase 181 -> 83 us a row;
# C = 32K loses, 1.83 -> 2.13, and 64K tied then). Since the lane loads evict first the
# programs' regions stay in L2 and 64K gains too (3.07 -> 2.85 ms); 32K still loses
# (1.80 -> 2.06), so chunks under 64K columns keep the warp-aggregated slots
LANES_WIDE = 65536
LANE_ROW_SHAPE = (128, 4)
LANE_ROW_STEP = 4
SAMP = 256  # bracket: strided samples of the row that place the window of the k-th key (split mode)
SAMP_ROW = 512  # row mode (prefill): a narrower window pays for the longer sort (7.09 -> 6.68 ms at C = 128K)
PF_ROW = 1  # row mode: blocks of loads in flight in the bracket's read (2 measured slower: 6.7 -> 8.1 ms)
NBW = 2048  # bracket: bins over the window at most (256 per warp: more spill registers)
# split mode, (rows below, bracket from live length L; 0: never), from a sweep on the H200: one
# row gains 1-3 us from 8K on; 2-15 rows lose up to 5 us at every length; 16 rows gain from
# 128K (tie at 64K), 32 and 64 rows from 32K (64 x 128K: 109 -> 65 us)
SPLIT_BRACKET_FROM = ((2, 1 << 13), (16, 0), (32, 98304), (1 << 30, 1 << 15))
HEAD = 12304 + 2 * PMAX + NBW  # histograms, counters, per-program counts, window bins (int32 entries)
MANY_ROWS = 16  # from this many rows up, :func:`tuning` picks smaller, more numerous programs
SPARSE_MAX = 4096  # split mode: later passes use per-key atomics when at most this many keys of the row match
SPARSE_ROW = 16384  # row mode (one program per row): its atomics meet no other program's
DBITS = 8  # digit width: four passes of 256 bins (4..12 work; see the kernel notes for timings)


@dataclass(frozen=True)
class RadixPlan:
    """Launch shape for (R, W) on one device. Host ints only."""

    grid0: int
    slices: int
    cand_cap: int
    rank_budget: int

    @property
    def ws_stride(self) -> int:
        return HEAD + 2 * self.cand_cap


@functools.lru_cache(maxsize=None)
def _hist_mask() -> bool:
    """Whether this Triton's ``tl.histogram`` takes ``mask=`` (3.3 and later)."""
    import triton.language as tl  # optional: loaded at the first launch, never at import

    return "mask" in inspect.signature(tl.histogram).parameters


def _per_sm(device: torch.device, num_warps: int, per_sm: int | None, maxnreg: int = MAXNREG) -> int:
    """Programs per multiprocessor that are guaranteed co-resident."""
    if device.type != "cuda" or torch.version.hip is not None:
        return 1
    fit = min(65536 // (num_warps * 32 * maxnreg), 2048 // (num_warps * 32))
    want = PER_SM if per_sm is None else per_sm
    if not 1 <= want <= fit:
        raise ValueError(f"per_sm must be in [1, {fit}] at num_warps={num_warps}, got {want}")
    return want


def window_bound(width: int, k: int, samp: int = SAMP) -> int:
    """Keys the bracket's window holds at most, w.h.p., on rows of up to ``width`` columns:
    the mean of the count below the window's top sample (sample rank q + 4.5 sigma + 2, as
    ``_row_pivots`` places it) plus four standard deviations, maximised over the lengths.
    A larger window only overflows into the exact fallback; it is never wrong."""
    worst = 0.0
    length = max(k + 1, 4 * samp)
    while True:
        q = ((k - 1) * samp) // length
        hi = q + int(4.5 * math.sqrt(max(q * (1 - q / samp), 0.0)) + 2.0) + 1  # samples at or below the top
        worst = max(worst, min(length, length * hi / samp + 4 * length * math.sqrt(hi) / samp))
        if length >= width:
            return int(worst)
        length = min(width, length * 2)


def lane_bound(window: float, lanes: int) -> int:
    """Region slots that hold a window of ``window`` keys in lane regions (``kernels_bracket._lane_pass``)
    w.h.p.: each of ``lanes`` lanes gets its mean share plus 4.5 standard deviations (the keys of
    a window spread over the lanes about evenly on real rows), plus the row of counts."""
    per = window / lanes
    return int(lanes * (per + 4.5 * math.sqrt(per) + 2))


def plan(rows: int, width: int, device: torch.device, slices: int | None = None,
         block: int = BLOCK, num_warps: int = NUM_WARPS, per_sm: int | None = None, k: int = 2048,
         maxnreg: int = MAXNREG, lanes: bool = False) -> RadixPlan:
    """Split a few long rows over the multiprocessors; one program per row otherwise.

    Under Triton's interpreter programs run one after another, so a row barrier could
    never be passed: CPU plans are always one program per row. ``DSA_OPS_TRITON_SPLIT=0``
    forces that plan on GPUs too: use it where this process may get fewer multiprocessors
    than the device reports (MPS thread limits, green contexts), since split rows spin at
    barriers that need every program of the row resident.
    """
    cap = num_sms(device.type, device.index or 0) * _per_sm(device, num_warps, per_sm, maxnreg)
    if device.type != "cuda" or os.environ.get("DSA_OPS_TRITON_SPLIT", "1") == "0":
        slices = 1
    elif slices is None:
        slices = max(1, min(-(-width // block), cap // max(rows, 1), MAX_ACT))
    elif slices > 1 and rows * slices > cap:
        raise ValueError(f"slices={slices} x rows={rows} exceeds the {cap} co-resident programs "
                         "(split mode needs every program of a row resident)")
    if not 1 <= slices <= PMAX:
        raise ValueError(f"slices must be in [1, {PMAX}], got {slices}")
    need = window_bound(width, k)  # the bracket gathers into half the buffer
    if lanes:  # every lane (32 x num_warps a program) holds its share of its program's window w.h.p.
        per = window_bound(width, k, SAMP_ROW if slices == 1 else SAMP) / slices
        need = max(need, slices * lane_bound(per, 32 * num_warps))
    half = 1 << max(0, need - 1).bit_length()
    if slices > 1:
        return RadixPlan(grid0=rows, slices=slices, cand_cap=max(CAND_SPLIT, 2 * min(half, HALF_MAX_SPLIT)),
                         rank_budget=RANK_BUDGET)
    return RadixPlan(grid0=max(1, min(rows, ROW_PROGRAMS_PER_SM * cap)), slices=1,
                     cand_cap=max(CAND_ROW, 2 * min(half, HALF_MAX_ROW)), rank_budget=ROW_RANK_BUDGET)


def tuning(rows: int) -> dict:
    """Launch shape by batch size (a host int, so graph-safe). Measured on the H200 (the kernel
    notes, ``lab/notes/kernel-variants.md``): from
    MANY_ROWS rows up, 4-warp programs of 1024-column blocks, 4 per multiprocessor, give each row twice the programs
    (16 x 128K: 43.6 -> 39.7 us, 64 x 128K: 125.7 -> 110.4 us) and cost nothing at 4K; one
    row at 128K is faster with 8-warp programs (23.8 vs 27.6 us)."""
    if rows >= MANY_ROWS:
        return {"block": 1024, "num_warps": 4, "per_sm": 4, "min_slice": 1024}
    return {"block": BLOCK, "num_warps": NUM_WARPS, "per_sm": PER_SM, "min_slice": MIN_SLICE}


def launch_plan(rows: int, width: int, device: torch.device, slices: int | None = None, block: int | None = None,
                num_warps: int | None = None, per_sm: int | None = None, min_slice: int | None = None,
                maxnreg: int | None = None, k: int = 2048, lanes: bool | None = False,
                packed: bool = True) -> tuple[RadixPlan, dict]:
    """:func:`launch`'s plan and launch shape (block, num_warps, min_slice, maxnreg, lanes,
    postbins) from its knobs, None meaning the default: :func:`tuning` by rows, then, for a
    row-mode plan of four-warp programs on CUDA with neither maxnreg nor per_sm given,
    ROW_MAXNREG registers and ROW_PER_SM programs a multiprocessor (no program waits on
    another there). ``lanes``: lane regions in the bracket's read (they need ``packed``
    stores and a block of whole lane rows), with room for them in the candidate buffer
    (:func:`lane_bound`); None picks them by the measured rule (see LANES_WIDE): row mode
    where every program has one row, or wide rows; the wide-row case also takes
    LANE_ROW_SHAPE and LANE_ROW_STEP (``lane_step``, with the default shape) and counts the
    bins after the read (``postbins``)."""
    t = tuning(rows)
    explicit = (maxnreg, per_sm)
    block = t["block"] if block is None else block
    per_sm = t["per_sm"] if per_sm is None and num_warps is None else per_sm  # (None: PER_SM)
    num_warps = t["num_warps"] if num_warps is None else num_warps
    min_slice = t["min_slice"] if min_slice is None else min_slice
    maxnreg = MAXNREG if maxnreg is None else maxnreg
    if maxnreg not in (64, 80, 96, 128, 168, 255):
        raise ValueError(f"maxnreg must be 64, 80, 96, 128, 168 or 255, got {maxnreg}")
    p = plan(rows, width, device, slices, block, num_warps, per_sm, k, maxnreg)
    cuda = device.type == "cuda" and torch.version.hip is None
    row_default = p.slices == 1 and cuda and explicit == (None, None) and num_warps == 4
    if row_default:
        maxnreg, per_sm = ROW_MAXNREG, ROW_PER_SM
        p = plan(rows, width, device, 1, block, num_warps, per_sm, k, maxnreg)
    ln = 32 * num_warps
    can = packed and block % ln == 0
    wide = False
    if lanes is None:
        one_each = rows <= p.grid0  # each program one row: its latency is the launch's
        wide = p.slices == 1 and not one_each and width >= LANES_WIDE
        lanes = can and p.slices == 1 and (one_each or wide)
        wide = wide and lanes
    elif lanes and not can:
        raise ValueError(f"lanes=True needs packed stores (pack=True, catom=True, finisher=False) and block a "
                         f"multiple of 32 x num_warps (block={block}, num_warps={num_warps})")
    step = 1
    if lanes:
        if wide and row_default:
            maxnreg, per_sm = LANE_ROW_SHAPE
            step = LANE_ROW_STEP
        p = plan(rows, width, device, 1 if p.slices == 1 else slices, block, num_warps, per_sm, k, maxnreg, True)
    return p, {"block": block, "num_warps": num_warps, "min_slice": min_slice, "maxnreg": maxnreg,
               "lanes": bool(lanes), "postbins": wide, "lane_step": step}


def _cached_plan(rows, width, device, slices, block, num_warps, per_sm, min_slice, maxnreg, k, lanes, packed):
    """:func:`launch_plan`, memoised per host facts and the split switch (a launch's host work
    is then a dict lookup: the plan's loops cost tens of us a call on a slow host)."""
    return _plan_memo(rows, width, device, slices, block, num_warps, per_sm, min_slice, maxnreg, k, lanes, packed,
                      os.environ.get("DSA_OPS_TRITON_SPLIT", "1"))


@functools.lru_cache(maxsize=4096)
def _plan_memo(rows, width, device, slices, block, num_warps, per_sm, min_slice, maxnreg, k, lanes, packed, split_env):
    return launch_plan(rows, width, device, slices, block, num_warps, per_sm, min_slice, maxnreg, k, lanes, packed)


@functools.lru_cache(maxsize=4096)
def _cached_bracket(p: RadixPlan, rows: int, samp: int, env: str) -> int:
    """:func:`bracket_min_len`, memoised per plan and ``DSA_OPS_TRITON_BRACKET``."""
    return bracket_min_len(p, rows, samp)


def bracket_min_len(p: RadixPlan, rows: int, samp: int = SAMP) -> int:
    """Shortest row (live length) that starts with the bracket, 0 for none: a host int, so
    graph-safe; each row compares its own device length with it. ``DSA_OPS_TRITON_BRACKET=1``
    / ``0`` forces the bracket on (every row of at least 4 x samp columns) / off; ``auto``
    (the default) follows the H200 measurements in lab/notes/kernel-variants.md
    (v4): always in row mode (prefill: 2-3x faster), and in split mode from the length where
    the bracket's fixed cost (the sample sort, ~4 us) is paid back, which depends on the
    batch."""
    env = os.environ.get("DSA_OPS_TRITON_BRACKET", "auto")
    if env not in ("auto", "0", "1"):
        raise ValueError(f"DSA_OPS_TRITON_BRACKET must be auto, 0 or 1, got {env!r}")
    floor = 4 * samp
    if env != "auto":
        return floor if env == "1" else 0
    if p.slices == 1:
        return floor
    length = _split_bracket_from(rows)
    return max(floor, length) if length else 0


def _split_bracket_from(rows: int) -> int:
    """Split mode: the bracket pays from this live length on (measured; see bracket_min_len)."""
    for below, length in SPLIT_BRACKET_FROM:
        if rows < below:
            return length
    raise AssertionError("SPLIT_BRACKET_FROM ends with an unbounded entry")


def wagg_ok(device: torch.device, block: int, num_warps: int) -> bool:
    """Whether the warp-aggregated slot atomics (inline PTX) can run: CUDA, compiled (not
    Triton's interpreter), and four keys a thread in each group of a block (a multiple of
    4 keys a thread, none replicated)."""
    return (device.type == "cuda" and torch.version.hip is None and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
            and block % (128 * num_warps) == 0)


def workspace(device: torch.device, slots: int, stride: int) -> Tensor:
    """int32 (slots, >= stride) zeros, one grown buffer per stream (see ``workspace.cached_workspace``)."""
    return cached_workspace(device, "radix", slots, stride,
                            lambda dev, n, st: (torch.zeros((n, st), dtype=torch.int32, device=dev),))[0]


def launch(logits: Tensor, lens: Tensor, starts: Tensor, ends: Tensor, k: int, next_n: int,
           is_prefill: bool, stable: bool, out: Tensor, slices: int | None = None,
           block: int | None = None, num_warps: int | None = None, per_sm: int | None = None,
           min_slice: int | None = None, rank_budget: int | None = None, rt: int = RT, ct: int = CT, rb: int = RB,
           hist_mask: bool | None = None, dbits: int = DBITS, sparse_max: int | None = None,
           fuse: bool = True, bracket: bool | int | None = None, stats: Tensor | None = None,
           nbw: int | None = None, samp: int | None = None, catom: bool = True, finisher: bool = False,
           pipe: bool = False, solo_emit: bool = True, prefetch: int | None = None,
           maxnreg: int | None = None, bins: bool = True, wagg: bool | None = None, pack: bool = True,
           wagg_max: int | None = None, lanes: bool | None = None, postbins: bool | None = None,
           lane_step: int | None = None, lane_prefetch: bool = True) -> None:
    """Fill ``out`` (R, k) int32 with the cooperative radix kernel (keywords: tuning).

    ``bracket``: non-stable rows of at least 4 x samp columns start with the sampled window
    (one read; see ``kernels_radix``): True / False for every row / none, an int for rows
    of at least that live length (>= 4 x samp), None for :func:`bracket_min_len`.
    ``finisher``: with 16-32 programs a row, the last to arrive after the bracket's read
    finishes the row alone instead of a barrier (measured slower on the H200: off).
    ``catom``: the bracket read takes a window key's slot with one atomic per key (else a
    block scan); ``pipe``: it stores each block's window keys one block later, so their
    slot atomics' round trip overlaps the next block. ``solo_emit``: a row's only program
    emits the gathered keys with running slot counts instead of two atomics a chunk.
    ``samp`` / ``prefetch``: None picks SAMP / 1 in split mode, SAMP_ROW / PF_ROW in row mode.
    ``maxnreg`` (CUDA): registers a thread at most; ``per_sm`` programs of ``num_warps``
    warps must fit a multiprocessor's 65536 registers with it. When neither is given, row
    mode with four-warp programs takes ROW_MAXNREG / ROW_PER_SM, split mode MAXNREG and the
    tuning's per_sm.
    ``rb``: gathered keys per step of the passes over the candidate buffer.
    ``bins=False`` (with catom): the bracket's read counts no window bins; each bracketed row
    then radixes its gathered keys from the top digit (an experiment: one atomic a window
    key fewer in the read, digit passes over the buffer after it).
    ``wagg``: the bracket read's slot atomics aggregated per warp (inline PTX, see
    ``kernels_bracket._slots``); None: wherever it can run (:func:`wagg_ok`). ``wagg_max``: only
    rows shorter than this live length aggregate (None: every row).
    ``pack``: the bracket read stores each window key and its column as one int64 (one
    store instead of two; with catom, and not with the finisher, which reads the regions
    as two arrays).
    ``lanes``: the bracket read gives each lane of a block (32 x num_warps of them) its own
    strided slots of the region, counted in registers (no slot atomics; pure Triton, so also
    under the interpreter and on ROCm; ``kernels_bracket._lane_pass``). Needs pack (and so
    catom, no finisher). None: :func:`launch_plan`'s measured rule. A lane that overflows
    sends its row to the exact fallback. ``postbins`` (with lanes and bins): the window bins
    are counted after the read, from the region's keys, instead of in it; None: with the
    rule's wide rows. ``lane_step`` (1, 2, 4 or 8; None: the rule's, LANE_ROW_STEP for wide
    rows, else 1): blocks the lane read takes a step, so more keys in flight a program (each
    thread holds a step's keys in registers); ``lane_prefetch``: the next step's loads are
    issued before this step's keys are stored (twice the registers).
    ``stats``: an int32 (R, 2) tensor that receives each bracketed row's path and window
    size (tests and probes; rows without the bracket keep their values).
    """
    from dsa_ops.backends.triton.kernels_radix import radix_kernel

    if samp is not None and samp not in (128, 256, 512, 1024):
        raise ValueError(f"samp must be 128, 256, 512 or 1024 (the bracket's samples), got {samp}")
    if nbw is not None and nbw not in (256, 512, 1024, 2048):
        raise ValueError(f"nbw must be 256, 512, 1024 or 2048 (the window's bins), got {nbw}")
    if not 4 <= dbits <= 12:
        raise ValueError(f"dbits must be in [4, 12] (the histogram region holds 12288 bins), got {dbits}")
    rows, width = logits.shape
    cuda = logits.device.type == "cuda" and torch.version.hip is None
    timing = stats is not None and stats.dim() == 2 and stats.shape[1] == 10 and cuda
    if stats is not None and (stats.dtype != torch.int32 or tuple(stats.shape) != (rows, 10 if timing else 2)
                              or stats.device != logits.device or not stats.is_contiguous()):
        raise ValueError(f"stats must be a contiguous int32 ({rows}, 2) tensor on {logits.device} (or "
                         f"({rows}, 10) on CUDA: + SM clocks), got {stats.dtype} {tuple(stats.shape)} on "
                         f"{stats.device}")
    if rows == 0:
        return
    packed = bool(pack) and bool(catom) and not finisher
    p, sh = _cached_plan(rows, width, logits.device, slices, block, num_warps, per_sm, min_slice, maxnreg, k,
                        lanes, packed)
    block, num_warps, min_slice, maxnreg = sh["block"], sh["num_warps"], sh["min_slice"], sh["maxnreg"]
    lanes = sh["lanes"]
    ln = 32 * num_warps
    if prefetch is not None and prefetch not in (1, 2):
        raise ValueError(f"prefetch must be 1 or 2 (blocks in flight in the bracket's read), got {prefetch}")
    if rb not in (128, 256, 512, 1024, 2048):
        raise ValueError(f"rb must be 128, 256, 512, 1024 or 2048 (gathered keys per step), got {rb}")
    if wagg_max is not None and (not isinstance(wagg_max, int) or not 0 <= wagg_max < 1 << 31):
        raise ValueError(f"wagg_max must be None or an int in [0, 2**31) (a live length), got {wagg_max!r}")
    ok = wagg_ok(logits.device, block, num_warps)
    if wagg is None:
        wagg = ok
    elif wagg and not ok:
        raise ValueError(f"wagg=True needs CUDA outside Triton's interpreter and block a multiple of 128 x "
                         f"num_warps (block={block}, num_warps={num_warps})")
    row_mode = p.slices == 1
    if postbins is None:
        postbins = sh["postbins"] and bool(bins)
    elif postbins and not (lanes and bins):
        raise ValueError(f"postbins=True needs lane regions and bins (lanes={lanes}, bins={bins})")
    lane_step = sh["lane_step"] if lane_step is None else lane_step
    if lane_step not in (1, 2, 4, 8):
        raise ValueError(f"lane_step must be 1, 2, 4 or 8 (blocks a step of the lane read), got {lane_step!r}")
    if not lanes and (lane_step != 1 or not lane_prefetch):
        raise ValueError(f"lane_step and lane_prefetch shape the lane read, which this launch does not take "
                         f"(lanes={lanes}; got lane_step={lane_step}, lane_prefetch={lane_prefetch})")
    if lanes and (p.cand_cap // 2) // p.slices // ln < 2:
        raise ValueError(f"lanes=True needs at least two rows of {ln} slots a program's region "
                         f"({p.cand_cap // 2} slots over {p.slices} slices)")
    samp = (SAMP_ROW if row_mode else SAMP) if samp is None else samp
    prefetch = (PF_ROW if row_mode else 1) if prefetch is None else prefetch
    if bracket is None:
        br_min = _cached_bracket(p, rows, samp, os.environ.get("DSA_OPS_TRITON_BRACKET", "auto"))
    elif isinstance(bracket, bool):
        br_min = 4 * samp if bracket else 0
    elif isinstance(bracket, int) and bracket >= 4 * samp:
        br_min = bracket
    else:
        raise ValueError(f"bracket must be None, a bool or an int >= 4 x samp = {4 * samp}, got {bracket!r}")
    if sparse_max is None:
        sparse_max = SPARSE_MAX if p.slices > 1 else SPARSE_ROW
    ws = workspace(logits.device, p.grid0, p.ws_stride)
    radix_kernel[(p.grid0, p.slices)](
        logits, logits.stride(0), lens, starts, ends, out, ws, out if stats is None else stats,
        rows, width, k, next_n, p.slices, int(is_prefill), int(stable), p.cand_cap, ws.stride(0), min_slice,
        p.rank_budget if rank_budget is None else rank_budget, sparse_max, int(fuse), br_min,
        int(stats is not None), int(finisher), int(solo_emit), (1 << 31) - 1 if wagg_max is None else wagg_max,
        BLOCK=block, RT=rt, CT=ct, PMAX=PMAX, HMASK=_hist_mask() if hist_mask is None else hist_mask,
        DBITS=dbits, NB=1 << dbits, RB=rb, SAMP=samp, NBW=min(NBW, 256 * num_warps) if nbw is None else nbw,
        CATOM=catom, PIPE=pipe, PF=prefetch, BINS=bool(bins), WAGG=bool(wagg),
        PACK=packed, LANES=ln if lanes else 0, PBINS=bool(postbins), LU=lane_step, LPF=bool(lane_prefetch),
        TIMING=timing, num_warps=num_warps,
        **({"maxnreg": maxnreg} if cuda else {}),
    )

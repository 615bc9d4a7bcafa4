"""Host side of the ``cuda`` backend: the launch plans and the two writers for ``topk.cu``
(the cluster kernel), ``solo.cu`` (one CTA a row) and ``split.cu`` (a row over a cluster
under a sampled bound), compiled as one program (their shared code: ``common.cuh``,
``solo_row.cuh``; the files: docs/cuda-kernel.md §1 and §7).

The plan depends only on host ints (R, W) and the device (multiprocessor count, shared
memory), never on device data, so a captured graph replays correctly with new lengths.
No workspace: the kernel keeps everything in shared memory (docs/cuda-kernel.md §4).
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch
from torch import Tensor

from dsa_ops.backends.cuda import driver
from dsa_ops.backends.cuda.kernel import Function, Program

FOLDER = Path(__file__).parent
# The program's files, handed to NVRTC as named headers (each source includes the headers it
# uses; nothing is read from disk at compile time), and its main source: the three kernel
# sources in one translation unit, so one module holds every entry point.
FILES = ("common.cuh", "solo_row.cuh", "topk.cu", "solo.cu", "split.cu")
MAIN = '#include "topk.cu"\n#include "solo.cu"\n#include "split.cu"\n'
KERNEL = "topk_rows"  # one CTA a multiprocessor; "topk_rows_many": two (64 registers a thread)
SOLO_KERNEL = "topk_solo"  # one CTA a row, two a multiprocessor (solo.cu)
SPLIT_KERNEL = "topk_split"  # a row over a cluster under one sampled bound (split.cu)
THREADS = 512  # NT in common.cuh
HIST_BYTES = 3 * 2048 * 4  # two shared histograms and the reduce-scatter totals
STATIC_BYTES = 2048  # the kernel's static shared memory (Scalars: 1808 bytes), rounded up
MAX_CLUSTER = 16  # Hopper's non-portable cluster limit
# Few rows: CTAs a row by row count (H200, lab/notes/cuda-variants.md: more than 64
# CTAs in clusters of 8 or 16 ran slower than these).
FEW_ROWS = ((4, 16), (8, 8), (16, 4), (64, 2), (1 << 62, 1))
MIN_SLICE = 4096  # few rows: no more CTAs a row than leave each this many columns
MANY_STAGE = 18432  # many rows: keys staged a CTA (two CTAs fit a multiprocessor)
CAND_FEW, CAND_MANY = 4096, 1536  # the leader's candidate buffer (few rows / many rows)
MODE_PER_ROW, MODE_PER_REQUEST, MODE_PREFILL = 0, 1, 2
SOLO_SHORT = 12288  # few rows: rows up to this length are selected by the cluster's CTA 0 alone (solo_row)
SOLO_ROWS = 64  # more rows than this: topk_solo, one CTA a row (decode and prefill)
SOLO_BUF_MIN, SOLO_BUF_MAX = 8192, 32768  # solo: words of the key buffer (sampled rows keep half as many)
SHARED_RESERVED = 1024  # shared memory the hardware keeps a CTA (sm_90)
SPLIT_BUF_MAX = 16384  # split, ordered: words of the leader's buffer (at most half as many kept keys)
# Unordered plans (no bitmaps): the split's buffer, and solo's up to W = SAMPLE_LONG (beyond:
# SOLO_BUF_MAX). More shared memory than this costs L1: larger buffers (split 53504 words,
# solo 24320) ran slower.
SPLIT_BUF_ANY = 32768  # 16384 kept keys: a row of L <= 1M keeps about 5K under the sampled bound
# Unordered split plans with one CTA a multiprocessor: a stage the bulk copy engine lands a
# slice in during the sample (split.cu), so that the slice's read overlaps the sample's, or,
# for slices of RING_MIN keys or more, the ring they stream through. Up to W = SAMPLE_LONG
# carved out of SPLIT_BUF_ANY (a row of L <= 256K keeps at most ~5K keys); wider rows keep the
# whole SPLIT_BUF_ANY and the stage comes after it (the overlap still pays at W 1M).
SPLIT_STAGE = 16384
SOLO_BUF_ANY = 16384
# Unordered split plans of PAIR_ROWS[0] < rows <= PAIR_ROWS[1] up to W = PAIR_WIDTH: PAIR_ROWS[2]
# CTAs a row, each with SPLIT_BUF_ANY - SPLIT_STAGE words (PAIR_BUF_LONG past W = SAMPLE_LONG: rows
# up to 1M keep up to ~5K keys, mean + 4.4 standard deviations inside 10240) and no stage, so
# that two CTAs fit a multiprocessor and every cluster is placed at once (with one CTA a
# multiprocessor, clusters of 8 ran in two waves; these 8 unstaged CTAs a row beat 4 staged
# ones, up to W 1M).
PAIR_ROWS = (8, 16, 8)
PAIR_BUF_LONG = 20480
SPLIT_ROWS = 64  # up to this many rows topk_split is the default plan (docs/cuda-kernel.md §4.3)


# Every entry point's first arguments (name, ctypes type); each shape's ARGS follow them, and a
# lab build's stamp buffer (STAMPS_ARG) comes last. The kernels' signatures: topk.cu, solo.cu, split.cu.
HEAD_ARGS = (("logits", ctypes.c_void_p), ("pitch", ctypes.c_int64), ("width", ctypes.c_int),
             ("lens", ctypes.c_void_p), ("starts", ctypes.c_void_p), ("ends", ctypes.c_void_p),
             ("mode", ctypes.c_int), ("next_n", ctypes.c_int), ("k", ctypes.c_int), ("out", ctypes.c_void_p))
STAMPS_ARG = ("stamps", ctypes.c_void_p)
_INT = ctypes.c_int


@dataclass(frozen=True)
class Plan:
    """Launch shape of the cluster kernel (``topk_rows``, ``topk_rows_many``) for rows of width
    W: each row over a cluster of ``cluster`` CTAs."""

    cluster: int  # CTAs a row (one thread-block cluster)
    stage_keys: int  # keys of a row slice the CTA keeps in shared memory
    cand_keys: int = CAND_FEW  # the leader's buffer of first-digit candidates (key, column)
    solo_max: int = 0  # rows up to this length: CTA 0 alone (solo_row.cuh's select), the others leave

    ARGS = (("C", _INT), ("stage_keys", _INT), ("cand_keys", _INT), ("solo_max", _INT))
    clustered = True  # launched with cluster dims (cluster, 1, 1)

    @property
    def shared(self) -> int:
        """Dynamic shared memory a CTA (bytes)."""
        return HIST_BYTES + 4 * self.stage_keys + 8 * self.cand_keys

    def kernel(self, rows: int, sms: int) -> str:
        """The entry point: two CTAs a multiprocessor (64 registers a thread) when the grid
        needs them."""
        return KERNEL + ("_many" if rows * self.cluster > sms else "")

    def tail(self, ordered: bool) -> tuple:
        """The values of ARGS (the cluster kernel's output is ordered either way)."""
        return (self.cluster, self.stage_keys, self.cand_keys, self.solo_max)

    def check(self, width: int, ordered: bool) -> None:
        """Nothing to check: the cluster kernel has no column bitmaps."""


def _solo_bytes(words: int, buf: int) -> int:
    """Dynamic shared memory of solo_row.cuh's layout (bytes): two 2048-bin histograms, two
    column bitmaps of ``words`` words, a buffer of ``buf`` words."""
    return 4 * (2 * 2048 + 2 * words + buf)


def _solo_layout(width: int, smem: int, buf: Optional[int], buf_max: int,
                 ordered: bool = True) -> Optional[tuple[int, int]]:
    """(buf, words) of solo_row.cuh's layout for rows of ``width`` columns in ``smem`` bytes a CTA
    (shared memory of a multiprocessor over the CTAs it holds): ``buf`` given is checked
    against the room left by the bitmaps; None given takes min(buf_max, room), or None when
    that is under SOLO_BUF_MIN words. Not ``ordered`` (stable=False): no bitmaps (words = 0;
    the unordered emission never uses them), so the room does not depend on the width."""
    words = _ceil(_ceil(max(width, 1), 32), 4) * 4 if ordered else 0
    room = (smem - SHARED_RESERVED - STATIC_BYTES - _solo_bytes(words, 0)) // 4 & ~7
    if buf is None:
        buf = min(buf_max, room)
        if buf < SOLO_BUF_MIN:
            return None
    elif not 8 <= buf <= room:
        raise ValueError(f"buf: expected 8..{room} words for width {width}, got {buf}")
    return buf & ~7, words


@dataclass(frozen=True)
class SoloPlan:
    """Launch shape of ``topk_solo`` (one CTA a row) for rows of width W: rows up to ``buf``
    keys are kept whole in shared memory, longer ones keep the keys under a sampled bound
    (at most ``buf // 2``, with their columns); two column bitmaps of ``words`` words."""

    buf: int
    words: int
    cluster: int = 1

    ARGS = (("buf", _INT), ("words", _INT), ("ordered", _INT))
    clustered = False  # a plain launch, one CTA a row

    @property
    def shared(self) -> int:
        """Dynamic shared memory a CTA (bytes): two histograms, two bitmaps, the buffer."""
        return _solo_bytes(self.words, self.buf)

    def kernel(self, rows: int, sms: int) -> str:
        return SOLO_KERNEL

    def tail(self, ordered: bool) -> tuple:
        return (self.buf, self.words, int(ordered))

    def check(self, width: int, ordered: bool) -> None:
        _check_bitmaps(self.words, width, ordered)


def solo_plan(width: int, smem_per_sm: int, buf: Optional[int] = None, ordered: bool = True) -> Optional[SoloPlan]:
    """The solo plan for rows of ``width`` columns with two CTAs a multiprocessor, or None
    when the bitmaps leave less than SOLO_BUF_MIN words of buffer (``ordered`` and W above
    ~250K; the unordered plan has no bitmaps and fits every width)."""
    most = SOLO_BUF_MAX if ordered or width > SAMPLE_LONG else SOLO_BUF_ANY
    layout = _solo_layout(width, smem_per_sm // 2, buf, most, ordered)
    return None if layout is None else SoloPlan(*layout)


@dataclass(frozen=True)
class SplitPlan:
    """Launch shape of ``topk_split``: each row over a cluster of ``cluster`` CTAs that keep
    the keys under one sampled bound and send them to CTA 0, which selects and emits (rows up
    to ``solo_max`` keys: CTA 0 alone, the row kept whole). solo_row.cuh's layout in every CTA:
    two histograms, two column bitmaps of ``words`` words, a buffer of ``buf`` words."""

    cluster: int
    buf: int
    words: int
    solo_max: int
    stage: int = 0  # words after the buffer that the bulk copy engine lands a CTA's slice in

    ARGS = (("C", _INT), ("buf", _INT), ("words", _INT), ("solo_max", _INT), ("ordered", _INT), ("stage", _INT))
    clustered = True

    @property
    def shared(self) -> int:
        """Dynamic shared memory a CTA (bytes)."""
        return _solo_bytes(self.words, self.buf + self.stage)

    def kernel(self, rows: int, sms: int) -> str:
        return SPLIT_KERNEL

    def tail(self, ordered: bool) -> tuple:
        return (self.cluster, self.buf, self.words, self.solo_max, int(ordered), self.stage)

    def check(self, width: int, ordered: bool) -> None:
        _check_bitmaps(self.words, width, ordered)


def _check_bitmaps(words: int, width: int, ordered: bool) -> None:
    """The ordered emission marks winners in column bitmaps of ``words`` words: refuse a plan
    whose bitmaps cannot hold ``width`` columns (an unordered plan has none)."""
    if ordered and 32 * words < width:
        raise ValueError(f"plan: the ordered emission needs column bitmaps of {_ceil(width, 32)} words for width "
                         f"{width}, the plan has {words} (an unordered plan: pass ordered=False)")


def split_plan(rows: int, width: int, sms: int, smem_per_sm: int, cluster: Optional[int] = None,
               buf: Optional[int] = None, solo_max: Optional[int] = None,
               ordered: bool = True, stage: Optional[int] = None) -> Optional[SplitPlan]:
    """The split plan for R rows of W columns (host ints only), or None when the leader's
    bitmaps leave less than SOLO_BUF_MIN words of buffer (``ordered`` and W above ~700K; the
    unordered plan has no bitmaps and fits every width). Cluster sizes as the few-rows table
    (FEW_ROWS); two CTAs a multiprocessor when the grid needs them. ``stage`` (words, a
    multiple of 8): room after the buffer for the slice's bulk copy; by default SPLIT_STAGE for
    unordered plans with one CTA a multiprocessor (carved out of SPLIT_BUF_ANY up to W =
    SAMPLE_LONG, after it beyond), else none. Unordered plans of 9-16 rows up to W = PAIR_WIDTH
    (PAIR_ROWS, no cluster, buf or stage given): 8 CTAs a row with an unstaged buffer of
    SPLIT_BUF_ANY - SPLIT_STAGE words (PAIR_BUF_LONG past SAMPLE_LONG), small enough for two
    CTAs a multiprocessor."""
    narrow = width <= SAMPLE_LONG
    paired = (cluster is None and buf is None and stage is None and not ordered and width <= PAIR_WIDTH
              and PAIR_ROWS[0] < rows <= PAIR_ROWS[1])
    if cluster is None:
        cluster = PAIR_ROWS[2] if paired else next(c for r, c in FEW_ROWS if rows <= r)
        while cluster > 1 and (rows * cluster > 2 * sms or _ceil(width, cluster) < MIN_SLICE):
            cluster //= 2
    if paired:
        buf, stage = (SPLIT_BUF_ANY - SPLIT_STAGE if narrow else PAIR_BUF_LONG), 0
    if not 1 <= cluster <= MAX_CLUSTER or cluster & (cluster - 1):
        raise ValueError(f"cluster: expected a power of two in [1, {MAX_CLUSTER}], got {cluster}")
    per_sm = 1 if rows * cluster <= sms else 2
    smem = smem_per_sm // per_sm
    if stage is None:
        staged = not ordered and per_sm == 1 and buf is None
        stage = SPLIT_STAGE if staged else 0
        if staged and narrow:
            buf = SPLIT_BUF_ANY - SPLIT_STAGE
    elif stage < 0 or stage % 8:
        raise ValueError(f"stage: expected a multiple of 8 words >= 0, got {stage}")
    # unordered: no bitmaps, and room for a row of L = 1M (its ~5K keys under the bound, with a
    # wide margin; a row that overflows falls back to the leader alone)
    layout = _solo_layout(width, smem - 4 * stage, buf, SPLIT_BUF_MAX if ordered else SPLIT_BUF_ANY, ordered)
    if layout is None:
        if stage:
            raise ValueError(f"stage: {stage} words leave less than {SOLO_BUF_MIN} words of buffer for width {width}")
        return None
    buf, words = layout
    short = min(SOLO_SHORT, buf) if solo_max is None else int(solo_max)
    if not 0 <= short <= buf:
        raise ValueError(f"solo_max: expected 0..{buf} (the buffer), got {short}")
    return SplitPlan(cluster, buf, words, short, stage)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def stage_for(columns: int) -> int:
    """Stage keys a slice of ``columns`` needs: THREADS x m, m = 4 x an odd number >= the
    slice's share a thread (the kernel's ``m``; odd so that the emission's 16-byte shared
    loads are free of bank conflicts)."""
    return THREADS * 4 * (_ceil(max(columns, 1), 4 * THREADS) | 1)


def solo_short_fits(plan: Plan, cap: int = SOLO_SHORT) -> int:
    """The longest row (at most ``cap``) the plan's shared memory lets CTA 0 select alone
    (solo_row.cuh's layout: two histograms, two bitmaps of L / 32 words, the row kept whole)."""
    room = plan.shared // 4 - 2 * 2048 - 8  # words; 2 x (L / 32 + 4) bitmap words + (L + 8) keys
    return max(0, min(cap, (room - 8) * 16 // 17) & ~31)


def make_plan(rows: int, width: int, sms: int, smem_max: int, cluster: Optional[int] = None,
              stage_keys: Optional[int] = None, cand_keys: Optional[int] = None,
              solo_max: Optional[int] = None) -> Plan:
    """The launch shape (pure function of host ints; the keyword overrides are for
    benchmarks and tests).

    Few rows (R <= multiprocessors): 16 CTAs a row up to 4 rows, 8 up to 8, 4 up to 16, 2
    up to 64, else 1 (FEW_ROWS), fewer when slices would drop below MIN_SLICE columns; the stage as large as
    the slice (every row read once) up to the shared memory left. Many rows: the smallest
    cluster whose full-width slice fits MANY_STAGE keys, so that rows are read once and two
    CTAs share a multiprocessor.
    """
    few = rows <= sms
    cand = (CAND_FEW if few else CAND_MANY) if cand_keys is None else int(cand_keys)
    if not 0 <= cand <= 1 << 16:
        raise ValueError(f"cand_keys: expected 0..65536, got {cand}")
    limit = max(4, (smem_max - HIST_BYTES - STATIC_BYTES - 8 * cand) // 4)
    if cluster is None:
        if few:
            cluster = next(c for r, c in FEW_ROWS if rows <= r)
            while cluster > 1 and (rows * cluster > sms or _ceil(width, cluster) < MIN_SLICE):
                cluster //= 2
        else:
            cluster = 1
            while cluster < MAX_CLUSTER and stage_for(_ceil(width, cluster)) > MANY_STAGE:
                cluster *= 2
    if not 1 <= cluster <= MAX_CLUSTER or cluster & (cluster - 1):
        raise ValueError(f"cluster: expected a power of two in [1, {MAX_CLUSTER}], got {cluster}")
    if stage_keys is None:
        stage_keys = min(stage_for(_ceil(width, cluster)), limit if few else min(limit, MANY_STAGE))
    stage_keys = max(4, min(int(stage_keys), limit)) & ~3
    plan = Plan(cluster, stage_keys, cand)
    fits = solo_short_fits(plan, SOLO_SHORT if solo_max is None else 1 << 30)
    if solo_max is None:
        solo_max = fits if few else 0
    elif not 0 <= solo_max <= fits:
        raise ValueError(f"solo_max: expected 0..{fits} for this plan's shared memory, got {solo_max}")
    return Plan(cluster, stage_keys, cand, int(solo_max))


_PROGRAM = Program("dsa_ops_topk", MAIN, headers={name: (FOLDER / name).read_text() for name in FILES})
PROFILE = "DSA_OPS_PROFILE"  # the lab builds' define: phase stamps (common.cuh)
_BUILDS: dict = {}


def program(profile: int = 0, options: tuple = ()) -> Program:
    """The shipped program (``profile`` 0, no ``options``), or a lab build of the same files:
    ``profile`` 1 stamps each CTA's phases with the SM's clock, 2 with the global nanosecond
    timer (``-DDSA_OPS_PROFILE=<profile>``); ``options``: more NVRTC options (``-DNAME=V``)."""
    key = (int(profile), tuple(options))
    if key == (0, ()):
        return _PROGRAM
    if key[0] not in (0, 1, 2):
        raise ValueError(f"profile: expected 0 (off), 1 (SM clock) or 2 (global ns), got {profile}")
    if key not in _BUILDS:
        flags = ((f"-D{PROFILE}={key[0]}",) if key[0] else ()) + key[1]
        _BUILDS[key] = Program(_PROGRAM.name, _PROGRAM.source, flags, _PROGRAM.headers)
    return _BUILDS[key]


def profiling(prog: Program) -> bool:
    """Whether ``prog`` is a lab build (its kernels take the stamp buffer as their last argument)."""
    return any(o.startswith(f"-D{PROFILE}") for o in prog.options)


def _constant(name: str) -> int:
    """The value of an ``enum : int { NAME = <int> };`` of the program (one value for host and kernel)."""
    m = re.search(rf"^enum : int {{ {name} = (\d+) }};", "".join(_PROGRAM.headers.values()), re.MULTILINE)
    if m is None:
        raise RuntimeError(f"topk.py: the kernel source defines no {name}")
    return int(m.group(1))


SAMPLE = _constant("SAMPLE")  # solo_row.cuh: keys in a row's sample (rows of L <= SAMPLE_LONG)
SAMPLE_LONG = _constant("SAMPLE_LONG")  # solo_row.cuh: longer rows take twice the sample, past twice this four times
PAIR_WIDTH = 4 * SAMPLE_LONG  # the widest rows of the 9-16-row plan (PAIR_ROWS): L = 1M keeps ~5K keys
KEEPB_MIN = _constant("KEEPB_MIN")  # split.cu: keep_slice reads slices of this many keys or more in batches
RING_MIN = _constant("RING_MIN")  # split.cu: slices of this many keys or more stream through the stage as a ring
RING_SLOT = _constant("RING_SLOT")  # split.cu: words a slot of that ring (two slots at least, else no ring)


def sample_keys(length: int) -> int:
    """Keys in the sample of a row of ``length`` (solo_row.cuh's sample_tau): SAMPLE, twice as
    many past SAMPLE_LONG, four times past 2 x SAMPLE_LONG, so that a sample key stands for
    at most SAMPLE_LONG / SAMPLE columns up to L = 1M."""
    return SAMPLE * (4 if length > 2 * SAMPLE_LONG else 2 if length > SAMPLE_LONG else 1)


@dataclass(frozen=True)
class DeviceFacts:
    """What the plans read of a device (host ints; the plan never depends on device data)."""

    sms: int  # multiprocessors
    smem_block: int  # opt-in shared memory a block (bytes)
    smem_sm: int  # shared memory a multiprocessor (bytes)


@functools.lru_cache(maxsize=None)
def _facts(index: int) -> DeviceFacts:
    return DeviceFacts(torch.cuda.get_device_properties(index).multi_processor_count,
                       driver.device_attribute(index, driver.DEV_ATTR_MAX_SHARED_PER_BLOCK_OPTIN),
                       driver.device_attribute(index, driver.DEV_ATTR_MAX_SHARED_PER_MULTIPROCESSOR))


def device_facts(device=None) -> DeviceFacts:
    """The :class:`DeviceFacts` of ``device`` (a torch device, an index; default the current
    CUDA device), read once per device."""
    index = device if isinstance(device, int) else None if device is None else torch.device(device).index
    return _facts(torch.cuda.current_device() if index is None else index)


def default_shape(rows: int, width: int, facts: DeviceFacts, ordered: bool = True) -> Union[Plan, SoloPlan, SplitPlan]:
    """The default plan's shape: ``topk_solo`` for more than SOLO_ROWS rows, ``topk_split`` for
    up to SPLIT_ROWS (each when its bitmaps fit the width: always when not ``ordered``, whose
    plans have none), else the cluster plan of :func:`make_plan`."""
    alt = None
    if rows > SOLO_ROWS:
        alt = solo_plan(width, facts.smem_sm, ordered=ordered)
    elif rows <= SPLIT_ROWS:
        alt = split_plan(rows, width, facts.sms, facts.smem_sm, ordered=ordered)
    return alt if alt is not None else make_plan(rows, width, facts.sms, facts.smem_block)


@dataclass(frozen=True)
class LaunchPlan:
    """One launch of the program for R rows of width W, all but the tensors: the entry point
    (``kernel``), ``grid`` CTAs of ``block`` threads, the cluster dims (None: a plain launch),
    the dynamic shared memory a CTA, and the kernel's arguments (:meth:`arg_types`,
    :meth:`args`). ``shape``: the per-kernel record (:class:`Plan`, :class:`SoloPlan`,
    :class:`SplitPlan`) it was made from. Build one with :func:`plan`."""

    shape: Union[Plan, SoloPlan, SplitPlan]
    rows: int
    width: int
    ordered: bool
    kernel: str
    grid: int
    cluster: Optional[tuple[int, int, int]]
    shared: int
    block: int = THREADS

    def arg_names(self, profile: bool = False) -> tuple[str, ...]:
        """The kernel's parameter names, in order (``profile``: a lab build, stamps last)."""
        return tuple(n for n, _ in HEAD_ARGS + self.shape.ARGS + ((STAMPS_ARG,) if profile else ()))

    def arg_types(self, profile: bool = False) -> tuple:
        """The ctypes type of each kernel parameter, in order."""
        return tuple(t for _, t in HEAD_ARGS + self.shape.ARGS + ((STAMPS_ARG,) if profile else ()))

    def args(self, logits: Tensor, lens: Tensor, starts: Tensor, ends: Tensor, mode: int, next_n: int, k: int,
             out: Tensor, stamps: Optional[Tensor] = None, profile: bool = False) -> tuple:
        """The kernel's argument values, in :meth:`arg_types`' order (pointers as ints; a lab
        build's ``stamps`` last, None for none)."""
        head = (logits.data_ptr(), logits.stride(0), self.width, lens.data_ptr(), starts.data_ptr(), ends.data_ptr(),
                mode, next_n, k, out.data_ptr()) + self.shape.tail(self.ordered)
        return head + (None if stamps is None else stamps.data_ptr(),) if profile else head


def plan(rows: int, width: int, stable: bool = True, device=None, shape=None,
         facts: Optional[DeviceFacts] = None) -> LaunchPlan:
    """The launch of the ``cuda`` backend for ``rows`` rows of ``width`` columns (host ints
    only: a captured graph replays correctly with new lengths). ``stable``: the ordered
    emission (False: the plans without column bitmaps, winners in any order). ``shape``: a
    :class:`Plan` / :class:`SoloPlan` / :class:`SplitPlan` to launch instead of the default
    (benchmarks, tests); ``facts``: the device's :class:`DeviceFacts` (default: read from
    ``device``, the current CUDA device by default). ValueError for an ordered launch of a
    shape without room for its bitmaps."""
    ordered = bool(stable)
    if shape is not None:
        shape.check(width, ordered)
    facts = facts if facts is not None else device_facts(device)
    s = default_shape(rows, width, facts, ordered) if shape is None else shape
    return LaunchPlan(s, rows, width, ordered, s.kernel(rows, facts.sms), rows * s.cluster,
                      (s.cluster, 1, 1) if s.clustered else None, s.shared)


@functools.lru_cache(maxsize=4096)
def _plan(rows: int, width: int, index: Optional[int], ordered: bool, shape) -> LaunchPlan:
    return plan(rows, width, ordered, index, shape)


class _Launch:
    """One prepared launch of a kernel for a (function, plan, stream, build): the
    ``CUlaunchConfig`` and the argument array are built once; a call refills the values.
    ``profile``: a lab build, whose kernels take the stamp buffer after their other arguments."""

    def __init__(self, fn: Function, plan: LaunchPlan, stream: int, profile: bool = False) -> None:
        if not 0 <= plan.shared <= fn.max_shared:
            raise ValueError(f"plan: {plan.shared} bytes of shared memory; the kernel was loaded for {fn.max_shared}")
        self.handle = fn.handle
        self.cfg, self._attrs = driver.launch_config((plan.grid,), (plan.block,), plan.shared, stream, plan.cluster)
        self.values = [t() for t in plan.arg_types(profile)]
        self.params = (ctypes.c_void_p * len(self.values))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in self.values])

    def __call__(self, args) -> None:
        for v, a in zip(self.values, args):
            v.value = a
        driver.launch(self.handle, self.cfg, self.params)


_LAUNCHES: dict = {}


def launch(logits: Tensor, lens: Tensor, starts: Tensor, ends: Tensor, mode: int, next_n: int, k: int,
           out: Tensor, plan=None, stamps: Optional[Tensor] = None,
           program: Optional[Program] = None, ordered: bool = True) -> None:
    """Fill ``out`` (R, k) int32 from ``logits`` (R, W) fp32 rows (already validated: every
    tensor on the logits' device). ``plan``: a shape (:class:`Plan`, :class:`SoloPlan`,
    :class:`SplitPlan`) to launch instead of the default one. ``ordered``: the stable bytes
    (ascending columns, lowest column ties); False lets the solo and split kernels emit their
    winners in any order (the contract's ``stable=False``; the cluster kernel's output is
    ordered either way). ``program``: a build of the kernels (:func:`program`), default the
    shipped one; ``stamps`` (grid x 16 int64): each CTA's phase stamps, from a lab build only."""
    rows, width = logits.shape
    if rows == 0:
        return
    prog = program or _PROGRAM
    profile = profiling(prog)
    if stamps is not None and not profile:
        raise ValueError("stamps: the shipped build has no phase stamps; launch a lab build "
                         "(program=topk.program(profile=1))")
    index = logits.device.index
    lp = _plan(rows, width, index, ordered, plan)
    fn = prog.function(lp.kernel, index, max_shared=_facts(index).smem_block - STATIC_BYTES, non_portable_cluster=True)
    stream = torch.cuda.current_stream(index).cuda_stream
    key = (fn.handle, rows, width, ordered, plan, stream, profile, threading.get_ident())  # what lp was made from
    run = _LAUNCHES.get(key)
    if run is None:
        if len(_LAUNCHES) > 4096:  # many shapes or threads: start over rather than grow
            _LAUNCHES.clear()
        run = _LAUNCHES[key] = _Launch(fn, lp, stream, profile)
    run(lp.args(logits, lens, starts, ends, mode, next_n, k, out, stamps, profile))


def decode(logits: Tensor, lengths: Tensor, k: int, next_n: int, stable: bool, out: Tensor) -> None:
    """Decode writer: per-row lengths when numel == R, else per request with ``next_n``;
    ``stable``: the ordered emission (else any order, any ties: contract §1.1)."""
    flat = lengths.reshape(-1)
    per_row = flat.numel() == logits.shape[0]
    launch(logits, flat, flat, flat, MODE_PER_ROW if per_row else MODE_PER_REQUEST, 1 if per_row else next_n,
           k, out, ordered=stable)


def prefill(logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int, stable: bool, out: Tensor) -> None:
    """Prefill writer: window [clamp(s), clamp(e)), sequence-local indices; ``stable`` as
    for :func:`decode`."""
    launch(logits, row_starts, row_starts, row_ends, MODE_PREFILL, 1, k, out, ordered=stable)

"""Row-banded decode rules from timings: what ``dsa-ops calibrate`` writes.

A captured decode graph sees its row count but not the live lengths, so per (width, row count)
the backend with the least expected time over a context mix (weights on the measured lengths
L; equal by default) wins, never one whose output failed the contract check at that width.
With vLLM's own choice measured too (the pseudo-backend :data:`STOCK`: the kernel stock vLLM
0.33.0 runs for the call, with its real length bound), the stock guard first keeps the
backends within ``stock_tol`` us of stock at every measured length (if none is, the one whose
worst excess over stock is least). Adjacent row counts and then adjacent widths with the same
winners merge into bands; :func:`regret` says what the choice costs at each measured shape
against the fastest backend there and against stock. Pure functions of the timings.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Optional

from dsa_ops import policy as P
from dsa_ops.backends import get as get_backend
from dsa_ops.calibration import Measurement, _points, prefill_threshold
from dsa_ops.stock import KERNELS, stock_choice

STOCK = "stock"  # vLLM 0.33.0's own choice for the call, timed by calibrate: a reference, never routed to
# The vLLM route (passes/vllm_route.py) calls these kernels itself, as stock vLLM does, where the
# policy picks one of these backends: kernel -> the backends whose pick runs it.
ROUTE_CALLS = {"cooperative_topk": ("vllm_cooperative",), "persistent_topk": ("vllm_cooperative", "vllm_persistent")}


def route_view(ms: Iterable[Measurement], arch: str, k: int = 2048) -> list[Measurement]:
    """The measurements as the CUDA vLLM route pays them: at each decode shape where stock was
    measured, a vLLM backend whose pick makes the route run stock's own kernel call there
    (:data:`ROUTE_CALLS`) costs stock's time (right only if both its adapter's output and
    stock's were). Everything else as measured."""
    ms = list(ms)
    digits = "".join(c for c in arch if c.isdigit())
    cap = (int(digits[:-1] or 0), int(digits[-1])) if digits else None
    stock = {(m.rows, m.length, m.width): m for m in ms if m.family == "decode" and m.backend == STOCK}
    out = []
    for m in ms:
        st = stock.get((m.rows, m.length, m.width)) if m.family == "decode" else None
        if st is not None and m.backend != STOCK:
            kernel = KERNELS[stock_choice("decode", "cuda", cap, k, m.rows, m.width)]
            if m.backend in ROUTE_CALLS.get(kernel, ()):
                m = Measurement(m.family, m.backend, m.rows, m.length, m.width, st.us, m.ok and st.ok)
        out.append(m)
    return out


@dataclass(frozen=True)
class RowBand:
    """One decode rule's reach: widths [min_width, max_width) x rows [min_rows, max_rows).

    ``fallback`` marks the rule with no row band that follows a width's row bands: it serves
    a symbolic row range that straddles them (the least geo-mean slowdown over the measured
    row counts). ``rows`` / ``widths`` are the measured points inside it."""

    min_width: int
    max_width: Optional[int]
    min_rows: int
    max_rows: Optional[int]
    backend: str
    rows: tuple[int, ...]
    widths: tuple[int, ...]
    fallback: bool = False


@dataclass(frozen=True)
class Regret:
    """At one measured decode shape (``length`` an int, or "mix": the context mix's expected
    time), the chosen backend against the fastest one there."""

    width: int
    rows: int
    length: object
    chosen: str
    chosen_us: float
    best: str
    best_us: float
    stock_us: Optional[float] = None  # vLLM's own choice there, when it was measured

    @property
    def regret_us(self) -> float:
        return self.chosen_us - self.best_us

    @property
    def over_stock_us(self) -> Optional[float]:
        return None if self.stock_us is None else self.chosen_us - self.stock_us

    @property
    def ratio(self) -> float:
        return self.chosen_us / self.best_us


def parse_context_mix(text: str) -> dict[int, float]:
    """``"4096:0.5,32768:0.3,131072:0.2"`` -> {L: weight}, weights scaled to sum to 1."""
    mix: dict[int, float] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        length, sep, weight = item.partition(":")
        try:
            L, w = int(length), float(weight)
        except ValueError:
            L, w = None, None
        if not sep or L is None or L < 1 or not (w >= 0 and math.isfinite(w)):
            raise ValueError(f"context mix: expected L:weight items (L an int >= 1, weight >= 0), got {item!r}")
        if L in mix:
            raise ValueError(f"context mix: L = {L} is named twice")
        mix[L] = w
    total = sum(mix.values())
    if not mix or total <= 0:
        raise ValueError(f"context mix: expected at least one L with a weight above 0, got {text!r}")
    return {L: w / total for L, w in sorted(mix.items())}


def mix_label(mix: dict[int, float]) -> str:
    return ",".join(f"{L}:{w:.3g}" for L, w in sorted(mix.items()))


def context_mix(ms: Iterable[Measurement], mix: Optional[dict[int, float]] = None) -> dict[int, float]:
    """The mix in force: ``mix`` (normalised), else every measured decode length weighted equally."""
    if mix:
        total = sum(mix.values())
        return {L: w / total for L, w in sorted(mix.items()) if w > 0}
    lengths = sorted({m.length for m in ms if m.family == "decode"})
    if not lengths:
        raise ValueError("measurements: no decode point")
    return {L: 1 / len(lengths) for L in lengths}


def _expected(pts: dict, wrong: set, rows: int, width: int, mix: dict[int, float]) -> dict[str, float]:
    """Expected time per candidate at (rows, width) over the mix: backends timed at every L of
    the mix there and never wrong at this width."""
    missing = [L for L in mix if (rows, L, width) not in pts]
    if missing:
        raise ValueError(f"measurements: the context mix names L = {missing} but nothing was measured there "
                         f"at rows = {rows}, W = {width}")
    names = set.intersection(*(set(pts[(rows, L, width)]) for L in mix)) - {b for (w, b) in wrong if w == width}
    names.discard(STOCK)
    if not names:
        raise ValueError(f"measurements: no backend was measured right at every L of the mix at rows = {rows}, "
                         f"W = {width}")
    return {b: sum(w * pts[(rows, L, width)][b] for L, w in mix.items()) for b in sorted(names)}


def _guarded(pts: dict, exp: dict[str, float], rows: int, width: int, tol: Optional[float]) -> dict[str, float]:
    """The stock guard: of the candidates ``exp``, those within ``tol`` us of :data:`STOCK` at every
    length where stock was measured at (rows, width); if none is, the one whose worst excess over
    stock is least. No guard (``exp`` as is) when ``tol`` is None or stock was not measured."""
    lengths = sorted(L for (r, L, w), t in pts.items() if r == rows and w == width and STOCK in t)
    if tol is None or not lengths:
        return exp
    excess = {b: max(pts[(rows, L, width)].get(b, math.inf) - pts[(rows, L, width)][STOCK] for L in lengths)
              for b in exp}
    within = {b: e for b, e in exp.items() if excess[b] <= tol}
    if within:
        return within
    closest = min(exp, key=lambda b: (excess[b], exp[b], b))
    return {closest: exp[closest]}


def decode_row_bands(ms: Iterable[Measurement], mix: Optional[dict[int, float]] = None,
                     stock_tol: Optional[float] = None) -> list[RowBand]:
    """Per width, the least expected time per measured row count, adjacent equal winners merged
    into row bands; a band ends right past its last measured row count (rows between two
    measured counts with different winners take the larger count's winner: both the cuda
    kernel and vLLM's cooperative kernel change plans past 64 rows, which a power-of-two grid
    measures on each side);
    adjacent widths with the same row bands merged into width bands; then, for a width band
    with several row bands, its symbolic-rows fallback. ``stock_tol``: the stock guard
    (:func:`_guarded`) before the choice. A backend with a known fault on legal input
    (``Backend.faults``) is never a candidate: its measurements are dropped here."""
    ms = [m for m in ms if m.backend == STOCK or not _faults(m.backend)]
    mix = context_mix(ms, mix)
    pts = _points(ms, "decode")
    wrong = {(m.width, m.backend) for m in ms if m.family == "decode" and not m.ok}
    widths = sorted({w for (_, _, w) in pts})
    per_width = []  # (width, [(row_lo, row_hi, backend, rows)], expected per row count)
    for w in widths:
        counts = sorted({r for (r, _, ww) in pts if ww == w})
        raw = {r: _expected(pts, wrong, r, w, mix) for r in counts}
        exp = {r: _guarded(pts, raw[r], r, w, stock_tol) for r in counts}
        runs: list[list] = []
        for r in counts:
            best = min(exp[r], key=lambda b: (exp[r][b], b))
            if runs and runs[-1][2] == best:
                runs[-1][3].append(r)
            else:  # a new band starts right past the last measured row count of the one before
                runs.append([0 if not runs else runs[-1][3][-1] + 1, None, best, [r]])
        for a, b in zip(runs, runs[1:]):
            a[1] = b[0]
        per_width.append((w, [(lo, hi, b, tuple(rs)) for lo, hi, b, rs in runs], (exp, raw)))
    groups: list[list] = []  # merge adjacent widths with the same row bands
    for w, bands, exp in per_width:
        shape = [(lo, hi, b) for lo, hi, b, _ in bands]
        if groups and groups[-1][1] == shape:
            groups[-1][0].append(w)
            groups[-1][3].append(exp)
            groups[-1][2] = [(lo, hi, b, tuple(sorted(set(rs + rs2)))) for (lo, hi, b, rs), (_, _, _, rs2)
                             in zip(groups[-1][2], bands)]
        else:
            groups.append([[w], shape, bands, [exp]])
    out: list[RowBand] = []
    for i, (ws, _, bands, exps) in enumerate(groups):
        lo_w = 0 if i == 0 else ws[0]
        hi_w = groups[i + 1][0][0] if i + 1 < len(groups) else None
        out += [RowBand(lo_w, hi_w, lo, hi, b, rs, tuple(ws)) for lo, hi, b, rs in bands]
        if len(bands) > 1:
            guarded, raw = [e for e, _ in exps], [r for _, r in exps]
            pick = _fallback(guarded) or _fallback(raw)  # the guard's picks at every row count, else all
            if pick is None:
                raise ValueError("measurements: no backend is a candidate at every row count of a width band")
            out.append(RowBand(lo_w, hi_w, 0, None, pick, tuple(sorted({r for e in raw for r in e})), tuple(ws),
                               fallback=True))
    return out


def _faults(name: str) -> str:
    """The registered backend's known fault on legal input ("" if none, or not registered here)."""
    try:
        return get_backend(name).faults
    except ValueError:
        return ""


def _fallback(exps: list[dict]) -> Optional[str]:
    """The backend with the least geometric-mean slowdown over every (width, rows) point given,
    among those that are candidates at all of them (None if none is)."""
    points = [e for exp in exps for e in exp.values()]
    names = sorted(set.intersection(*(set(e) for e in points)))
    if not names:
        return None
    score = {b: sum(math.log(e[b] / min(e.values())) for e in points) for b in names}
    return min(names, key=lambda b: (round(score[b], 12), b))


def chosen(bands: list[RowBand], rows: int, width: int) -> str:
    """The banded backend for concrete (rows, width), as the policy's rules would pick it."""
    for b in bands:
        if not b.fallback and b.min_width <= width and (b.max_width is None or width < b.max_width) \
                and b.min_rows <= rows and (b.max_rows is None or rows < b.max_rows):
            return b.backend
    raise ValueError(f"no band covers rows = {rows}, W = {width}")


def regret(ms: Iterable[Measurement], bands: list[RowBand], mix: Optional[dict[int, float]] = None) -> list[Regret]:
    """Per measured decode shape, and per (width, rows) for the mix ("mix": expected times, the
    best being an oracle that knows each call's L), the chosen backend against the fastest."""
    ms = list(ms)
    mix = context_mix(ms, mix)
    pts = _points(ms, "decode")
    out = []
    routable = {p: {b: t for b, t in times.items() if b != STOCK} for p, times in pts.items()}
    for (r, L, w) in sorted(pts):
        c, times = chosen(bands, r, w), routable[(r, L, w)]
        if c not in times:
            continue  # chosen for the mix, not timed at this L
        best = min(times, key=lambda b: (times[b], b))
        out.append(Regret(w, r, L, c, times[c], best, times[best], pts[(r, L, w)].get(STOCK)))
    for (r, w) in sorted({(r, w) for (r, _, w) in pts}):
        c = chosen(bands, r, w)
        if all((r, L, w) in pts and c in routable[(r, L, w)] for L in mix):
            oracle = sum(wt * min(routable[(r, L, w)].values()) for L, wt in mix.items())
            stock = (sum(wt * pts[(r, L, w)][STOCK] for L, wt in mix.items())
                     if all(STOCK in pts[(r, L, w)] for L in mix) else None)
            out.append(Regret(w, r, "mix", c, sum(wt * routable[(r, L, w)][c] for L, wt in mix.items()),
                              "(per-L best)", oracle, stock))
    return out


def regret_table(rows: list[Regret]) -> str:
    """Markdown: one line per shape, the mix lines after each (width, rows) group; with stock
    measured, its time and chosen - stock too."""
    stock = any(g.stock_us is not None for g in rows)
    head = "| W | rows | L | chosen | chosen us | best | best us | regret us | chosen / best |"
    head += " stock us | chosen - stock us |" if stock else ""
    lines = [head, "|" + "---|" * head.count(" |")]
    key = lambda g: (g.width, g.rows, g.length == "mix", g.length if g.length != "mix" else 0)  # noqa: E731
    for g in sorted(rows, key=key):
        line = (f"| {g.width} | {g.rows} | {g.length} | {g.chosen} | {g.chosen_us:.1f} | {g.best} | "
                f"{g.best_us:.1f} | {g.regret_us:+.1f} | {g.ratio:.3f} |")
        if stock:
            line += " - | - |" if g.stock_us is None else f" {g.stock_us:.1f} | {g.over_stock_us:+.1f} |"
        lines.append(line)
    return "\n".join(lines)


def build_row_policy(ms: list[Measurement], platform: str, arch: str, meta: dict,
                     mix: Optional[dict[int, float]] = None, k: Optional[int] = None,
                     stock_tol: Optional[float] = None, for_route: bool = False) -> P.Policy:
    """Calibrated decode rules by width and row band (:func:`decode_row_bands`, with the stock
    guard when ``stock_tol`` is given and stock was measured), scoped to this platform, arch
    and (when given) k, then the prefill threshold's two rules, ahead of the default rules;
    the measurements, bands, mix, guard and regret go under ``meta``. ``for_route``: decide on
    the costs the CUDA vLLM route pays (:func:`route_view`); ``meta`` keeps the measurements."""
    measured = list(ms)
    mix = context_mix(measured, mix)
    ms = route_view(measured, arch, k or 2048) if for_route else measured
    bands = decode_row_bands(ms, mix, stock_tol)
    guard = stock_tol is not None and any(m.backend == STOCK for m in ms)
    dev = meta.get("device", arch)
    label = mix_label(mix)
    decode = []
    for b in bands:
        where = f"W in [{b.min_width}, {b.max_width or 'inf'})"
        if b.fallback:
            why = (f"calibrated on {dev}: a symbolic row count across the row bands, {where}: least geo-mean "
                   f"slowdown over rows {list(b.rows)} (context mix {label})")
        else:
            why = (f"calibrated on {dev}: least expected time over the context mix {label}"
                   + (f", within {stock_tol:g} us of stock vLLM at every measured L where one is" if guard else "")
                   + f", for rows in [{b.min_rows}, {b.max_rows or 'inf'}), {where} (measured rows {list(b.rows)})")
        decode.append(P.Rule(b.backend, why, platform=platform, arch=arch, k=k, min_width=b.min_width,
                             max_width=b.max_width, min_rows=b.min_rows, max_rows=b.max_rows))
    thr = prefill_threshold(ms) if any(m.family == "prefill" for m in ms) else None
    prefill, threshold = P.DEFAULT.prefill, P.DEFAULT.prefill_threshold
    if thr is not None:
        why = f"calibrated on {dev}: mean log-slowdown {thr.cost:.3f} over {thr.points} points"
        prefill = (P.Rule(thr.above, why + " (long side)", platform=platform, arch=arch, k=k, long=True),
                   P.Rule(thr.below, why + " (short side)", platform=platform, arch=arch, k=k, long=False)) + prefill
        threshold = thr.threshold
    regrets = regret(ms, bands, mix)
    full_meta = {**meta, "method": "row-bands", "context_mix": {str(L): w for L, w in mix.items()},
                 "stock_guard_us": stock_tol if guard else None, "for_vllm_route": for_route,
                 "decode_row_bands": [asdict(b) for b in bands], "prefill": asdict(thr) if thr else None,
                 "regret": [{**asdict(g), "regret_us": round(g.regret_us, 3)} for g in regrets],
                 "measurements": [asdict(m) for m in measured]}
    return P.Policy(tuple(decode) + P.DEFAULT.decode, prefill, threshold, False, f"calibrated-{dev}", full_meta)

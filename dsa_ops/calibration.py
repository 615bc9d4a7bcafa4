"""From timings to a policy: the crossover finding behind ``dsa-ops calibrate``.

Pure functions of a list of :class:`Measurement` (no GPU here), so the logic is tested
on synthetic timings and is deterministic: the same timings always give the same policy.

Decode graphs cannot see the live length, but they do see the row count (a captured graph
is captured for one batch size). So :func:`build_row_policy` (what ``dsa-ops calibrate``
writes, issue 46) decides per (width, row count): the backend with the least expected time
over a context mix (weights on the measured lengths L; equal by default), never one whose
output failed the contract check at that width; adjacent row counts and then adjacent
widths with the same winners merge into bands; :func:`regret` says what that costs at
each measured shape against the fastest backend there. :func:`build_policy` is the
earlier width-only method (per width, the least geometric-mean slowdown over all rows and
lengths), kept because the stored H200 policies were made with it and must stay
reproducible from their measurements. Prefill has one threshold on ``max_seqlen_k``: the
(threshold, below-backend, above-backend) triple with the smallest summed log-slowdown over
all measured prefill points.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Iterable, Optional

from dsa_ops import policy as P


@dataclass(frozen=True)
class Measurement:
    """One timed configuration. ``length`` is L for decode and max_seqlen_k for prefill."""

    family: str
    backend: str
    rows: int
    length: int
    width: int
    us: float
    ok: bool = True  # False: the output failed the contract check here (never chosen)


@dataclass(frozen=True)
class Band:
    min_width: int
    max_width: Optional[int]
    backend: str
    score: float  # geometric-mean slowdown vs the per-point best (1.0 = fastest everywhere)
    points: int


@dataclass(frozen=True)
class Threshold:
    threshold: int
    below: str
    above: str
    cost: float  # mean log-slowdown over the points (0.0 = optimal everywhere)
    points: int
    crossover: bool  # False when one backend wins on both sides


def _points(ms: Iterable[Measurement], family: str) -> dict[tuple, dict[str, float]]:
    pts: dict[tuple, dict[str, float]] = defaultdict(dict)
    for m in ms:
        if m.family != family:
            continue
        if not (m.us > 0 and math.isfinite(m.us)):
            raise ValueError(f"measurements: {m} has a non-positive or non-finite time")
        if m.ok:  # a wrong output is no timing to compare
            pts[(m.rows, m.length, m.width)][m.backend] = m.us
    return pts


def _complete(pts: dict[tuple, dict[str, float]]) -> list[str]:
    """Backends measured at every point (only those can be compared fairly)."""
    names = None
    for times in pts.values():
        names = set(times) if names is None else names & set(times)
    return sorted(names or ())


def decode_bands(ms: Iterable[Measurement]) -> list[Band]:
    """Winner per measured width, merged into [min_width, max_width) bands."""
    pts = _points(ms, "decode")
    widths = sorted({w for (_, _, w) in pts})
    winners = []
    for w in widths:
        sub = {p: t for p, t in pts.items() if p[2] == w}
        names = _complete(sub)
        if not names:
            raise ValueError(f"measurements: no backend was measured at every decode point of width {w}")
        scores = {
            b: math.exp(sum(math.log(t[b] / min(t[n] for n in names)) for t in sub.values()) / len(sub))
            for b in names
        }
        best = min(names, key=lambda b: (round(scores[b], 12), b))
        winners.append((w, best, scores[best], len(sub)))
    bands: list[Band] = []
    for i, (w, best, score, n) in enumerate(winners):
        lo = 0 if i == 0 else w
        if bands and bands[-1].backend == best:
            prev = bands.pop()
            lo, n, score = prev.min_width, prev.points + n, max(prev.score, score)
        bands.append(Band(lo, None, best, score, n))
    return [Band(b.min_width, bands[i + 1].min_width if i + 1 < len(bands) else None, b.backend, b.score, b.points)
            for i, b in enumerate(bands)]


def prefill_threshold(ms: Iterable[Measurement]) -> Threshold:
    """Best single threshold on max_seqlen_k and the backend on each side."""
    pts = _points(ms, "prefill")
    names = _complete(pts)
    if not names:
        raise ValueError("measurements: no backend was measured at every prefill point")
    best_at = {p: min(t[n] for n in names) for p, t in pts.items()}
    lengths = sorted({p[1] for p in pts})
    # Candidate t: the long side is max_seqlen_k >= t. t above every length = never long.
    candidates = lengths + [lengths[-1] + 1]
    best = None
    for t in candidates:
        for below in names:
            for above in names:
                cost = sum(math.log(pts[p][above if p[1] >= t else below] / best_at[p]) for p in pts) / len(pts)
                # Ties: prefer one backend on both sides, then the larger threshold, then names.
                key = (round(cost, 12), below != above, -t, below, above)
                if best is None or key < best[0]:
                    best = (key, t, below, above, cost)
    _, t, below, above, cost = best
    if below == above or t == candidates[-1] or t == lengths[0]:
        only = above if t == lengths[0] else below
        return Threshold(P.AITER_MIN_PREFILL_SEQLEN, only, only, cost, len(pts), False)
    return Threshold(t, below, above, cost, len(pts), True)


def build_policy(ms: list[Measurement], platform: str, arch: str, meta: dict) -> P.Policy:
    """Calibrated rules (scoped to this platform and arch) ahead of the default rules."""
    bands = decode_bands(ms)
    thr = prefill_threshold(ms) if any(m.family == "prefill" for m in ms) else None
    decode = tuple(
        P.Rule(b.backend, f"calibrated on {meta.get('device', arch)}: fastest for W in "
               f"[{b.min_width}, {b.max_width or 'inf'}) (geo-mean slowdown {b.score:.2f} over {b.points} points)",
               platform=platform, arch=arch, min_width=b.min_width, max_width=b.max_width)
        for b in bands
    ) + P.DEFAULT.decode
    prefill = P.DEFAULT.prefill
    threshold = P.DEFAULT.prefill_threshold
    if thr is not None:
        why = f"calibrated on {meta.get('device', arch)}: mean log-slowdown {thr.cost:.3f} over {thr.points} points"
        prefill = (P.Rule(thr.above, why + " (long side)", platform=platform, arch=arch, long=True),
                   P.Rule(thr.below, why + " (short side)", platform=platform, arch=arch, long=False)) + prefill
        threshold = thr.threshold
    full_meta = {**meta, "decode_bands": [asdict(b) for b in bands],
                 "prefill": asdict(thr) if thr else None,
                 "measurements": [asdict(m) for m in ms]}
    return P.Policy(decode, prefill, threshold, False, f"calibrated-{meta.get('device', arch)}", full_meta)


# ---------------------------------------------------------------- row bands (issue 46)

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

    @property
    def regret_us(self) -> float:
        return self.chosen_us - self.best_us

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
    if not names:
        raise ValueError(f"measurements: no backend was measured right at every L of the mix at rows = {rows}, "
                         f"W = {width}")
    return {b: sum(w * pts[(rows, L, width)][b] for L, w in mix.items()) for b in sorted(names)}


def decode_row_bands(ms: Iterable[Measurement], mix: Optional[dict[int, float]] = None) -> list[RowBand]:
    """Per width, the least expected time per measured row count, adjacent equal winners merged
    into row bands; a band ends right past its last measured row count (rows between two
    measured counts with different winners take the larger count's winner: both the cuda
    kernel and vLLM's cooperative kernel change plans past 64 rows, which a power-of-two grid
    measures on each side);
    adjacent widths with the same row bands merged into width bands; then, for a width band
    with several row bands, its symbolic-rows fallback."""
    ms = list(ms)
    mix = context_mix(ms, mix)
    pts = _points(ms, "decode")
    wrong = {(m.width, m.backend) for m in ms if m.family == "decode" and not m.ok}
    widths = sorted({w for (_, _, w) in pts})
    per_width = []  # (width, [(row_lo, row_hi, backend, rows)], expected per row count)
    for w in widths:
        counts = sorted({r for (r, _, ww) in pts if ww == w})
        exp = {r: _expected(pts, wrong, r, w, mix) for r in counts}
        runs: list[list] = []
        for r in counts:
            best = min(exp[r], key=lambda b: (exp[r][b], b))
            if runs and runs[-1][2] == best:
                runs[-1][3].append(r)
            else:  # a new band starts right past the last measured row count of the one before
                runs.append([0 if not runs else runs[-1][3][-1] + 1, None, best, [r]])
        for a, b in zip(runs, runs[1:]):
            a[1] = b[0]
        per_width.append((w, [(lo, hi, b, tuple(rs)) for lo, hi, b, rs in runs], exp))
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
            out.append(RowBand(lo_w, hi_w, 0, None, _fallback(exps), tuple(sorted({r for e in exps for r in e})),
                               tuple(ws), fallback=True))
    return out


def _fallback(exps: list[dict]) -> str:
    """The backend with the least geometric-mean slowdown over every (width, rows) point given,
    among those that are candidates at all of them."""
    points = [e for exp in exps for e in exp.values()]
    names = sorted(set.intersection(*(set(e) for e in points)))
    if not names:
        raise ValueError("measurements: no backend is a candidate at every row count of a width band")
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
    for (r, L, w) in sorted(pts):
        c = chosen(bands, r, w)
        if c not in pts[(r, L, w)]:
            continue  # chosen for the mix, not timed at this L
        best = min(pts[(r, L, w)], key=lambda b: (pts[(r, L, w)][b], b))
        out.append(Regret(w, r, L, c, pts[(r, L, w)][c], best, pts[(r, L, w)][best]))
    for (r, w) in sorted({(r, w) for (r, _, w) in pts}):
        c = chosen(bands, r, w)
        if all((r, L, w) in pts and c in pts[(r, L, w)] for L in mix):
            oracle = sum(wt * min(pts[(r, L, w)].values()) for L, wt in mix.items())
            out.append(Regret(w, r, "mix", c, sum(wt * pts[(r, L, w)][c] for L, wt in mix.items()), "(per-L best)",
                              oracle))
    return out


def regret_table(rows: list[Regret]) -> str:
    """Markdown: one line per shape, the mix lines after each (width, rows) group."""
    head = "| W | rows | L | chosen | chosen us | best | best us | regret us | chosen / best |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    key = lambda g: (g.width, g.rows, g.length == "mix", g.length if g.length != "mix" else 0)  # noqa: E731
    for g in sorted(rows, key=key):
        lines.append(f"| {g.width} | {g.rows} | {g.length} | {g.chosen} | {g.chosen_us:.1f} | {g.best} | "
                     f"{g.best_us:.1f} | {g.regret_us:+.1f} | {g.ratio:.3f} |")
    return "\n".join(lines)


def build_row_policy(ms: list[Measurement], platform: str, arch: str, meta: dict,
                     mix: Optional[dict[int, float]] = None, k: Optional[int] = None) -> P.Policy:
    """Calibrated decode rules by width and row band (:func:`decode_row_bands`), scoped to this
    platform, arch and (when given) k, then the prefill threshold's two rules, ahead of the
    default rules; the measurements, bands, mix and regret go under ``meta``."""
    mix = context_mix(ms, mix)
    bands = decode_row_bands(ms, mix)
    dev = meta.get("device", arch)
    label = mix_label(mix)
    decode = []
    for b in bands:
        where = f"W in [{b.min_width}, {b.max_width or 'inf'})"
        if b.fallback:
            why = (f"calibrated on {dev}: a symbolic row count across the row bands, {where}: least geo-mean "
                   f"slowdown over rows {list(b.rows)} (context mix {label})")
        else:
            why = (f"calibrated on {dev}: least expected time over the context mix {label} for rows in "
                   f"[{b.min_rows}, {b.max_rows or 'inf'}), {where} (measured rows {list(b.rows)})")
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
                 "decode_row_bands": [asdict(b) for b in bands], "prefill": asdict(thr) if thr else None,
                 "regret": [{**asdict(g), "regret_us": round(g.regret_us, 3)} for g in regrets],
                 "measurements": [asdict(m) for m in ms]}
    return P.Policy(tuple(decode) + P.DEFAULT.decode, prefill, threshold, False, f"calibrated-{dev}", full_meta)

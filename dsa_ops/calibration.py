"""From timings to a policy: the crossover finding behind ``dsa-ops calibrate``.

Pure functions of a list of :class:`Measurement` (no GPU here), so the logic is tested
on synthetic timings and is deterministic: the same timings always give the same policy.

Decode graphs cannot see the live length, but they do see the row count (a captured graph
is captured for one batch size): ``dsa_ops.calibration_rows`` decides per (width, row count)
from a context mix, which is what ``dsa-ops calibrate`` writes. Here: the
measurements, the prefill threshold, and :func:`build_policy`, the earlier width-only method (per width, the least geometric-mean slowdown over all rows and
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

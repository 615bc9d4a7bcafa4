"""The backend policy as data: which backend serves which call, decided from host facts.

A :class:`Policy` holds ordered decode and prefill rules. A rule matches on platform,
device arch, k, compress_ratio, a width band and (prefill only) the side of the
``max_seqlen_k`` threshold. The first matching rule whose backend is available and
supports the call wins; rules naming unavailable backends are skipped, and the reason is
kept for ``dsa-ops explain``. ``reference`` always serves as the last resort.

Nothing here reads device data, so a choice holds for every replay of a captured graph.
Policies load from JSON (see ``docs/policy.md``); ``current()`` is the default policy or
the file named by ``DSA_OPS_POLICY``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch

from dsa_ops.backends import get as get_backend
from dsa_ops.backends.base import Query, Support  # noqa: F401  (Query re-exported)

ENV_VAR = "DSA_OPS_POLICY"
# Measured on gfx950 by vLLM PR #61943: AITER's top-k wins prefill once a chunk's
# longest row reaches 32K tokens (the gate is inclusive).
AITER_MIN_PREFILL_SEQLEN = 32_768
PLATFORMS = ("cuda", "rocm", "cpu", "*")


@dataclass(frozen=True)
class Rule:
    """One routing rule. ``None`` / ``"*"`` fields match anything."""

    backend: str
    why: str = ""
    platform: str = "*"  # "cuda" | "rocm" | "cpu" | "*"
    arch: str = "*"  # prefix of the device arch: "gfx950", "sm_90", ...
    k: Optional[int] = None
    compress_ratio: Optional[int] = None
    min_width: int = 0  # inclusive
    max_width: Optional[int] = None  # exclusive
    long: Optional[bool] = None  # prefill: True = max_seqlen_k >= threshold, False = below

    def matches(self, facts: "Facts", long: Optional[bool] = None) -> bool:
        return self.matches_but_band(facts, long) and self.band_holds(facts)

    def matches_but_band(self, facts: "Facts", long: Optional[bool] = None) -> bool:
        return (
            self.platform in ("*", facts.platform)
            and (self.arch == "*" or facts.arch.startswith(self.arch))
            and self.k in (None, facts.k)
            and self.compress_ratio in (None, facts.compress_ratio)
            and (self.long is None or self.long == long)
        )

    def band_holds(self, facts: "Facts") -> bool:
        """Whether every width the call may have lies in [min_width, max_width): the width
        itself, or for a symbolic width (``facts.width`` None) its whole value range
        ``facts.width_bounds`` (dynamo's ShapeEnv range, bounded by ``mark_dynamic(min=,
        max=)``). An unbounded range holds in no band with a ``max_width``, so such a rule
        is skipped, never applied to widths outside its band."""
        lo, hi = (facts.width, facts.width) if facts.width is not None else facts.width_bounds
        return lo >= self.min_width and (self.max_width is None or (hi is not None and hi < self.max_width))


@dataclass(frozen=True)
class Facts:
    """Host facts a choice is made from (never device data)."""

    platform: str
    arch: str
    device_type: str
    k: int
    compress_ratio: int = 1
    width: Optional[int] = None  # None when symbolic
    stable: bool = False
    width_bounds: tuple[int, Optional[int]] = (0, None)  # symbolic width: [lo, hi] inclusive, hi None = unbounded


@dataclass(frozen=True)
class Choice:
    backend: str
    reason: str
    skipped: tuple[str, ...] = ()  # rules that matched but could not serve, with why


@functools.lru_cache(maxsize=None)
def device_platform(device_type: str) -> tuple[str, str]:
    """(platform, arch) of the current device of ``device_type``: ("rocm", "gfx950"), ("cuda", "sm_90"), ("cpu", "")."""
    if device_type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        if torch.version.hip:
            return "rocm", str(getattr(props, "gcnArchName", "gfx")).split(":")[0]
        return "cuda", f"sm_{props.major}{props.minor}"
    return ("cpu", "") if device_type == "cpu" else (device_type, "")


def facts_for(device: torch.device | str, k: int, compress_ratio: int = 1, width: Optional[int] = None,
              stable: bool = False, width_bounds: tuple[int, Optional[int]] = (0, None)) -> Facts:
    dtype = torch.device(device).type
    platform, arch = device_platform(dtype)
    return Facts(platform, arch, dtype, k, compress_ratio, width, stable, width_bounds)


@dataclass(frozen=True)
class Policy:
    """Routing rules for both families; frozen, hashable, JSON round-trippable."""

    decode: tuple[Rule, ...]
    prefill: tuple[Rule, ...]
    prefill_threshold: int = AITER_MIN_PREFILL_SEQLEN
    stable: bool = False
    name: str = "default"
    meta: dict = field(default_factory=dict, compare=False, hash=False)  # provenance, measurements

    def choose(self, family: str, facts: Facts, long: Optional[bool] = None) -> Choice:
        """First matching rule whose backend can serve; ``reference`` if none can.

        Reasons number the rules from 1, as docs/policy.md's table does (rule i is entry
        i - 1 of the family's JSON list).
        """
        skipped = []
        rules = self.decode if family == "decode" else self.prefill
        for i, rule in enumerate(rules, 1):
            if not rule.matches(facts, long):
                if facts.width is None and rule.matches_but_band(facts, long):
                    lo, hi = facts.width_bounds
                    skipped.append(f"rule {i} ({rule.backend}): the width is symbolic in [{lo}, "
                                   f"{'inf' if hi is None else hi}], not inside the band [{rule.min_width}, "
                                   f"{'inf' if rule.max_width is None else rule.max_width})")
                continue
            query = Query(family, facts.device_type, facts.k, facts.width, facts.stable, facts.compress_ratio)
            try:
                sup = get_backend(rule.backend).check(query)
            except ValueError as exc:  # rule names a backend that is not registered
                sup = Support(False, str(exc))
            if sup:
                return Choice(rule.backend, f"{family} rule {i}: {rule.why or rule.backend}", tuple(skipped))
            skipped.append(f"rule {i} ({rule.backend}): {sup.reason}")
        return Choice("reference", "no rule could serve; reference is the last resort", tuple(skipped))

    def is_long(self, max_seqlen_k: int) -> bool:
        return max_seqlen_k >= self.prefill_threshold

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for fam in ("decode", "prefill"):
            d[fam] = [{k: v for k, v in r.items() if v != getattr(Rule, k, object())} for r in d[fam]]
        return d

    def content_hash(self) -> str:
        """sha256 over everything that routes (rules, threshold, stable); not name/meta."""
        body = {k: v for k, v in self.to_dict().items() if k not in ("name", "meta")}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def backends_named(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.backend for r in self.decode + self.prefill))


_DEFAULT_DECODE = (
    Rule("aiter", "vLLM PR #61943: AITER wins DSA decode at k=2048 on gfx950 (81 -> 28 us/layer at 128K)",
         platform="rocm", arch="gfx950", k=2048, compress_ratio=1),
    Rule("vllm", "vLLM in-tree kernel on ROCm where the AITER gate does not apply", platform="rocm"),
    Rule("cuda", "dsa-ops CUDA radix select (clusters; one CTA a row for short rows and many rows): faster than "
         "triton at 22 of 24 calibrated decode shapes on the H200 (docs/benchmarks/h200-policy.md)",
         platform="cuda", arch="sm_90"),
    Rule("triton", "dsa-ops Triton radix select", platform="cuda"),
    Rule("triton", "dsa-ops Triton radix select (ROCm without AITER / vLLM)", platform="rocm"),
    Rule("reference", "pure PyTorch reference"),
)
_DEFAULT_PREFILL = (
    Rule("aiter", "vLLM PR #61943: AITER wins prefill once max_seqlen_k >= 32768 on gfx950",
         platform="rocm", arch="gfx950", k=2048, compress_ratio=1, long=True),
    Rule("vllm", "vLLM in-tree kernel wins short prefill chunks on ROCm", platform="rocm"),
    Rule("cuda", "dsa-ops CUDA kernel (topk_solo, one CTA a row) wins prefill at every chunk on the H200 "
         "(C = 16K / 128K: 0.55 / 3.49 ms; triton 1.07 / 4.50, vLLM 0.70 / 5.04)", platform="cuda", arch="sm_90"),
    Rule("triton", "dsa-ops Triton radix select", platform="cuda"),
    Rule("triton", "dsa-ops Triton radix select (ROCm without AITER / vLLM)", platform="rocm"),
    Rule("reference", "pure PyTorch reference"),
)
DEFAULT = Policy(decode=_DEFAULT_DECODE, prefill=_DEFAULT_PREFILL)


def from_dict(d: dict[str, Any], source: str = "<dict>") -> Policy:
    """Build and validate a policy; ValueError names the offending field."""
    if not isinstance(d, dict):
        raise ValueError(f"policy ({source}): expected a JSON object, got {type(d).__name__}")
    known = {f.name for f in dataclasses.fields(Policy)}
    extra = set(d) - known
    if extra:
        raise ValueError(f"policy ({source}): unknown field(s) {sorted(extra)}; known: {sorted(known)}")
    rule_fields = {f.name: f for f in dataclasses.fields(Rule)}
    families = {}
    for fam in ("decode", "prefill"):
        rules = d.get(fam, [dataclasses.asdict(r) for r in getattr(DEFAULT, fam)])
        if not isinstance(rules, list):
            raise ValueError(f"policy ({source}): {fam}: expected a list of rules")
        out = []
        for i, r in enumerate(rules):
            where = f"policy ({source}): {fam}[{i}]"
            if not isinstance(r, dict) or "backend" not in r:
                raise ValueError(f"{where}: expected an object with a 'backend' field, got {r!r}")
            bad = set(r) - set(rule_fields)
            if bad:
                raise ValueError(f"{where}: unknown field(s) {sorted(bad)}; known: {sorted(rule_fields)}")
            if r.get("platform", "*") not in PLATFORMS:
                raise ValueError(f"{where}.platform: expected one of {PLATFORMS}, got {r['platform']!r}")
            for name in ("k", "compress_ratio", "max_width", "min_width"):
                v = r.get(name)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                    raise ValueError(f"{where}.{name}: expected a non-negative int or null, got {v!r}")
            if fam == "decode" and r.get("long") is not None:
                raise ValueError(f"{where}.long: only prefill rules may name a threshold side")
            if not isinstance(r["backend"], str):
                raise ValueError(f"{where}.backend: expected a backend name (a string), got {r['backend']!r}")
            try:
                get_backend(r["backend"])
            except ValueError as exc:  # "backend: no backend named ...; registered: [...]"
                raise ValueError(f"{where}.{exc}") from None
            for name in ("why", "platform", "arch"):
                if name in r and not isinstance(r[name], str):
                    raise ValueError(f"{where}.{name}: expected a string, got {r[name]!r}")
            if r.get("long") is not None and not isinstance(r["long"], bool):
                raise ValueError(f"{where}.long: expected true, false or null, got {r['long']!r}")
            out.append(Rule(**r))
        families[fam] = tuple(out)
    thr = d.get("prefill_threshold", AITER_MIN_PREFILL_SEQLEN)
    if isinstance(thr, bool) or not isinstance(thr, int) or thr < 0:
        raise ValueError(f"policy ({source}): prefill_threshold: expected a non-negative int, got {thr!r}")
    stable = d.get("stable", False)
    if not isinstance(stable, bool):
        raise ValueError(f"policy ({source}): stable: expected true or false, got {stable!r}")
    meta = d.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueError(f"policy ({source}): meta: expected an object, got {meta!r}")
    return Policy(families["decode"], families["prefill"], thr, stable, str(d.get("name", source)), meta)


def load(path: str | os.PathLike) -> Policy:
    """Read a policy JSON file (format: ``docs/policy.md``)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"policy: cannot read {os.fspath(path)!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"policy: {os.fspath(path)!r} is not valid JSON: {exc}") from None
    return from_dict(data, source=os.fspath(path))


def save(policy: Policy, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(policy.to_dict(), f, indent=2, sort_keys=False)
        f.write("\n")


_override: list[Policy] = []

# What the pass API's ``policy`` arguments accept (checked by :func:`resolve`).
PolicyArg = Optional[Union[Policy, str, os.PathLike]]


def current() -> Policy:
    """The policy in force: :func:`use`'s innermost, else ``$DSA_OPS_POLICY``, else :data:`DEFAULT`."""
    if _override:
        return _override[-1]
    path = os.environ.get(ENV_VAR)
    if not path:
        return DEFAULT
    try:  # one stat a call (the file is read again when it changes)
        mtime = os.stat(path).st_mtime
    except OSError:  # load() says what is wrong with the path
        mtime = 0.0
    return _load_cached(path, mtime)


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, mtime: float) -> Policy:
    return load(path)


def resolve(policy: PolicyArg, argument: str = "policy", *, none_ok: bool = True) -> Optional[Policy]:
    """``policy`` as a :class:`Policy`, checked where it is passed rather than at compile time.

    A Policy is returned as is, a path (str or os.PathLike) is read with :func:`load` now,
    and None stays None (it means :func:`current`, read later) when ``none_ok``.

    Raises:
        dsa_ops.validate.ArgumentError: (a ValueError) naming ``argument``: a path with no
            file, or a value of another type. A file that is not a valid policy raises
            :func:`load`'s ValueError, which names the file and the field.
    """
    from dsa_ops.validate import ArgumentError

    if isinstance(policy, Policy) or (policy is None and none_ok):
        return policy
    if isinstance(policy, (str, os.PathLike)):
        path = os.fspath(policy)
        if not os.path.isfile(path):
            why = "is a directory" if os.path.isdir(path) else "does not exist"
            where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()!r})"
            raise ArgumentError(f"{argument}: policy file {path!r} {why}{where}")
        return load(path)
    expected = "a dsa_ops.policy.Policy, a path to a policy JSON file (str or os.PathLike)"
    shown = repr(policy) if len(repr(policy)) <= 80 else repr(policy)[:77] + "..."
    raise ArgumentError(f"{argument}: expected {expected}{' or None' if none_ok else ''}, "
                        f"got {type(policy).__name__} {shown}")


class use:
    """Context manager: make ``policy`` (a Policy or a JSON path) current inside the block."""

    def __init__(self, policy: Policy | str | os.PathLike) -> None:
        self.policy = resolve(policy, none_ok=False)

    def __enter__(self) -> Policy:
        _override.append(self.policy)
        return self.policy

    def __exit__(self, *exc: object) -> None:
        _override.remove(self.policy)

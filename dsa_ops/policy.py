"""The backend policy as data: which backend serves which call, decided from host facts.

A :class:`Policy` holds ordered decode and prefill rules. A rule matches on platform,
device arch, k, compress_ratio, a width band, a row band and (prefill only) the side of the
``max_seqlen_k`` threshold. The first matching rule whose backend is available and
supports the call wins; rules naming unavailable backends are skipped, and the reason is
kept for ``dsa-ops explain``. ``reference`` always serves as the last resort.

Nothing here reads device data, so a choice holds for every replay of a captured graph. The
row count is a host fact too: a captured graph is captured for one batch size (or, compiled
with dynamic rows, for the range dynamo bounds), and an eager call sees its tensor.
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
from dsa_ops.validate import ArgumentError

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
    min_rows: int = 0  # inclusive
    max_rows: Optional[int] = None  # exclusive

    def matches(self, facts: "Facts", long: Optional[bool] = None) -> bool:
        return self.matches_but_band(facts, long) and self.band_holds(facts) and self.rows_hold(facts)

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
        return _inside(facts.width, facts.width_bounds, self.min_width, self.max_width)

    def rows_hold(self, facts: "Facts") -> bool:
        """Whether every row count the call may have lies in [min_rows, max_rows), as
        :meth:`band_holds` for the width: the row count itself, or for a symbolic one
        (``facts.rows`` None) its whole range ``facts.rows_bounds``. A rule without a row
        band (0, None) holds for any row count, known or not."""
        return _inside(facts.rows, facts.rows_bounds, self.min_rows, self.max_rows)

    def band_misses(self, facts: "Facts") -> list[str]:
        """Why a symbolic width or row count keeps this rule from applying ([] when neither does)."""
        out = []
        for what, value, (lo, hi), band in (("width", facts.width, facts.width_bounds, (self.min_width, self.max_width)),
                                            ("row count", facts.rows, facts.rows_bounds, (self.min_rows, self.max_rows))):
            if value is None and not _inside(None, (lo, hi), *band):
                out.append(f"the {what} is symbolic in [{lo}, {_inf(hi)}], not inside the "
                           f"{'band' if what == 'width' else 'row band'} [{band[0]}, {_inf(band[1])})")
        return out


def _inf(v: Optional[int]) -> str:
    return "inf" if v is None else str(v)


def _inside(value: Optional[int], bounds: tuple[int, Optional[int]], low: int, high: Optional[int]) -> bool:
    """[lo, hi] (``value`` itself when known; hi None = unbounded) lies inside [low, high)."""
    lo, hi = (value, value) if value is not None else bounds
    return lo >= low and (high is None or (hi is not None and hi < high))


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
    rows: Optional[int] = None  # None when symbolic or not known
    rows_bounds: tuple[int, Optional[int]] = (0, None)  # symbolic rows: [lo, hi] inclusive, hi None = unbounded


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
              stable: bool = False, width_bounds: tuple[int, Optional[int]] = (0, None), rows: Optional[int] = None,
              rows_bounds: tuple[int, Optional[int]] = (0, None)) -> Facts:
    dtype = torch.device(device).type
    platform, arch = device_platform(dtype)
    return Facts(platform, arch, dtype, k, compress_ratio, width, stable, width_bounds, rows, rows_bounds)


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
        """First matching rule whose backend can serve; ``reference`` if none can. A backend
        with a known fault on legal input (``Backend.faults``) never serves a policy's choice.

        Reasons number the rules from 1, as docs/policy.md's table does (rule i is entry
        i - 1 of the family's JSON list).
        """
        skipped = []
        rules = self.decode if family == "decode" else self.prefill
        for i, rule in enumerate(rules, 1):
            if not rule.matches(facts, long):
                if rule.matches_but_band(facts, long):
                    skipped.extend(f"rule {i} ({rule.backend}): {why}" for why in rule.band_misses(facts))
                continue
            query = Query(family, facts.device_type, facts.k, facts.width, facts.stable, facts.compress_ratio)
            try:
                record = get_backend(rule.backend)
                sup = record.check(query)
                if sup and record.faults:
                    sup = Support(False, f"known to fault on legal input, so no policy picks it: {record.faults}")
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

# Shipped calibrated policies, chosen by :func:`default_choice`: on Hopper, the one
# calibrated with vLLM's kernels among the candidates where those kernels load (the vLLM
# route's case: never slower than stock vLLM), else the one calibrated without them. Built by
# ``python -m lab.ship_policies`` from one ``dsa-ops calibrate`` run on an H100.
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "policies")
HOPPER_VLLM = "hopper-vllm.json"
HOPPER = "hopper.json"
VLLM_KERNELS = ("vllm_persistent", "vllm_cooperative")  # what "vLLM's kernels are available" means


@dataclass(frozen=True)
class DefaultChoice:
    """The policy this host gets by default, the file it came from (None: the built-in
    rules, :data:`DEFAULT`) and why."""

    policy: Policy
    why: str
    path: Optional[str] = None


def default_choice(platform: Optional[str] = None, arch: Optional[str] = None, vllm: Optional[bool] = None,
                   folder: Optional[str] = None) -> DefaultChoice:
    """Which policy is the default here: a shipped Hopper policy (with or without vLLM's kernels,
    by whether they load), else the built-in rules. The arguments override the host's facts (tests)."""
    if platform is None:
        platform, arch = device_platform("cuda")
    arch = arch or ""
    if platform != "cuda" or not arch.startswith("sm_90"):
        here = f"{platform} {arch}" if arch else "this host, where no CUDA GPU is visible"
        return DefaultChoice(DEFAULT, f"built-in rules: no shipped policy for {here}; the shipped ones are for "
                                      f"Hopper (sm_90)")
    why_vllm = ""
    if vllm is None:
        missing = [f"{n}: {a.reason}" for n in VLLM_KERNELS for a in [get_backend(n).availability()] if not a]
        vllm, why_vllm = not missing, "; ".join(missing)
    name = HOPPER_VLLM if vllm else HOPPER
    side = "with vLLM's kernels (they load here)" if vllm else ("without vLLM's kernels" + (
        f" (not available: {why_vllm})" if why_vllm else ""))
    path = os.path.join(folder or SHIPPED_DIR, name)
    if not os.path.exists(path):
        return DefaultChoice(DEFAULT, f"built-in rules: {arch}, {side}, but no measured {name} is shipped yet")
    return DefaultChoice(load(path), f"{name}: calibrated on Hopper, {side}", path)


@functools.lru_cache(maxsize=1)
def _default_here() -> DefaultChoice:
    return default_choice()


def default() -> Policy:
    """The default policy on this host (:func:`default_choice`, decided once per process)."""
    return _default_here().policy


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
            for name in ("k", "compress_ratio", "max_width", "min_width", "max_rows", "min_rows"):
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
            for name in ("min_width", "min_rows"):
                if r.get(name) is None and name in r:
                    raise ValueError(f"{where}.{name}: expected a non-negative int, got null")
            for low, high in (("min_width", "max_width"), ("min_rows", "max_rows")):
                if r.get(high) is not None and r.get(high) <= r.get(low, 0):
                    raise ValueError(f"{where}.{high}: expected more than {low} ({r.get(low, 0)}), got {r[high]} "
                                     f"(an empty band)")
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
    """The policy in force: :func:`use`'s innermost, else ``$DSA_OPS_POLICY``, else :func:`default`
    (a shipped calibrated policy on Hopper, once measured; :data:`DEFAULT` elsewhere)."""
    if _override:
        return _override[-1]
    path = os.environ.get(ENV_VAR)
    if not path:
        return default()
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

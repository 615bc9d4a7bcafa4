"""Putting :class:`passes.IndexerTopKPass` into vLLM's compile pipeline.

Two ways in (``docs/vllm.md``):

* :func:`add_to_compilation_config`: the supported path. It returns a vLLM
  ``CompilationConfig`` (or the dict of its fields) whose
  ``inductor_compile_config["post_grad_custom_post_pass"]`` runs whatever pass was
  there, then ours. vLLM's ``PostGradPassManager`` appends that entry to its own pass
  list and folds its uuid into the manager's uuid and the compile-cache hash.
* :func:`register`: the ``vllm.general_plugins`` entry point. vLLM calls it with no
  arguments in every process. It always registers the ``dsa_ops`` ops; with
  ``DSA_OPS_VLLM_ROUTE=1`` it installs the eager route of :mod:`passes.vllm_route`; only with
  ``DSA_OPS_VLLM_PASS=1`` does it also install the pass, by wrapping
  ``VllmConfig.__post_init__`` so every ``VllmConfig`` built afterwards in that process
  gets it. A plugin gets no handle on the config (it runs before process 0 builds one),
  so this hook is the only way a plugin can reach it; it is opt-in for that reason.

vLLM is imported lazily, inside the functions. ``passes`` imports ``dsa_ops``, never the
reverse.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Optional, TypeVar

from dsa_ops.policy import Policy, PolicyArg, resolve

PASS_KEY = "post_grad_custom_post_pass"
ENV_VAR = "DSA_OPS_VLLM_PASS"
_HOOK_MARK = "_dsa_ops_vllm_hook"

C = TypeVar("C")


def opted_in() -> bool:
    """Whether ``DSA_OPS_VLLM_PASS`` asks the plugin to install the pass ("1": yes; unset, "" or "0": no)."""
    from passes.vllm_route import env_switch

    return env_switch(ENV_VAR)


def _compose(existing: Any, policy: Optional[Policy]) -> Any:
    """A ``VllmComposedPass``: ``existing``'s passes (minus any IndexerTopKPass), then ours."""
    from passes._vllm_inductor import VllmComposedPass
    from passes.indexer_topk import IndexerTopKPass

    if existing is None:
        members: list[Any] = []
    elif isinstance(existing, VllmComposedPass):
        members = list(existing.foreign())  # a second install replaces our pass, keeps theirs
    elif isinstance(existing, IndexerTopKPass):
        members = []
    elif callable(existing):
        members = [existing]
    else:
        raise ValueError(
            f"config: inductor_compile_config[{PASS_KEY!r}] is a {type(existing).__name__}, "
            f"not a graph pass; cannot compose with it"
        )
    return VllmComposedPass([*members, IndexerTopKPass(policy)])


def _has_ours(existing: Any) -> bool:
    from passes._vllm_inductor import VllmComposedPass

    return isinstance(existing, VllmComposedPass) and existing.topk_pass is not None


def install(compilation_config: Any, policy: PolicyArg = None, *, replace: bool = True) -> None:
    """Install the pass into a vLLM ``CompilationConfig`` in place.

    Args:
        compilation_config: a ``vllm.config.CompilationConfig``.
        policy: the :class:`dsa_ops.policy.Policy` or a policy JSON path (read here, once);
            None reads ``dsa_ops.policy.current()`` (``$DSA_OPS_POLICY`` or the default)
            whenever the pass runs or is hashed.
        replace: if our pass is already there, replace it (True) or leave it (False).

    A pass named in ``inductor_passes[PASS_KEY]`` has already been resolved into
    ``inductor_compile_config`` by vLLM; it is composed with ours and the name removed,
    so a later re-validation cannot put it back in place of the composition.
    """
    policy = resolve(policy)
    icc = compilation_config.inductor_compile_config
    if not isinstance(icc, dict):
        raise ValueError(f"compilation_config: inductor_compile_config must be a dict, got {type(icc).__name__}")
    existing = icc.get(PASS_KEY)
    if not replace and _has_ours(existing):
        return
    icc[PASS_KEY] = _compose(existing, policy)
    if PASS_KEY in (compilation_config.inductor_passes or {}):
        compilation_config.inductor_passes = {
            k: v for k, v in compilation_config.inductor_passes.items() if k != PASS_KEY
        }


def add_to_compilation_config(config: C, policy: PolicyArg = None) -> C:
    """A copy of ``config`` whose post-grad hook also runs :class:`passes.IndexerTopKPass`.

    Args:
        config: a ``vllm.config.CompilationConfig``, or a dict of its fields (what
            ``LLM(compilation_config=...)`` and ``EngineArgs`` accept). Not modified.
        policy: the routing policy: a :class:`dsa_ops.policy.Policy` or a policy JSON path
            (read here, once, and carried in the config to every vLLM process); None reads
            ``dsa_ops.policy.current()`` at compile time, in each process.

    Returns:
        The same type: a deep-copied ``CompilationConfig``, or a new dict (other entries
        shared). Any pass already under ``post_grad_custom_post_pass`` runs first; a
        previous dsa_ops pass is replaced, not doubled.

    Raises:
        ValueError: ``policy`` is none of those, or names no file (an ArgumentError naming
            it, raised before vLLM is imported); ``config`` is neither; its
            ``inductor_compile_config`` is not a dict; a
            dict names ``inductor_passes["post_grad_custom_post_pass"]`` (vLLM would resolve
            that name later and overwrite the composition: build the ``CompilationConfig``
            first and pass that instead).

    Example:
        >>> llm = vllm.LLM(model, compilation_config=add_to_compilation_config({"mode": 3}))  # doctest: +SKIP
    """
    policy = resolve(policy)
    if isinstance(config, dict):
        if PASS_KEY in (config.get("inductor_passes") or {}):
            raise ValueError(
                f"config: inductor_passes[{PASS_KEY!r}] would replace the composed pass when vLLM "
                f"resolves it; build vllm.config.CompilationConfig(**config) first and pass that"
            )
        icc = config.get("inductor_compile_config") or {}
        if not isinstance(icc, dict):
            raise ValueError(f"config: inductor_compile_config must be a dict, got {type(icc).__name__}")
        icc = dict(icc)
        icc[PASS_KEY] = _compose(icc.get(PASS_KEY), policy)
        return {**config, "inductor_compile_config": icc}  # type: ignore[return-value]
    try:
        from vllm.config import CompilationConfig
    except ImportError as exc:
        raise ValueError(f"config: got a {type(config).__name__}, but vLLM does not import: {exc}") from None
    if not isinstance(config, CompilationConfig):
        raise ValueError(
            f"config: expected a vllm.config.CompilationConfig or a dict of its fields, got {type(config).__name__}"
        )
    new = copy.deepcopy(config)
    install(new, policy)
    return new


def _hook_vllm_config() -> bool:
    """Wrap ``VllmConfig.__post_init__`` (once) to install the pass; False if already wrapped."""
    from vllm.config import VllmConfig

    original = VllmConfig.__post_init__
    if getattr(original, _HOOK_MARK, False):
        return False

    @functools.wraps(original)
    def __post_init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        install(self.compilation_config, None, replace=False)

    setattr(__post_init__, _HOOK_MARK, True)
    VllmConfig.__post_init__ = __post_init__
    return True


def register() -> None:
    """``vllm.general_plugins`` entry point (``dsa_ops = "passes.vllm:register"``).

    Registers the ``dsa_ops`` ops in this process. With ``DSA_OPS_VLLM_PASS=1`` it also
    installs the pass into the current ``VllmConfig`` (if one is set) and into every
    ``VllmConfig`` built later in this process, leaving any pass already there in place
    and running it first. With ``DSA_OPS_VLLM_ROUTE=1`` it routes stock vLLM's DSA indexer
    top-k through dsa-ops eagerly (:mod:`passes.vllm_route`; the path for DeepSeek-V3.2 /
    GLM-5, which vLLM 0.33.0 never compiles). The policy is ``dsa_ops.policy.current()``
    (``$DSA_OPS_POLICY``). Safe to call more than once (vLLM loads plugins in every process).
    """
    import dsa_ops  # noqa: F401  (registers the ops and the built-in backends)
    from passes import vllm_route

    if vllm_route.opted_in():
        vllm_route.install_for_current_platform()
    if not opted_in():
        return
    _hook_vllm_config()
    from vllm.config import get_current_vllm_config_or_none

    current = get_current_vllm_config_or_none()
    if current is not None:
        install(current.compilation_config, None, replace=False)


__all__ = ["PASS_KEY", "ENV_VAR", "add_to_compilation_config", "install", "register", "opted_in"]

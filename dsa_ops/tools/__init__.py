"""Tools that ship with the package and run as modules (not imported by ``dsa_ops`` itself).

``python -m dsa_ops.tools.build_vllm_topk`` builds vLLM 0.33.0's indexer top-k ops from its
source release against the installed torch (docs/vllm-kernels.md); its C++ glue is
:mod:`dsa_ops.tools.vllm_topk_glue`. The kernel-development probes live outside the package,
in the repository's ``lab/`` folder (``python -m lab.<probe>`` from a checkout).
"""

"""Developer tools that ship with dsa-ops (not imported by ``dsa_ops``; run as modules).

Device (CUDA): ``python -m dsa_ops.devtools.probe_radix OUT.json [sections]`` times kernel
variants, ``floor_probe`` the steps of a decode top-k on their own, ``read_probe`` a prefill
chunk's read alone, ``ncu_radix`` drives one kernel launch for Nsight Compute
(``dsa_ops/devtools/ncu_radix.sh`` collects the reports, ``ncu_stalls`` groups their stall
samples by loop). No GPU: ``offline_sass`` compiles the radix kernel for sm_90 and reports
registers, spills and the read loop; ``floor_probe --selfcheck`` and ``read_probe --selfcheck``
run their kernels under ``TRITON_INTERPRET=1``. ``build_vllm_topk`` builds vLLM 0.33.0's
top-k ops from its source release (docs/vllm-kernels.md), ``vllm_real_check`` sweeps them for
ties and special values, ``host_cost`` times an eager call's host cost, ``vllm_route_bench`` (in vLLM's venv) a
routed vLLM call's.
"""


def help_requested(doc: str | None) -> None:
    """For the tools that read ``sys.argv`` by hand: ``-h`` / ``--help`` prints the tool's
    docstring and exits 0, before the tool touches the GPU or its arguments."""
    import sys

    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print((doc or "").strip())
        sys.exit(0)

"""The lab: kernel-development probes and the measurement history, outside the wheel.

Nothing here ships: ``pyproject.toml`` packages ``dsa_ops*`` and ``passes*`` only, and
``dsa_ops`` never imports ``lab``. Run the probes from a checkout's root as modules, with the
package installed (``pip install -e .``): ``python -m lab.<probe>``.

Device (CUDA): ``python -m lab.probe_radix OUT.json [sections]`` times Triton kernel
variants, ``floor_probe`` the steps of a decode top-k on their own, ``read_probe`` a prefill
chunk's read alone, ``ncu_radix`` drives one kernel launch for Nsight Compute
(``lab/ncu_radix.sh`` collects the reports, ``ncu_stalls`` groups their stall
samples by loop). ``cuda_floors`` times the CUDA floor kernels (``cuda_floors.cu``, read
next to it), ``cuda_topk_variants`` the ``cuda`` backend's launch plans and source variants
with per-phase clocks, ``cuda_split_replays`` checks and stamps eager launches of its split
plans, ``ncu_cuda_topk`` (with ``ncu_cuda_topk.sh``) profiles it. No GPU: ``offline_sass``
compiles the radix kernel for sm_90 and reports registers, spills and the read loop;
``floor_probe --selfcheck`` and ``read_probe --selfcheck`` run their kernels under
``TRITON_INTERPRET=1``. ``vllm_real_check`` sweeps vLLM's kernels (built by
``python -m dsa_ops.tools.build_vllm_topk``, which ships) for ties and special values,
``host_cost`` times an eager call's host cost, ``vllm_route_bench`` (in vLLM's venv) a routed
vLLM call's.

``lab/notes/`` holds the design history (the kernels' runs and variants), ``lab/history/``
the raw benchmark dumps those notes cite; ``docs/benchmarks/`` keeps the current results.
"""


def help_requested(doc: str | None) -> None:
    """For the tools that read ``sys.argv`` by hand: ``-h`` / ``--help`` prints the tool's
    docstring and exits 0, before the tool touches the GPU or its arguments."""
    import sys

    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print((doc or "").strip())
        sys.exit(0)

"""Developer probes for the Triton kernels (not imported by ``dsa_ops``; run as modules).

Device (CUDA): ``python -m dsa_ops.devtools.probe_radix OUT.json [sections]`` times kernel
variants, ``floor_probe`` the steps of a decode top-k on their own, ``read_probe`` a prefill
chunk's read alone, ``ncu_radix`` drives one kernel launch for Nsight Compute
(``dsa_ops/devtools/ncu_radix.sh`` collects the reports, ``ncu_stalls`` groups their stall
samples by loop). No GPU: ``offline_sass`` compiles the radix kernel for sm_90 and reports
registers, spills and the read loop; ``floor_probe --selfcheck`` and ``read_probe --selfcheck``
run their kernels under ``TRITON_INTERPRET=1``.
"""

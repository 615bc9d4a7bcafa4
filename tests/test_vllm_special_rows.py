"""Rows of -inf holding fewer than k finite keys and thousands of NaNs of either or both
signs, columns past L poisoned with +NaN / +inf, through every GPU backend.

Each call runs in a child process: a CUDA fault is sticky and ends the process that meets
it, so a faulting kernel fails its own test instead of the run. Every backend must give
rows of the contract's shape (min(L, k) distinct indices in [0, L), then -1); an ``exact``
backend must meet the contract itself. A backend whose record names a fault on such rows
(``Backend.faults``) is held to that finding instead: the test fails once the fault is
gone, so the record, the docs and the policies can be updated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dsa_ops
from dsa_ops.backends.base import Query

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
NAMES = ("vllm", "vllm_persistent", "vllm_cooperative", "cuda", "triton")
VARIANTS = ("neg_nan", "both_nan")

CHILD = """
import json, sys, torch, dsa_ops
from dsa_ops.testing import assert_decode_equivalent
from tests.specials import ISSUE_LENGTHS, NEG_NAN, POS_NAN, WIDTH, special_rows, structural
name, variant = sys.argv[1:3]
spec = {"neg_nan": {}, "both_nan": {"nan_bits": (NEG_NAN, POS_NAN)}, "no_tail": {"tail": False}}[variant]
x = special_rows(ISSUE_LENGTHS, **spec).cuda()
lens = torch.tensor(ISSUE_LENGTHS, dtype=torch.int32, device="cuda")
out = torch.full((len(ISSUE_LENGTHS), 2048), 0x7EADBEEF, dtype=torch.int32, device="cuda")
dsa_ops.topk_decode(x, lens, 2048, backend=name, out=out)
torch.cuda.synchronize()
rec = {"structural": structural(out, lens, WIDTH, 2048), "contract": ""}
try:
    assert_decode_equivalent(out, x, lens, 2048)
except AssertionError as e:
    rec["contract"] = str(e).splitlines()[0]
print(json.dumps(rec))
"""


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", NAMES)
def test_special_rows_never_fault_and_keep_the_contract_shape(name, variant):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rec = dsa_ops.backends()[name]
    sup = rec.check(Query("decode", "cuda", 2048, 133120))
    if not sup:
        pytest.skip(f"{name} cannot run here: {sup.reason}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", CHILD, name, variant], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    if rec.faults:
        assert p.returncode != 0 and "illegal memory access" in p.stderr, (
            f"{name} no longer faults on these rows ({variant}): update Backend.faults, "
            f"docs/vllm-kernels.md and the policies")
        return
    assert p.returncode == 0, f"{name} ({variant}) ended its process:\n{p.stderr[-2000:]}"
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["structural"] == "", f"{name} ({variant}): {got['structural']}"
    if rec.exact:
        assert got["contract"] == "", f"{name} ({variant}): {got['contract']}"

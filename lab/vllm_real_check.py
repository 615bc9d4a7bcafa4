"""Run vLLM's real top-k kernels through the dsa-ops backends on tie-heavy inputs and
record, per backend and case, whether the result meets the contract.

This is what decides each vLLM backend's ``exact`` flag (docs/vllm-kernels.md). Needs a
CUDA GPU and the ops (``dsa_ops.tools.build_vllm_topk``). Cases:

* value kinds: ``equal`` (every row constant), ``few`` (4 distinct values), ``fp16``
  (randn rounded to the fp16 grid: long runs of equal values around any cut), ``randn``,
  ``specials`` (NaN of both signs, +-inf, +-0, denormals: the contract's key order);
* rows 1 / 64 / 80 (80: cooperative hands it to persistent), live lengths 3K-128K, W
  133120 and 1M, lengths with negative and past-W entries mixed in;
* CUDA-graph replay: captured once per (backend, rows, W), replayed with new lengths.

    python -m lab.vllm_real_check --out ties.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from dsa_ops.testing import POISON

BACKENDS = ("vllm", "vllm_persistent", "vllm_cooperative")
KINDS = ("equal", "few", "fp16", "randn", "specials")
# fp32 bit patterns for "specials": NaN of both signs and two payloads, +-inf, +-0,
# denormals, +-max, and a few ordinary values; repeated, so they also tie.
SPECIAL_BITS = (0x7FC00000, 0x7FFFFFFF, 0xFFC00000, 0xFFFFFFFF, 0x7F800000, 0xFF800000, 0x00000000,
                0x80000000, 0x00000001, 0x80000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000,
                0x3F000000, 0x40000000)
ROWS = (1, 64, 80)
LENGTHS = (3072, 32768, 131072)
WIDTHS = (133120, 1048576)


def make_logits(kind: str, rows: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """(rows, width) float32 on the GPU, of one tie flavour (module docstring)."""
    if kind == "equal":
        return torch.full((rows, width), 0.25, device="cuda")
    if kind == "specials":
        pool = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in SPECIAL_BITS],
                            dtype=torch.int32, device="cuda")
        pick = torch.randint(0, len(SPECIAL_BITS), (rows, width), device="cuda", generator=gen)
        return pool[pick].view(torch.float32)
    if kind == "few":
        return torch.randint(-1, 3, (rows, width), device="cuda", generator=gen).float()
    x = torch.randn(rows, width, device="cuda", generator=gen)
    if kind == "fp16":
        return x.half().float()
    if kind == "randn":
        return x
    raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")


def make_lengths(rows: int, width: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``length`` for most rows; with 8+ rows also 0, -5, k, W + 9, 3W (clamp checks) and 2100."""
    lens = torch.full((rows,), min(length, width), dtype=torch.int32)
    extra = [0, -5, 2048, width + 9, 3 * width, length - 1, 2100]
    if rows >= 8:
        pos = torch.randperm(rows, generator=torch.Generator().manual_seed(rows + length))[: len(extra)]
        lens[pos] = torch.tensor(extra[: len(pos)], dtype=torch.int32)
    return lens.cuda()


def verdict(got: torch.Tensor, x: torch.Tensor, lengths: torch.Tensor, k: int) -> dict:
    """Contract check (dsa_ops.testing), plus how many valid slots hold -1 (unwritten)."""
    from dsa_ops import testing

    width = x.shape[1]
    m = lengths.to(torch.int64).clamp(0, width).clamp(max=k)
    slot = torch.arange(k, device=got.device)[None, :]
    unwritten = int(((slot < m[:, None]) & (got == -1)).sum())
    try:
        testing.assert_decode_equivalent(got, x, lengths, k)
    except AssertionError as exc:
        return {"ok": False, "why": str(exc).splitlines()[0], "unwritten": unwritten}
    return {"ok": True, "why": "", "unwritten": unwritten}


def eager_case(name: str, kind: str, rows: int, width: int, length: int, k: int = 2048) -> dict:
    import dsa_ops

    gen = torch.Generator(device="cuda").manual_seed(rows * 31 + length + width)
    x = make_logits(kind, rows, width, gen)
    lens = make_lengths(rows, width, length, torch.Generator().manual_seed(length))
    out = torch.full((rows, k), POISON, dtype=torch.int32, device="cuda")
    dsa_ops.topk_decode(x, lens, k, backend=name, out=out)
    torch.cuda.synchronize()
    return verdict(out, x, lens, k)


def graph_case(name: str, kind: str, rows: int, width: int, k: int = 2048) -> dict:
    """Capture one call, replay it with several new length sets; all must verify."""
    import dsa_ops
    from dsa_ops.benchmarking import capture

    gen = torch.Generator(device="cuda").manual_seed(rows + width)
    x = make_logits(kind, rows, width, gen)
    lens = torch.full((rows,), 4096, dtype=torch.int32, device="cuda")
    out = torch.empty(rows, k, dtype=torch.int32, device="cuda")
    graph = capture(lambda: dsa_ops.topk_decode(x, lens, k, backend=name, out=out))
    results = []
    for i, length in enumerate((3072, 131072, 0, 2049, 40_000, width)):
        lens.copy_(make_lengths(rows, width, length, torch.Generator().manual_seed(i)))
        out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        results.append(verdict(out, x, lens, k))
    bad = [r for r in results if not r["ok"]]
    return bad[0] if bad else {"ok": True, "why": "", "unwritten": sum(r["unwritten"] for r in results)}


def sweep(backends=BACKENDS, kinds=KINDS, rows=ROWS, lengths=LENGTHS, widths=WIDTHS) -> list[dict]:
    import dsa_ops
    from dsa_ops.backends.base import Query

    records = []
    for name in backends:
        rec = dsa_ops.backends()[name]
        for w in widths:
            sup = rec.check(Query("decode", "cuda", 2048, w))
            if not sup:
                records.append({"backend": name, "width": w, "skipped": sup.reason})
                continue
            for r in rows:
                for kind in kinds:
                    for length in lengths:
                        res = eager_case(name, kind, r, w, length)
                        records.append({"backend": name, "mode": "eager", "kind": kind, "rows": r, "width": w,
                                        "length": length, **res})
                    res = graph_case(name, kind, r, w)
                    records.append({"backend": name, "mode": "graph", "kind": kind, "rows": r, "width": w, **res})
                torch.cuda.empty_cache()
    return records


def summary(records: list[dict]) -> str:
    lines = ["| backend | cases | contract ok | failures (kind: count) | unwritten slots |", "|---|---|---|---|---|"]
    for name in dict.fromkeys(r["backend"] for r in records):
        rs = [r for r in records if r["backend"] == name and "ok" in r]
        fails: dict[str, int] = {}
        for r in rs:
            if not r["ok"]:
                fails[r["kind"]] = fails.get(r["kind"], 0) + 1
        lines.append(f"| {name} | {len(rs)} | {sum(r['ok'] for r in rs)} | "
                     f"{', '.join(f'{k}: {v}' for k, v in fails.items()) or '-'} | "
                     f"{sum(r['unwritten'] for r in rs)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.vllm_real_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="vllm-real-check.json", help="raw JSON of every case")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--kinds", default=",".join(KINDS), help=f"value kinds (default: {','.join(KINDS)})")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    records: list[dict] = []
    for name in (b for b in args.backends.split(",") if b):
        records += sweep(backends=[name], kinds=[k for k in args.kinds.split(",") if k])
        with open(args.out, "w") as f:  # after each backend, so a cut-off run keeps what it has
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records},
                      f, indent=1)
        print(summary([r for r in records if r["backend"] == name]), flush=True)
    for r in records:
        if r.get("ok") is False:
            print("FAIL", {k: v for k, v in r.items() if k != "ok"})
    return 0


if __name__ == "__main__":
    sys.exit(main())

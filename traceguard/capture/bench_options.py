"""The options of :mod:`traceguard.capture.bench_collectives`, without torch.

The benchmark needs torch; its command line does not, so ``traceguard bench-collectives --help``
can show every option on a machine without torch, from this one definition.
"""

from __future__ import annotations

import argparse
from pathlib import Path

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
#: torch dtype name (``torch.<name>``) -> the type name nccl-tests prints.
DTYPE_NAMES: dict[str, str] = {
    "float32": "float",
    "float16": "half",
    "bfloat16": "bfloat16",
    "float64": "double",
    "int32": "int32",
    "int64": "int64",
    "int8": "int8",
    "uint8": "uint8",
}
_SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``8``, ``64K``, ``1G`` (binary multiples, as nccl-tests' ``-b``/``-e``) -> bytes."""
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in _SUFFIX:
        return int(float(text[:-1]) * _SUFFIX[text[-1]])
    return int(text)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Collective benchmark with torch.distributed that prints nccl-tests' output format."
    )
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--min-bytes", type=parse_size, default=8)
    p.add_argument("--max-bytes", type=parse_size, default=1 << 30)
    p.add_argument("--factor", type=int, default=2, help="size multiplication factor between rows")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--cuda-graph", action="store_true", help="time a CUDA-graph replay of the iters ops")
    p.add_argument("--dtype", choices=sorted(DTYPE_NAMES), default="float32")
    p.add_argument("--backend", choices=["nccl", "gloo"], default=None)
    p.add_argument("--check", action="store_true", help="verify results once per size (#wrong column)")
    p.add_argument("--out", type=Path, default=None, help="also write the text output here (rank 0)")
    p.add_argument("--json", type=Path, default=None, help="write machine-readable rows here (rank 0)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in args.ops if o not in OPS]
    if unknown:
        p.error(f"unknown op(s) {unknown}; choose from {list(OPS)}")
    if args.factor < 2 or args.min_bytes <= 0 or args.max_bytes < args.min_bytes or args.iters < 1:
        p.error("need --factor >= 2, 0 < --min-bytes <= --max-bytes and --iters >= 1")
    return args

"""The long fuzz run, by hand: ``python -m tests.fuzz.run [--examples 10000] [--seed 1] [READER ...]``.

Prints one JSON line per reader (examples, outcomes, mutations, findings, seconds) and copies every
crashing input to ``--keep`` (default ``fuzz-findings/``) for triage; a crash becomes a committed
regression input under ``tests/fixtures/fuzz/<reader>/`` with the test in ``test_regressions.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.run")
    parser.add_argument("readers", nargs="*", help="readers to fuzz (default: all)")
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=Path("fuzz-findings"))
    parser.add_argument("--out", type=Path, help="append the JSON summaries to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tg-fuzz-") as tmp:
        os.environ["TRACEGUARD_CACHE_DIR"] = str(Path(tmp) / "cache")
        from tests.fuzz.targets import READERS, campaign

        failed = False
        for name in args.readers or list(READERS):
            result = campaign(
                name,
                args.examples,
                seed=args.seed,
                workdir=Path(tmp) / name,
                keep=args.keep,
                progress=lambda r: print(
                    f"  {r.reader}: {r.examples} examples, {dict(r.outcomes)}, {r.seconds:.0f} s", file=sys.stderr
                ),
            )
            summary = {
                "reader": name,
                "examples": result.examples,
                "seed": args.seed,
                "outcomes": dict(result.outcomes),
                "mutations": dict(result.mutations),
                "seconds": round(result.seconds, 1),
                "findings": [
                    {"example": f.example, "mutation": f.mutation, "error": f.error, "path": str(f.path)}
                    for f in result.findings
                ],
            }
            line = json.dumps(summary)
            print(line, flush=True)
            if args.out:
                with args.out.open("a") as fh:
                    fh.write(line + "\n")
            failed = failed or bool(result.findings)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

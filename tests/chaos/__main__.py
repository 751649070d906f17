"""`python -m tests.chaos --seed N --duration S`: one chaos run; prints the report; exit 1 on a violation."""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
from pathlib import Path

from .harness import chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos")
    parser.add_argument("--seed", type=int, default=None, help="default: a random seed (printed)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load and faults")
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--runs", type=int, default=1, help="consecutive seeded runs (seed, seed+1, ...)")
    parser.add_argument("--report", type=Path, default=None, help="write the JSON reports here")
    parser.add_argument("--keep", type=Path, default=None, help="keep logs and records under this directory")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    failed = False
    reports = []
    for i in range(args.runs):
        print(f"chaos run {i + 1}/{args.runs}: seed {seed + i} (replay: --seed {seed + i})", flush=True)
        if args.keep is not None:
            workdir = args.keep / f"seed-{seed + i}"
            shutil.rmtree(workdir, ignore_errors=True)  # a cluster must not start on another's stores
            workdir.mkdir(parents=True)
            report = asyncio.run(chaos(seed + i, args.duration, workdir, keys=args.keys))
        else:
            with tempfile.TemporaryDirectory(prefix="plexus-chaos-") as tmp:
                report = asyncio.run(chaos(seed + i, args.duration, Path(tmp), keys=args.keys))
        print(report.summary(), flush=True)
        for detail in report.details:
            print(f"  violation: {detail}", flush=True)
        reports.append(report.to_json())
        failed = failed or not report.ok
    if args.report is not None:
        args.report.write_text("[\n" + ",\n".join(reports) + "\n]\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

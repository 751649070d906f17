"""`python -m tests.chaos --seed N --duration S`: one chaos run; prints the report; exit 1 on a violation."""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
from pathlib import Path

from deploy.local.netns import netns_available

from .harness import chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos")
    parser.add_argument("--seed", type=int, default=None, help="default: a random seed (printed)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load and faults")
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--runs", type=int, default=1, help="consecutive seeded runs (seed, seed+1, ...)")
    parser.add_argument("--report", type=Path, default=None, help="write the JSON reports here")
    parser.add_argument("--keep", type=Path, default=None, help="keep logs and records under this directory")
    parser.add_argument(
        "--netns",
        choices=("auto", "on", "off"),
        default="auto",
        help="every process on its own network-namespace host, with `cut_host` faults (auto: when root)",
    )
    args = parser.parse_args(argv)
    why_not = netns_available()
    if args.netns == "on" and why_not:
        parser.error(f"--netns on: {why_not}")
    netns = args.netns == "on" or (args.netns == "auto" and why_not is None)
    where = "network namespaces (cut_host faults on)" if netns else f"loopback ({why_not or 'netns off'})"
    print(f"hosts: {where}", flush=True)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    failed = False
    reports = []
    for i in range(args.runs):
        print(f"chaos run {i + 1}/{args.runs}: seed {seed + i} (replay: --seed {seed + i})", flush=True)
        if args.keep is not None:
            workdir = args.keep / f"seed-{seed + i}"
            shutil.rmtree(workdir, ignore_errors=True)  # a cluster must not start on another's stores
            workdir.mkdir(parents=True)
            report = asyncio.run(chaos(seed + i, args.duration, workdir, keys=args.keys, netns=netns))
        else:
            with tempfile.TemporaryDirectory(prefix="plexus-chaos-") as tmp:
                report = asyncio.run(chaos(seed + i, args.duration, Path(tmp), keys=args.keys, netns=netns))
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

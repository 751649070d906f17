"""`python -m tests.fuzz [--messages N] [--seed S] [--workdir DIR]`: run the fuzz harness once (see
docs/fuzzing.md). Prints the seed first, so a failing run can be replayed exactly."""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

from .found import found_inputs
from .harness import FuzzFailure, fuzz, replay


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument(
        "--messages", type=int, default=20_000, help="fuzzed messages to send (default 20,000)"
    )
    parser.add_argument("--seed", type=int, default=None, help="replay this seed (default: a random one)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep server store and service logs here")
    parser.add_argument(
        "--keep-going", action="store_true", help="record failures and go on (until a process exits)"
    )
    parser.add_argument(
        "--found",
        action="store_true",
        help="replay the inputs in tests/fuzz/found.py instead",
    )
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error("--messages must be at least 1")
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    what = "the inputs of tests/fuzz/found.py" if args.found else f"seed {seed}, {args.messages} messages"
    print(f"fuzz: {what}", flush=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="plexus-fuzz-"))
    try:
        if args.found:
            report = asyncio.run(replay(found_inputs, workdir, args.keep_going))
        else:
            report = asyncio.run(fuzz(seed, args.messages, workdir, args.keep_going))
    except FuzzFailure as exc:
        print(f"fuzz: FAILED\n{exc}\nlogs in {workdir}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())

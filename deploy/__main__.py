"""``python -m deploy render [--check]``: write (or check) compose.yaml and k8s/ from deploy/spec.py."""

from __future__ import annotations

import argparse
import sys

from .render import DEPLOY, render_all, write_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy", description=__doc__)
    parser.add_argument("command", choices=("render",))
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file differs")
    args = parser.parse_args(argv)
    if args.check:
        stale = [
            rel
            for rel, text in render_all().items()
            if not (DEPLOY / rel).is_file() or (DEPLOY / rel).read_text() != text
        ]
        for rel in stale:
            print(f"deploy/{rel} is not what deploy/spec.py gives; run `python -m deploy render`")
        return 1 if stale else 0
    for path in write_all():
        print(f"wrote {path.relative_to(DEPLOY.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

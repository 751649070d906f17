"""One version for the five Plexus distributions: the repository's VERSION file is the source.

    python scripts/versions.py check        every member's [project].version and internal pin equal VERSION,
                                            and every member ships README.md and the repository's LICENSE
    python scripts/versions.py set 0.2.0    write VERSION, each member's version and its `== X.Y.Z` pins

Static versions (not a build hook) keep `uv build` of a member, its sdist and the workspace lock simple.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parents[1]
MEMBERS = (
    "libs/plexus-core",
    "libs/plexus-runtime",
    "libs/plexus-llm",
    "services/orchestrator",
    "services/gateway",
)
PREFIX = "plexus-kernel-"
# A dependency line (indented, in a list): never the `name = "..."` line.
_PIN = re.compile(r'(?m)^(\s+)"(plexus-kernel-[a-z]+)\s*(==\s*[^"]*)?"')
_NAME = re.compile(r"plexus-kernel-[a-z]+")


def _members() -> dict[str, Path]:
    return {
        tomllib.loads((REPO / m / "pyproject.toml").read_text())["project"]["name"]: REPO / m for m in MEMBERS
    }


def problems() -> list[str]:
    """Everything that disagrees with VERSION (empty: consistent)."""
    version = (REPO / "VERSION").read_text().strip()
    found = []
    names = _members()
    license_text = (REPO / "LICENSE").read_text()
    for name, path in names.items():
        project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
        if not _NAME.fullmatch(name):
            found.append(f"{path.name}: distribution {name!r} lacks the {PREFIX!r} prefix")
        if project["version"] != version:
            found.append(f"{name}: version {project['version']} != VERSION {version}")
        for dep in project.get("dependencies", []):
            bare = re.split(r"[\s<>=!~;\[]", dep, maxsplit=1)[0]
            if bare in names and dep.replace(" ", "") != f"{bare}=={version}":
                found.append(f"{name}: depends on {dep!r}, not {bare}=={version}")
        if not (path / "README.md").is_file():
            found.append(f"{name}: no README.md")
        if not (path / "LICENSE").is_file() or (path / "LICENSE").read_text() != license_text:
            found.append(f"{name}: LICENSE missing or not the repository's LICENSE")
    return found


def set_version(version: str) -> None:
    """Write ``version`` to VERSION and to every member's version and internal pins."""
    (REPO / "VERSION").write_text(version + "\n")
    for path in _members().values():
        pyproject = path / "pyproject.toml"
        text = re.sub(r'(?m)^version = "[^"]*"$', f'version = "{version}"', pyproject.read_text(), count=1)
        text = _PIN.sub(lambda m: f'{m.group(1)}"{m.group(2)}=={version}"', text)
        pyproject.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="versions", description=__doc__.splitlines()[0] if __doc__ else None
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="exit 1 when a member disagrees with VERSION")
    bump = sub.add_parser("set", help="set the version everywhere (then run `uv lock`)")
    bump.add_argument("version")
    args = parser.parse_args(argv)
    if args.command == "set":
        try:
            Version(args.version)
        except InvalidVersion:
            parser.error(f"not a PEP 440 version: {args.version!r}")
        set_version(args.version)
    found = problems()
    for line in found:
        print(f"versions: {line}", file=sys.stderr)
    if not found:
        print(f"versions: {len(MEMBERS)} distributions at {(REPO / 'VERSION').read_text().strip()}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

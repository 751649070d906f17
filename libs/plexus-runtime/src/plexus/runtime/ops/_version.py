"""The installed Plexus version, from the distribution's metadata (VERSION sets it for all five)."""

from __future__ import annotations

from importlib import metadata

__all__ = ["DISTRIBUTION", "installed_version"]

#: The distribution that ships `plexus.runtime`; the registry's `plexus-runtime` / `plexus-core` are not ours.
DISTRIBUTION = "plexus-kernel-runtime"


def installed_version() -> str:
    """The installed version of `DISTRIBUTION`, or "" when running from a source tree without metadata."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return ""

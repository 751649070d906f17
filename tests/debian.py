"""Debian packages a test needs at run time (Chromium, jemalloc), installed with apt-get when missing.

As root only; otherwise the test is skipped, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def ensure_debian_package(package: str, path: str) -> str:
    """``path``, installing Debian's ``package`` (which provides it) first if it is missing."""
    if os.path.exists(path):
        return path
    if os.geteuid() != 0:
        pytest.skip(
            f"{path} is missing and installing Debian's {package} needs root (apt-get install {package})"
        )
    if shutil.which("apt-get") is None:
        pytest.skip(f"{path} is missing and there is no apt-get to install {package} with")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, env=env, capture_output=True, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", package], check=True, env=env, capture_output=True, timeout=1200
    )
    if not os.path.exists(path):
        pytest.fail(f"apt-get installed {package} but {path} is still missing")
    return path

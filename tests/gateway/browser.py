"""Real headless Chromium for the dashboard test: Debian's `chromium` package driven by Playwright.

`playwright install` cannot download browsers here, so the Debian package is installed when it is missing
(as root; otherwise the test is skipped, saying why).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def ensure_chromium() -> str:
    """The path of a Chromium executable, installing Debian's package if needed."""
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.geteuid() != 0:
        pytest.skip(
            f"{CHROMIUM} is missing and installing Debian's chromium needs root (apt-get install chromium)"
        )
    if shutil.which("apt-get") is None:
        pytest.skip(f"{CHROMIUM} is missing and there is no apt-get to install it with")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, env=env, capture_output=True, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "chromium"], check=True, env=env, capture_output=True, timeout=1200
    )
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"apt-get installed chromium but {CHROMIUM} is still missing")
    return CHROMIUM

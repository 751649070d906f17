"""Real headless Chromium for the dashboard test: Debian's `chromium` package driven by Playwright.

`playwright install` cannot download browsers here, so the Debian package is installed when it is missing
(as root; otherwise the test is skipped, saying why).
"""

from __future__ import annotations

from tests.debian import ensure_debian_package

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
    return ensure_debian_package("chromium", CHROMIUM)

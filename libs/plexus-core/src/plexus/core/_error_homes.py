"""Where the KernelErrors of the other Plexus packages live, so that any process rebuilds them as their class.

An error crosses processes as its type name (`KernelError.to_wire`); the receiver finds the class in the
registry its definition filled in. A client that never imported ``plexus.llm`` has no `RateLimitError`
there, so when `KernelError.from_wire` meets a type it does not know, `import_error_packages` imports the
Plexus packages that define KernelErrors (those installed, each once) and the lookup is tried again.
plexus.core never imports upward at import time (the layers contract): the packages are named here as data.
Packages, not one entry per error type, so that a new error class needs no entry; tests/core/
test_error_homes.py checks that every KernelError subclass of the Plexus packages lives in one of them.
"""

from __future__ import annotations

import importlib
import logging
import sys

__all__ = ["ERROR_PACKAGES", "import_error_packages"]

log = logging.getLogger("plexus.core")

#: The public packages whose import defines every KernelError outside plexus.core.
ERROR_PACKAGES: tuple[str, ...] = ("plexus.runtime", "plexus.llm")

_unavailable: set[str] = set()  # failed to import: not tried again for every unknown error


def import_error_packages() -> bool:
    """Import the `ERROR_PACKAGES` not imported yet; True if one was. Never raises: the caller is decoding
    someone else's bytes, and a package that is not installed simply defines nothing here."""
    imported = False
    for name in ERROR_PACKAGES:
        if name in sys.modules or name in _unavailable:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # not installed, or broken: its errors stay RemoteKernelError
            _unavailable.add(name)
            log.info("cannot import %s to rebuild its errors: %s", name, exc)
            continue
        imported = True
    return imported

"""Where the KernelErrors of the other Plexus packages live, so that any process rebuilds them as their class.

An error crosses processes as its type name (`KernelError.to_wire`); the receiver finds the class in the
registry its definition filled in. A client that never imported ``plexus.llm`` has no `RateLimitError`
there, so when `KernelError.from_wire` meets a type it does not know, `import_error_packages` imports the
modules the installed distributions declare in the ``plexus.errors`` entry-point group (each once) and the
lookup is tried again. plexus.core names no package above it: each distribution says where its errors are,
as it says where its CLI commands are (``plexus.commands``). Modules, not one entry per error type, so that
a new error class needs no entry; tests/core/test_error_homes.py checks that every KernelError subclass of
the Plexus packages lives in a declared module.
"""

from __future__ import annotations

import importlib
import logging
import sys
from importlib.metadata import entry_points

__all__ = ["ENTRY_POINT_GROUP", "error_packages", "import_error_packages"]

log = logging.getLogger("plexus.core")

#: The entry-point group whose values name the modules that define KernelErrors outside plexus.core.
ENTRY_POINT_GROUP = "plexus.errors"

_unavailable: set[str] = set()  # failed to import: not tried again for every unknown error


def error_packages() -> tuple[str, ...]:
    """The modules the installed distributions declare in ``plexus.errors``."""
    return tuple(sorted({ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}))


def import_error_packages() -> bool:
    """Import the declared modules not imported yet; True if one was. Never raises: the caller is decoding
    someone else's bytes, and a module that cannot be imported simply defines nothing here."""
    imported = False
    for name in error_packages():
        if name in sys.modules or name in _unavailable:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # broken: its errors stay RemoteKernelError
            _unavailable.add(name)
            log.info("cannot import %s to rebuild its errors: %s", name, exc)
            continue
        imported = True
    return imported

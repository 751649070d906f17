"""Where the KernelErrors of the other Plexus packages live, so that any process rebuilds them as their class.

An error crosses processes as its type name (`KernelError.to_wire`); the receiver finds the class in the
registry its definition filled in. A client that never imported ``plexus.llm`` has no `RateLimitError` there,
so `KernelError.from_wire` asks `import_home` to import the type's package first, once, if it is installed.
plexus.core never imports upward at import time (the layers contract): the table names packages as data.
Keyed by the stable error_type (the class name); tests/core/test_error_homes.py checks that it covers every
KernelError subclass of the Plexus packages.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["ERROR_HOMES", "import_home"]

log = logging.getLogger("plexus.core")

_RUNTIME = "plexus.runtime"
_LLM = "plexus.llm"

#: error_type -> the public package whose import defines it.
ERROR_HOMES: Mapping[str, str] = MappingProxyType(
    {
        "ArtifactNotFoundError": _RUNTIME,
        "CheckpointConflictError": _RUNTIME,
        "InvalidRunRequest": _RUNTIME,
        "PayloadTooLargeError": _RUNTIME,
        "RunNotFoundError": _RUNTIME,
        "RunStateError": _RUNTIME,
        "ServiceUnavailableError": _RUNTIME,
        "TopologyConflictError": _RUNTIME,
        "ApprovalPendingError": _LLM,
        "AuthenticationError": _LLM,
        "BadRequestError": _LLM,
        "ContextTooLongError": _LLM,
        "ModelFinishedWithError": _LLM,
        "NoPendingApprovalError": _LLM,
        "ProviderError": _LLM,
        "ProviderProtocolError": _LLM,
        "ProviderUnavailableError": _LLM,
        "RateLimitError": _LLM,
        "ScriptExhaustedError": _LLM,
        "TranscriptTooLargeError": _LLM,
    }
)

_unavailable: set[str] = set()  # packages that failed to import: not tried again for every error


def import_home(error_type: str) -> bool:
    """Import the package that defines `error_type`; False when none is known, it was imported already (so
    the type is not its), or it is not installed. Never raises: the caller is decoding someone's bytes."""
    home = ERROR_HOMES.get(error_type)
    if home is None or home in sys.modules or home in _unavailable:
        return False
    try:
        importlib.import_module(home)
    except Exception as exc:  # not installed, or broken: the error stays a RemoteKernelError
        _unavailable.add(home)
        log.info("cannot import %s for %s: %s", home, error_type, exc)
        return False
    return True

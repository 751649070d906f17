"""An SDK client with the SDK's own retries off, made once per client.

Retries are Plexus's (`ProviderRetry`, then the run's RetryPolicy): the SDK's own would stack under them
(3 x 3 calls) and hide each failure from the journal and the logs, so the adapters call a ``max_retries=0``
copy of the client they are given. Adapters are usually built per activation (``lambda _id:
LLMAgent(OpenAIChatModel(client, ...))``), and a fresh copy is not free: ≈ 20 µs to make, and the SDK probes
the platform in a worker thread on a client's first request, so every activation's first model call paid a
thread hop. One copy per client, kept while the client lives, pays that once.
"""

from __future__ import annotations

import weakref
from typing import Any, TypeVar

__all__ = ["without_retries"]

_Client = TypeVar("_Client")

#: Client -> its ``max_retries=0`` copy. Weak keys: a dropped client takes its copy with it (the copy shares
#: the client's connection pool, not the client).
_copies: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def without_retries(client: _Client) -> _Client:
    """``client`` itself when its retries are off already or it has no ``with_options`` (a stand-in, such as
    the benchmarks' recording); else its ``with_options(max_retries=0)`` copy, the same one every time."""
    with_options = getattr(client, "with_options", None)
    if with_options is None or getattr(client, "max_retries", None) == 0:
        return client
    try:
        copy: _Client | None = _copies.get(client)
    except TypeError:  # not weakly referenceable: a copy of its own each time, as before
        return with_options(max_retries=0)  # type: ignore[no-any-return]
    if copy is None:
        copy = _copies[client] = with_options(max_retries=0)
    return copy

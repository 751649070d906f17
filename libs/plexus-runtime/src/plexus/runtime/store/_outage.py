"""Which failures are the cluster's (an outage: retry later) rather than the request's own."""

from __future__ import annotations

import nats.errors
import nats.js.errors

from plexus.core import KernelError

__all__ = ["ServiceUnavailableError", "is_nats_outage", "is_unavailable"]


# Defined here, below the orchestrator client that raises it, so that the topology (which asks
# `is_unavailable`) does not import the client: no import circle.
class ServiceUnavailableError(KernelError):
    """No instance of a Plexus service (e.g. the orchestrator) answered in time; `hint`: how to start one."""

    fields = ("service", "hint")
    recoverable = True

    def __init__(self, service: str, hint: str = "") -> None:
        self.service = service
        self.hint = hint
        super().__init__(f"no {service} instance answered; is it running?" + (f" {hint}" if hint else ""))


#: Raised by nats-py only: a handler that raises one met an outage through its context's calls.
_NATS_UNAVAILABLE = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.NoServersError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    ServiceUnavailableError,  # a Plexus service (the orchestrator) or its store did not answer
)
_UNAVAILABLE = (TimeoutError, *_NATS_UNAVAILABLE)  # ReplyTimeoutError is a TimeoutError too


def is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` is the cluster's failure rather than the message's: nobody answered in time, no
    JetStream response, a reconnect. Retrying the same message later can succeed."""
    return isinstance(exc, _UNAVAILABLE) or (isinstance(exc, nats.js.errors.APIError) and exc.code == 503)


def is_nats_outage(exc: BaseException) -> bool:
    """Like `is_unavailable`, for exceptions that escape a handler: only nats-py's own kinds count, so a
    handler's own `TimeoutError` (a slow third-party API) stays the handler's failure."""
    return isinstance(exc, _NATS_UNAVAILABLE) or (
        isinstance(exc, nats.js.errors.APIError) and exc.code == 503
    )

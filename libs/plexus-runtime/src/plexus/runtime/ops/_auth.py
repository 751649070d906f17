"""How a process proves who it is to NATS: user and password or a credentials file, TLS (with a client
certificate for mTLS), and its own reply-inbox prefix.

Every Plexus command reads the same environment variables (`NatsAuth.from_env`), so a worker, an
orchestrator, a gateway and `plexus runs` are secured the same way; `plexus security init` writes them per
role. Nothing set means the open development mode of `make run`.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ENV_VARS", "NatsAuth", "NatsAuthError"]

#: field -> environment variable
ENV_VARS = {
    "user": "PLEXUS_NATS_USER",
    "password": "PLEXUS_NATS_PASSWORD",
    "creds": "PLEXUS_NATS_CREDS",
    "tls_ca": "PLEXUS_NATS_TLS_CA",
    "tls_cert": "PLEXUS_NATS_TLS_CERT",
    "tls_key": "PLEXUS_NATS_TLS_KEY",
    "inbox_prefix": "PLEXUS_NATS_INBOX_PREFIX",
}
_INBOX_RE = re.compile(r"_INBOX(?:\.[A-Za-z0-9_-]+)+")


class NatsAuthError(ValueError):
    """Credential or TLS settings that cannot work together (the message names the setting)."""


class _DropSslEofWarning(logging.Filter):
    # asyncio warns on every TLS connection that nats-py's stream protocol asks to keep a half-closed socket
    # open (which TLS cannot do); it says nothing about the connection, yet every TLS process printed it.
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("returning true from eof_received()")


_SSL_EOF_FILTER = _DropSslEofWarning()


def _quiet_ssl_eof_warning() -> None:
    logging.getLogger("asyncio").addFilter(_SSL_EOF_FILTER)  # idempotent: a logger holds a filter once


@dataclass(frozen=True)
class NatsAuth:
    """Credentials and TLS settings for one NATS connection (all optional)."""

    user: str | None = None
    password: str | None = None
    creds: str | None = None  # a NATS credentials file (operator/JWT mode)
    tls_ca: str | None = None  # CA bundle that signed the servers' certificates (turns TLS on)
    tls_cert: str | None = None  # client certificate, for servers that verify clients (mTLS)
    tls_key: str | None = None
    #: This identity's reply inboxes, ``_INBOX.<name>``: a shared ``_INBOX.>`` would let every user that
    #: may subscribe to it read every other user's replies.
    inbox_prefix: str | None = None

    def __post_init__(self) -> None:
        if self.password is not None and self.user is None:
            raise NatsAuthError(f"a password needs a user ({ENV_VARS['user']})")
        if self.creds is not None and self.user is not None:
            raise NatsAuthError("use either a credentials file or a user and password, not both")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise NatsAuthError("a client certificate needs its key, and a key its certificate")
        if self.tls_cert is not None and self.tls_ca is None:
            raise NatsAuthError(f"a client certificate needs the servers' CA ({ENV_VARS['tls_ca']})")
        for name in ("creds", "tls_ca", "tls_cert", "tls_key"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise NatsAuthError(f"{ENV_VARS[name]}: no such file {path!r}")
        if self.inbox_prefix is not None and _INBOX_RE.fullmatch(self.inbox_prefix) is None:
            raise NatsAuthError(f"inbox prefix must look like _INBOX.<name>, got {self.inbox_prefix!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NatsAuth:
        """The settings of the ``PLEXUS_NATS_*`` variables (`ENV_VARS`); empty ones count as unset."""
        env = os.environ if env is None else env
        values = {field: env.get(var) or None for field, var in ENV_VARS.items()}
        return cls(**values)

    @property
    def is_open(self) -> bool:
        """No credentials and no TLS: the development mode."""
        return self == NatsAuth()

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.tls_ca is None:
            return None
        _quiet_ssl_eof_warning()
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        if self.tls_cert is not None and self.tls_key is not None:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        return context

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``."""
        options: dict[str, Any] = {}
        if self.user is not None:
            options["user"] = self.user
            options["password"] = self.password or ""
        if self.creds is not None:
            options["user_credentials"] = self.creds
        context = self.ssl_context()
        if context is not None:
            options["tls"] = context
        if self.inbox_prefix is not None:
            options["inbox_prefix"] = self.inbox_prefix
        return options

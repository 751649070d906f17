"""Configuration of every Plexus command from ``PLEXUS_*`` environment variables (pydantic-settings).

A command-line flag wins over its variable; a variable wins over the default. A bad value is refused at
start-up with the variable's name (`SettingsError`), before anything connects. `env_help` renders a
settings class as the "environment" section of a command's ``--help``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["NatsSettings", "SettingsError", "WorkerSettings", "env_help", "load_settings"]

_Port = Annotated[int, Field(ge=1, le=65535)]
_AnyPort = Annotated[int, Field(ge=0, le=65535)]  # 0: a free port, announced on stdout
_SCHEMES = ("nats://", "tls://", "ws://", "wss://")


class SettingsError(ValueError):
    """An environment variable has a value its setting cannot take."""


class NatsSettings(BaseSettings):
    """What every long-running Plexus process reads: where NATS is, and where to serve health and metrics.
    Credentials and TLS (``PLEXUS_NATS_USER``, ``..._CREDS``, ``..._TLS_CA``...) are `NatsAuth`'s."""

    model_config = SettingsConfigDict(env_prefix="PLEXUS_", extra="ignore")

    nats: Annotated[list[str], NoDecode] = Field(
        default=["nats://127.0.0.1:4222"],
        description="NATS seed URLs, comma-separated (every node of a cluster)",
    )
    health_port: _AnyPort | None = Field(
        default=None, description="serve /healthz and /readyz on this port (0: any free port)"
    )
    health_host: str = Field(default="127.0.0.1", description="address of the health endpoint")
    metrics_port: _Port | None = Field(default=None, description="serve Prometheus /metrics on this port")
    metrics_host: str = Field(default="127.0.0.1", description="address of the metrics endpoint")

    @field_validator("nats", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [url.strip() for url in value.split(",") if url.strip()]
        if isinstance(value, list):
            if not value:
                raise ValueError("at least one URL is needed")
            for url in value:
                if not (isinstance(url, str) and url.startswith(_SCHEMES)):
                    raise ValueError(f"expected nats:// URLs, got {url!r}")
        return value


class WorkerSettings(NatsSettings):
    """``plexus worker``: the flags of the same names override these."""

    concurrency: Annotated[int, Field(ge=1)] = Field(default=64, description="handlers running at once")
    replicas: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="create/reconcile streams and buckets with this many replicas"
    )
    ack_wait: Annotated[float, Field(gt=0)] = Field(default=30.0, description="seconds before a redelivery")
    lease_ttl: Annotated[float, Field(gt=0)] = Field(default=10.0, description="partition lease TTL, seconds")
    heartbeat_ttl: Annotated[float, Field(gt=0)] = Field(
        default=10.0, description="seconds without heartbeats before a worker is dead"
    )
    worker_id: str | None = Field(default=None, description="this worker's id (default: generated)")
    allocator: Literal["default", "jemalloc"] = Field(
        default="default",
        description="memory allocator: jemalloc gives memory back after a burst of activations (Linux)",
    )
    allocator_library: str | None = Field(
        default=None, description="path of the jemalloc library (default: found by the loader)"
    )


_S = TypeVar("_S", bound=BaseSettings)


def load_settings(cls: type[_S]) -> _S:
    """Read `cls` from the environment; a bad value raises `SettingsError` naming the variable."""
    try:
        return cls()
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        problems = "; ".join(
            f"{prefix}{'_'.join(str(p) for p in err['loc'][:1]).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise SettingsError(f"bad environment: {problems}") from None


def env_help(cls: type[BaseSettings]) -> str:
    """The environment variables of `cls`, one per line, for an argparse epilog."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    lines = ["environment (a flag of the same name wins):"]
    for name, info in cls.model_fields.items():
        default = info.default
        shown = ",".join(default) if isinstance(default, list) else default
        suffix = f" (default {shown})" if shown is not None else ""
        lines.append(f"  {prefix}{name.upper():<22} {info.description}{suffix}")
    return "\n".join(lines)

"""How every `plexus` command logs: the level of our own loggers, and text or JSON lines.

The ``plexus.*`` loggers log at INFO by default (a worker's failed handlers, an orchestrator's ended runs);
third-party loggers (nats, httpx, uvicorn...) stay at WARNING unless ``-v`` asks for everything at DEBUG.
``--log-format json`` writes one JSON object per line: ``ts``, ``level``, ``logger``, ``message``, plus the
structured fields a call passed as ``extra`` (``agent_id``, ``run_id``, ``status``, ``error_type``...).
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "JsonFormatter", "LogSettings", "configure_logging"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s %(message)s"
#: The attributes every `LogRecord` has: anything else on a record came from ``extra``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class LogSettings(BaseSettings):
    """``PLEXUS_LOG_LEVEL`` and ``PLEXUS_LOG_FORMAT`` (the global ``--log-level`` / ``--log-format`` win)."""

    model_config = SettingsConfigDict(env_prefix="PLEXUS_", extra="ignore")

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        default="INFO", description="level of the plexus.* loggers (third-party ones log at WARNING)"
    )
    log_format: Literal["text", "json"] = Field(default="text", description="text, or one JSON object a line")

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _fold_case(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        return value.strip().upper() if info.field_name == "log_level" else value.strip().lower()


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (ISO 8601, UTC), level, logger, message, then the ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "INFO", fmt: str = "text", verbose: bool = False) -> None:
    """Log to stderr: the ``plexus`` loggers at `level` (DEBUG with `verbose`), the others at WARNING (DEBUG
    with `verbose`), as text or JSON lines (`fmt`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    logging.getLogger("plexus").setLevel(logging.DEBUG if verbose else level)

"""Typed replies: a reply's `DataBlock` validated into a pydantic type, for Python callers.

``rt.send_message(..., output_type=T)`` and ``rt.run_result(run_id, output_type=T)`` return a ``T``
instead of blocks. Any agent that answers with a DataBlock qualifies (an ``LLMAgent(output_type=T)`` puts
its validated answer in one, ``schema_id`` the type's name); a reply without one, or whose data does not
validate, is a typed `ReplyValidationError`, never a bare pydantic error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ValidationError

from plexus.core import BaseBlock, DataBlock, KernelError, TextBlock

__all__ = ["ReplyValidationError", "typed_reply"]

T = TypeVar("T", bound=BaseModel)


class ReplyValidationError(KernelError):
    """A reply asked for as ``output_type`` carries no DataBlock, or its data does not validate into it;
    ``errors`` are pydantic's (without their input), ``blocks`` the reply's block types."""

    fields: ClassVar[tuple[str, ...]] = ("message", "output_type", "errors", "blocks")

    def __init__(
        self,
        message: str = "",
        output_type: str = "",
        errors: list[dict[str, Any]] | None = None,
        blocks: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.output_type = output_type
        self.errors = list(errors or [])
        self.blocks = list(blocks or [])


def typed_reply(blocks: Sequence[BaseBlock], output_type: type[T]) -> T:
    """The reply's data as an ``output_type``: the last DataBlock whose ``schema_id`` is the type's name,
    else the last DataBlock."""
    name = output_type.__name__
    data = [b for b in blocks if isinstance(b, DataBlock)]
    named = [b for b in data if b.schema_id == name]
    kinds = [b.type for b in blocks]
    if not data:
        text = " ".join(b.text for b in blocks if isinstance(b, TextBlock))[:200]
        raise ReplyValidationError(
            f"the reply carries no DataBlock to read as {name} (blocks: {kinds}; text: {text!r})",
            name,
            blocks=kinds,
        )
    block = (named or data)[-1]
    try:
        return output_type.model_validate(block.data)
    except ValidationError as exc:
        errors = [
            {"type": e["type"], "loc": list(e["loc"]), "msg": e["msg"]}
            for e in exc.errors(include_url=False, include_context=False, include_input=False)
        ]
        raise ReplyValidationError(
            f"the reply's data (schema_id {block.schema_id!r}) is not a valid {name}: {errors}",
            name,
            errors,
            kinds,
        ) from None

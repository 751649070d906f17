"""``send_message(..., output_type=T)``: any agent's DataBlock reply validated into a pydantic type; a reply
without one, or with data that does not validate, is a typed `ReplyValidationError` (never a bare pydantic
error), and the untyped call is unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from plexus.core import AgentId, BaseBlock, DataBlock, TextBlock
from plexus.runtime import Agent, App, Context, ReplyValidationError, Runtime


class Point(BaseModel):
    x: int
    y: int


class Answers(Agent):
    """Replies by the text it gets: a Point, another type's data before it, bad data, or text."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        text = blocks[0].text if isinstance(blocks[0], TextBlock) else ""
        if text == "point":
            return [DataBlock(data={"x": 1, "y": 2}, schema_id="Point")]
        if text == "two":
            return [
                DataBlock(data={"x": 3, "y": 4}, schema_id="Point"),
                DataBlock(data={"z": 0}, schema_id="Z"),
            ]
        if text == "bad":
            return [DataBlock(data={"x": "one"}, schema_id="Point")]
        return [TextBlock(text="no data here")]


async def test_a_data_reply_is_returned_as_the_type_and_a_bad_one_is_a_typed_error(
    runtime: Runtime, start_worker: Any
) -> None:
    app = App()
    app.register("answers", lambda _id: Answers())
    await start_worker(app)
    agent = AgentId("answers", "a1", app.namespace)

    async def ask(text: str) -> Point:
        return await runtime.send_message([TextBlock(text=text)], agent, output_type=Point, timeout=20)

    assert await ask("point") == Point(x=1, y=2)
    assert await ask("two") == Point(x=3, y=4)  # the block named after the type, not the last one
    with pytest.raises(ReplyValidationError) as bad:
        await ask("bad")
    assert bad.value.output_type == "Point"
    assert [(e["loc"], e["type"]) for e in bad.value.errors] == [(["x"], "int_parsing"), (["y"], "missing")]
    with pytest.raises(ReplyValidationError, match="no DataBlock") as text:
        await ask("text")
    assert text.value.blocks == ["text"]
    (block,) = await runtime.send_message([TextBlock(text="text")], agent, timeout=20)
    assert block == TextBlock(text="no data here")

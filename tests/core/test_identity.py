"""AgentId / TopicId: string forms, parsing, validation messages, immutability."""

from __future__ import annotations

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexus.core import AgentId, TopicId

names = st.from_regex(r"\A[A-Za-z0-9_\-.:=]{1,40}\Z")
keys = st.text(min_size=1, max_size=200)


def test_seed_examples() -> None:
    assert str(AgentId("react", "sess-123")) == "react/sess-123"
    assert str(TopicId("agent.progress", "run-abc")) == "agent.progress/run-abc"
    assert str(AgentId("react", "k", "prod")) == "prod/react/k"
    assert TopicId("t").source == "default"


@given(names, keys, names)
def test_agent_id_round_trips_through_its_string_form(type_: str, key: str, namespace: str) -> None:
    agent_id = AgentId(type_, key, namespace)
    assert AgentId.parse(str(agent_id)) == agent_id
    assert AgentId.model_validate_json(agent_id.model_dump_json()) == agent_id
    assert AgentId.model_validate(str(agent_id)) == agent_id


@given(names, keys, names)
def test_topic_id_round_trips(type_: str, source: str, namespace: str) -> None:
    topic = TopicId(type_, source, namespace)
    assert TopicId.parse(str(topic)) == topic


def test_keys_with_slashes_always_carry_the_namespace() -> None:
    agent_id = AgentId("web", "https://x.org/a")
    assert str(agent_id) == "default/web/https://x.org/a"
    assert AgentId.parse(str(agent_id)) == agent_id


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("noslash", "has no '/'"),
        ("/key", "agent type must not be empty"),
        ("type/", "agent key must not be empty"),
        ("bad type/k", "contains ' '"),
        ("ns!/t/k", "namespace 'ns!' contains '!'"),
        ("x" * 300 + "/k", "the limit is 255"),
    ],
)
def test_malformed_strings_name_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        AgentId.parse(text)


def test_non_string_input_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="expected a string"):
        AgentId.parse(42)  # type: ignore[arg-type]


def test_frozen_and_hashable() -> None:
    agent_id = AgentId("a", "b")
    with pytest.raises(pydantic.ValidationError):
        agent_id.key = "c"  # type: ignore[misc]
    assert {agent_id: 1}[AgentId("a", "b")] == 1
    assert len({AgentId("a", "b"), AgentId("a", "b"), AgentId("a", "c")}) == 2

"""Importing plexus.llm does not import the provider SDKs: a worker that serves only ScriptedModel agents, or
only one provider, does not pay seconds of start-up for the others (`anthropic` alone takes ≈ 2.5 s here)."""

from __future__ import annotations

from tests.imports import modules_after

SDKS = ("openai", "anthropic", "google.genai")


def test_importing_plexus_llm_imports_no_provider_sdk() -> None:
    assert modules_after("import plexus.llm", SDKS) == {
        "openai": False,
        "anthropic": False,
        "google.genai": False,
    }


def test_a_model_built_on_one_sdk_imports_that_sdk_only() -> None:
    code = "import openai, plexus.llm\nplexus.llm.OpenAIChatModel(openai.AsyncOpenAI(api_key='k'), 'm')"
    assert modules_after(code, SDKS) == {"openai": True, "anthropic": False, "google.genai": False}


def test_a_gemini_model_imports_the_google_genai_sdk_only() -> None:
    code = (
        "from google import genai\nimport plexus.llm\nplexus.llm.GeminiModel(genai.Client(api_key='k'), 'm')"
    )
    assert modules_after(code, SDKS) == {"openai": False, "anthropic": False, "google.genai": True}


def test_importing_plexus_llm_imports_no_a2a_sdk_until_a_remote_agent_is_used() -> None:
    code = "import plexus.llm\nplexus.llm.A2AAgent('http://127.0.0.1:9/a2a/x', 'token')"
    assert modules_after(code, ("a2a", "httpx")) == {"a2a": False, "httpx": False}

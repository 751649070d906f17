"""Importing plexus.llm does not import the provider SDKs: a worker that serves only ScriptedModel agents, or only
one provider, does not pay seconds of start-up for the others (`anthropic` alone takes ≈ 2.5 s here)."""

from __future__ import annotations

import json
import subprocess
import sys


def _modules_after(code: str) -> dict[str, bool]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in ('openai', 'anthropic')}}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    result: dict[str, bool] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_importing_plexus_llm_imports_no_provider_sdk() -> None:
    assert _modules_after("import plexus.llm") == {"openai": False, "anthropic": False}


def test_a_model_built_on_one_sdk_imports_that_sdk_only() -> None:
    code = "import openai, plexus.llm\nplexus.llm.OpenAIChatModel(openai.AsyncOpenAI(api_key='k'), 'm')"
    assert _modules_after(code) == {"openai": True, "anthropic": False}

"""After `import platoon`, the openreward SDK imports quietly and without its model clients,
which are the real packages once used."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_ors_environment_imports_without_the_anthropic_openai_and_google_clients() -> None:
    out = run("""
        import sys
        import platoon
        from openreward.environments import Environment, tool  # what an ORS env module does
        import openreward
        print(sorted(name for name in ("anthropic", "openai", "google.genai") if name in sys.modules))
        print(openreward.Rollout.__name__, issubclass(Environment, object))
    """)
    assert out.splitlines() == ["[]", "Rollout True"]


@pytest.mark.slow
def test_the_clients_are_the_real_packages_once_used() -> None:
    out = run("""
        import platoon
        import openreward
        from openreward.api.rollouts import rollout
        from openreward.chat_backends import openai as backend

        import anthropic, openai, google.genai
        from anthropic.types import MessageParam
        print(type(anthropic).__name__, type(openai).__name__, type(google.genai).__name__)
        print(rollout.AnthropicMessageParam.resolve() is MessageParam)
        print(backend.AsyncOpenAI.resolve() is openai.AsyncOpenAI)
        print(rollout.gdm_types.Content is google.genai.types.Content)
        client = backend.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
        print(isinstance(client, backend.AsyncOpenAI), isinstance(client, openai.AsyncOpenAI))
    """)
    assert out.splitlines() == ["module module module", "True", "True", "True", "True True"]


@pytest.mark.slow
def test_a_client_imported_before_the_sdk_is_used_as_it_is() -> None:
    out = run("""
        import openai
        import platoon
        from openreward.chat_backends import openai as backend
        print(backend.AsyncOpenAI is openai.AsyncOpenAI)
    """)
    assert out.strip() == "True"


def test_importing_platoon_quiets_the_sdk_unless_the_user_set_it() -> None:
    out = run("""
        import os
        os.environ["OPENREWARD_LOG_LEVEL"] = "DEBUG"
        import platoon
        print(os.environ["OPENREWARD_LOG_LEVEL"], os.environ["OPENREWARD_DISABLE_UPDATE_CHECK"])
    """)
    assert out.strip() == "DEBUG 1"

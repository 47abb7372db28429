"""`service: verifiers://ENV_ID`: a verifiers environment written in the tests
(`tests/envs/verifiers_env`), played by verifiers' own null harness in its subprocess runtime,
every model call through platoon's gateway, scored by the environment's rubric.

The worker's venv (Python 3.12, verifiers, uv) is built once per machine into the site cache;
the environment's package is put on the worker's import path (`paths`), not installed.
"""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path
from typing import Any

import pytest

from platoon.bus import Bus, running
from platoon.bus.events import (
    AgentProcessExited,
    BatchReady,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    Event,
    ModelCallFinished,
    TaskRef,
    new_id,
)
from platoon.credit import CreditConfig
from platoon.envs import EnvError, EnvService, TaskInfo, build_env_service
from platoon.gateway import Gateway, GatewayPolicy
from platoon.gateway.renderers import get_renderer
from platoon.harness.toolchain import find_python
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory
from platoon.train.batcher import CreditAssigner, CreditSettings

ENV_PACKAGE = Path(__file__).resolve().parents[1] / "verifiers_env"
NO_PYTHON = None if find_python("3.12") else "no Python 3.12 here (verifiers needs Python >= 3.12)"
needs_python = pytest.mark.skipif(NO_PYTHON is not None, reason=NO_PYTHON or "")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # verifiers' runtime is asyncio's; the worker is another process anyway


def kwargs(**more: Any) -> dict[str, Any]:
    return {"paths": [str(ENV_PACKAGE)], **more}


def solver(messages: list[dict[str, Any]]) -> str:
    """Sums answered right; the guessing game by binary search over its hints."""
    text = str(messages[-1]["content"])
    asked = re.search(r"What is (\d+) \+ (\d+)", text)
    if asked:
        return str(int(asked.group(1)) + int(asked.group(2)))
    lo, hi = 1, 9
    guesses = [int(m["content"]) for m in messages if m["role"] == "assistant"]
    hints = [m["content"] for m in messages if m["role"] == "user"][1:]
    for guess, hint in zip(guesses, hints, strict=False):
        lo, hi = (guess + 1, hi) if hint == "higher" else (lo, guess - 1)
    return str((lo + hi) // 2)


@pytest.mark.parametrize("runtime", ["prime", "modal", "e2b"])
def test_a_cloud_runtime_is_refused_in_one_line(runtime):
    with pytest.raises(EnvError) as caught:
        build_env_service("sums", "verifiers://platoon-vf-toy", service_kwargs=kwargs(runtime=runtime))
    message = str(caught.value)
    assert "\n" not in message and f"runtime {runtime!r}" in message and "account" in message


@pytest.mark.slow
@needs_python
@pytest.mark.anyio
async def test_a_harness_that_runs_the_models_commands_is_refused_in_one_line():
    service = build_env_service("sums", "verifiers://platoon-vf-toy", service_kwargs=kwargs(harness="bash"))
    with pytest.raises(EnvError) as caught:
        await service.backend.list_tasks("train")
    await service.backend.aclose()
    assert "\n" not in str(caught.value) and "harness bash runs the model's commands" in str(caught.value)


def service(env_id: str) -> EnvService:
    return build_env_service("vf", f"verifiers://{env_id}", service_kwargs=kwargs())


async def play(tokenizer: Any, env: EnvService, task_id: str, policy: Any = solver) -> list[Event]:
    """One episode of `task_id` played by the verifiers harness against a scripted policy."""
    entry = EntrySettings(name="vf", harness="verifiers", max_steps=8)
    components: list[Any] = [
        env,
        Gateway(
            GatewayPolicy(
                get_renderer("qwen3_instruct", tokenizer), ScriptedSamplerFactory(tokenizer, policy)
            ),
        ),
        EpisodeRunner([entry], request_timeout=120),
        Grader(),
        CreditAssigner(
            CreditSettings(group_size=1, batch_size=1, credit=CreditConfig(remove_constant_groups=False))
        ),
    ]
    episode_id, events = new_id(), []
    async with Bus() as bus, running(bus, components):
        async with bus.stream(Event, name="test:episode") as stream:
            task = TaskRef(env="vf", split="train", task_id=task_id)
            await bus.publish(EpisodeRequested(episode_id=episode_id, group_id=new_id(), task=task))
            async for event in stream:
                if getattr(event, "episode_id", None) == episode_id or isinstance(
                    event, AgentProcessExited | BatchReady
                ):
                    events.append(event)
                if isinstance(event, BatchReady):
                    break
        await bus.drained()
    return events


@pytest.mark.slow
@needs_python
@pytest.mark.anyio
async def test_tasks_are_listed_and_an_episode_is_scored_by_the_rubric_on_the_gateways_tokens(toy_tokenizer):
    env = service("platoon-vf-toy")
    started = time.monotonic()
    tasks = await env.backend.list_tasks("train")
    print(f"venv ready and worker loaded in {time.monotonic() - started:.1f} s")
    assert [(t.task_id, t.index) for t in tasks] == [("sum-2-3", 0), ("sum-4-5", 1), ("sum-10-7", 2)]
    assert tasks[0].spec["prompt"] == "What is 2 + 3? Reply with the number only."
    assert await env.backend.list_tasks("test") == [
        TaskInfo(split="test", task_id=t.task_id, index=t.index, spec=t.spec) for t in tasks
    ]

    started = time.monotonic()
    events = await play(toy_tokenizer, env, "sum-10-7")
    print(f"one single-turn episode in {time.monotonic() - started:.1f} s")

    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    assert finished.status == "completed", finished.reason
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    # the rubric: correct (weight 1) + brief (weight 0.5), each function's value a rule/ part
    assert graded.reward == 1.5
    assert graded.rewards["rule/correct"] == 1.0 and graded.rewards["rule/brief"] == 1.0
    [call] = [e for e in events if isinstance(e, ModelCallFinished)]
    # the tokens recorded are the ones the policy sampled: "17" and the stop token
    assert toy_tokenizer.decode(call.completion_tokens) == "17<|im_end|>"
    assert "What is 10 + 7?" in toy_tokenizer.decode(call.prompt_tokens)
    [batch] = [e for e in events if isinstance(e, BatchReady)]
    [datum] = batch.datums
    assert datum.num_trained_tokens == len(call.completion_tokens)
    assert datum.agent_id == call.agent_id


@pytest.mark.slow
@needs_python
@pytest.mark.anyio
async def test_a_multi_turn_environment_plays_the_user_and_its_calls_merge_into_one_datum(toy_tokenizer):
    started = time.monotonic()
    events = await play(toy_tokenizer, service("platoon-vf-guess"), "guess-3")
    print(f"one three-turn episode in {time.monotonic() - started:.1f} s")

    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    # guesses 5 (lower), 2 (higher), 3 (right): found, and few_guesses = 1 - 2/4
    assert [toy_tokenizer.decode(c.completion_tokens) for c in calls] == [
        "5<|im_end|>",
        "2<|im_end|>",
        "3<|im_end|>",
    ]
    assert graded.rewards["rule/found"] == 1.0 and graded.rewards["rule/few_guesses"] == 0.5
    assert graded.reward == 1.25
    # each prompt extends the last prompt and its completion: one datum trains all three
    for before, after in itertools.pairwise(calls):
        assert after.prompt_tokens[: len(before.prompt_tokens) + len(before.completion_tokens)] == [
            *before.prompt_tokens,
            *before.completion_tokens,
        ]
    [batch] = [e for e in events if isinstance(e, BatchReady)]
    [datum] = batch.datums
    assert datum.num_trained_tokens == sum(len(c.completion_tokens) for c in calls)


@pytest.mark.slow
@pytest.mark.torch
@needs_python
def test_a_training_step_on_the_tiny_model_runs_on_the_environment(tmp_path):
    pytest.importorskip("torch")
    import anyio

    from platoon.api import train
    from platoon.config import validate_config
    from platoon.testing.models import save_tiny_model

    model = save_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2, seed=0)
    config = {
        "environments": [
            {
                "name": "sums",
                "service": "verifiers://platoon-vf-toy",
                "harness": "verifiers",
                "service_kwargs": kwargs(),
            }
        ],
        "train": {
            "backend": "local",
            "model_name": str(model),
            "renderer_name": "qwen3_instruct",
            "lora_rank": 4,
            "batch_size": 1,
            "max_training_steps": 1,
            "save_every": 0,
            "workflow_config": {
                "group_size": 2,
                "remove_constant_reward_groups": False,
                "rollout_config": {"max_steps": 2, "inference_params": {"max_completion_tokens": 4}},
            },
        },
        "eval": {"every": 0},
    }
    started = time.monotonic()
    last = anyio.run(lambda: train(validate_config(config), run_dir=tmp_path / "run", console=False))
    print(f"one training step on the verifiers environment in {time.monotonic() - started:.1f} s")
    assert last["policy/version"] == 1
    assert last["train/datums"] == 2 and last["train/trained_tokens"] > 0
    # the rubric's functions are columns of the step's metrics
    assert last["episodes/graded"] == 2
    # the rubric's functions are columns of the step's metrics
    assert {"reward/rule/correct/mean", "reward/rule/brief/mean"} <= set(last)

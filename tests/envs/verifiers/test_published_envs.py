"""verifiers environments nobody here wrote, installed from the package index as a user would:
their tasks listed, an episode played by the environment's own rollout through platoon's gateway
and graded by its rubric, and one training step of the tiny model.

| package | its verifiers requirement | the venv's verifiers | API |
|---|---|---|---|
| staros-stardata[env] 0.1.1 (`stardata.envs.constraint_gym`) | >=0.1.8 | 0.2.0 (named) | classic |
| sophistry-bench-sprint 0.1.6 | >=0.1.14 | 0.2.0 (named) | classic |
| tasksets 0.1.4 | >=0.1.15.dev11 | 0.4.0 (resolved) | its import of verifiers.utils fails: said |

Both classic packages allow 0.4, which no longer has the classic API, so the entries name 0.2.0.
Each venv is built once into the site cache (about 2.5 minutes each here the first time).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_verifiers_service import NO_PYTHON, play

from platoon.bus.events import BatchReady, EpisodeFinished, EpisodeGraded, ModelCallFinished
from platoon.envs import EnvError, build_env_service

pytestmark = [pytest.mark.slow, pytest.mark.skipif(NO_PYTHON is not None, reason=NO_PYTHON or "")]

STARDATA = {"packages": ["staros-stardata[env]==0.1.1"], "verifiers": "0.2.0", "max_tasks": 4}
SOPHISTRY = {"packages": ["sophistry-bench-sprint==0.1.6"], "verifiers": "0.2.0", "max_tasks": 4}
HAIKU = "cold light on the sea\nthe keeper climbs the last stair\nhis lamp goes dark now"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("env_id", "kwargs", "reply", "reward_part"),
    [
        ("stardata.envs.constraint_gym", STARDATA, HAIKU, "rule/prosody_reward"),
        (
            "sophistry-bench-sprint",
            SOPHISTRY,
            "<claim>The article says so.</claim> <quote>he</quote>",
            "rule/aggregate_reward",
        ),
    ],
    ids=["staros-stardata", "sophistry-bench-sprint"],
)
async def test_a_published_classic_environment_is_listed_played_and_graded(
    toy_tokenizer, env_id: str, kwargs: dict[str, Any], reply: str, reward_part: str
):
    env = build_env_service("vf", f"verifiers://{env_id}", service_kwargs=kwargs)
    started = time.monotonic()
    tasks = await env.backend.list_tasks("train")
    print(f"{env_id}: venv ready and {len(tasks)} tasks listed in {time.monotonic() - started:.1f} s")
    assert [t.index for t in tasks] == [0, 1, 2, 3] and all(t.spec["prompt"] for t in tasks)

    events = await play(toy_tokenizer, env, tasks[0].task_id, policy=lambda messages: reply)
    await env.backend.aclose()
    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    assert finished.status == "completed", finished.reason
    assert graded.reward is not None, graded.reason  # the environment's rubric graded it
    assert graded.rewards[reward_part] == graded.reward  # its one weighted function is the reward
    [call] = [e for e in events if isinstance(e, ModelCallFinished)]
    assert toy_tokenizer.decode(call.completion_tokens) == reply + "<|im_end|>"
    [batch] = [e for e in events if isinstance(e, BatchReady)]
    assert batch.datums[0].num_trained_tokens == len(call.completion_tokens)


@pytest.mark.anyio
async def test_a_package_that_no_longer_imports_says_why_and_from_which_package():
    """tasksets 0.1.4 allows verifiers 0.4, which removed the `verifiers.utils` it imports: the
    one line says that, and names tasksets, not "taskset not found"."""
    env = build_env_service("vf", "verifiers://tasksets", service_kwargs={"packages": ["tasksets==0.1.4"]})
    with pytest.raises(EnvError) as caught:
        await env.backend.list_tasks("train")
    message = str(caught.value)
    assert "\n" not in message
    assert (
        "ModuleNotFoundError: No module named 'verifiers.utils' (raised in tasksets 0.1.4 (tasksets/"
        in message
    )
    assert message.endswith("the venv has verifiers 0.4.0")


@pytest.mark.torch
def test_a_training_step_on_a_published_environment(tmp_path):
    pytest.importorskip("torch")
    import anyio

    from platoon.api import train
    from platoon.config import validate_config
    from platoon.testing.models import save_tiny_model

    model = save_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2, seed=0)
    config = {
        "environments": [
            {
                "name": "haiku",
                "service": "verifiers://stardata.envs.constraint_gym",
                "harness": "verifiers",
                "service_kwargs": STARDATA,
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
                "rollout_config": {"max_steps": 2, "inference_params": {"max_completion_tokens": 8}},
            },
        },
        "eval": {"every": 0},
    }
    started = time.monotonic()
    last = anyio.run(lambda: train(validate_config(config), run_dir=tmp_path / "run", console=False))
    print(f"one training step on staros-stardata in {time.monotonic() - started:.1f} s")
    assert last["policy/version"] == 1
    assert last["train/datums"] == 2 and last["episodes/graded"] == 2
    assert "reward/rule/prosody_reward/mean" in set(last)

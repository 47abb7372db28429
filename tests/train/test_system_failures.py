"""Episodes the system failed never enter a baseline: a group's advantages are those of the
rollouts the policy played, as if the failed ones had never been requested.

A whole system on one bus (env service, gateway with a scripted policy, episode runner, grader,
credit assigner) plays a group of one task; the sandbox or the sampler fails some of it."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import platoon as pt
from platoon.bus import Bus, running
from platoon.bus.events import BatchReady, EpisodeGraded, EpisodeRequested, TaskRef, new_id
from platoon.credit import CreditConfig, mean_baseline
from platoon.envs import EnvError, EnvService
from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
from platoon.gateway.renderers import get_renderer
from platoon.harness import ChatError
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.stats.failures import failure_kind
from platoon.testing.policies import ScriptedSamplerFactory
from platoon.train.batcher import CreditAssigner, CreditSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "programs"))
from programs_helpers import ToyBackend

pytestmark = pytest.mark.anyio

SECRET = 6  # the toy's secret of task train-5


class FaultySandboxes(ToyBackend):
    """The sessions started in the places of `failing` (counted from 1) fail to start."""

    def __init__(self, failing: set[int]) -> None:
        super().__init__()
        self.failing = failing
        self.starts = 0

    async def open(self, task, secrets):  # type: ignore[no-untyped-def]
        self.starts += 1
        if self.starts in self.failing:
            raise EnvError("the sandbox failed to start: its container exited with 125")
        return await super().open(task, secrets)


def alternating(failing: set[int]) -> Any:
    """The scripted policy: the secret on even calls, 0 on odd ones (so rewards differ within the
    group); calls numbered in `failing` raise, as a sampler whose service went away."""
    calls = itertools.count()

    def script(messages: list[dict[str, Any]]) -> str:
        n = next(calls)
        if n in failing:
            raise RuntimeError("the sampling service answered 503")
        guess = SECRET if n % 2 == 0 else 0
        return f"<tool_call>\n{json.dumps({'name': 'guess', 'arguments': {'number': guess}})}\n</tool_call>"

    return script


@pt.harness("guess-once-or-carry-on")
async def guess_once(ctx: pt.AgentContext) -> pt.AgentResult:
    """One model call and its guess; without the model (a 5xx it swallows, as many agents do),
    a guess of its own that happens to be right: a reward the policy never earned."""
    try:
        reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], tools=ctx.openai_tools())
        number = json.loads(reply.tool_calls[0]["function"]["arguments"])["number"]
    except ChatError:
        number = SECRET
    result = await ctx.call_tool("guess", {"number": number})
    return pt.AgentResult("completed", final_message=result.output)


@asynccontextmanager
async def system(toy_tokenizer: Any, backend: ToyBackend, script: Any, group_size: int) -> AsyncIterator[Bus]:
    components = [
        EnvService("toy", backend),
        Gateway(
            GatewayPolicy(
                get_renderer("qwen3_instruct", toy_tokenizer), ScriptedSamplerFactory(toy_tokenizer, script)
            ),
            GatewaySettings(serve_http=False),
        ),
        EpisodeRunner(
            [EntrySettings(name="toy", harness="guess-once-or-carry-on", max_steps=2)], request_timeout=10
        ),
        Grader(),
        CreditAssigner(
            CreditSettings(
                group_size=group_size, batch_size=1, credit=CreditConfig(remove_constant_groups=False)
            )
        ),
    ]
    async with Bus() as bus, running(bus, components):
        yield bus


async def play_group(bus: Bus, size: int) -> tuple[BatchReady, list[EpisodeGraded]]:
    """Request one group of `size` rollouts of task train-5, one at a time (so that the sandbox
    and the script fail the same rollouts on every backend); its batch and grades."""
    group = new_id()
    graded: list[EpisodeGraded] = []
    async with bus.stream(BatchReady) as batches, bus.stream(EpisodeGraded) as grades:
        for _ in range(size):
            await bus.publish(
                EpisodeRequested(
                    episode_id=new_id(),
                    group_id=group,
                    task=TaskRef(env="toy", split="train", task_id="train-5"),
                )
            )
            with anyio.fail_after(10):
                graded.append(await grades.receive())
        with anyio.fail_after(10):
            return await batches.receive(), graded


def advantages(batch: BatchReady) -> dict[str, float]:
    return {
        d.episode_id: next(a for a, w in zip(d.advantages, d.weights, strict=True) if w) for d in batch.datums
    }


async def test_a_group_of_8_where_3_sandboxes_fail_gets_the_advantages_of_the_5_alone(toy_tokenizer):
    async with system(toy_tokenizer, FaultySandboxes({2, 4, 6}), alternating(set()), group_size=8) as bus:
        batch, graded = await play_group(bus, 8)
    failed = [g for g in graded if g.reward is None]
    played = [g for g in graded if g.reward is not None]
    assert len(failed) == 3 and {failure_kind(g.reason or "") for g in failed} == {"env_session"}
    assert sorted(g.reward for g in played) == [0.0, 0.0, 1.0, 1.0, 1.0]
    # the baseline is the mean of the 5 (0.6), not of 8 with the failures as 0 (0.375)
    expected = dict(
        zip([g.episode_id for g in played], mean_baseline([g.reward for g in played]), strict=True)
    )
    assert advantages(batch) == pytest.approx(expected)
    assert batch.stats["episodes/failed/env_session"] == 3
    assert batch.stats["reward/mean"] == pytest.approx(0.6)

    async with system(toy_tokenizer, FaultySandboxes(set()), alternating(set()), group_size=5) as bus:
        alone, _ = await play_group(bus, 5)
    assert sorted(advantages(alone).values()) == pytest.approx(sorted(advantages(batch).values()))


async def test_an_episode_whose_sampler_failed_is_not_graded_though_its_harness_carried_on(toy_tokenizer):
    """The harness swallows the 5xx and guesses right: graded, it would be a 1 the policy never
    earned, pulling its group's baseline up."""
    async with system(toy_tokenizer, ToyBackend(), alternating({1}), group_size=4) as bus:
        batch, graded = await play_group(bus, 4)
    (failed,) = [g for g in graded if g.reward is None]
    assert failure_kind(failed.reason or "") == "sampler"
    assert "the sampling service answered 503" in (failed.reason or "")
    played = [g for g in graded if g.reward is not None]
    expected = dict(
        zip([g.episode_id for g in played], mean_baseline([g.reward for g in played]), strict=True)
    )
    assert failed.episode_id not in advantages(batch)
    assert advantages(batch) == pytest.approx(expected)
    assert batch.stats["episodes/failed/sampler"] == 1


async def test_a_group_the_system_failed_more_than_half_of_is_dropped_not_trained_on_the_few(toy_tokenizer):
    async with system(
        toy_tokenizer, FaultySandboxes({2, 3, 4, 5, 6}), alternating(set()), group_size=8
    ) as bus:
        batch, graded = await play_group(bus, 8)
    assert sorted(g.reward for g in graded if g.reward is not None) == [0.0, 1.0, 1.0]  # 3 of 8
    assert batch.datums == []
    assert batch.stats["credit/groups_removed_too_few"] == 1
    assert batch.stats["episodes/failed/env_session"] == 5
    assert batch.stats["reward/mean"] == pytest.approx(2 / 3)  # the rewards it got still count

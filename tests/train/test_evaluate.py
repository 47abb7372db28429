"""Evaluation: the report's fields from a known set of results, and pass@k by hand."""

from __future__ import annotations

import math
from collections import defaultdict

import anyio
import msgspec
import pytest

from platoon.bus import Bus
from platoon.bus.events import (
    AgentSpawned,
    EpisodeAbandoned,
    EpisodeGraded,
    EpisodeRequested,
    EvalFinished,
    ModelCallFinished,
    TaskRef,
)
from platoon.train.evaluate import EvalSettings, as_json, evaluate, pass_at_k

# Rewards each task's attempts get, in order; None is an episode that failed.
RESULTS = {
    "a": [1.0, 1.0, 1.0, 1.0],
    "b": [1.0, 0.0, 0.0, 0.0],
    "c": [0.0, None, 0.5, 0.0],
}
TASKS = [TaskRef(env="toy", split="test", task_id=t) for t in RESULTS]


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 1 / 4),
        (4, 1, 2, 1 - (3 / 4) * (2 / 3)),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (4, 0, 2, 0.0),
        (4, 3, 2, 1.0),  # n - c < k: every draw of k contains a success
        (4, 4, 4, 1.0),
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


class FakePlayer:
    """Answers each `EpisodeRequested` as a runner and grader would, from RESULTS, with one
    agent and two model calls (3 + 2 prompt and 1 + 1 completion tokens) per episode."""

    def __init__(self) -> None:
        self.attempts: defaultdict[str, int] = defaultdict(int)
        self.running = 0
        self.peak = 0

    async def play(self, bus: Bus, request: EpisodeRequested) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        task = request.task.task_id
        reward = RESULTS[task][self.attempts[task]]
        self.attempts[task] += 1
        episode = request.episode_id
        await bus.publish(
            AgentSpawned(
                episode_id=episode,
                agent_id=f"{episode}/root",
                parent_id=None,
                depth=0,
                harness="h",
                instruction="",
            )
        )
        for prompt in ([1, 2, 3], [1, 2]):
            await bus.publish(
                ModelCallFinished(
                    call_id=f"{episode}{len(prompt)}",
                    episode_id=episode,
                    agent_id=f"{episode}/root",
                    prompt_tokens=prompt,
                    completion_tokens=[9],
                    logprobs=[-1.0],
                    stop_reason="stop",
                    policy_version=0,
                )
            )
        await anyio.sleep(0.01)
        self.running -= 1
        await bus.publish(
            EpisodeGraded(
                episode_id=episode,
                group_id=request.group_id,
                task=request.task,
                reward=reward,
                # a verifier's side metric beside the reward, as a Harbor task's reward.json gives
                rewards={} if reward is None else {"reward": reward, "exact": float(reward == 1.0)},
                status="completed" if reward is not None else "error",
                reason=None if reward is not None else "the harness raised ValueError: x",
                purpose=request.purpose,
                step=request.step,
            )
        )

    async def run(self, bus: Bus) -> None:
        async with bus.stream(EpisodeRequested) as requests, anyio.create_task_group() as tg:
            async for request in requests:
                tg.start_soon(self.play, bus, request)


@pytest.mark.anyio
async def test_the_report_adds_up(tmp_path):
    player = FakePlayer()
    async with Bus() as bus:
        bus.start_soon(player.run, bus)
        await anyio.sleep(0.01)
        async with bus.stream(EvalFinished) as finished:
            report = await evaluate(bus, TASKS, EvalSettings(group_size=4, concurrency=3), step=7)
            published = await finished.receive()

    assert player.peak <= 3  # `concurrency` episodes at a time
    assert (report.step, report.episodes, report.graded) == (7, 12, 11)
    rewards = [r for rs in RESULTS.values() for r in rs if r is not None]
    assert report.reward_mean == pytest.approx(sum(rewards) / 11)  # 5.5 / 11
    assert report.reward_std == pytest.approx(math.sqrt(sum((r - 0.5) ** 2 for r in rewards) / 11))
    # Successes (reward >= 1.0) per task: a 4/4, b 1/4, c 0/4 (the failed attempt counts as one).
    assert report.pass_at_k == {"1": pytest.approx((1 + 1 / 4 + 0) / 3), "4": pytest.approx((1 + 1 + 0) / 3)}
    assert report.failures == {"harness_raised": 1}
    assert report.tokens == {"prompt": 12 * 5, "completion": 12 * 2, "calls": 24}
    assert report.by_env == {"toy": {"reward_mean": pytest.approx(0.5), "episodes": 11.0}}
    assert report.by_depth["0"]["agents"] == 12 and report.by_depth["0"]["model_calls"] == 24
    by_task = {t.task_id: t for t in report.tasks}
    assert sorted(by_task["c"].rewards, key=str) == sorted(RESULTS["c"], key=str)
    assert by_task["c"].failures == ["the harness raised ValueError: x"]
    assert report.seconds > 0
    # Side metrics: each graded episode's, and their means (5 of the 11 graded rewards are 1.0).
    assert report.reward_parts == {"exact": pytest.approx(5 / 11), "reward": pytest.approx(0.5)}
    assert sorted(p["exact"] for p in by_task["a"].parts) == [1.0] * 4
    assert published.metrics["eval/reward/exact/mean"] == pytest.approx(5 / 11)

    assert published.step == 7
    assert published.metrics["eval/pass@1"] == report.pass_at_k["1"]
    assert published.metrics["eval/reward_mean"] == report.reward_mean
    assert published.metrics["eval/toy/reward_mean"] == pytest.approx(0.5)

    decoded = msgspec.json.decode(as_json(report))
    assert decoded["pass_at_k"]["4"] == pytest.approx(2 / 3) and decoded["episodes"] == 12


@pytest.mark.anyio
async def test_a_success_threshold_below_one_counts_partial_rewards(tmp_path):
    player = FakePlayer()
    async with Bus() as bus:
        bus.start_soon(player.run, bus)
        await anyio.sleep(0.01)
        report = await evaluate(
            bus, TASKS[2:], EvalSettings(group_size=4, success_threshold=0.5), publish=False
        )
    assert report.pass_at_k == {"1": pytest.approx(1 / 4), "4": 1.0}  # c: one of four reaches 0.5


@pytest.mark.anyio
async def test_an_episode_re_requested_under_a_new_id_counts_once():
    """The lease keeper gave the first attempt up (`EpisodeAbandoned`) and requested a retry;
    the silent worker comes back and grades the first attempt after all: only the retry counts."""
    task = TASKS[0]

    async def worker(bus: Bus, requests) -> None:
        with requests:
            first = await requests.receive()
            spawned = AgentSpawned(
                episode_id=first.episode_id,
                agent_id="old",
                parent_id=None,
                depth=0,
                harness="h",
                instruction="",
            )
            await bus.publish(spawned)
            await bus.publish(
                EpisodeAbandoned(
                    episode_id=first.episode_id,
                    group_id=first.group_id,
                    task=task,
                    replaced_by="r",
                    reason="lease",
                )
            )
            await bus.publish(
                EpisodeGraded(episode_id=first.episode_id, group_id=first.group_id, task=task, reward=0.0)
            )
            await bus.publish(EpisodeGraded(episode_id="r", group_id=first.group_id, task=task, reward=1.0))

    async with Bus() as bus:
        bus.start_soon(worker, bus, bus.stream(EpisodeRequested).open())
        report = await evaluate(bus, [task], publish=False)
    assert (report.episodes, report.graded, report.reward_mean) == (1, 1, 1.0)
    assert report.by_depth == {}  # the abandoned attempt's agent is not counted


@pytest.mark.anyio
async def test_no_tasks_is_an_empty_report():
    async with Bus() as bus:
        report = await evaluate(bus, [], EvalSettings(group_size=2), publish=False)
    assert (report.episodes, report.graded, report.reward_mean, report.pass_at_k) == (0, 0, None, {})


class TwoPolicyPlayer:
    """Each episode: a planner root (one call, the episode's reward) and an executor child (two
    calls, graded on its own: 0.25)."""

    async def run(self, bus: Bus) -> None:
        from platoon.bus.events import AgentFinished

        async with bus.stream(EpisodeRequested) as requests:
            async for request in requests:
                episode = request.episode_id
                agents = (("root", None, 0, "planner", 1), ("child", "root", 1, "executor", 2))
                for agent, parent, depth, policy, calls in agents:
                    await bus.publish(
                        AgentSpawned(
                            episode_id=episode,
                            agent_id=f"{episode}/{agent}",
                            parent_id=parent and f"{episode}/{parent}",
                            depth=depth,
                            harness="h",
                            instruction="",
                            policy=policy,
                        )
                    )
                    for _ in range(calls):
                        await bus.publish(
                            ModelCallFinished(
                                call_id=f"{episode}/{agent}/{_}",
                                episode_id=episode,
                                agent_id=f"{episode}/{agent}",
                                prompt_tokens=[1],
                                completion_tokens=[2],
                                logprobs=[-0.1],
                                stop_reason="stop",
                                policy_version=0,
                                policy=policy,
                            )
                        )
                await bus.publish(
                    AgentFinished(
                        episode_id=episode, agent_id=f"{episode}/child", status="completed", reward=0.25
                    )
                )
                await bus.publish(
                    EpisodeGraded(
                        episode_id=episode, group_id=request.group_id, task=request.task, reward=1.0
                    )
                )


@pytest.mark.anyio
async def test_the_report_splits_per_policy_when_several_played():
    async with Bus() as bus:
        bus.start_soon(TwoPolicyPlayer().run, bus)
        await anyio.sleep(0.01)
        report = await evaluate(bus, TASKS, EvalSettings(group_size=2), publish=False)
    assert report.by_policy == {
        "executor": {
            "agents": 6.0,
            "model_calls": 12.0,
            "calls_per_agent": 2.0,
            "own_reward_mean": 0.25,
            "own_rewards": 6.0,
        },
        "planner": {
            "agents": 6.0,
            "model_calls": 6.0,
            "calls_per_agent": 1.0,
            "own_reward_mean": 1.0,
            "own_rewards": 6.0,
        },
    }
    metrics = report.metrics()
    assert metrics["eval/planner/own_reward_mean"] == 1.0 and metrics["eval/executor/own_reward_mean"] == 0.25

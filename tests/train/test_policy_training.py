"""Several policies in the training half of a run (RFC 0001): the credit assigner's batch per
policy, the step that ends when every policy trained, and where a resume starts each policy."""

from __future__ import annotations

import anyio
import pytest
from test_batcher import assigner

from platoon.bus import Bus
from platoon.bus.events import AgentFinished, AgentSpawned, PolicyStepFinished, TrainStepFinished
from platoon.credit import CreditConfig
from platoon.train.checkpoints import Checkpoint, CheckpointStore, ResumeError
from platoon.train.policies import StepJoin, policy_stores, resume_points

pytestmark = pytest.mark.anyio


async def planner_and_executor(h, episode: str, reward: float, executor_reward: float) -> None:
    """An episode: a planner root, one executor child graded on its own."""
    await h.request(episode, "g")
    root, child = f"{episode}/root", f"{episode}/child"
    for agent, parent, depth, policy in ((root, None, 0, "planner"), (child, root, 1, "executor")):
        await h.bus.publish(
            AgentSpawned(
                episode_id=episode,
                agent_id=agent,
                parent_id=parent,
                depth=depth,
                harness="h",
                instruction="",
                policy=policy,
            )
        )
        await h.call(episode, agent, [1, 2], [3 + depth, 4])
    await h.bus.publish(
        AgentFinished(episode_id=episode, agent_id=child, status="completed", reward=executor_reward)
    )
    await h.grade(episode, "g", reward)


async def test_each_trained_policy_gets_a_batch_of_its_own_agents_with_its_own_statistics():
    credit = CreditConfig(subagent_reward="own", remove_constant_groups=False)
    async with assigner(credit=credit, policies=("planner", "executor")) as h:
        await planner_and_executor(h, "A", 1.0, 0.0)
        await planner_and_executor(h, "B", 0.0, 0.5)
        await h.until(lambda: len(h.batches) == 2)
    planner, executor = h.batches
    assert (planner.policy, executor.policy) == ("planner", "executor")
    assert {d.agent_id for d in planner.datums} == {"A/root", "B/root"}
    assert {d.agent_id for d in executor.datums} == {"A/child", "B/child"}
    # the episodes' statistics are the same in both; each policy's own are under its name
    for batch in (planner, executor):
        assert batch.stats["episodes/graded"] == 2 and batch.stats["reward/mean"] == 0.5
    assert planner.stats["planner/reward/mean"] == 0.5  # its agents' own rewards: the episodes'
    assert executor.stats["executor/reward/mean"] == 0.25  # the executors' own grades 0 and 0.5
    assert planner.stats["planner/train/datums"] == 2 and "executor/train/datums" not in planner.stats
    assert executor.stats["executor/credit/depth/1/agents"] == 2


async def test_with_one_policy_the_batch_is_the_one_it_always_was():
    async with assigner() as h:
        await h.episode("A", "g", 1.0)
        await h.episode("B", "g", 0.0)
        await h.until(lambda: len(h.batches) == 1)
    [batch] = h.batches
    assert batch.policy == "default"
    assert not any(key.startswith("default/") for key in batch.stats)
    assert [d.advantages[-1] for d in batch.datums] == [0.5, -0.5]


async def test_a_step_finishes_once_every_trained_policy_has_trained_it():
    join = StepJoin(["planner", "executor"])
    async with Bus() as bus:
        finished: list[TrainStepFinished] = []
        bus.subscribe(TrainStepFinished, finished.append)
        join.attach(bus)
        bus.start_soon(join.run, bus)
        await bus.publish(PolicyStepFinished(step=0, policy="executor", metrics={"executor/train/loss": 2.0}))
        await bus.publish(PolicyStepFinished(step=1, policy="planner", metrics={"planner/train/loss": 3.0}))
        await bus.drained()
        assert finished == []
        await bus.publish(PolicyStepFinished(step=0, policy="planner", metrics={"planner/train/loss": 1.0}))
        with anyio.fail_after(2):
            await bus.drained()
    assert finished == [
        TrainStepFinished(step=0, metrics={"planner/train/loss": 1.0, "executor/train/loss": 2.0})
    ]


def checkpoint(step: int) -> Checkpoint:
    return Checkpoint(
        step=step,
        state_path=f"tinker://m/weights/{step}",
        sampler_path="s",
        policy_version=step,
        task_cursor=step,
    )


def test_one_policy_keeps_its_checkpoints_where_they_always_were(tmp_path):
    [store] = policy_stores(tmp_path, ["default"], several=False).values()
    assert store.path == tmp_path / "checkpoints.jsonl"
    stores = policy_stores(tmp_path, ["planner", "executor"], several=True)
    assert [s.path for s in stores.values()] == [
        tmp_path / "checkpoints" / "planner" / "checkpoints.jsonl",
        tmp_path / "checkpoints" / "executor" / "checkpoints.jsonl",
    ]


def test_a_resume_starts_every_policy_from_the_newest_step_they_all_saved(tmp_path):
    stores = {name: CheckpointStore(tmp_path / name) for name in ("planner", "executor")}
    assert resume_points(stores) == {"planner": [], "executor": []}
    for step in (1, 3, 5):
        stores["planner"].append(checkpoint(step))
    for step in (1, 3):  # the run stopped between the planner's save of step 5 and the executor's
        stores["executor"].append(checkpoint(step))
    points = resume_points(stores)
    assert [c.step for c in points["planner"]] == [3, 1]
    assert [c.step for c in points["executor"]] == [3, 1]


def test_a_resume_refuses_a_run_where_only_some_policies_have_checkpoints(tmp_path):
    stores = {name: CheckpointStore(tmp_path / name) for name in ("planner", "executor")}
    stores["planner"].append(checkpoint(1))
    with pytest.raises(ResumeError, match="policies executor have no checkpoint while others do"):
        resume_points(stores)


class TwoTrainers:
    """Two policies' trainers: the planner steps its version every step, the executor only on
    even steps (a step without datums trains nothing); then the step finishes."""

    async def run(self, bus) -> None:
        from platoon.bus.events import EpisodeRequested, PolicyUpdated

        counts: dict[int, int] = {}
        versions = {"planner": 0, "executor": 0}
        async with bus.stream(EpisodeRequested) as requests:
            async for request in requests:
                counts[request.step] = counts.get(request.step, 0) + 1
                if counts[request.step] < 4:
                    continue
                for policy in versions:
                    if policy == "planner" or request.step % 2 == 0:
                        versions[policy] += 1
                        await bus.publish(
                            PolicyUpdated(version=versions[policy], sampler_path="s", policy=policy)
                        )
                metrics = {"episodes/total": 4.0, "episodes/graded": 4.0}
                await bus.publish(TrainStepFinished(step=request.step, metrics=metrics))


async def test_each_policy_is_asked_for_its_own_version_and_the_oldest_is_the_episodes():
    from test_scheduler import Tasks, play, settings

    from platoon.bus.events import EpisodeRequested
    from platoon.train.loop import Scheduler

    scheduler = Scheduler(settings(policies=("planner", "executor")))
    seen = await play([Tasks(), TwoTrainers(), scheduler])
    requests = [e for e in seen if isinstance(e, EpisodeRequested)]
    by_step = {r.step: (r.policy_version, r.policy_versions) for r in requests}
    assert by_step == {
        0: (0, {"planner": 0, "executor": 0}),
        1: (1, {"planner": 1, "executor": 1}),
        2: (1, {"planner": 2, "executor": 1}),  # the executor skipped step 1's update
    }


def test_a_several_policy_run_has_a_trainer_per_trained_policy_and_the_step_join(tmp_path, monkeypatch):
    from platoon.assembly import assemble
    from platoon.config import validate_config
    from platoon.train.trainer import Trainer

    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    config = validate_config(
        {
            "environments": [
                {
                    "name": "duet",
                    "env": "duet@1",
                    "harness": "h",
                    "program": "recursive",
                    "agents": {
                        "max_depth": 1,
                        "policy": {"by": "depth", "map": {"0": "planner", "1": "executor"}},
                    },
                }
            ],
            "policies": {"planner": {}, "executor": {"lora_rank": 4}, "rival": {"frozen": True}},
            "train": {
                "backend": "local",
                "model_name": "platoon-tiny-qwen3",
                "renderer_name": "qwen3_instruct",
            },
        }
    )
    run = assemble(config, "train", run_dir=tmp_path / "run")
    names = [p.name for p in run.parts]
    assert names[names.index("credit-assigner") :][:4] == [
        "credit-assigner",
        "trainer:planner",
        "trainer:executor",
        "step-join",
    ]
    assert [p.kind for p in run.parts if p.name.startswith("trainer")] == [Trainer, Trainer]
    s = run.settings
    assert list(s.policies) == ["planner", "executor", "rival"] and s.policy.name == "planner"
    assert s.trained() == ["planner", "executor"] and s.policies["rival"].frozen
    assert s.policies["executor"].lora_rank == 4 and s.policies["rival"].trainer is None
    assert s.credit.policies == s.scheduler.policies == ("planner", "executor")
    assert all(e.default_policy == "planner" for e in s.runner.entries)
    # one policy: the run as it always was
    single = validate_config({**msgspec_plain(config), "policies": None})
    one = assemble(single, "train", run_dir=tmp_path / "one")
    assert "trainer" in [p.name for p in one.parts] and list(one.settings.policies) == ["default"]
    assert one.settings.credit.policies == ("default",)


def msgspec_plain(config):
    from platoon.config import to_builtins

    data = to_builtins(config)
    data["environments"][0]["agents"]["policy"] = None
    return data

"""The pieces a distributed run adds, on an in-process bus (asyncio and trio): the credit
assigner's sealed mode, leases, the policy announcer and follower, the result seal, and the
settings taken from `nats:`."""

from __future__ import annotations

import anyio
import pytest

from platoon.assembly.nats import lease_timeout, nats_settings, run_name, trainer_bridge
from platoon.bus import Bus
from platoon.bus.events import (
    AgentFinished,
    AgentSpawned,
    BatchReady,
    EpisodeGraded,
    EpisodeRequested,
    EpisodeStarted,
    GroupCompleted,
    ModelCallFinished,
    PolicyUpdated,
    TaskRef,
    WorkClaimed,
)
from platoon.config import validate_config
from platoon.credit import CreditConfig
from platoon.train.batcher import CreditAssigner, CreditSettings
from platoon.train.distributed import (
    DistributedError,
    EpisodeAbandoned,
    EpisodeSealed,
    LeaseKeeper,
    PolicyAnnounced,
    PolicyAnnouncer,
)
from platoon.train.worker import PolicyFollower, ResultSeal

pytestmark = pytest.mark.anyio

TASK = TaskRef(env="numbers", split="train", task_id="train-1")


def request(episode: str, group: str = "g", **kw) -> EpisodeRequested:
    return EpisodeRequested(episode_id=episode, group_id=group, task=TASK, **kw)


def call(episode: str, n: int = 0) -> ModelCallFinished:
    return ModelCallFinished(
        call_id=f"{episode}-{n}",
        episode_id=episode,
        agent_id=f"{episode}-a",
        prompt_tokens=[1, 2, 3],
        completion_tokens=[4, 5],
        logprobs=[-0.1, -0.2],
        stop_reason="stop",
        policy_version=0,
    )


def graded(episode: str, group: str = "g", reward: float | None = 1.0) -> EpisodeGraded:
    return EpisodeGraded(episode_id=episode, group_id=group, task=TASK, reward=reward)


def agent(episode: str) -> AgentSpawned:
    return AgentSpawned(
        episode_id=episode, agent_id=f"{episode}-a", parent_id=None, depth=0, harness="h", instruction="i"
    )


def seal(episode: str, calls: int = 1, group: str = "g") -> EpisodeSealed:
    return EpisodeSealed(episode_id=episode, group_id=group, worker="w1", calls=calls, agents=1)


async def collect(bus: Bus, event_type, into: list) -> None:
    bus.subscribe(event_type, into.append)


async def settle(bus: Bus) -> None:
    for _ in range(3):
        await bus.drained()
        await anyio.sleep(0.01)


async def run_assigner(events, *, group_size=2, sealed=True):
    """Publish `events` to a credit assigner (batch_size 1) and return its batches and groups."""
    assigner = CreditAssigner(
        CreditSettings(
            group_size=group_size,
            batch_size=1,
            credit=CreditConfig(remove_constant_groups=False),
            sealed=sealed,
        )
    )
    batches: list[BatchReady] = []
    groups: list[GroupCompleted] = []
    async with Bus() as bus:
        await collect(bus, BatchReady, batches)
        await collect(bus, GroupCompleted, groups)
        assigner.attach(bus)
        bus.start_soon(assigner.run, bus)
        for event in events:
            await bus.publish(event)
        await settle(bus)
    return batches, groups, assigner


def started(episode: str, worker: str) -> EpisodeStarted:
    return EpisodeStarted(
        episode_id=episode,
        group_id="g",
        task=TASK,
        root_agent_id=f"{episode}-a",
        instruction="i",
        worker=worker,
    )


async def test_a_sealed_grade_waits_for_calls_that_arrive_after_it():
    events = [request("e1"), request("e2"), started("e1", "w1"), started("e2", "w2")]
    events += [agent("e1"), graded("e1"), seal("e1", calls=2), call("e1", 0)]  # one call still missing
    events += [agent("e2"), call("e2"), graded("e2"), seal("e2")]
    batches, groups, _ = await run_assigner(events)
    assert groups == [] and batches == []  # e1 is held: its seal counts 2 calls, 1 arrived

    batches, groups, _ = await run_assigner([*events, call("e1", 1)])
    assert [sorted(g.episode_ids) for g in groups] == [["e1", "e2"]]
    (batch,) = batches
    assert batch.stats["episodes/graded"] == 2
    assert batch.stats["workers/count"] == 2 and batch.stats["workers/w1/episodes"] == 1
    assert sorted(d.episode_id for d in batch.datums) == ["e1", "e1", "e2"]  # both of e1's calls


async def test_a_second_grade_for_an_episode_counts_once():
    events = [request("e1"), request("e2"), agent("e1"), call("e1"), graded("e1"), graded("e1")]
    events += [seal("e1"), seal("e1"), agent("e2"), call("e2"), graded("e2"), seal("e2")]
    batches, groups, _ = await run_assigner(events)
    assert [g.episode_ids for g in groups] == [["e1", "e2"]]
    assert batches[0].stats["episodes/dropped_duplicates"] == 1

    # The same without seals: an all-in-one run ignores a second grade too.
    plain = [request("e1"), request("e2"), call("e1"), graded("e1"), graded("e1"), call("e2"), graded("e2")]
    batches, groups, _ = await run_assigner(plain, sealed=False)
    assert [g.episode_ids for g in groups] == [["e1", "e2"]]
    assert batches[0].stats["episodes/graded"] == 2


async def test_an_abandoned_episode_is_replaced_and_its_late_results_dropped():
    abandoned = EpisodeAbandoned(episode_id="e1", group_id="g", task=TASK, replaced_by="e3", reason="lease")
    events = [request("e1"), request("e2"), agent("e1"), call("e1"), abandoned, request("e3", attempt=1)]
    events += [agent("e2"), call("e2"), graded("e2"), seal("e2")]
    events += [graded("e1", reward=0.0), seal("e1")]  # the lost worker comes back: too late
    events += [agent("e3"), call("e3"), graded("e3"), seal("e3")]
    batches, groups, _ = await run_assigner(events)
    assert [sorted(g.episode_ids) for g in groups] == [["e2", "e3"]]
    stats = batches[0].stats
    assert stats["episodes/abandoned"] == 1 and stats["episodes/dropped_abandoned"] == 1
    assert stats["reward/mean"] == 1.0  # e1's reward of 0 did not count
    assert {d.episode_id for d in batches[0].datums} == {"e2", "e3"}


async def test_an_episode_given_up_counts_as_failed():
    gave_up = EpisodeAbandoned(episode_id="e1", group_id="g", task=TASK, replaced_by=None, reason="3 tries")
    events = [request("e1"), request("e2"), agent("e2"), call("e2"), graded("e2"), seal("e2"), gave_up]
    batches, groups, _ = await run_assigner(events)
    assert [sorted(g.episode_ids) for g in groups] == [["e1", "e2"]]
    assert batches[0].stats["episodes/graded"] == 1
    assert batches[0].stats["episodes/failed/other"] == 1


async def run_keeper(keeper: LeaseKeeper, script, *, claim: bool = True) -> list:
    """Run `script` against the keeper; with `claim`, a worker claims every request at once
    (the trainer's bridge says so with `WorkClaimed`)."""
    seen: list = []
    async with Bus() as bus:
        await collect(bus, EpisodeRequested, seen)
        await collect(bus, EpisodeAbandoned, seen)
        await collect(bus, EpisodeGraded, seen)
        if claim:

            async def claimed(event: EpisodeRequested) -> None:
                await bus.publish(WorkClaimed(episode_id=event.episode_id, attempt=event.attempt))

            bus.subscribe(EpisodeRequested, claimed)
        keeper.attach(bus)
        bus.start_soon(keeper.run, bus)
        await script(bus)
        await settle(bus)
    return seen


async def test_a_lease_without_news_is_re_requested_in_the_same_group():
    async def script(bus):
        await bus.publish(request("e1", step=3))
        await bus.publish(request("e2", step=3))
        for _ in range(6):  # e2 keeps showing signs of life; e1 does not
            await anyio.sleep(0.05)
            await bus.publish(call("e2"))
        await bus.publish(seal("e2"))
        with anyio.fail_after(30):  # e1 and its retries expire: wait for the keeper to give up
            while not keeper.stats["gave_up"]:  # noqa: ASYNC110 - the keeper's own clock decides
                await anyio.sleep(0.01)

    keeper = LeaseKeeper(lease=0.2, max_attempts=3, check_every=0.02)
    seen = await run_keeper(keeper, script)
    retries = [e for e in seen if isinstance(e, EpisodeRequested) and e.attempt > 0]
    abandoned = [e for e in seen if isinstance(e, EpisodeAbandoned)]
    assert [a.episode_id for a in abandoned[:1]] == ["e1"]
    first = retries[0]
    assert first.group_id == "g" and first.step == 3 and first.attempt == 1 and first.episode_id != "e1"
    assert abandoned[0].replaced_by == first.episode_id
    assert all(a.episode_id != "e2" for a in abandoned)
    # Nobody plays the retries either: after max_attempts the keeper gives up.
    assert [r.attempt for r in retries] == [1, 2]
    assert abandoned[-1].replaced_by is None and abandoned[-1].attempt == 2
    assert keeper.stats == {"reissued": 2, "gave_up": 1}


async def test_an_eval_episode_is_retried_under_a_new_id_then_failed():
    """Under a new id, like a training episode: a silent worker that comes back and finishes the
    first attempt cannot mix its events with the retry's (the evaluator follows `replaced_by`)."""
    keeper = LeaseKeeper(lease=0.1, max_attempts=2, check_every=0.02)

    async def script(bus):
        await bus.publish(request("v1", purpose="eval"))
        await until(lambda: keeper.stats["gave_up"] == 1)

    seen = await run_keeper(keeper, script)
    requests = [e for e in seen if isinstance(e, EpisodeRequested)]
    assert [(r.attempt, r.purpose) for r in requests] == [(0, "eval"), (1, "eval")]
    retry = requests[1].episode_id
    assert requests[0].episode_id == "v1" and retry != "v1"
    abandoned = [(a.episode_id, a.replaced_by) for a in seen if isinstance(a, EpisodeAbandoned)]
    assert abandoned == [("v1", retry), (retry, None)]
    (failed,) = [e for e in seen if isinstance(e, EpisodeGraded)]
    assert failed.episode_id == retry and failed.reward is None and "2 attempts" in failed.reason


async def until(condition, timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while not condition():  # noqa: ASYNC110 - the keeper's own clock decides
            await anyio.sleep(0.01)


async def test_a_lease_starts_when_a_worker_claims_the_episode():
    """An episode nobody has claimed (queued behind busy workers) is not expired, however long
    it waits: the offer protocol places it. Once claimed, a silent worker loses it."""
    keeper = LeaseKeeper(lease=0.1, max_attempts=3, check_every=0.02)

    async def script(bus):
        await bus.publish(request("queued"))
        await bus.publish(request("claimed"))
        await bus.publish(WorkClaimed(episode_id="claimed"))
        await until(lambda: keeper.stats["reissued"] == 1)  # many leases after "queued" was requested
        assert keeper.leases["queued"].expires is None
        await bus.publish(WorkClaimed(episode_id="queued"))  # a worker takes it, then hangs
        await until(lambda: keeper.stats["reissued"] == 2)

    seen = await run_keeper(keeper, script, claim=False)
    abandoned = [e for e in seen if isinstance(e, EpisodeAbandoned)]
    assert [a.episode_id for a in abandoned] == ["claimed", "queued"]  # in the order of their claims
    assert all(a.replaced_by and a.attempt == 0 for a in abandoned)
    retries = {e.episode_id for e in seen if isinstance(e, EpisodeRequested) and e.attempt == 1}
    assert retries == {a.replaced_by for a in abandoned}
    assert set(keeper.leases) == retries  # the retries wait, unclaimed, for a worker


async def test_a_stalled_keeper_does_not_hold_its_own_stall_against_workers():
    """While the trainer's event loop is blocked, no sign of life can reach the keeper: that
    time does not count, and news that was on its way when the stall ended keeps the lease."""
    import time

    keeper = LeaseKeeper(lease=0.3, max_attempts=3, check_every=0.02)

    async def script(bus):
        await bus.publish(request("e1"))
        await until(lambda: "e1" in keeper.leases and keeper.leases["e1"].expires is not None)
        time.sleep(0.6)  # noqa: ASYNC251 - the stall under test: the event loop is blocked
        await anyio.sleep(0.05)  # the news the worker sent meanwhile is still being fetched
        await bus.publish(call("e1"))
        await bus.publish(seal("e1"))
        await until(lambda: "e1" not in keeper.leases)

    seen = await run_keeper(keeper, script)
    assert not [e for e in seen if isinstance(e, EpisodeAbandoned)]
    assert not keeper.stats


async def test_the_follower_learns_each_announced_policy_once():
    made: list[PolicyUpdated] = []

    async def sampler_for(policy):
        made.append(policy)
        return policy.version

    follower = PolicyFollower(sampler_for)
    announcer = PolicyAnnouncer(
        PolicyUpdated(version=0, sampler_path="", base_model="platoon-policy"), every=0.05
    )
    updates: list[PolicyUpdated] = []
    async with Bus() as bus, anyio.create_task_group() as trainer:
        follower.attach(bus)
        announcer.attach(bus)
        bus.start_soon(follower.run, bus)
        assert not await follower.wait_for(0, 0.05)  # nothing announced yet
        trainer.start_soon(announcer.run, bus)
        assert await follower.initial() == 0
        await collect(bus, PolicyUpdated, updates)
        await bus.publish(PolicyUpdated(version=1, sampler_path="p1", base_model="platoon-policy"))
        assert await follower.wait_for(1, 1.0)
        await anyio.sleep(0.2)  # several re-announcements of version 1
        assert await follower.updated(follower.policy) == 1
        # The trainer restarts: a new process starts over at version 0, and the follower accepts it.
        trainer.cancel_scope.cancel()
        await bus.publish(PolicyAnnounced(trainer="another", version=0, sampler_path="q0"))
        await settle(bus)
        assert follower.policy.sampler_path == "q0"
    assert [u.version for u in updates] == [1, 1, 0]  # the trainer's own, the follower's, the new one
    assert [p.version for p in made] == [0, 1]


async def test_the_follower_keeps_each_of_several_policies_apart():
    """One announcement carries every policy of a several-policy run (RFC 0001); an update of
    one is learned, and switched to in the gateway, for that one only; a frozen one never moves."""
    made: list[PolicyUpdated] = []

    async def sampler_for(policy):
        made.append(policy)
        return (policy.policy, policy.version)

    start = [
        PolicyUpdated(version=0, sampler_path="", base_model="m", policy="planner"),
        PolicyUpdated(version=0, sampler_path="", base_model="m", policy="executor"),
        PolicyUpdated(version=0, sampler_path="tinker://opp", base_model="m", policy="opponent"),
    ]
    follower = PolicyFollower(sampler_for)
    announcer = PolicyAnnouncer(start, every=3600)
    switched: list[PolicyUpdated] = []
    async with Bus() as bus:
        follower.attach(bus)
        announcer.attach(bus)
        bus.start_soon(follower.run, bus)
        bus.start_soon(announcer.run, bus)
        views = {name: follower.factory(name) for name in ("planner", "executor", "opponent")}
        assert await views["executor"].initial() == ("executor", 0)
        assert await views["opponent"].initial() == ("opponent", 0)
        assert await follower.initial() == ("planner", 0)  # the follower is the first policy's
        bus.subscribe(PolicyUpdated, lambda e: switched.append(e) if e.sampler_path == "p1" else None)
        await bus.publish(PolicyUpdated(version=1, sampler_path="p1", base_model="m", policy="planner"))
        assert await follower.wait_for({"planner": 1, "executor": 0}, 5.0)
        assert not await follower.wait_for({"executor": 1}, 0.05)
        await settle(bus)
        # the trainer's update, then the follower's, each of the planner alone
        assert [(e.policy, e.version) for e in switched] == [("planner", 1), ("planner", 1)]
        assert await views["planner"].updated(switched[-1]) == ("planner", 1)
        assert await views["executor"].updated(follower.policies["executor"]) == ("executor", 0)
        assert follower.policies["opponent"].sampler_path == "tinker://opp"
    # one sampler per policy and version, however often each was asked for
    assert [(p.policy, p.version) for p in made] == [
        ("executor", 0),
        ("opponent", 0),
        ("planner", 0),
        ("planner", 1),
    ]


async def test_the_seal_counts_what_went_before_the_grade():
    seal_component = ResultSeal(worker="w", envs={"numbers"})
    sealed: list[EpisodeSealed] = []
    async with Bus() as bus:
        await collect(bus, EpisodeSealed, sealed)
        seal_component.attach(bus)
        bus.start_soon(seal_component.run, bus)
        await bus.publish(request("e1"))
        await bus.publish(
            EpisodeRequested(episode_id="x", group_id="g", task=TaskRef(env="other", split="s", task_id="t"))
        )
        await settle(bus)
        assert not seal_component._idle.is_set()
        for event in (
            agent("e1"),
            call("e1", 0),
            call("e1", 1),
            AgentFinished(episode_id="e1", agent_id="e1-a", status="completed"),
            graded("e1"),
        ):
            await bus.publish(event)
        with anyio.fail_after(2):
            await seal_component.idle()
        await settle(bus)
    assert sealed == [
        EpisodeSealed(episode_id="e1", group_id="g", worker="w", calls=2, agents=1, agents_finished=1)
    ]


def config(**nats):
    return validate_config(
        {
            "environments": [{"name": "numbers", "env": "platoon-number-search@1", "harness": "h"}],
            "train": {
                "model_name": "m",
                "renderer_name": "qwen3_instruct",
                "workflow_config": {"rollout_config": {"timeout": 90}},
            },
            "stats": {"experiment_name": "exp.1", "trial_name": "a b"},
            "nats": nats,
        }
    )


def test_settings_from_the_nats_section():
    assert run_name(config()) == "exp-1-a-b"
    assert run_name(config(run="mine")) == "mine"
    assert lease_timeout(config()) == 120.0
    assert lease_timeout(config(lease_timeout=5)) == 5.0
    with pytest.raises(DistributedError, match="subject_prefix"):
        trainer_bridge(nats_settings(config(subject_prefix="other")))
    with pytest.raises(DistributedError, match=r"nats.subjects.0: no event type 'Nope'"):
        trainer_bridge(nats_settings(config(subjects=["Nope"])))
    with pytest.raises(DistributedError, match=r"run name 'a\.b'"):
        trainer_bridge(nats_settings(config(run="a.b")))
    with pytest.raises(DistributedError, match=r"nats\.tls"):
        trainer_bridge(nats_settings(config(tls={"ca_file": "/nonexistent/ca.pem"})))


def _with(data: dict, dotted: str, value) -> dict:
    import copy

    out = copy.deepcopy(data)
    *path, last = dotted.split(".")
    node = out
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    node[last] = value
    return out


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (("environments.0.service_kwargs", {"options": {"hi": 20}}), "environments"),
        (("train.workflow_config.rollout_config.max_steps", 3), "rollout"),
        (("train.lora_rank", 8), "lora_rank"),
        (("train.renderer_name", "llama3"), "renderer"),
    ],
)
def test_the_handshake_names_what_shapes_episodes_differently(change, named):
    from platoon.assembly.nats import worker_identity
    from platoon.config import to_builtins
    from platoon.train.distributed import identity_mismatch

    base = to_builtins(config())
    trainer = worker_identity(validate_config(base))
    worker = worker_identity(validate_config(_with(base, *change)))
    mismatch = identity_mismatch(trainer, worker)
    assert mismatch is not None and mismatch.startswith(f"{named}: the trainer's")
    # a worker's own settings (how long it drains, when it takes the trainer for gone) differ freely
    own = _with(_with(base, "nats.drain_timeout", 1), "nats.trainer_timeout", 7)
    assert identity_mismatch(trainer, worker_identity(validate_config(own))) is None


def test_the_handshake_names_another_platoon_version(monkeypatch):
    from platoon.assembly import nats
    from platoon.assembly.nats import worker_identity
    from platoon.train.distributed import identity_mismatch

    trainer = worker_identity(config())
    monkeypatch.setattr(nats, "__version__", "0.0.0-other")
    assert identity_mismatch(trainer, worker_identity(config())).startswith("platoon: the trainer's '")


def test_the_handshake_compares_how_the_policies_sample_but_not_how_they_train():
    from platoon.assembly.nats import worker_identity
    from platoon.config import to_builtins
    from platoon.train.distributed import identity_mismatch

    base = to_builtins(config())
    base["policies"] = {"a": {}, "b": {"lora_rank": 4}}
    base["environments"][0]["agents"] = {"policy": {"by": "depth", "map": {"0": "a", "1": "b"}}}
    trainer = worker_identity(validate_config(base))
    other = worker_identity(validate_config(_with(base, "policies.b.renderer_name", "qwen3")))
    assert identity_mismatch(trainer, other).startswith("policies: the trainer's")
    # where a policy's service is, and how it trains, are the trainer's alone
    for key, value in (("tinker_base_url", "http://h:1"), ("lora_rank", 8), ("load_path", "tinker://x")):
        elsewhere = worker_identity(validate_config(_with(base, f"policies.b.{key}", value)))
        assert identity_mismatch(trainer, elsewhere) is None, key


REPLIES = ["done"]  # a scripted policy for the worker below


def test_a_worker_states_the_tool_call_parser_it_chose_as_the_trainer_does(tmp_path, tiny_model):
    """`tool_call_parser: auto` is resolved by a probe of the tokenizer on each machine; the
    worker's identity states each policy's choice, which is the trainer's own."""
    from platoon.assembly import RunOptions, assemble, load_policy, resolve
    from platoon.models.loading import load_tokenizer, make_renderer

    raw = {
        "environments": [
            {
                "name": "numbers",
                "env": "platoon-number-search@1",
                "harness": "platoon-react",
                "agents": {"policy": {"by": "depth", "map": {"0": "a", "1": "b"}}},
            }
        ],
        "train": {"model_name": tiny_model, "renderer_name": "qwen3_instruct"},
        "policies": {"a": {}, "b": {"renderer_name": "qwen3"}},
        "nats": {"url": "nats://127.0.0.1:1"},
    }
    cfg = validate_config(raw)
    worker = assemble(cfg, "worker", RunOptions(policy="scripted:test_distributed_parts:REPLIES")).worker()
    trainer_side = {
        name: load_policy(p).tool_call_parser
        for name, p in resolve(
            cfg, "train", RunOptions(policy="scripted:x:y"), run_dir=tmp_path
        ).policies.items()
    }
    assert worker.identity["tool_call_parsers"] == f"a={trainer_side['a']}, b={trainer_side['b']}"
    chosen = {
        n: make_renderer(r, load_tokenizer(tiny_model))[1]
        for n, r in (("a", "qwen3_instruct"), ("b", "qwen3"))
    }
    assert trainer_side == chosen and None not in chosen.values() and "auto" not in chosen.values()

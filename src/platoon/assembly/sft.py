"""An SFT run's data, made ready before its policies open their services: the recorded
episodes read (`--from`), checked against each policy's tokenizer, filtered (`--where`,
`--agent`), given to the policies whose agents played them, split into training and held-out
datums, and the trainers' schedule set to the plan's steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import msgspec
import structlog

from platoon.assembly.builders import tokenizer_lock
from platoon.assembly.policies import OpenPolicy
from platoon.assembly.settings import PolicySettings, SftSettings
from platoon.config.policies import PolicyChoiceError, choose_policy
from platoon.train.conversations import is_conversations, read_conversations
from platoon.train.recorded import (
    RecordedAgent,
    RecordedEpisode,
    RecordedError,
    RecordedRun,
    Where,
    check_tokenizer,
    datums_digest,
    heldout_episodes,
    read_run,
    rewards_seen,
    sft_datums,
)
from platoon.train.sft import SftPlan

__all__ = ["sft_identity", "sft_plan", "with_schedule"]

log = structlog.get_logger("platoon.sft")


def sft_plan(s: SftSettings, policies: Mapping[str, OpenPolicy], trained: Sequence[str]) -> SftPlan:
    """The plan of an SFT run: each trained policy's training and held-out datums. Raises
    `RecordedError` with what to do when nothing would train."""
    if not s.sources:
        raise RecordedError("platoon sft learns from recorded episodes: name them with --from RUN_DIR")
    where = Where.parse(s.where)
    runs = [_read(source, policies, trained) for source in s.sources]
    for run in runs:
        if run.damage:
            log.warning("recorded episodes skipped: the event log is damaged", detail=run.damage)
    episodes = [e for run in runs for e in run.episodes]
    froms = " ".join(f"--from {source}" for source in s.sources)
    if not episodes:
        raise RecordedError(f"{froms}: no recorded episode with a model call there")
    kept = [e for e in episodes if where.keeps(e)]
    if not kept:
        raise RecordedError(
            f"no recorded episode passes --where {where.text} (of {len(episodes)} read from "
            f"{', '.join(s.sources)}: {rewards_seen(episodes)})"
        )
    held = heldout_episodes(kept, s.heldout, s.seed)
    by_source = {run.source: run for run in runs}
    assign = _Assigner(s, policies, trained, by_source)
    train = sft_datums([e for e in kept if e.episode_id not in held], assign, agent=s.agent)
    heldout = sft_datums([e for e in kept if e.episode_id in held], assign, agent=s.agent)
    if not any(train.values()):
        who = f" of an agent with role or harness {s.agent!r}" if s.agent else ""
        raise RecordedError(
            f"the {len(kept)} episodes kept hold no model call{who} that a trained policy "
            f"({', '.join(trained)}) played"
            + (f"; the agents' roles and harnesses: {', '.join(sorted(assign.seen))}" if assign.seen else "")
        )
    log.info(
        "recorded episodes for SFT",
        read=len(episodes),
        kept=len(kept),
        held_out=len(held),
        datums={p: len(d) for p, d in train.items()},
    )
    return SftPlan(
        train={p: train.get(p, []) for p in trained},
        heldout={p: heldout.get(p, []) for p in trained},
        batch_size=s.batch_size,
        epochs=s.epochs,
        seed=s.seed,
    )


def _read(source: str, policies: Mapping[str, OpenPolicy], trained: Sequence[str]) -> RecordedRun:
    """A run directory's recorded episodes, or a JSONL of conversations rendered with the
    renderer of the first trained policy, which they then train."""
    if not is_conversations(source):
        return read_run(source)
    name = trained[0] if trained else next(iter(policies))
    policy = policies[name]
    return read_conversations(source, policy.renderer, tokenizer_lock(policy), policy=name)


class _Assigner:
    """Which trained policy an agent's calls train, its tokenizer checked against the recorded
    run's once per pair: the recorded agent's own policy when the config trains one of that name,
    else the one the config's `agents.policy` chooses for it; with one policy, that one."""

    def __init__(
        self,
        s: SftSettings,
        policies: Mapping[str, OpenPolicy],
        trained: Sequence[str],
        runs: Mapping[str, RecordedRun],
    ) -> None:
        self.s, self.policies, self.trained, self.runs = s, policies, list(trained), runs
        self.checked: set[tuple[str, str, str]] = set()
        self.seen: set[str] = set()  # roles and harnesses of the agents read, for a message

    def __call__(self, episode: RecordedEpisode, agent: RecordedAgent) -> str | None:
        self.seen |= {x for x in (agent.role, agent.harness) if x}
        policy = self._choose(episode, agent)
        if policy is None:
            return None
        key = (episode.source, agent.policy, policy)
        if key not in self.checked:
            run = self.runs[episode.source]
            check_tokenizer(
                run, agent.policy, tokenizer_lock(self.policies[policy]), what=f"policy {policy!r}"
            )
            self.checked.add(key)
        return policy

    def _choose(self, episode: RecordedEpisode, agent: RecordedAgent) -> str | None:
        if len(self.policies) == 1:
            return self.trained[0] if self.trained else None
        if agent.policy in self.policies:
            return agent.policy if agent.policy in self.trained else None
        choice = self.s.choices.get(episode.env)
        if choice is None:
            return None
        try:
            chosen = choose_policy(choice, depth=agent.depth, harness=agent.harness, role=agent.role)
        except PolicyChoiceError:
            return None
        return chosen if chosen in self.trained else None


def with_schedule(policy: PolicySettings, plan: SftPlan, save_every: int) -> PolicySettings:
    """The policy's settings with its trainer's schedule: the plan's steps, and a checkpoint
    every `save_every` steps (0: at the end of each epoch) and after the last."""
    assert policy.trainer is not None
    train = msgspec.structs.replace(
        policy.trainer.train,
        max_training_steps=plan.total_steps,
        save_every=save_every or plan.steps_per_epoch,
    )
    return replace(policy, trainer=msgspec.structs.replace(policy.trainer, train=train))


def sft_identity(plan: SftPlan) -> dict[str, object]:
    """What a resumed SFT run must share with the run it resumes: the data and its order."""
    return {
        "data": {p: datums_digest(d) for p, d in plan.train.items()},
        "heldout": {p: datums_digest(d) for p, d in plan.heldout.items()},
        "batch_size": plan.batch_size,
        "seed": plan.seed,
    }

"""Recorded episodes read back from run directories, for supervised fine-tuning (`platoon sft`).

Every run's event log holds the exact tokens of every model call (`ModelCallFinished`), the agent
tree (`AgentSpawned`, and the role each agent was opened with), how each episode ended and its
grade. `read_run` gathers them per episode; `Where` keeps the episodes a filter names
(`reward>=1`, `eval`, `split=test`, `role=planner`); `sft_datums` folds each kept agent's calls
into datums with the RL prefix merging (`platoon.credit.merge_calls`), so the weights are 1 on
the tokens the sampler produced and 0 on prompts and tool results, exactly as RL trains them.

A run's `lock.json` records its tokenizer (a name and a fingerprint of the vocabulary); tokens
recorded under another vocabulary are refused (`check_tokenizer`), naming both.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from platoon.bus import LogDamage, read_events
from platoon.bus.episodes import EpisodeLog, fold_events
from platoon.bus.eventlog import EVENT_LOG_NAME
from platoon.bus.events import Datum
from platoon.config import AssemblyError
from platoon.credit import Call, merge_calls
from platoon.train.batcher import recorded_call

__all__ = [
    "RecordedAgent",
    "RecordedEpisode",
    "RecordedError",
    "RecordedRun",
    "Where",
    "check_tokenizer",
    "datums_digest",
    "heldout_episodes",
    "read_run",
    "recorded_tokenizers",
    "rewards_seen",
    "sft_datums",
]

log = structlog.get_logger("platoon.sft")


class RecordedError(AssemblyError):
    """Recorded episodes that cannot train this policy (a filter keeping none, another tokenizer)."""


@dataclass
class RecordedAgent:
    """One agent of a recorded episode: its place in the tree and its calls, in order."""

    agent_id: str
    parent_id: str | None = None
    depth: int = 0
    harness: str = ""
    role: str = ""
    policy: str = "default"  # the policy that sampled it in the recorded run
    calls: list[Call] = field(default_factory=list)


@dataclass
class RecordedEpisode:
    """One recorded episode: where it came from, how it ended, its reward and its agents."""

    episode_id: str
    source: str  # the run directory (or file) it was read from
    purpose: str = ""  # train, eval or rollout; "" where the log never said (a served gateway)
    env: str = ""
    split: str = ""
    task_id: str = ""
    status: str = ""  # completed, limit, timeout, error, cancelled; "" when it never finished
    reward: float | None = None  # None: not graded
    agents: dict[str, RecordedAgent] = field(default_factory=dict)

    def agent(self, agent_id: str) -> RecordedAgent:
        return self.agents.setdefault(agent_id, RecordedAgent(agent_id))

    @property
    def calls(self) -> int:
        return sum(len(a.calls) for a in self.agents.values())


@dataclass
class RecordedRun:
    """The episodes of one run directory, with the tokenizer its lock.json names."""

    source: str
    episodes: list[RecordedEpisode]
    # lock.json's tokenizers ({"name", "fingerprint"}): the run's under "", each policy's by name
    tokenizers: dict[str, dict[str, str]] = field(default_factory=dict)
    damage: str | None = None  # what the event log reader had to skip, said once

    def tokenizer_of(self, policy: str) -> dict[str, str] | None:
        """The tokenizer the recorded policy `policy` sampled with (the run's, failing that)."""
        return self.tokenizers.get(policy) or self.tokenizers.get("")


def read_run(run_dir: str | Path) -> RecordedRun:
    """The recorded episodes of a run directory (or an event log file), in the order they were
    requested. Abandoned episodes (re-requested elsewhere) and episodes without a model call are
    left out."""
    path = Path(run_dir)
    if not path.exists():
        raise RecordedError(f"--from {run_dir}: no such run directory (or conversations file)")
    if path.is_dir() and not (path / EVENT_LOG_NAME).is_file():
        raise RecordedError(f"--from {run_dir}: no event log ({EVENT_LOG_NAME}) there")
    damage = LogDamage(path="")
    folded = fold_events(read_events(path, damage)).values()
    kept = [_recorded(log, str(path)) for log in folded if not log.abandoned]
    return RecordedRun(
        str(path),
        [e for e in kept if e.calls],
        recorded_tokenizers(path),
        damage.describe() if damage.found else None,
    )


def _recorded(log: EpisodeLog, source: str) -> RecordedEpisode:
    """An episode of the log as SFT reads it: its task, how it ended, its first reward and each
    agent's place in the tree, role and calls."""
    episode = RecordedEpisode(log.episode_id, source)
    if log.requested is not None:
        asked = log.requested.event
        episode.purpose, episode.env, episode.split = asked.purpose, asked.task.env, asked.task.split
        episode.task_id = asked.task.task_id
    if log.finished is not None:
        episode.status = log.finished.event.status
    graded = next((g.event for g in log.grades if g.event.reward is not None), None)
    if graded is not None:
        episode.reward, episode.purpose = graded.reward, episode.purpose or graded.purpose
    for agent in log.agents.values():
        calls = agent.calls()
        if agent.spawned is None and not calls and agent.agent_id not in log.roles:
            continue  # an agent the log knows only by its sessions and tools: not recorded
        recorded = episode.agent(agent.agent_id)
        recorded.calls = [recorded_call(call) for call in calls]
        if agent.spawned is not None:
            spawned = agent.spawned.event
            recorded.parent_id, recorded.depth = spawned.parent_id, spawned.depth
            recorded.harness, recorded.policy = spawned.harness, spawned.policy
    for agent_id, role in log.roles.items():
        episode.agent(agent_id).role = role
    return episode


def recorded_tokenizers(path: Path) -> dict[str, dict[str, str]]:
    """The tokenizers lock.json records: the run's under "", each of several policies' by name."""
    lock_path = (path if path.is_dir() else path.parent) / "lock.json"
    try:
        lock = json.loads(lock_path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(lock, dict):
        return {}
    found = {"": lock.get("tokenizer")}
    policies = lock.get("policies")
    if isinstance(policies, dict):
        found |= {name: p.get("tokenizer") for name, p in policies.items() if isinstance(p, dict)}
    return {
        name: {"name": str(t.get("name", "")), "fingerprint": t["fingerprint"]}
        for name, t in found.items()
        if isinstance(t, dict) and isinstance(t.get("fingerprint"), str)
    }


def check_tokenizer(
    run: RecordedRun, recorded_policy: str, tokenizer: Mapping[str, str], *, what: str = "the policy"
) -> None:
    """Refuse tokens recorded under another vocabulary than the policy's, naming both. A run
    whose lock.json records no tokenizer (written before platoon recorded one) is taken on trust,
    with a warning."""
    recorded = run.tokenizer_of(recorded_policy)
    if recorded is None:
        log.warning(
            "the run records no tokenizer: its tokens are taken to be the policy's",
            run=run.source,
            policy_tokenizer=tokenizer.get("name"),
        )
        return
    if recorded["fingerprint"] != tokenizer.get("fingerprint"):
        raise RecordedError(
            f"--from {run.source}: its episodes were tokenized with {recorded['name']!r}, but "
            f"{what} uses the tokenizer {tokenizer.get('name')!r}, another vocabulary (the same ids "
            "are other text there); train a policy on the tokenizer the episodes were recorded "
            "with, or record them again with this one"
        )


# --- --where ---------------------------------------------------------------------------------------

_COMPARE = re.compile(r"^reward\s*(>=|<=|==|!=|=|>|<)\s*(-?[0-9.]+(?:e-?[0-9]+)?)$")
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "=": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_FIELDS = ("split", "env", "status", "task", "role", "purpose")
_PURPOSES = ("train", "eval", "rollout")
_FORMS = (
    "reward>=1 (also >, <, <=, ==, !=), train, eval, rollout, split=NAME, env=NAME, "
    "status=completed, task=ID, role=NAME"
)


@dataclass(frozen=True)
class Where:
    """The episodes to keep: every term must hold (terms are `--where` flags, or comma-separated
    in one). `text` is what the user wrote, for messages."""

    terms: tuple[Callable[[RecordedEpisode], bool], ...] = ()
    text: str = ""

    @classmethod
    def parse(cls, expressions: Iterable[str]) -> Where:
        written = [part.strip() for expr in expressions for part in expr.split(",") if part.strip()]
        return cls(tuple(_term(part) for part in written), ", ".join(written))

    def keeps(self, episode: RecordedEpisode) -> bool:
        return all(term(episode) for term in self.terms)


def _term(text: str) -> Callable[[RecordedEpisode], bool]:
    compare = _COMPARE.match(text)
    if compare:
        op, bound = _OPS[compare.group(1)], float(compare.group(2))
        return lambda e: e.reward is not None and op(e.reward, bound)
    if text in _PURPOSES:
        return lambda e: e.purpose == text
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if sep and name in _FIELDS and value:
        if name == "role":
            return lambda e: any(a.role == value for a in e.agents.values())
        attribute = "task_id" if name == "task" else name
        return lambda e: getattr(e, attribute) == value
    raise RecordedError(f"--where {text!r} is not a filter this understands; one of: {_FORMS}")


def rewards_seen(episodes: Sequence[RecordedEpisode]) -> str:
    """The rewards of `episodes` in a few words, for a filter that kept none of them."""
    rewards = [e.reward for e in episodes if e.reward is not None]
    ungraded = len(episodes) - len(rewards)
    if not rewards:
        return "none was graded"
    counts: dict[float, int] = {}
    for r in rewards:
        counts[r] = counts.get(r, 0) + 1
    if len(counts) <= 6:
        seen = ", ".join(f"{value:g} x{n}" for value, n in sorted(counts.items()))
    else:
        seen = f"min {min(rewards):g}, mean {sum(rewards) / len(rewards):.3g}, max {max(rewards):g}"
    return f"rewards {seen}" + (f"; {ungraded} not graded" if ungraded else "")


# --- datums ----------------------------------------------------------------------------------------


def sft_datums(
    episodes: Sequence[RecordedEpisode],
    policy_of: Callable[[RecordedEpisode, RecordedAgent], str | None],
    *,
    agent: str | None = None,
) -> dict[str, list[Datum]]:
    """Each policy's datums from the kept episodes: every agent's calls merged where their
    prefixes chain (`merge_calls`: weight 1 on sampled tokens, 0 on prompts and tool results;
    judge calls never train). `policy_of` says which policy an agent trains (None: none);
    `agent` keeps only the agents whose role or harness it names."""
    out: dict[str, list[Datum]] = {}
    for episode in episodes:
        for a in sorted(episode.agents.values(), key=lambda a: (a.depth, a.agent_id)):
            if agent is not None and agent not in (a.role, a.harness):
                continue
            policy = policy_of(episode, a)
            if policy is None or not a.calls:
                continue
            out.setdefault(policy, []).extend(
                merge_calls(
                    a.calls,
                    episode_id=episode.episode_id,
                    group_id=episode.task_id,
                    agent_id=a.agent_id,
                    depth=a.depth,
                )
            )
    return out


def heldout_episodes(episodes: Sequence[RecordedEpisode], share: float, seed: int) -> set[str]:
    """The ids of the episodes held out: `share` of them (at least one when the share is above 0
    and there are two or more), chosen by a hash of the seed and each episode's task (its
    environment, split, task id and which attempt at the task it was), never by its random id,
    so a recording made again holds out the same tasks."""
    if share <= 0 or len(episodes) < 2:
        return set()
    count = min(len(episodes) - 1, max(1, math.floor(share * len(episodes) + 0.5)))
    attempts: dict[tuple[str, str, str], int] = {}
    ranks: dict[str, str] = {}
    for e in episodes:
        task = (e.env, e.split, e.task_id or e.episode_id)
        attempts[task] = attempts.get(task, 0) + 1
        key = f"{seed}:{':'.join(task)}:{attempts[task]}"
        ranks[e.episode_id] = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
    return {e.episode_id for e in sorted(episodes, key=lambda e: ranks[e.episode_id])[:count]}


def datums_digest(datums: Sequence[Datum]) -> str:
    """A fingerprint of what trains (tokens and weights, in order): a resume that would train on
    other data is refused by it."""
    digest = hashlib.sha256()
    for d in datums:
        digest.update(json.dumps([d.model_input, d.target_tokens, d.weights]).encode())
    return f"sha256:{digest.hexdigest()[:32]}"

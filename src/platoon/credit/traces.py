"""What credit assignment reads: the recorded model calls of each agent of each rollout.

These are plain records, built by whoever assembled the episode (the recorder, a test, a
replay of an event log); credit assignment never reaches back to the bus for more.
"""

from typing import Literal

import msgspec

from platoon.credit.exceptions import CreditError

CallKind = Literal["policy", "aux", "judge"]


class Call(msgspec.Struct, frozen=True, kw_only=True):
    """One model call, as the sampler returned it.

    `kind` says whether it trains: `policy` and `aux` calls (a summary for compaction, say)
    are the policy's own tokens and train; `judge` calls grade and never train.
    """

    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]
    policy_version: int = 0
    kind: CallKind = "policy"

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.completion_tokens):
            raise CreditError(
                f"a call has {len(self.completion_tokens)} completion tokens "
                f"but {len(self.logprobs)} logprobs"
            )
        if self.kind not in ("policy", "aux", "judge"):
            raise CreditError(f"unknown call kind {self.kind!r} (expected policy, aux or judge)")


class AgentTrace(msgspec.Struct, frozen=True, kw_only=True):
    """One agent of an episode's agent tree: its place in the tree, its calls, its own grade."""

    agent_id: str
    parent_id: str | None
    depth: int
    calls: list[Call]
    reward: float | None = None
    # per-turn credit: one reward per trainable call (judge calls not counted), for what arrived
    # after that call and before the next; [] when none arrived mid-episode
    turn_rewards: list[float] = []
    policy: str = "default"  # the policy that sampled its calls (several policies: see RFC 0001)


class Rollout(msgspec.Struct, frozen=True, kw_only=True):
    """One graded episode: the episode's reward and every agent that ran in it, root first."""

    episode_id: str
    group_id: str
    reward: float
    agents: list[AgentTrace]

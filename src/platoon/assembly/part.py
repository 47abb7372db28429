"""A run's part: one component, known before anything opens (its name and class), and how it is
built once the run has opened what it is built over (`Opened`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from platoon.assembly.policies import OpenPolicy
from platoon.train.sft import SftPlan
from platoon.train.worker import PolicyFollower

if TYPE_CHECKING:
    from platoon.bus.nats import Leases  # the nats extra: a worker's alone

__all__ = ["Opened", "Part"]


@dataclass(frozen=True)
class Opened:
    """What a run has opened when its parts are built: its policies, the step it starts at, an
    SFT run's plan of recorded datums, and a worker's policy follower, the leases its two
    bridges share and how long its runner waits for a policy."""

    policies: Mapping[str, OpenPolicy]
    start_step: int = 0
    plan: SftPlan | None = None
    follower: PolicyFollower | None = None
    leases: Leases | None = None
    policy_wait: float = 30.0

    @property
    def policy(self) -> OpenPolicy:
        """The run's own policy: the first."""
        return next(iter(self.policies.values()))


@dataclass(frozen=True)
class Part:
    """One component of a run: its name and class, known before anything starts, and `build`,
    which makes it over what the run opened. `instance`: the component itself where it is made
    up front (a plugin, whose declarations may be its own)."""

    name: str
    kind: type
    build: Callable[[Opened], object]
    instance: object = None

    @property
    def declares(self) -> object:
        """What holds the component's declarations (`subscribes`, `publishes`)."""
        return self.instance if self.instance is not None else self.kind

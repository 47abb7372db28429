"""Leases: who was given an episode may report on it, nobody else.

A bridge with `issue_leases=True` (the trainer's) sends each work event with a fresh token in
the `Platoon-Lease` header and drops any incoming event of an episode whose header does not
hold a token it issued for that episode; a worker's bridges remember the token of each work
event they take and attach it to every event of that episode they send. With the server's
permissions (`platoon nats init`), a worker may take work only through the queue group, so the
token of an episode reaches the one worker that plays it.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Sequence

import structlog

from platoon.bus.events import Event
from platoon.bus.nats.stats import BridgeStats
from platoon.bus.nats.wire import episode_of

log = structlog.get_logger("platoon.bus.nats")


class Leases:
    """Per-episode tokens: issued with work (trainer), remembered and attached (worker)."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._tokens: OrderedDict[str, list[str]] = OrderedDict()

    def issue(self, episode_id: str) -> str:
        token = secrets.token_urlsafe(18)
        self._tokens.setdefault(episode_id, []).append(token)  # a re-request keeps the old ones
        self._trim(episode_id)
        return token

    def remember(self, episode_id: str, token: str) -> None:
        self._tokens[episode_id] = [token]
        self._trim(episode_id)

    def token_for(self, episode_id: str) -> str | None:
        tokens = self._tokens.get(episode_id)
        return tokens[-1] if tokens else None

    def revoke(self, episode_id: str, token: str) -> None:
        """Forget a token that never reached anyone who may use it (an offer not claimed)."""
        tokens = self._tokens.get(episode_id)
        if tokens and token in tokens:
            tokens.remove(token)

    def valid(self, episode_id: str, token: str | None) -> bool:
        return token is not None and any(
            secrets.compare_digest(token, issued) for issued in self._tokens.get(episode_id, ())
        )

    def _trim(self, episode_id: str) -> None:
        self._tokens.move_to_end(episode_id)
        while len(self._tokens) > self.limit:
            self._tokens.popitem(last=False)


class LeaseGate:
    """A bridge's side of the leases: the token each outgoing event carries, and whether an
    incoming one may pass. Without `leases` every event passes and none carries a token."""

    def __init__(
        self,
        leases: Leases | None,
        *,
        issue: bool,
        work: Sequence[type[Event]],
        consume_work: bool,
        stats: BridgeStats,
    ) -> None:
        self.leases = leases
        self.issue = issue
        self.work = work
        self.consume_work = consume_work
        self.stats = stats

    def token_out(self, event: Event) -> str | None:
        """The lease token to send with `event`: a new one with work we hand out, else the
        one of its episode we were given."""
        episode = episode_of(event)
        if self.leases is None or episode is None:
            return None
        if self.issue and type(event) in self.work:
            return self.leases.issue(episode)
        return self.leases.token_for(episode)

    def revoke(self, episode: str, token: str | None) -> None:
        """Nobody may report on an offer nobody holds."""
        if token and self.leases is not None:
            self.leases.revoke(episode, token)

    def admit(self, event: Event, token: str | None) -> Event | None:
        """`event` if it may pass (remembering the token of work we take), else None."""
        episode = episode_of(event)
        if self.leases is None or episode is None:
            return event
        if type(event) in self.work and self.consume_work:
            if token:
                self.leases.remember(episode, token)
            return event
        if self.issue and not self.leases.valid(episode, token):
            self.stats.unleased += 1
            log.warning(
                "dropped an event of an episode its sender was not given",
                type=type(event).__name__,
                episode=episode,
                dropped=self.stats.unleased,
            )
            return None
        return event

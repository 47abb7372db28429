"""Which per-step sampler weights a trainer may delete, and when.

The trainer saves sampler weights (`step-NNNNNN`) after every step so that the samplers can
switch to the new policy. Kept forever they fill the training service's disk (one LoRA adapter
per step: 90 MB for a 0.5B model at rank 32 in float32). A version's weights are deleted once
nothing can sample them any more, which holds when all of these do:

1. **A newer version is published, and it is not among the newest `max_staleness + 2`.** The
   scheduler requests step s once step `s - max_staleness - 1` trained, at the newest version it
   heard of; each step adds at most one version. So when the trainer publishes version V, every
   training episode still to be requested asks for V - max_staleness - 1 or newer. The margin
   also covers samplers still switching: a gateway (here or on a NATS worker) keeps sampling V-1
   while it loads V, and the episode count below may lag the trainer by a few events.
2. **No episode still in flight was requested at that version or an older one.** An episode
   requested at version r samples whatever its gateway holds at each call, r or newer (the
   gateway waits for r): until it ends it may hold a call on any version from r up. A long
   evaluation, or a training episode still running with `max_staleness` > 0, therefore holds
   its versions back until it ends (`EpisodeFinished`, or `EpisodeAbandoned` when the lease
   keeper gave up on its worker: whatever that worker still sends is dropped).
3. **No checkpoint points at them.** Checkpoints save their own sampler weights
   (`ckpt-NNNNNN`, `CheckpointSaved.sampler_path`), which `checkpoint.keep` alone deletes.

The newest version is never deleted: it is what the samplers switch to, and at the end of a
run it is the run's final weights. A run therefore keeps at most `max_staleness + 2` step
weights (more only while old episodes are in flight). Deleting is best effort: a failure is
logged and the run goes on.

The trainer keeps the paths it still holds in `step_weights.json`, next to `checkpoints.jsonl`.
A run that stopped left those behind; when it resumes, it samples from its checkpoint's own
weights, so nothing can sample them any more and the resumed trainer deletes them first.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["StepWeights"]


class StepWeights:
    """The step sampler weights one trainer saved, and the episodes that may still use them."""

    def __init__(self, max_staleness: int) -> None:
        self.keep = max_staleness + 2
        self.saved: dict[int, str] = {}  # version -> tinker path, oldest first
        self.in_flight: dict[str, int] = {}  # episode id -> the version it was requested at

    def published(self, version: int, path: str) -> None:
        self.saved[version] = path

    def requested(self, episode_id: str, version: int) -> None:
        self.in_flight[episode_id] = version

    def ended(self, episode_id: str) -> None:
        self.in_flight.pop(episode_id, None)

    def paths(self) -> list[str]:
        """Every path still held, oldest first (what `step_weights.json` records)."""
        return list(self.saved.values())

    def unused(self, protected: Iterable[str] = ()) -> list[str]:
        """The paths that may be deleted now (rules 1 to 3), oldest first; they are forgotten."""
        if not self.saved:
            return []
        newest = max(self.saved)
        below = min(newest - self.keep + 1, min(self.in_flight.values(), default=newest))
        keep = set(protected)
        out = []
        for version in [v for v in self.saved if v < below]:
            path = self.saved.pop(version)
            if path not in keep:
                out.append(path)
        return out

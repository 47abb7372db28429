"""Checkpoints and what a resume may not change.

`checkpoints.jsonl` in the run directory holds one line per saved checkpoint: the training
state's path (weights and optimizer), the sampler weights' path, the step it completes, the
policy version and the task cursor. A line is written only after both saves returned, so the
last line always names a complete checkpoint, even after a SIGKILL.

`identity.json` records what a run is: the model, the renderer, the LoRA rank and the
held-out split. A resume whose config changes any of them is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["Checkpoint", "CheckpointStore", "ResumeError", "run_identity"]


class ResumeError(RuntimeError):
    """The run cannot be resumed with this config."""


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    step: int
    state_path: str
    sampler_path: str
    policy_version: int
    task_cursor: int


def run_identity(config: Any, holdout: Any = None) -> dict[str, Any]:
    train = config.train
    return {
        "model_name": train.model_name,
        "renderer_name": train.renderer_name,
        "lora_rank": train.lora_rank,
        "eval_splits": [e.splits.eval for e in config.environments],
        "holdout": holdout,
    }


class CheckpointStore:
    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "checkpoints.jsonl"
        self.identity_path = self.run_dir / "identity.json"

    def append(self, checkpoint: Checkpoint) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as file:
            file.write(msgspec.json.encode(checkpoint) + b"\n")
            file.flush()
            os.fsync(file.fileno())

    def latest(self) -> Checkpoint | None:
        if not self.path.exists():
            return None
        last = None
        for line in self.path.read_bytes().splitlines():
            try:
                last = msgspec.json.decode(line, type=Checkpoint)
            except msgspec.DecodeError:
                break  # a line cut short by a crash: the one before it is the last complete one
        return last

    def write_identity(self, identity: dict[str, Any]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.identity_path.write_text(json.dumps(identity, indent=2, sort_keys=True))

    def check_identity(self, identity: dict[str, Any]) -> None:
        """Refuse a resume that changes what the run is."""
        if not self.identity_path.exists():
            raise ResumeError(f"{self.run_dir} is not a platoon training run (no identity.json)")
        recorded = json.loads(self.identity_path.read_text())
        changed = [
            f"{key}: {recorded.get(key)!r} -> {identity.get(key)!r}"
            for key in sorted(set(recorded) | set(identity))
            if recorded.get(key) != identity.get(key)
        ]
        if changed:
            raise ResumeError("a resume cannot change what the run trains; changed: " + "; ".join(changed))

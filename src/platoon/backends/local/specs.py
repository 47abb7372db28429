"""What the engine's callers name: its errors, the LoRA and Adam settings they pass, and the
references to the weights a sampler uses."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["AdamParams", "EngineError", "LoraSpec", "ModelNotFound", "WeightsRef", "not_offered"]


def not_offered(feature: str, instead: str) -> str:
    """How the server refuses a feature of the Tinker API it does not have, in one line."""
    return f"{feature} is not offered by platoon's Tinker server: {instead}"


class EngineError(ValueError):
    """Bad input from a client (wrong ids, lengths, names, paths): a user error."""


class ModelNotFound(EngineError):
    """A model id or checkpoint path this server does not know."""


class LoraSpec(msgspec.Struct, frozen=True):
    rank: int = 32
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True
    alpha: float = 32.0


class AdamParams(msgspec.Struct, frozen=True):
    """Tinker's AdamParams: torch AdamW with decoupled weight decay; grad_clip_norm 0 = no clipping."""

    learning_rate: Annotated[float, Meta(ge=0)] = 1e-4
    beta1: Annotated[float, Meta(ge=0, lt=1)] = 0.9
    beta2: Annotated[float, Meta(ge=0, lt=1)] = 0.95
    eps: Annotated[float, Meta(ge=0)] = 1e-12
    weight_decay: Annotated[float, Meta(ge=0)] = 0.0
    grad_clip_norm: Annotated[float, Meta(ge=0)] = 0.0


class WeightsRef(msgspec.Struct, frozen=True):
    """Which weights a sampler uses: the base model, a training model's live adapter
    (`model_id`), or a fixed snapshot (`key`, held in memory or on disk)."""

    model_id: str | None = None
    key: str | None = None

"""The JSON request bodies of the Tinker API, as the `tinker` SDK sends them: msgspec structs.

Forward/backward requests are protobuf (`proto`); everything else the SDK posts is one of these.
"""

from __future__ import annotations

import msgspec


class LoraConfig(msgspec.Struct):
    rank: int = 32
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


class OptimizerConfig(msgspec.Struct):
    type: str = "adamw"


class CreateSession(msgspec.Struct):
    tags: list[str] | None = None
    user_metadata: dict[str, object] | None = None
    display_name: str | None = None


class _FinishReason(msgspec.Struct):
    type: str = "success"


class FinishSession(msgspec.Struct):
    reason: _FinishReason = msgspec.field(default_factory=_FinishReason)
    detail: str | None = None


class SessionRef(msgspec.Struct):
    session_id: str


class CreateModel(msgspec.Struct):
    session_id: str
    model_seq_id: int
    base_model: str
    lora_config: LoraConfig | None = None
    optimizer_config: OptimizerConfig | None = None
    user_metadata: dict[str, object] | None = None


class ModelRef(msgspec.Struct):
    model_id: str


class OptimStep(msgspec.Struct):
    model_id: str
    seq_id: int
    adam_params: dict[str, object] | None = None
    optimizer_params: dict[str, object] | None = None


class SaveWeights(msgspec.Struct):
    model_id: str
    seq_id: int
    path: str | None = None
    overwrite: bool = False
    ttl_seconds: int | None = None


class SaveForSampler(msgspec.Struct):
    model_id: str
    seq_id: int
    path: str | None = None
    sampling_session_seq_id: int | None = None
    kind: str = "snapshot"
    ttl_seconds: int | None = None


class LoadWeights(msgspec.Struct):
    path: str
    optimizer: bool = False
    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    base_model: str | None = None
    optimizer_config: OptimizerConfig | None = None


class CreateSamplingSession(msgspec.Struct):
    session_id: str
    sampling_session_seq_id: int
    model_path: str | None = None
    base_model: str | None = None


class _Prompt(msgspec.Struct):
    chunks: list[dict[str, object]]


class SamplingParams(msgspec.Struct):
    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str | int] | None = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0


class Asample(msgspec.Struct):
    prompt: _Prompt
    sampling_params: SamplingParams
    num_samples: int = 1
    sampling_session_id: str | None = None
    seq_id: int | None = None
    base_model: str | None = None
    model_path: str | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: object = None
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None
    record_stability_info: bool | None = None


class RetrieveFuture(msgspec.Struct):
    request_id: str


class FuturesTarget(msgspec.Struct):
    sampling_session_id: str
    cloned_sampler_id: int = 0
    type: str = "sampling_session"


class RetrieveFutures(msgspec.Struct):
    target: FuturesTarget
    prev_cursor: int = 0
    timeout: float | None = None
    retrieved_request_ids: list[str] = []


class SamplerRef(msgspec.Struct):
    sampling_session_id: str


class CopyWeights(msgspec.Struct):
    source_path: str
    session_id: str | None = None
    model_seq_id: int | None = None
    destination_project_id: str | None = None
    ttl_seconds: int | None = None
    weights_access_token: str | None = None


class SaveExternal(msgspec.Struct):
    model_id: str
    path: str
    seq_id: int | None = None

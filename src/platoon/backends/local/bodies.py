"""The JSON request bodies of the Tinker API, as the `tinker` SDK sends them: msgspec structs.

Forward/backward requests are protobuf (`proto`); everything else the SDK posts is one of these.
Each count and size a client chooses is bounded here, in its type, so a body asking for more is
refused with a 400 naming the field and the bound (`$.num_samples`, `<= 1024`) as it is read,
before any work or allocation; the bounds that depend on the model (its vocabulary, its context
length) are checked by the service before it answers. docs/security.md lists them.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

MAX_NUM_SAMPLES = 1024  # sequences one sample request draws
MAX_TOPK = 1024  # top-k logprobs per position (also at most the vocabulary)
MAX_LORA_RANK = 1024
MAX_STOPS = 256  # stop strings or token ids of one request
MAX_TTL_SECONDS = 10 * 365 * 24 * 3600  # a checkpoint's time to live: ten years
MAX_METADATA = 256  # entries of a session's or model's user metadata, and a session's tags
MAX_IDS = 100_000  # request ids one retrieve_futures acknowledges

# A sequence number: clients count from 0 or 1; int64, as the protobuf carries it.
SeqId = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Ttl = Annotated[int, Meta(ge=-MAX_TTL_SECONDS, le=MAX_TTL_SECONDS)]  # 0 or none: never; < 0: already past
Metadata = Annotated[dict[str, object], Meta(max_length=MAX_METADATA)]
Seed = Annotated[
    int, Meta(ge=-(2**63), le=2**63 - 1)
]  # int64: what torch's generators take, and msgspec bounds


class LoraConfig(msgspec.Struct):
    rank: Annotated[int, Meta(ge=1, le=MAX_LORA_RANK)] = 32
    seed: Seed | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


class OptimizerConfig(msgspec.Struct):
    type: str = "adamw"


class CreateSession(msgspec.Struct):
    tags: Annotated[list[str], Meta(max_length=MAX_METADATA)] | None = None
    user_metadata: Metadata | None = None
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
    model_seq_id: SeqId
    base_model: str
    lora_config: LoraConfig | None = None
    optimizer_config: OptimizerConfig | None = None
    user_metadata: Metadata | None = None


class ModelRef(msgspec.Struct):
    model_id: str


class OptimStep(msgspec.Struct):
    model_id: str
    seq_id: SeqId
    adam_params: dict[str, object] | None = None
    optimizer_params: dict[str, object] | None = None


class SaveWeights(msgspec.Struct):
    model_id: str
    seq_id: SeqId
    path: str | None = None
    overwrite: bool = False
    ttl_seconds: Ttl | None = None


class SaveForSampler(msgspec.Struct):
    model_id: str
    seq_id: SeqId
    path: str | None = None
    sampling_session_seq_id: SeqId | None = None
    kind: str = "snapshot"
    ttl_seconds: Ttl | None = None


class LoadWeights(msgspec.Struct):
    path: str
    optimizer: bool = False
    model_id: str | None = None
    seq_id: SeqId | None = None
    session_id: str | None = None
    model_seq_id: SeqId | None = None
    base_model: str | None = None
    optimizer_config: OptimizerConfig | None = None


class CreateSamplingSession(msgspec.Struct):
    session_id: str
    sampling_session_seq_id: SeqId
    model_path: str | None = None
    base_model: str | None = None


class _Prompt(msgspec.Struct):
    chunks: list[dict[str, object]]


class SamplingParams(msgspec.Struct):
    max_tokens: Annotated[int, Meta(ge=1)] | None = None  # past the context: what room is left
    seed: Seed | None = None
    stop: str | Annotated[list[str | int], Meta(max_length=MAX_STOPS)] | None = None
    temperature: Annotated[float, Meta(ge=0)] = 1.0
    top_k: Annotated[int, Meta(ge=-1)] = -1  # -1: off; 0 is refused by the sampler
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0


class Asample(msgspec.Struct):
    prompt: _Prompt
    sampling_params: SamplingParams
    num_samples: Annotated[int, Meta(ge=1, le=MAX_NUM_SAMPLES)] = 1
    sampling_session_id: str | None = None
    seq_id: SeqId | None = None
    base_model: str | None = None
    model_path: str | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: Annotated[int, Meta(ge=0, le=MAX_TOPK)] = 0
    topk_sample_logprobs: Annotated[int, Meta(ge=0, le=MAX_TOPK)] = 0
    target_prompt_logprobs: object = None
    prompt_alt_tokens_k: Annotated[int, Meta(ge=0)] = 0
    prompt_logprobs_last_n: Annotated[int, Meta(ge=0)] | None = None
    record_stability_info: bool | None = None


class RetrieveFuture(msgspec.Struct):
    request_id: str


class FuturesTarget(msgspec.Struct):
    sampling_session_id: str
    cloned_sampler_id: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0
    type: str = "sampling_session"


class RetrieveFutures(msgspec.Struct):
    target: FuturesTarget
    prev_cursor: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0
    timeout: Annotated[float, Meta(ge=0)] | None = None  # longer than the server's poll: its poll
    retrieved_request_ids: Annotated[list[str], Meta(max_length=MAX_IDS)] = []


class SamplerRef(msgspec.Struct):
    sampling_session_id: str


class CopyWeights(msgspec.Struct):
    source_path: str
    session_id: str | None = None
    model_seq_id: SeqId | None = None
    destination_project_id: str | None = None
    ttl_seconds: Ttl | None = None
    weights_access_token: str | None = None


class SaveExternal(msgspec.Struct):
    model_id: str
    path: str
    seq_id: SeqId | None = None

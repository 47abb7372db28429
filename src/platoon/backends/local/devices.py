"""Where the engine's model comes from and runs: its directory, device, dtype and attention."""

from __future__ import annotations

from pathlib import Path

import torch

from platoon.backends.local.specs import EngineError, ModelNotFound

__all__ = ["pick_attention", "pick_device", "pick_dtype", "release_freed_memory", "resolve_model_dir"]


def resolve_model_dir(model: str) -> Path:
    """A local directory for `model`: the path itself, or its snapshot in the HF cache (never downloads)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))  # nosec B615 # a local directory, never a download
    except Exception:
        raise ModelNotFound(
            f"model {model!r} is neither a directory nor in the local Hugging Face cache"
        ) from None


def pick_device(device: str | None) -> torch.device:
    """`auto` (or None): the first CUDA device when there is one, else the CPU."""
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError:
        raise EngineError(f"unknown device {device!r} (auto, cpu, cuda, cuda:1, ...)") from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise EngineError(f"device {device!r} asked for, but torch sees no CUDA device")
    return chosen


def pick_dtype(device: torch.device, dtype: str | None) -> torch.dtype:
    """`auto` (or None): bfloat16 on a GPU that has it (float16 otherwise), float32 on the CPU."""
    if dtype not in (None, "", "auto"):
        value = getattr(torch, str(dtype), None)
        if not isinstance(value, torch.dtype) or not value.is_floating_point:
            raise EngineError(f"unknown dtype {dtype!r} (auto, float32, bfloat16, float16)")
        return value
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def pick_attention(device: torch.device) -> str:
    """flash attention 2 on CUDA when the `flash_attn` package is installed, else torch SDPA."""
    import importlib.util

    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def release_freed_memory(device: torch.device) -> None:
    """Hand back to the system the memory a CPU step freed and glibc's allocator kept.

    A training step's activations are gigabytes on a CPU (SmolLM2-135M, 13 sequences of 410
    tokens: about 10 GB); freed, they stay in the process (glibc keeps freed chunks for reuse),
    so the sampler's caches of the evaluation that follows stack on top of them. Measured: an RL
    run of the real-agent example was killed for memory at 17.6 GB in such an evaluation; one
    step's 2.3 GB kept fell to 0.5 GB after a trim. A no-op off Linux's glibc and on a GPU."""
    if device.type != "cpu":
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim this way
        pass

"""Take a trained policy out of a run: `platoon export RUN_DIR [--step N] --out DIR [--adapter]`.

A run on the embedded backend keeps each checkpoint's LoRA adapter under `RUN_DIR/tinker/`.
Export writes either the base model with the adapter merged in, with its tokenizer and chat
template, a directory plain transformers loads (`AutoModelForCausalLM.from_pretrained(DIR)`),
or the PEFT adapter alone (`PeftModel.from_pretrained(base, DIR)`). The output is built aside
and renamed into place, so a directory named by `--out` is either whole or absent.

A model whose output layer shares its weights with the input embeddings (SmolLM2, the tiny
model) is written with the two untied when the adapter trained the output layer: merged into a
shared matrix, the output layer's update would change the input embeddings too.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import msgspec

from platoon.config.load import read_file
from platoon.models.loading import builtin_model_name, resolve_model
from platoon.train.checkpoints import (
    Checkpoint,
    CheckpointNotFound,
    CheckpointStore,
    checkpoint_problem,
    locate_weights,
)

__all__ = ["ExportError", "export", "run_checkpoint"]

_ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


class ExportError(RuntimeError):
    """The run, step or output cannot be exported as asked."""


def run_checkpoint(run_dir: Path, step: int | None, policy: str | None) -> Checkpoint:
    """The run's checkpoint saved after `step` training steps (its sampler weights are
    `ckpt-<step>`; None: the newest), of `policy` in a run of several."""
    several = run_dir / "checkpoints"
    if policy is not None:
        store = CheckpointStore(several / policy)
        if not store.path.is_file():
            known = sorted(d.name for d in several.iterdir()) if several.is_dir() else []
            raise ExportError(
                f"{run_dir} has no policy {policy!r} with checkpoints (policies: {known or 'none'})"
            )
    elif (run_dir / "checkpoints.jsonl").is_file():
        store = CheckpointStore(run_dir)
    elif several.is_dir():
        known = sorted(d.name for d in several.iterdir() if d.is_dir())
        raise ExportError(f"{run_dir} trained several policies; name one with --policy ({', '.join(known)})")
    else:
        raise ExportError(f"{run_dir} is not a training run with checkpoints (no checkpoints.jsonl)")
    found = store.candidates()
    if not found:
        raise ExportError(f"{run_dir}: the run saved no checkpoint")
    if step is None:
        return found[0]
    for checkpoint in found:
        if checkpoint.step == step:
            return checkpoint
    steps = ", ".join(str(c.step) for c in sorted(found, key=lambda c: c.step))
    raise ExportError(f"{run_dir} has no checkpoint of step {step} (steps saved: {steps})")


def _run_model(run_dir: Path, policy: str | None) -> str:
    """The base model the run trained: its resolved config's model name (a built-in model is
    built or pulled again if the cache lost it)."""

    try:
        config = read_file(run_dir / "config.yaml")
    except Exception as exc:
        raise ExportError(f"{run_dir}: cannot read the run's config.yaml ({exc})") from None
    train = config.get("train") or {}
    policies = config.get("policies") or {}
    model = (policies.get(policy) or {}).get("model_name") if policy else None
    model = model or train.get("model_name")
    if not isinstance(model, str):
        raise ExportError(f"{run_dir}/config.yaml names no train.model_name")
    return model


def export(
    run_dir: str | Path,
    out: str | Path,
    *,
    step: int | None = None,
    adapter_only: bool = False,
    policy: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Export a run's checkpoint to `out`; returns what was written (step, paths, base model)."""

    run_dir, out = Path(run_dir).expanduser(), Path(out).expanduser()
    if out.exists() and not overwrite and any(out.iterdir() if out.is_dir() else [out]):
        raise ExportError(f"{out} exists and is not empty (pass --overwrite to replace it)")
    checkpoint = run_checkpoint(run_dir, step, policy)
    try:
        checkpoint_dir, path = locate_weights(checkpoint.sampler_path, [run_dir])
    except CheckpointNotFound as exc:
        if checkpoint.digests:  # the run saved its files here: they are gone
            raise ExportError(
                f"step {checkpoint.step}: {checkpoint.sampler_path} is missing (deleted since it was "
                "saved?); export another --step"
            ) from None
        raise ExportError(
            f"step {checkpoint.step}: {exc} (a run on hosted Tinker keeps its weights there)"
        ) from None
    session, kind, name = path.removeprefix("tinker://").split("/")
    weights = checkpoint_dir / session / kind / name
    # The files as they were saved (the digests the run recorded), else as their own manifest says.
    problem = checkpoint_problem(checkpoint, checkpoint_dir)
    if problem is not None:
        raise ExportError(f"step {checkpoint.step}: {problem}; export another --step")
    from platoon.backends.local.engine import EngineError, check_manifest  # the local extra: torch

    try:
        check_manifest(weights)
    except EngineError as exc:
        raise ExportError(str(exc)) from None
    model_name = _run_model(run_dir, policy)
    base = resolve_model(model_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        if adapter_only:
            _write_adapter(weights, building, builtin_model_name(model_name) or model_name)
        else:
            _write_merged(weights, base, building)
        facts = {
            "run": str(run_dir),
            "step": checkpoint.step,
            "sampler_path": checkpoint.sampler_path,
            "base_model": builtin_model_name(model_name) or model_name,
            "kind": "adapter" if adapter_only else "merged",
        }
        (building / "platoon_export.json").write_text(json.dumps(facts, indent=1) + "\n")
        building.chmod(0o755)  # made private by mkdtemp; a model directory is an ordinary one
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        building.rename(out)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return {**facts, "out": str(out)}


def _write_adapter(weights: Path, into: Path, base_name: str) -> None:
    for file in _ADAPTER_FILES:
        shutil.copy2(weights / file, into / file)
    config_file = into / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = base_name
    config["inference_mode"] = True
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _write_merged(weights: Path, base_dir: str, into: Path) -> None:
    try:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise ExportError(
            f"exporting a merged model needs the local extra: pip install 'platoon[local]' ({exc})"
        ) from None
    hf_logging.disable_progress_bar()
    meta = msgspec.json.decode((weights / "adapter_config.json").read_bytes())
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)  # nosec B615 # a local directory, never a download
    targets = set(meta.get("target_modules") or [])
    output = model.get_output_embeddings()
    out_name = next((n for n, m in model.named_modules() if m is output), None)
    tied = output is not None and output.weight is model.get_input_embeddings().weight
    if tied and out_name is not None and out_name.rpartition(".")[2] in targets:
        # Untie, so the merged output layer keeps its update and the input embeddings do not.
        output.weight = torch.nn.Parameter(output.weight.detach().clone())
        model.config.tie_word_embeddings = False
        if hasattr(model.config, "get_text_config"):
            model.config.get_text_config().tie_word_embeddings = False
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecations, seen by peft
        adapted = PeftModel.from_pretrained(model, str(weights))
        merged = adapted.merge_and_unload()
    merged.save_pretrained(into)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)  # nosec B615 # a local directory, never a download
    tokenizer.save_pretrained(into)  # with its chat template
    for extra in ("generation_config.json", "platoon_model.json"):
        source = Path(base_dir) / extra
        if source.is_file() and not (into / extra).exists():
            shutil.copy2(source, into / extra)

"""The training engine: one base causal LM, a LoRA adapter (peft) per training client, AdamW,
the Tinker losses, and the adapters sampled with (live, snapshots, saved checkpoints).

Every method here is synchronous and touches torch; the server calls them from one worker
thread at a time, so no two of them ever run at once.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Unpack

import msgspec
import numpy as np
import torch

from platoon.backends.local import losses
from platoon.backends.local.checkpoints import (
    CheckpointInfo,
    CheckpointStore,
    Mark,
    check_manifest,
    private_dir,
    read_spec,
)
from platoon.backends.local.devices import (
    pick_attention,
    pick_device,
    pick_dtype,
    release_freed_memory,
    resolve_model_dir,
)
from platoon.backends.local.invariant import left_padded, per_row_attention
from platoon.backends.local.proto import Datum
from platoon.backends.local.specs import AdamParams, EngineError, LoraSpec, ModelNotFound, WeightsRef

__all__ = [
    "AdamParams",
    "CheckpointInfo",
    "Engine",
    "EngineError",
    "LoraSpec",
    "ModelNotFound",
    "WeightsRef",
    "check_manifest",
    "pick_attention",
    "pick_device",
    "pick_dtype",
    "resolve_model_dir",
]


class _Trainable:
    def __init__(self, adapter: str, spec: LoraSpec, optimizer: torch.optim.Optimizer, params: list) -> None:
        self.adapter = adapter
        self.spec = spec
        self.optimizer = optimizer
        self.params = params
        self.steps = 0


class _Snapshot(msgspec.Struct):
    spec: LoraSpec
    tensors: dict[str, torch.Tensor] | None = None
    path: Path | None = None


CPU_BATCH_TOKENS = 1024  # a training batch's tokens on a CPU (see Engine.forward_backward)

_ATTN = re.compile(r"(attn|attention)", re.I)
_MLP = re.compile(r"(mlp|ffn|feed_forward|feedforward)", re.I)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence peft's warnings about tied embeddings, which do not apply to LoRA deltas."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        warnings.filterwarnings("ignore", message=".*save_embedding_layers.*")
        warnings.filterwarnings("ignore", message="Adapter .* was active which is now deleted.*")
        yield


class Engine:
    """A base model with LoRA training clients and sampler weights on top of it.

    The device is chosen once (`auto`: CUDA when present, else CPU); one engine, one process,
    serves one device.
    """

    def __init__(
        self,
        model: str,
        *,
        checkpoint_dir: str | Path,
        device: str | None = "auto",
        dtype: str | None = None,
        attention: str | None = None,
        sampler_slots: int = 4,
        memory_snapshots: int = 4,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.model_dir = resolve_model_dir(model)
        self.device = pick_device(device)
        self.dtype = pick_dtype(self.device, dtype)
        self.attention = attention or pick_attention(self.device)
        try:
            self.base = AutoModelForCausalLM.from_pretrained(  # nosec B615 # a local directory, never a download
                self.model_dir, dtype=self.dtype, local_files_only=True, attn_implementation=self.attention
            )
        except (ValueError, ImportError):
            if attention is not None:
                raise
            # An architecture without SDPA (or flash attention) support runs its own attention.
            self.attention = "eager"
            self.base = AutoModelForCausalLM.from_pretrained(  # nosec B615 # a local directory, never a download
                self.model_dir, dtype=self.dtype, local_files_only=True, attn_implementation="eager"
            )
        self.base.to(self.device).eval().requires_grad_(False)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)  # nosec B615 # a local directory, never a download
        rows = self.base.get_input_embeddings().num_embeddings
        if not isinstance(rows, int):  # an embedding table's rows: torch types module attributes loosely
            raise EngineError(f"the model's input embeddings have no row count: {rows!r}")
        self.vocab_size = rows
        self.max_context = int(getattr(self.base.config, "max_position_embeddings", 0) or 32768)
        self.eos_ids = self._eos_ids()
        self.checkpoint_dir = Path(checkpoint_dir)
        self.store = CheckpointStore(self.checkpoint_dir)
        self.store.sweep_partial()  # what a checkpoint write cut short by a kill left
        self.peft: Any = None
        self._models: dict[str, _Trainable] = {}
        self._snapshots: dict[str, _Snapshot] = {}
        self._slots: OrderedDict[str, str] = OrderedDict()  # snapshot key -> adapter name, LRU
        self._sampler_slots = sampler_slots
        self.memory_snapshots = memory_snapshots
        self._counter = 0
        self._targets = self._lora_targets()
        self._active: object = _UNSET  # the adapter peft has active now (None: adapters off)
        self.generations: dict[str, int] = {}  # sampler weights key -> times its weights were replaced

    # ---- model facts ----------------------------------------------------------------

    def facts(self) -> dict[str, object]:
        """Where and how the model runs, for `get_server_capabilities` and the start-up line."""
        facts: dict[str, object] = {
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "attention": self.attention,
            "torch": torch.__version__,
        }
        if self.device.type == "cuda":
            facts["device_name"] = torch.cuda.get_device_name(self.device)
        else:
            facts["cpu_threads"] = torch.get_num_threads()
        return facts

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        generation = getattr(self.base, "generation_config", None)
        for source in (getattr(generation, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(int(i) for i in source)
        return frozenset(ids)

    def _lora_targets(self) -> dict[str, list[str]]:
        from transformers.pytorch_utils import Conv1D

        out_name = next(
            (n for n, m in self.base.named_modules() if m is self.base.get_output_embeddings()), None
        )
        attn: set[str] = set()
        mlp: set[str] = set()
        for name, module in self.base.named_modules():
            if not isinstance(module, torch.nn.Linear | Conv1D) or name == out_name:
                continue
            parent, _, leaf = name.rpartition(".")
            if _ATTN.search(parent):
                attn.add(leaf)
            elif _MLP.search(parent):
                mlp.add(leaf)
        return {"attn": sorted(attn), "mlp": sorted(mlp), "unembed": [out_name] if out_name else []}

    # ---- adapters -------------------------------------------------------------------

    def _new_adapter(self, spec: LoraSpec, prefix: str) -> str:
        from peft import LoraConfig, get_peft_model

        targets = (
            (self._targets["attn"] if spec.train_attn else [])
            + (self._targets["mlp"] if spec.train_mlp else [])
            + (self._targets["unembed"] if spec.train_unembed else [])
        )
        if not targets:
            raise EngineError("LoRA config trains nothing: enable train_mlp, train_attn or train_unembed")
        if spec.rank < 1:
            raise EngineError(f"LoRA rank must be >= 1, got {spec.rank}")
        self._counter += 1
        name = f"{prefix}{self._counter}"
        config = LoraConfig(
            r=spec.rank,
            lora_alpha=spec.alpha,  # a float: peft scales by alpha / r
            lora_dropout=0.0,
            target_modules=targets,
        )
        with _quiet(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed if spec.seed is not None else self._counter)
            if self.peft is None:
                self.peft = get_peft_model(self.base, config, adapter_name=name)
                self.peft.eval()
            else:
                self.peft.add_adapter(name, config)
        self._active = _UNSET
        return name

    def _adapter_params(self, adapter: str) -> dict[str, torch.nn.Parameter]:
        marker = f".{adapter}."
        return {
            name.replace(marker, "."): param for name, param in self.peft.named_parameters() if marker in name
        }

    def _use(self, adapter: str | None) -> torch.nn.Module:
        """The model to call with `adapter` active (None: the base weights).

        peft walks every module to switch adapters, which costs more than a decoding step of a
        small model; the switch is made only when the wanted adapter changes.
        """
        if self.peft is None or (adapter is None and not self.peft.peft_config):
            return self.base  # no adapter left; the LoRA layers in place skip missing ones
        if self._active != adapter:
            with _quiet():
                if adapter is None:
                    if self.peft.active_adapter not in self.peft.peft_config:
                        # peft leaves a deleted adapter marked active and would look it up.
                        self.peft.set_adapter(next(iter(self.peft.peft_config)))
                    self.peft.base_model.disable_adapter_layers()
                else:
                    if self._active is None or self._active is _UNSET:
                        self.peft.base_model.enable_adapter_layers()
                    self.peft.set_adapter(adapter)
            self._active = adapter
        return self.peft

    def _drop_adapter(self, adapter: str) -> None:
        with _quiet():
            self.peft.delete_adapter(adapter)
        self._active = _UNSET

    # ---- training clients ----------------------------------------------------------

    def create_model(self, model_id: str, spec: LoraSpec) -> None:
        adapter = self._new_adapter(spec, "t")
        params = list(self._adapter_params(adapter).values())
        for p in params:
            p.requires_grad_(True)
        optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
        self._models[model_id] = _Trainable(adapter, spec, optimizer, params)

    def has_model(self, model_id: str) -> bool:
        return model_id in self._models

    def adapter_kind(self) -> tuple[int, tuple[str, ...]] | None:
        """The active adapter's rank and the modules it adapts (None: the base weights): what
        decides the shapes of a forward's matrix products."""
        if self.peft is None or not isinstance(self._active, str):
            return None
        config = self.peft.peft_config[self._active]
        targets = config.target_modules
        return config.r, (targets,) if isinstance(targets, str) else tuple(sorted(targets or ()))

    def lora_rank(self, model_id: str) -> int:
        return self._trainable(model_id).spec.rank

    def release_model(self, model_id: str) -> None:
        """Free a training client's adapter and optimizer (its checkpoints stay on disk)."""
        model = self._models.pop(model_id, None)
        if model is not None:
            self._drop_adapter(model.adapter)

    def _trainable(self, model_id: str) -> _Trainable:
        model = self._models.get(model_id)
        if model is None:
            raise ModelNotFound(f"unknown model_id {model_id!r}")
        return model

    def check_batch(self, data: list[Datum], loss_fn: str, config: dict[str, float]) -> dict[str, float]:
        """Refuse a batch this model cannot run (lengths, ids, the loss and its inputs); return
        the loss's config. Reads no model state: the server checks a request with it before
        queueing it."""
        names = set(data[0].inputs) if data else set()
        for i, datum in enumerate(data):
            if set(datum.inputs) != names:
                raise EngineError(f"datum {i}: loss_fn_inputs keys differ from datum 0's")
        try:
            resolved = losses.check_loss(loss_fn, names, config)
        except losses.LossError as exc:
            raise EngineError(str(exc)) from None
        self._check_datums(data)
        return resolved

    def _check_datums(self, data: list[Datum]) -> None:
        if not data:
            raise EngineError("forward_backward needs at least one datum")
        for i, datum in enumerate(data):
            n = datum.tokens.size
            if n == 0:
                raise EngineError(f"datum {i}: model_input is empty")
            if n > self.max_context:
                raise EngineError(f"datum {i}: {n} tokens exceed the context length {self.max_context}")
            self._check_ids(datum.tokens, f"datum {i}: model_input")
            for name, values in datum.inputs.items():
                if values.size != n:
                    raise EngineError(
                        f"datum {i}: loss_fn_inputs[{name!r}] has {values.size} values for {n} input tokens"
                    )
                if not np.all(np.isfinite(values)):
                    raise EngineError(f"datum {i}: loss_fn_inputs[{name!r}] holds NaN or infinite values")
            if "target_tokens" in datum.inputs:
                self._check_ids(datum.inputs["target_tokens"], f"datum {i}: target_tokens")

    def _check_ids(self, ids: np.ndarray, what: str) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = int(ids[(ids < 0) | (ids >= self.vocab_size)][0])
            raise EngineError(f"{what} holds token id {bad}, outside the vocabulary [0, {self.vocab_size})")

    def forward_backward(
        self,
        model_id: str,
        data: list[Datum],
        loss_fn: str,
        config: dict[str, float],
        *,
        forward_only: bool,
        max_batch_tokens: int = 8192,
        like_sampler: bool = False,
    ) -> tuple[list[np.ndarray], dict[str, float]]:
        """Run the loss over `data`; accumulate gradients unless `forward_only`.

        Returns each datum's target logprobs and the `name:reduction` metrics. `like_sampler`:
        score as the batch-invariant sampler does (`train.reproducible`, where its rows batch):
        a datum a row, left-padded, attending row by row (`invariant.blocked_attention`), so the
        logprobs are the sampler's to the last bit (measured: docs/how-to/rl-health.md), at the
        price of that attention and of no packing.
        """
        model = self._trainable(model_id)
        resolved = self.check_batch(data, loss_fn, config)
        self._use(model.adapter)
        budget = max(1, min(max_batch_tokens, (1 << 28) // max(1, self.vocab_size)))
        if self.device.type == "cpu":
            # A CPU gains nothing from wide batches and pays in memory: 16 datums of ~430 tokens
            # on SmolLM2, two threads, took 59 s at 16.2 GB in batches of 5,461 tokens and
            # 41 s at 3.8 GB in batches of 1,024 (benchmarks/forward_backward.py).
            budget = min(budget, CPU_BATCH_TOKENS)
        outputs: list[np.ndarray] = [np.zeros(0, np.float32)] * len(data)
        total = 0.0
        lengths = [d.tokens.size for d in data]
        batches = _batches(lengths, budget, pack=not like_sampler)
        attending = per_row_attention(self.peft) if like_sampler else contextlib.nullcontext()
        with attending:
            for rows in batches:
                logprobs, loss = self._batch_loss(rows, data, loss_fn, resolved, forward_only, like_sampler)
                total += loss
                for i, values in logprobs.items():
                    outputs[i] = values
        if not forward_only:
            release_freed_memory(self.device)  # the step's activations, before the sampler's caches
        return outputs, {"loss:sum": total}

    def _batch_loss(
        self,
        rows: list[list[int]],
        data: list[Datum],
        loss_fn: str,
        config: dict[str, float],
        forward_only: bool,
        like_sampler: bool = False,
    ) -> tuple[dict[int, np.ndarray], float]:
        """One forward (and backward) over packed rows: each row holds one or more datums end to
        end, each datum's positions start at 0 and it attends only to itself (transformers reads
        the restarts of `position_ids` as packed sequences), so the result equals one datum at a
        time while mixed lengths waste no compute on padding. `like_sampler`: a datum a row,
        left-padded, as the batch-invariant sampler prefills (its row attention reads the mask)."""
        ids, targets, extra, spans = (_left_padded if like_sampler else _packed)(rows, data)
        packed = bool(extra)
        order = sorted(spans)
        device = self.device
        ids_t = torch.from_numpy(ids).to(device)
        targets_t = torch.from_numpy(targets).to(device)
        extra = {name: torch.from_numpy(values).to(device) for name, values in extra.items()}
        with torch.set_grad_enabled(not forward_only):
            logits = self.peft(input_ids=ids_t, use_cache=False, **extra).logits.float()
            token_logprobs = -torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets_t.reshape(-1), reduction="none"
            ).reshape(ids_t.shape)
            if packed:
                flat = torch.cat([token_logprobs[r, a : a + n] for r, a, n in (spans[i] for i in order)])
            else:
                flat = token_logprobs[torch.tensor([spans[i][0] for i in order], device=device)].reshape(-1)
            inputs = {
                name: torch.from_numpy(
                    np.concatenate([data[i].inputs[name] for i in order]).astype(np.float32)
                ).to(device)
                for name in data[order[0]].inputs
                if name != "target_tokens"
            }
            sizes = [data[i].tokens.size for i in order]
            loss = losses.compute_loss(loss_fn, flat, inputs, config, sizes)
            if not forward_only:
                loss.backward()
        values = token_logprobs.detach().float().cpu().numpy()
        return {i: values[r, a : a + n].copy() for i, (r, a, n) in spans.items()}, float(loss.detach())

    def optim_step(self, model_id: str, params: AdamParams) -> dict[str, float]:
        model = self._trainable(model_id)
        if params.learning_rate < 0 or not (0 <= params.beta1 < 1 and 0 <= params.beta2 < 1):
            raise EngineError("adam_params out of range: learning_rate >= 0 and betas in [0, 1) are required")
        grads = [p for p in model.params if p.grad is not None]
        if not grads:
            norm = 0.0
        elif params.grad_clip_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(grads, params.grad_clip_norm))
        else:  # only the norm, for the metric: no pass multiplying every gradient by 1
            norm = float(
                torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in grads]))
            )
        for group in model.optimizer.param_groups:
            group.update(
                lr=params.learning_rate,
                betas=(params.beta1, params.beta2),
                eps=params.eps,
                weight_decay=params.weight_decay,
            )
        model.optimizer.step()
        model.optimizer.zero_grad(set_to_none=True)
        model.steps += 1
        return {"grad_norm:mean": norm, "learning_rate:mean": params.learning_rate}

    # ---- checkpoints ---------------------------------------------------------------

    def local_path(self, tinker_path: str) -> Path:
        """The directory behind a `tinker://<run>/<weights|sampler_weights>/<name>` path."""
        return self.store.local_path(tinker_path)

    def runs_on_disk(self) -> list[str]:
        """Training run ids (model ids) with a checkpoint directory, newest first."""
        return self.store.runs()

    def checkpoints(self, run_id: str, *, prune: bool = True) -> list[CheckpointInfo]:
        """The saved checkpoints of a run, oldest first; expired ones are left out, and removed
        with `prune` (which touches the adapters, so only from the worker thread)."""
        found, expired = self.store.listing(run_id)
        if prune:
            for checkpoint_id in expired:
                self.delete_checkpoint(run_id, checkpoint_id)
        return found

    def delete_checkpoint(self, run_id: str, checkpoint_id: str) -> None:
        path = f"tinker://{run_id}/{checkpoint_id}"
        if not self.store.directory_of(run_id, checkpoint_id).is_dir():
            raise ModelNotFound(f"no checkpoint at {path}")
        self._forget_snapshot(path)
        self.store.remove(run_id, checkpoint_id)

    def mark_checkpoint(self, run_id: str, checkpoint_id: str, **fields: Unpack[Mark]) -> None:
        """Set `public` or `expires_at` (unix time, None = never) on a saved checkpoint."""
        self.store.mark(run_id, checkpoint_id, fields)

    def copy_checkpoint(self, tinker_path: str, run_id: str) -> str:
        """Copy a saved checkpoint into another run; return the copy's tinker path."""
        return self.store.copy(tinker_path, run_id)

    def weights_info(self, tinker_path: str) -> LoraSpec:
        return read_spec(self.local_path(tinker_path))

    def _write_adapter(self, model: _Trainable, directory: Path, *, optimizer: bool) -> None:
        from safetensors.torch import save_file

        def fill(staging: Path) -> None:
            tensors = {
                k: v.detach().cpu().contiguous() for k, v in self._adapter_params(model.adapter).items()
            }
            save_file(tensors, staging / "adapter_model.safetensors")
            self.peft.peft_config[model.adapter].save_pretrained(staging)
            meta = {
                "lora": msgspec.to_builtins(model.spec),
                "base_model": str(self.model_dir),
                "steps": model.steps,
            }
            (staging / "platoon_lora.json").write_text(json.dumps(meta))
            if optimizer:
                torch.save(model.optimizer.state_dict(), staging / "optimizer.pt")

        self.store.write(directory, fill)

    def save_state(self, model_id: str, name: str, *, overwrite: bool = False) -> str:
        model = self._trainable(model_id)
        path, directory = self.store.path(model_id, "weights", name)
        if directory.exists() and not overwrite:
            raise EngineError(f"checkpoint {path} already exists (pass overwrite=True to replace it)")
        self._write_adapter(model, directory, optimizer=True)
        return path

    def save_for_sampler(self, model_id: str, name: str) -> str:
        model = self._trainable(model_id)
        path, directory = self.store.path(model_id, "sampler_weights", name)
        self._write_adapter(model, directory, optimizer=False)
        self._forget_snapshot(path)
        return path

    def snapshot(self, model_id: str) -> WeightsRef:
        """Copy a training model's current adapter into memory for an ephemeral sampler."""
        model = self._trainable(model_id)
        tensors = {k: v.detach().clone() for k, v in self._adapter_params(model.adapter).items()}
        self._counter += 1
        key = f"snapshot:{self._counter}"
        self._snapshots[key] = _Snapshot(spec=model.spec, tensors=tensors)
        self._spill()
        return WeightsRef(key=key)

    def _spill(self) -> None:
        """Keep at most `memory_snapshots` ephemeral snapshots in memory; older ones move to disk."""
        from safetensors.torch import save_file

        held = [k for k, s in self._snapshots.items() if s.tensors is not None]
        for key in held[: max(0, len(held) - self.memory_snapshots)]:
            snapshot = self._snapshots[key]
            assert snapshot.tensors is not None
            directory = self.checkpoint_dir / "_ephemeral" / key.replace(":", "-")
            private_dir(directory)
            save_file(
                {k: v.cpu().contiguous() for k, v in snapshot.tensors.items()},
                directory / "adapter_model.safetensors",
            )
            (directory / "adapter_model.safetensors").chmod(0o600)
            snapshot.tensors, snapshot.path = None, directory

    def sampler_weights(self, tinker_path: str) -> WeightsRef:
        """Weights for a sampler created from a saved checkpoint path."""
        directory = self.local_path(tinker_path)
        if tinker_path not in self._snapshots:
            self._snapshots[tinker_path] = _Snapshot(spec=read_spec(directory), path=directory)
        return WeightsRef(key=tinker_path)

    def _forget_snapshot(self, key: str) -> None:
        # A path saved again under the same name holds new weights: caches keyed on it go stale.
        # (Snapshot keys are never reused, so they need no count.)
        if not key.startswith("snapshot:"):
            self.generations[key] = self.generations.get(key, 0) + 1
        snapshot = self._snapshots.pop(key, None)
        if snapshot is not None and snapshot.path is not None and key.startswith("snapshot:"):
            shutil.rmtree(snapshot.path, ignore_errors=True)
        adapter = self._slots.pop(key, None)
        if adapter is not None:
            self._drop_adapter(adapter)

    def _load_into(self, adapter: str, directory: Path) -> None:
        from safetensors.torch import load_file

        check_manifest(directory)
        try:
            tensors = load_file(directory / "adapter_model.safetensors")
        except Exception as exc:
            raise EngineError(f"checkpoint {directory} cannot be read: {type(exc).__name__}: {exc}") from None
        self._copy_into(adapter, tensors, str(directory))

    def _copy_into(self, adapter: str, tensors: dict[str, torch.Tensor], source: str) -> None:
        params = self._adapter_params(adapter)
        if set(params) != set(tensors):
            raise EngineError(f"checkpoint {source} does not match the model's LoRA layout")
        with torch.no_grad():
            for key, param in params.items():
                if param.shape != tensors[key].shape:
                    raise EngineError(f"checkpoint {source} has a different LoRA shape for {key}")
                param.copy_(tensors[key])

    def load_state(self, model_id: str, tinker_path: str, *, optimizer: bool) -> None:
        """Load a `save_state` checkpoint into an existing training model."""
        model = self._trainable(model_id)
        directory = self.local_path(tinker_path)
        check_manifest(directory)
        spec = read_spec(directory)
        if (spec.rank, spec.train_mlp, spec.train_attn, spec.train_unembed) != (
            model.spec.rank,
            model.spec.train_mlp,
            model.spec.train_attn,
            model.spec.train_unembed,
        ):
            raise EngineError(f"checkpoint {tinker_path} has LoRA config {spec}, the model has {model.spec}")
        self._restore(model, directory, tinker_path, optimizer=optimizer)

    def create_from_state(self, model_id: str, tinker_path: str, *, optimizer: bool) -> None:
        """A new training model whose LoRA config and weights (and optimizer) come from a checkpoint."""
        directory = self.local_path(tinker_path)
        check_manifest(directory)
        self.create_model(model_id, read_spec(directory))
        try:
            self._restore(self._models[model_id], directory, tinker_path, optimizer=optimizer)
        except Exception:
            self.release_model(model_id)
            raise

    def _restore(self, model: _Trainable, directory: Path, source: str, *, optimizer: bool) -> None:
        self._load_into(model.adapter, directory)
        model.optimizer.zero_grad(set_to_none=True)
        if optimizer:
            state_file = directory / "optimizer.pt"
            if not state_file.is_file():
                raise EngineError(f"checkpoint {source} holds no optimizer state (sampler weights?)")
            try:
                model.optimizer.load_state_dict(
                    torch.load(state_file, map_location=self.device, weights_only=True)
                )
            except Exception as exc:
                raise EngineError(
                    f"checkpoint {source}: its optimizer state cannot be read: {type(exc).__name__}: {exc}"
                ) from None
        else:
            model.optimizer.state.clear()
        meta = json.loads((directory / "platoon_lora.json").read_text())
        model.steps = int(meta.get("steps", 0))

    # ---- sampling ----------------------------------------------------------------------

    @contextlib.contextmanager
    def weights(self, ref: WeightsRef) -> Iterator[torch.nn.Module]:
        """The model to call with `ref`'s weights active (call under torch.no_grad)."""
        if ref.model_id is not None:
            yield self._use(self._trainable(ref.model_id).adapter)
        elif ref.key is not None:
            yield self._use(self._slot(ref.key))
        else:
            yield self._use(None)

    def _slot(self, key: str) -> str:
        adapter = self._slots.get(key)
        if adapter is not None:
            self._slots.move_to_end(key)
            return adapter
        snapshot = self._snapshots.get(key)
        if snapshot is None:
            raise ModelNotFound(f"sampler weights {key!r} are gone")
        while len(self._slots) >= self._sampler_slots:
            _, old = self._slots.popitem(last=False)
            self._drop_adapter(old)
        adapter = self._new_adapter(snapshot.spec, "s")
        if snapshot.tensors is not None:
            self._copy_into(adapter, snapshot.tensors, key)
        else:
            assert snapshot.path is not None
            self._load_into(adapter, snapshot.path)
        for param in self._adapter_params(adapter).values():
            param.requires_grad_(False)
        self._slots[key] = adapter
        return adapter

    def drop_weights(self, ref: WeightsRef) -> None:
        """Forget an ephemeral snapshot once no sampler uses it."""
        if ref.key is not None and ref.key.startswith("snapshot:"):
            self._forget_snapshot(ref.key)


_UNSET = object()


Layout = tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], dict[int, tuple[int, int, int]]]


def _packed(rows: list[list[int]], data: list[Datum]) -> Layout:
    """The ids and targets of datums laid end to end in rows, right-padded, with the
    `position_ids` that restart at each datum (none when each row is one datum filling it), and
    where each datum is: datum -> (row, start, length)."""
    lengths = [[data[i].tokens.size for i in row] for row in rows]
    width = max(sum(n) for n in lengths)
    packed = any(len(row) > 1 or sum(n) < width for row, n in zip(rows, lengths, strict=True))
    ids = np.zeros((len(rows), width), dtype=np.int64)
    targets = np.zeros((len(rows), width), dtype=np.int64)
    positions = np.zeros((len(rows), width), dtype=np.int64)
    spans: dict[int, tuple[int, int, int]] = {}
    for r, row in enumerate(rows):
        start = 0
        for i in row:
            datum, n = data[i], data[i].tokens.size
            ids[r, start : start + n] = datum.tokens
            targets[r, start : start + n] = datum.inputs["target_tokens"]
            positions[r, start : start + n] = np.arange(n)
            spans[i] = (r, start, n)
            start += n
        positions[r, start:] = np.arange(width - start)  # padding: a sequence of its own
    return ids, targets, ({"position_ids": positions} if packed else {}), spans


def _left_padded(rows: list[list[int]], data: list[Datum]) -> Layout:
    """A datum a row, left-padded to the longest, with the `attention_mask` and `position_ids`
    that leave the padding out (`invariant.left_padded`, as the sampler prefills)."""
    datums = [data[i] for (i,) in rows]
    width = max(d.tokens.size for d in datums)
    ids, padding = left_padded([d.tokens.tolist() for d in datums], torch.device("cpu"))
    targets = np.zeros((len(rows), width), dtype=np.int64)
    spans: dict[int, tuple[int, int, int]] = {}
    for r, ((i,), datum) in enumerate(zip(rows, datums, strict=True)):
        n = datum.tokens.size
        targets[r, width - n :] = datum.inputs["target_tokens"]
        spans[i] = (r, width - n, n)
    return ids.numpy(), targets, {k: v.numpy() for k, v in padding.items()}, spans


def _batches(lengths: list[int], budget: int, *, pack: bool = True) -> Iterator[list[list[int]]]:
    """Pack datum indices into rows as wide as the longest datum (first fit, longest first; one
    a row without `pack`), and the rows into batches of at most `budget` tokens (always at least
    one row)."""
    width = max(lengths)
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, free in enumerate(room if pack else ()):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(width - lengths[i])
    per_batch = max(1, budget // width)
    for start in range(0, len(rows), per_batch):
        yield rows[start : start + per_batch]

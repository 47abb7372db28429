"""Disk taken by the sampler weights a training run saves at every step.

Trains the quickstart (`examples/quickstart/train-local.yaml`: the tiny model, LoRA rank 16) on
the embedded backend for `--steps` steps and prints the bytes of one step's sampler weights, what
the run leaves in its `sampler_weights` directory, and what it would hold had every step's
weights stayed (before the trainer deleted those nothing samples any more). Then it estimates one
step's weights for a ~0.5B-parameter model (Qwen2.5-0.5B's shape, built on the meta device: no
download) at LoRA rank 32 on every linear layer and the unembedding, as the embedded backend
trains it, in float32 (CPU) and bfloat16 (GPU).

    python benchmarks/step_weights.py [--steps 12] [--max-staleness 0] [--rank 32]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("OPENREWARD_LOG_LEVEL", "WARNING")

ROOT = Path(__file__).resolve().parents[1]


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(steps: int, max_staleness: int) -> None:
    import logging

    import anyio
    import structlog

    from platoon.api import train
    from platoon.config import load_config

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    sys.path.insert(0, str(ROOT / "examples" / "quickstart"))
    overrides = [
        f"train.max_training_steps={steps}",
        "train.save_every=0",
        f"train.max_staleness={max_staleness}",
    ]
    config = load_config(ROOT / "examples" / "quickstart" / "train-local.yaml", overrides)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site.yaml"
        site.write_text(f"runs: {tmp}/runs\ncache: {os.environ.get('PLATOON_BENCH_CACHE', tmp + '/cache')}\n")
        os.environ["PLATOON_SITE"] = str(site)
        run_dir = Path(tmp) / "run"
        anyio.run(lambda: train(config, run_dir=run_dir, console=False))
        folders = sorted(p for p in (run_dir / "tinker").glob("*/sampler_weights/*") if p.is_dir())
        steps_left = [p for p in folders if p.name.startswith("step-")]
        one = size(steps_left[-1])
        print(f"tiny model (quickstart), {steps} steps, max_staleness {max_staleness}:")
        print(f"  one step's sampler weights        {one:>12,} bytes")
        print(
            f"  left on disk                      {sum(map(size, folders)):>12,} bytes  {[p.name for p in folders]}"
        )
        print(f"  had every step's stayed           {one * steps:>12,} bytes")


def estimate(rank: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        model = Qwen2ForCausalLM(shape)
        base = sum(p.numel() for p in model.parameters())
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
        lora = get_peft_model(model, LoraConfig(r=rank, lora_alpha=32, target_modules=targets))
        adapter = sum(p.numel() for n, p in lora.named_parameters() if "lora_" in n)
    print(f"~0.5B model ({base / 1e9:.2f}B parameters), LoRA rank {rank}: {adapter:,} adapter parameters")
    for dtype, width in (("float32", 4), ("bfloat16", 2)):
        per_step = adapter * width
        print(
            f"  {dtype:<9} {per_step / 1e6:7.1f} MB a step; 1000 steps kept: {per_step * 1000 / 1e9:6.1f} GB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--max-staleness", type=int, default=0)
    parser.add_argument("--rank", type=int, default=32)
    args = parser.parse_args()
    run(args.steps, args.max_staleness)
    estimate(args.rank)


if __name__ == "__main__":
    main()

"""Where a training step's time goes, on the embedded backend with a tiny random-init model.

Runs `platoon.train.loop.train` on a vowel-counting environment (one model call and one tool
call an episode, every sample graded) with `max_staleness: 0` (strictly on-policy: rollouts
wait for the previous step's weights) and `max_staleness: 1` (the rollouts of step s+1 run while
step s trains). From the metrics the trainer publishes it prints, per step, the time of the
rollouts, credit assignment, training (forward_backward + optim_step) and the sampler refresh,
the time the trainer waited for the batch, the wall time per step, the share of time the
trainer sat idle, and the datums dropped as too stale (and steps left with none). The first step
is left out of the averages: it has no previous step to overlap with.

Each prompt carries `--context-words` of filler so that training (forward and backward over
every token) weighs about as much as sampling a few tokens does: with a tiny model and short
prompts the rollouts dominate and there is little for the overlap to hide.

    python benchmarks/train_step.py [--steps 8] [--batch-size 4] [--group-size 8] [--tokens 4]
                                    [--context-words 300] [--hidden 64] [--layers 2] [--threads N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("OPENREWARD_LOG_LEVEL", "WARNING")

import anyio
from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

import platoon as pt
from platoon.api import train
from platoon.config import validate_config


class Submission(BaseModel):
    text: str


class Vowels(Environment):
    """Say something; the reward is the share of its letters that are vowels."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}"} for i in range(64)]

    context_words = 0  # filler before the question: longer prompts weigh more in training

    def get_prompt(self) -> list[TextBlock]:
        filler = " ".join(f"word{i % 50}" for i in range(self.context_words))
        return [TextBlock(text=f"{filler}\nSay something.".lstrip())]

    @tool
    async def submit(self, args: Submission) -> ToolOutput:
        """Submit the answer."""
        letters = [c for c in args.text.lower() if c.isalpha() and c.isascii()]
        reward = sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0
        return ToolOutput(blocks=[TextBlock(text="ok")], reward=reward, finished=True)


@pt.harness("bench-say-and-submit")
async def say_and_submit(ctx: pt.AgentContext) -> pt.AgentResult:
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}])
    await ctx.call_tool("submit", {"text": reply.text})
    return pt.AgentResult("completed", final_message=reply.text)


def config(model: str, args: argparse.Namespace, staleness: int) -> dict[str, Any]:
    return {
        "environments": [
            {"name": "vowels", "service": "python://__main__:Vowels", "harness": "bench-say-and-submit"}
        ],
        "train": {
            "backend": "local",
            "model_name": model,
            "renderer_name": "qwen3_instruct",
            "lora_rank": 16,
            "batch_size": args.batch_size,
            "max_training_steps": args.steps,
            "max_staleness": staleness,
            "save_every": 0,
            "seed": 1,
            "optimizer": {"learning_rate": 0.01},
            "workflow_config": {
                "group_size": args.group_size,
                "remove_constant_reward_groups": False,
                "rollout_config": {
                    "max_steps": 1,
                    "inference_params": {"max_completion_tokens": args.tokens},
                },
            },
        },
        "stats": {"experiment_name": "bench", "trial_name": f"staleness-{staleness}"},
    }


def measure(model: str, args: argparse.Namespace, staleness: int, root: Path) -> dict[str, float]:
    run_dir = root / f"staleness-{staleness}"
    anyio.run(lambda: train(validate_config(config(model, args, staleness)), run_dir=run_dir, console=False))
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    later = steps[1:]
    walls = [b["time"] - a["time"] for a, b in itertools.pairwise(steps)]
    trained = [m for m in later if "time/train" in m]  # a step whose datums were all stale trains nothing
    idle = sum(m["time/trainer_idle"] for m in later)
    busy = sum(
        m.get("time/train", 0.0) + m.get("time/sampler_refresh", 0.0) + m["time/credit"] for m in later
    )
    return {
        "rollout": statistics.mean(m["time/rollout"] for m in later),
        "credit": statistics.mean(m["time/credit"] for m in later),
        "train": statistics.mean(m["time/train"] for m in trained) if trained else 0.0,
        "sampler_refresh": statistics.mean(m["time/sampler_refresh"] for m in trained) if trained else 0.0,
        "dropped": sum(m["staleness/dropped_datums"] for m in steps),
        "skipped": sum(m.get("train/skipped", 0.0) for m in steps),
        "trainer_idle": statistics.mean(m["time/trainer_idle"] for m in later),
        "wall": statistics.mean(walls),
        "idle_fraction": idle / (idle + busy),
        "idle_fraction_run": steps[-1]["trainer/idle_fraction"],
        "staleness_mean": statistics.mean(m.get("staleness/mean", 0.0) for m in later),
        "reward_first": steps[0]["reward/mean"],
        "reward_last": steps[-1]["reward/mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4, help="max completion tokens a sample")
    parser.add_argument("--context-words", type=int, default=300, help="filler words in each prompt")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = parser.parse_args()

    import torch

    Vowels.context_words = args.context_words
    if args.threads:
        torch.set_num_threads(args.threads)

    from platoon.testing.models import save_tiny_model

    with tempfile.TemporaryDirectory(prefix="platoon-bench-") as tmp:
        model = str(save_tiny_model(Path(tmp) / "model", hidden_size=args.hidden, num_layers=args.layers))
        print(
            f"tiny Qwen3 hidden={args.hidden} layers={args.layers}, torch threads {torch.get_num_threads()}; "
            f"{args.steps} steps of {args.batch_size} tasks x {args.group_size} rollouts, "
            f"<= {args.tokens} tokens a sample"
        )
        print("seconds per step (mean over steps 2..N)")
        print(
            f"{'staleness':>9} {'rollout':>8} {'credit':>8} {'train':>8} {'refresh':>8} {'idle':>8} "
            f"{'wall':>8} {'idle frac':>9} {'(run)':>6} {'stale':>6} {'dropped':>7} {'skipped':>7}"
        )
        results = {}
        for staleness in (0, 1):
            r = results[staleness] = measure(model, args, staleness, Path(tmp))
            print(
                f"{staleness:>9} {r['rollout']:>8.3f} {r['credit']:>8.4f} {r['train']:>8.3f} "
                f"{r['sampler_refresh']:>8.3f} {r['trainer_idle']:>8.3f} {r['wall']:>8.3f} "
                f"{r['idle_fraction']:>9.2f} {r['idle_fraction_run']:>6.2f} {r['staleness_mean']:>6.2f} "
                f"{r['dropped']:>7.0f} {r['skipped']:>7.0f}"
            )
        ratio = results[1]["idle_fraction"] / max(results[0]["idle_fraction"], 1e-9)
        print(f"idle fraction with max_staleness 1 / with 0: {ratio:.2f} (target <= 0.5)")


if __name__ == "__main__":
    main()

"""Time and peak memory of one training forward-backward on the real model, per batch size.

Scores 16 datums of 400-460 random tokens (an RL step's worth of agent episodes) with the
importance-sampling loss on SmolLM2-135M-Instruct with a rank-16 LoRA, in batches of at most
`--batch-tokens` tokens, and prints the seconds taken and the process's peak RSS. Run one size
a process, since the peak is the process's:

    for b in 512 1024 2048 8192; do python benchmarks/forward_backward.py --batch-tokens $b; done

On a CPU the engine caps the batch at `CPU_BATCH_TOKENS`; pass `--uncapped` to measure above it.
Needs the model (`platoon prepare` of a config with `base_model: smollm2`).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch

from platoon.backends.local import engine as engine_module
from platoon.backends.local.engine import Engine
from platoon.backends.local.proto import Datum
from platoon.backends.local.specs import LoraSpec
from platoon.models.loading import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--uncapped", action="store_true", help="lift the engine's CPU cap")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.uncapped:
        engine_module.CPU_BATCH_TOKENS = 1 << 30
    engine = Engine(resolve_model("smollm2-135m"), checkpoint_dir=tempfile.mkdtemp(), device="cpu")
    engine.create_model("m", LoraSpec(rank=16, seed=0))
    rng = np.random.default_rng(0)
    data = []
    for i in range(16):
        n = 400 + 4 * i
        data.append(
            Datum(
                tokens=rng.integers(0, 40000, n).astype(np.int64),
                inputs={
                    "target_tokens": rng.integers(0, 40000, n).astype(np.int64),
                    "advantages": np.ones(n, np.float32),
                    "logprobs": -np.ones(n, np.float32),
                },
            )
        )
    start = time.perf_counter()
    engine.forward_backward(
        "m", data, "importance_sampling", {}, forward_only=False, max_batch_tokens=args.batch_tokens
    )
    seconds = time.perf_counter() - start
    with open("/proc/self/status") as status:
        peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    print(
        f"batch ≤{args.batch_tokens} tokens, {args.threads} threads: {seconds:.1f} s, "
        f"peak RSS {peak_kb / 2**20:.1f} GB"
    )


if __name__ == "__main__":
    main()

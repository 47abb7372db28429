"""The GPU check: the embedded server against plain transformers on a small real architecture.

Run it on a machine with a CUDA device (tests never need one):

    python benchmarks/gpu_check.py [--rounds 2]

It builds a random-init model of Qwen3-0.6B's shape (28 layers, hidden 1024, 16/8 heads,
vocabulary 151,936) in bfloat16 and prints, side by side in one run, tokens/s for 1 and 8
concurrent requests through the tinker SDK against `generate`, and the time of a LoRA
training step (8 x 512) against a bare peft + AdamW loop, as `benchmarks/backend.py` does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

QWEN3_06B = [
    "--hidden", "1024", "--layers", "28", "--heads", "16", "--kv-heads", "8",
    "--intermediate", "3072", "--vocab", "151936",
    "--prompt-tokens", "256", "--new-tokens", "128",
    "--train-batch", "8", "--train-len", "512", "--rank", "32", "--threads", "4",
]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", default="2")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on a machine with a GPU", file=sys.stderr)
        return 2
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    sys.path.insert(0, str(Path(__file__).parent))
    import backend

    backend.main([*QWEN3_06B, "--device", "cuda", "--rounds", args.rounds])
    return 0


if __name__ == "__main__":
    sys.exit(main())

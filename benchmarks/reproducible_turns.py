"""Agents' turns in `train.reproducible`: the embedded sampler with its prefix cache off and on.

Each of `--agents` conversations runs `--turns` turns at once, as agents do: a turn's prompt is
the last one, its completion and a tool's reply of `--reply` tokens. Every turn re-reads its
conversation, so without a cache prefill is most of the model's work. Both sides run the same
seeded requests on the same engine, one after the other, and must draw the same tokens and
logprobs to the last bit (the cache's exactness, checked here at this size too); the figures
are the wall time of each side and the prompt tokens its forwards read.

    python benchmarks/reproducible_turns.py [--model smollm2] [--agents 8] [--turns 6] [--reply 120]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=None, help="a catalogue model (smollm2) or a directory; default: the tiny model"
    )
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--reply", type=int, default=120, help="tokens a tool's reply adds each turn")
    parser.add_argument("--first", type=int, default=300, help="tokens of the first prompt")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import anyio
    import torch

    from platoon.backends.local.engine import Engine
    from platoon.backends.local.sampler import SampleParams, Sampler, SampleRequest
    from platoon.backends.local.specs import WeightsRef

    torch.set_num_threads(args.threads)
    tmp = tempfile.mkdtemp(prefix="platoon-bench-")
    if args.model:
        from platoon.models.loading import resolve_model

        model_dir = resolve_model(args.model)
    else:
        from platoon.testing.models import save_tiny_model

        model_dir = str(save_tiny_model(f"{tmp}/model"))
    engine = Engine(model_dir, checkpoint_dir=tmp, device="cpu")
    vocab = min(engine.vocab_size, 30000)
    rng = random.Random(0)
    firsts = [[rng.randrange(100, vocab) for _ in range(args.first)] for _ in range(args.agents)]
    replies = [
        [[rng.randrange(100, vocab) for _ in range(args.reply)] for _ in range(args.turns)] for _ in firsts
    ]

    async def run(cache_bytes: int) -> tuple[float, int, int, list[object]]:
        sampler = Sampler(
            engine, anyio.to_thread.run_sync, batch_invariant=True, prefix_cache_bytes=cache_bytes
        )
        drawn: list[object] = []
        read = hit = 0

        async def agent(i: int) -> None:
            nonlocal read, hit
            prompt = firsts[i]
            for turn in range(args.turns):
                params = SampleParams(max_tokens=args.max_tokens, seed=100 * i + turn)
                result = await sampler.sample(SampleRequest(prompt, 1, params, False, WeightsRef()))
                sequence = result.sequences[0]
                drawn.append((i, turn, sequence.tokens, sequence.logprobs))
                read += len(prompt)
                hit += result.cache_hit_tokens
                prompt = [*prompt, *sequence.tokens, *replies[i][turn]]

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler.run)
            async with anyio.create_task_group() as agents:
                for i in range(args.agents):
                    agents.start_soon(agent, i)
            tg.cancel_scope.cancel()
        return time.perf_counter() - start, read, hit, sorted(drawn, key=lambda d: d[:2])

    print(
        f"{model_dir}: {args.agents} agents x {args.turns} turns, first prompt {args.first} tokens, "
        f"+{args.reply} a turn, {args.max_tokens} drawn, {args.threads} thread(s)"
    )
    results = {}
    for name, cache_bytes in (("prefix cache off", 0), ("prefix cache on", 2**30)):
        seconds, read, hit, drawn = anyio.run(run, cache_bytes)
        results[name] = drawn
        print(f"  {name:<17} {seconds:7.2f} s   prompt tokens {read:7d}, {read - hit:7d} prefilled")
    same = results["prefix cache off"] == results["prefix cache on"]
    print(f"  the same tokens and logprobs, to the last bit: {same}")


if __name__ == "__main__":
    main()

"""The embedded Tinker server against plain transformers/torch on the same model, side by side.

Each round measures both sides back to back under the same machine load:
- sampling: 1 request through the tinker SDK against one `model.generate`, and 8 concurrent
  requests against ONE batched `generate` of the same 8 prompts (the fair floor) and against 8
  `generate` calls in a row (tokens generated per second);
- a group: 8 requests sharing one prompt (a task's `group_size` rollouts), the prefix cache's case;
- seeded: 8 concurrent requests each with its own seed, as a training run's calls come (each
  row then draws from its own generator);
- training: one LoRA step (`forward_backward` + `optim_step` through the SDK) against a bare
  peft + AdamW loop on the same batch, for equal lengths and for mixed lengths, the two sides
  taking turns step by step.
The ratios of each round are printed, then their medians over the rounds, and the process's
peak resident memory (both sides live in it).

    python benchmarks/backend.py [--hidden 128] [--layers 4] [--new-tokens 64] [--rounds 3] [--threads 1]
    python benchmarks/backend.py --model smollm2 --threads 2   (the real model of examples/real-model)
    python benchmarks/backend.py --device cuda ...   (see benchmarks/gpu_check.py)

`--threads` sets torch's CPU threads for both sides (OMP_NUM_THREADS too, so the server's
worker thread gets the same); on a loaded machine one thread is the fair and faster choice.
`--device` (default auto: CUDA when present) and `--dtype` (default: bfloat16 on a GPU,
float32 on the CPU) apply to both sides.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def best(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def median_times(a, b, repeats: int = 5) -> tuple[float, float]:
    """The median times of `a` and `b`, run in turn (a, b, a, b, ...) so that a change of the
    machine's load falls on both sides alike."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((a, times[0]), (b, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model",
        default=None,
        help="a catalogue model (smollm2) or a model directory; default: a tiny random Qwen3 of --hidden etc.",
    )
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=None)
    parser.add_argument(
        "--vocab", type=int, default=None, help="vocabulary size (default: the toy tokenizer's)"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--new-tokens", type=int, default=None, help="default: 64 (a real model: 32)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="default: 32 (a real model: 40)")
    parser.add_argument("--train-batch", type=int, default=None, help="default: 8 (a real model: 32)")
    parser.add_argument("--train-len", type=int, default=None, help="default: 128 (a real model: 56)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    # A real model's defaults are the shapes of examples/real-model: 32 episodes of ~40 prompt
    # tokens and up to 16 sampled ones a step.
    real = args.model is not None
    defaults = {
        "new_tokens": (64, 32),
        "prompt_tokens": (32, 40),
        "train_batch": (8, 32),
        "train_len": (128, 56),
    }
    for key, (tiny, big) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, big if real else tiny)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import tinker
    import torch
    from anyio.from_thread import start_blocking_portal
    from peft import LoraConfig, get_peft_model
    from tinker import types
    from transformers import AutoModelForCausalLM

    from platoon.backends.local import running_server
    from platoon.backends.local.engine import pick_device, pick_dtype
    from platoon.testing.models import save_tiny_model

    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    dtype = pick_dtype(device, args.dtype)
    tmp = tempfile.mkdtemp(prefix="platoon-bench-")
    if real:
        from platoon.models.loading import resolve_model

        model_dir = resolve_model(args.model)  # a catalogue model is pulled into the cache once
    else:
        model_dir = save_tiny_model(
            f"{tmp}/model",
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.heads,
            num_kv_heads=args.kv_heads,
            intermediate_size=args.intermediate,
            vocab_size=args.vocab,
        )

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    new, plen = args.new_tokens, args.prompt_tokens
    prompts = [[(7 * i + j) % 200 + 10 for j in range(plen)] for i in range(8)]
    load = os.getloadavg()[0]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    shape = (
        f"{args.model} ({sum(p.numel() for p in hf.parameters()) / 1e6:.1f}M parameters)"
        if real
        else f"Qwen3 hidden={args.hidden} layers={args.layers} heads={args.heads}/{args.kv_heads}"
    )
    print(
        f"model: {shape}; {device} {str(dtype).removeprefix('torch.')}; torch threads={torch.get_num_threads()}; "
        f"{os.cpu_count()} cores, load average {load:.1f} at start; prompts {plen} tokens, {new} sampled"
    )

    # ---- plain transformers -----------------------------------------------------------------

    def generate(prompt: list[int]) -> None:
        with torch.no_grad():
            hf.generate(
                torch.tensor([prompt], device=device),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                top_k=0,
            )
        sync()

    def generate_batch(batch_prompts: list[list[int]]) -> None:
        """ONE batched `generate` of the prompts (equal lengths: no padding)."""
        with torch.no_grad():
            hf.generate(
                torch.tensor(batch_prompts, device=device),
                attention_mask=torch.ones(len(batch_prompts), plen, dtype=torch.long, device=device),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                top_k=0,
            )
        sync()

    batch, length = args.train_batch, args.train_len
    rows = [[(11 * i + 3 * j) % 300 + 5 for j in range(length + 1)] for i in range(batch)]
    mixed = [r[: max(8, length * (i + 1) // batch) + 1] for i, r in enumerate(rows)]

    def tinker_data(sequences: list[list[int]]) -> list[types.Datum]:
        return [
            types.Datum(
                model_input=types.ModelInput.from_ints(r[:-1]),
                loss_fn_inputs={"target_tokens": r[1:], "weights": [1.0] * (len(r) - 1)},
            )
            for r in sequences
        ]

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    base.requires_grad_(False)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    lora = get_peft_model(base, LoraConfig(r=args.rank, lora_alpha=32, target_modules=targets)).eval()
    optimizer = torch.optim.AdamW(
        [p for p in lora.parameters() if p.requires_grad], lr=1e-3, betas=(0.9, 0.95)
    )

    def torch_step(sequences: list[list[int]]) -> None:
        """The bare loop: one padded batch, right-padded, loss summed over real tokens."""
        width = max(len(r) for r in sequences) - 1
        ids = torch.zeros(len(sequences), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, r in enumerate(sequences):
            ids[i, : len(r) - 1] = torch.tensor(r[:-1])
            labels[i, : len(r) - 1] = torch.tensor(r[1:])
            mask[i, : len(r) - 1] = 1
        full = bool(mask.all())
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        logits = lora(input_ids=ids, attention_mask=None if full else mask).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()

    # ---- the embedded server through the tinker SDK ---------------------------------------
    results: list[dict[str, float]] = []
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            running_server(str(model_dir), checkpoint_dir=f"{tmp}/ckpt", device=str(device), dtype=args.dtype)
        ) as url,
    ):
        service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
        sampler = service.create_sampling_client(base_model=str(model_dir)).result()
        params = types.SamplingParams(max_tokens=new, stop=[])
        client = service.create_lora_training_client(
            base_model=str(model_dir), rank=args.rank, seed=0
        ).result()
        adam = types.AdamParams(learning_rate=1e-3)
        equal, varied = tinker_data(rows), tinker_data(mixed)

        def sample(count: int, shared: bool = False, seeded: bool = False) -> None:
            futures = [
                sampler.sample(
                    types.ModelInput.from_ints(prompts[0 if shared else i]),
                    1,
                    types.SamplingParams(max_tokens=new, stop=[], seed=i) if seeded else params,
                )
                for i in range(count)
            ]
            for f in futures:
                assert len(f.result().sequences[0].tokens) == new

        def server_step(data: list[types.Datum]) -> None:
            fwd = client.forward_backward(data, "cross_entropy")
            opt = client.optim_step(adam)
            fwd.result()
            opt.result()

        generate(prompts[0])
        sample(8)
        server_step(equal)
        torch_step(rows)
        for round_ in range(args.rounds):
            r: dict[str, float] = {}
            r["hf_one"] = best(lambda: generate(prompts[0]))
            r["srv_one"] = best(lambda: sample(1))
            r["hf_seq"] = best(lambda: [generate(p) for p in prompts], repeats=2)
            r["hf_batch"] = best(lambda: generate_batch(prompts), repeats=2)
            r["srv_eight"] = best(lambda: sample(8), repeats=2)
            r["srv_group"] = best(lambda: sample(8, shared=True), repeats=2)
            r["srv_seeded"] = best(lambda: sample(8, seeded=True), repeats=2)
            r["torch_step"], r["srv_step"] = median_times(
                lambda: torch_step(rows), lambda: server_step(equal)
            )
            r["torch_mixed"], r["srv_mixed"] = median_times(
                lambda: torch_step(mixed), lambda: server_step(varied)
            )
            r["load"] = os.getloadavg()[0]
            results.append(r)
            print(
                f"round {round_ + 1}: 1 request {new / r['srv_one']:.0f} vs {new / r['hf_one']:.0f} tok/s "
                f"({r['hf_one'] / r['srv_one']:.2f}x); 8 concurrent {8 * new / r['srv_eight']:.0f} tok/s vs "
                f"1 batched generate {8 * new / r['hf_batch']:.0f} ({r['hf_batch'] / r['srv_eight']:.2f}x); "
                f"step {r['srv_step'] * 1e3:.0f} vs {r['torch_step'] * 1e3:.0f} ms "
                f"({r['srv_step'] / r['torch_step']:.2f}x); load {r['load']:.1f}",
                file=sys.stderr,
                flush=True,
            )
        service.close("success").result()

    def med(key: str) -> float:
        return statistics.median(r[key] for r in results)

    def med_ratio(a: str, b: str) -> float:
        return statistics.median(r[a] / r[b] for r in results)

    print(f"\nsampling, tokens generated per second (best of repeats, median of {args.rounds} rounds)")
    print(
        f"  transformers generate, 1 request     {new / med('hf_one'):9.0f} tok/s  ({med('hf_one') * 1e3:.0f} ms)"
    )
    print(
        f"  server via SDK, 1 request            {new / med('srv_one'):9.0f} tok/s  ({med('srv_one') * 1e3:.0f} ms)"
    )
    print(f"    ratio server / generate            {med_ratio('hf_one', 'srv_one'):9.2f}x   (goal >= 0.8)")
    print(
        f"  transformers generate, 8 sequential  {8 * new / med('hf_seq'):9.0f} tok/s  ({med('hf_seq') * 1e3:.0f} ms)"
    )
    print(
        f"  server via SDK, 8 concurrent         {8 * new / med('srv_eight'):9.0f} tok/s  ({med('srv_eight') * 1e3:.0f} ms)"
    )
    print(f"    ratio 8 concurrent / 8 sequential  {med_ratio('hf_seq', 'srv_eight'):9.2f}x   (goal >= 4)")
    print(
        f"  transformers generate, 8 batched     {8 * new / med('hf_batch'):9.0f} tok/s  ({med('hf_batch') * 1e3:.0f} ms)"
    )
    print(
        f"    ratio 8 concurrent / 1 batched     {med_ratio('hf_batch', 'srv_eight'):9.2f}x   (goal >= 1.0)"
    )
    print(
        f"  server via SDK, 8 sharing a prompt   {8 * new / med('srv_group'):9.0f} tok/s  ({med('srv_group') * 1e3:.0f} ms)"
    )
    print(
        f"  server via SDK, 8 seeded (training)  {8 * new / med('srv_seeded'):9.0f} tok/s  ({med('srv_seeded') * 1e3:.0f} ms)"
    )
    print(
        f"    ratio seeded / unseeded            {med_ratio('srv_eight', 'srv_seeded'):9.2f}x   (goal >= 0.9)"
    )
    print(f"\ntraining step, LoRA rank {args.rank} (median of 5 steps, median of {args.rounds} rounds)")
    print(f"  bare torch + peft, {batch}x{length}          {med('torch_step') * 1e3:9.1f} ms")
    print(f"  server via SDK, {batch}x{length}             {med('srv_step') * 1e3:9.1f} ms")
    print(
        f"    ratio server / bare                {med_ratio('srv_step', 'torch_step'):9.2f}x   (goal <= 1.1)"
    )
    lengths = sorted(len(r) - 1 for r in mixed)
    print(
        f"  bare torch + peft, mixed {lengths[0]}..{lengths[-1]}     {med('torch_mixed') * 1e3:9.1f} ms  (padded batch)"
    )
    print(f"  server via SDK, mixed                {med('srv_mixed') * 1e3:9.1f} ms")
    print(f"    ratio server / bare                {med_ratio('srv_mixed', 'torch_mixed'):9.2f}x")
    loads = ", ".join(f"{r['load']:.1f}" for r in results)
    print(f"\nload average per round: {loads}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"peak RSS of this process (server and both plain models): {peak:.0f} MiB")


if __name__ == "__main__":
    main()

"""The embedded Tinker server against plain transformers/torch on the same model.

Prints sampling throughput (1 and 8 concurrent requests through the tinker SDK, against
`model.generate` called once and 8 times in a row) and the time of one LoRA training step
(forward_backward + optim_step through the SDK, against a bare peft + AdamW loop).

    python benchmarks/backend.py [--hidden 128] [--layers 4] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--train-len", type=int, default=128)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()

    import tinker
    import torch
    from anyio.from_thread import start_blocking_portal
    from peft import LoraConfig, get_peft_model
    from tinker import types
    from transformers import AutoModelForCausalLM

    from platoon.backends.local import running_server
    from platoon.testing.models import save_tiny_model

    tmp = tempfile.mkdtemp(prefix="platoon-bench-")
    model_dir = save_tiny_model(f"{tmp}/model", hidden_size=args.hidden, num_layers=args.layers)
    new, plen = args.new_tokens, args.prompt_tokens
    prompts = [[(7 * i + j) % 200 + 10 for j in range(plen)] for i in range(8)]
    print(f"model: Qwen3 hidden={args.hidden} layers={args.layers} torch threads={torch.get_num_threads()}")

    # ---- plain transformers generate -------------------------------------------------------
    hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()

    def generate(prompt: list[int]) -> None:
        with torch.no_grad():
            hf.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                top_k=0,
            )

    generate(prompts[0])
    hf_one = best(lambda: generate(prompts[0]))
    hf_seq = best(lambda: [generate(p) for p in prompts], repeats=2)

    # ---- the embedded server through the tinker SDK ---------------------------------------
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            running_server(str(model_dir), checkpoint_dir=f"{tmp}/ckpt")
        ) as url,
    ):
        service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
        sampler = service.create_sampling_client(base_model=str(model_dir)).result()
        params = types.SamplingParams(max_tokens=new, stop=[])

        def sample(count: int) -> None:
            futures = [sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in prompts[:count]]
            for f in futures:
                assert len(f.result().sequences[0].tokens) == new

        sample(1)
        srv_one = best(lambda: sample(1))
        srv_eight = best(lambda: sample(8))

        print("\nsampling (tokens generated per second, best of runs)")
        print(f"  transformers generate, 1 request     {new / hf_one:9.0f} tok/s  ({hf_one * 1e3:.0f} ms)")
        print(
            f"  transformers generate, 8 sequential  {8 * new / hf_seq:9.0f} tok/s  ({hf_seq * 1e3:.0f} ms)"
        )
        print(f"  server via SDK, 1 request            {new / srv_one:9.0f} tok/s  ({srv_one * 1e3:.0f} ms)")
        print(
            f"  server via SDK, 8 concurrent         {8 * new / srv_eight:9.0f} tok/s  ({srv_eight * 1e3:.0f} ms)"
        )
        print(f"  8 concurrent vs 8 sequential generate: {hf_seq / srv_eight:.1f}x faster")

        # ---- training step -------------------------------------------------------------------
        batch, length = args.train_batch, args.train_len
        rows = [[(11 * i + 3 * j) % 300 + 5 for j in range(length + 1)] for i in range(batch)]
        data = [
            types.Datum(
                model_input=types.ModelInput.from_ints(r[:-1]),
                loss_fn_inputs={"target_tokens": r[1:], "weights": [1.0] * length},
            )
            for r in rows
        ]
        client = service.create_lora_training_client(
            base_model=str(model_dir), rank=args.rank, seed=0
        ).result()
        adam = types.AdamParams(learning_rate=1e-3)

        def server_step() -> None:
            fwd = client.forward_backward(data, "cross_entropy")
            opt = client.optim_step(adam)
            fwd.result()
            opt.result()

        server_step()
        srv_steps = [best(server_step, repeats=1) for _ in range(5)]
        service.close("success").result()

    base = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    lora = get_peft_model(base, LoraConfig(r=args.rank, lora_alpha=32, target_modules=targets)).eval()
    optimizer = torch.optim.AdamW(
        [p for p in lora.parameters() if p.requires_grad], lr=1e-3, betas=(0.9, 0.95)
    )
    ids = torch.tensor([r[:-1] for r in rows])
    labels = torch.tensor([r[1:] for r in rows])

    def torch_step() -> None:
        logits = lora(input_ids=ids).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    torch_step()
    torch_steps = [best(torch_step, repeats=1) for _ in range(5)]
    srv_ms, torch_ms = statistics.median(srv_steps) * 1e3, statistics.median(torch_steps) * 1e3
    print(f"\ntraining step, LoRA rank {args.rank}, batch {batch}x{length} (median of 5)")
    print(f"  bare torch + peft loop               {torch_ms:9.1f} ms")
    print(f"  server via SDK (fwd_bwd + optim)     {srv_ms:9.1f} ms  ({srv_ms / torch_ms:.2f}x)")


if __name__ == "__main__":
    main()

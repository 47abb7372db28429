"""Which operation makes the trainer's logprobs differ from the sampler's, and what equality costs.

Reads the first step of a finished run on the embedded backend (its calls sampled the base
model: version 0, before any update) and scores each call's exact tokens again with the base
model as the trainer's forward does, whole sequences at once, once per attention:

- `sdpa`: what the trainer runs (torch's scaled dot-product attention);
- `eager`: transformers' own matmul-softmax-matmul;
- `rows`: the sampler's batch-invariant attention (`invariant.blocked_attention`: keys in fixed
  blocks of 64, summed left to right), which `train.reproducible` samples with;
- `rows+split`: that attention, and every linear layer (projections, MLP, output head) run as
  the sampler ran it: the prompt's rows in one product (its prefill), then each sampled token's
  row alone (a decode step multiplies one row).

For each it prints max |Δlogprob| against the logprobs the sampler recorded and the share of
sampled tokens bit-equal to them, and the time of a forward over all the sequences (the cost of
scoring with that attention; `rows` is forward-only as written: its in-place ops leave autograd
nothing to differentiate).

    python benchmarks/mismatch.py RUN_DIR MODEL_DIR_OR_NAME [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("model", help="the run's model: a directory or a catalogue name (smollm2-135m)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=64, help="at most this many calls of step 1")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from platoon.backends.local.invariant import per_row_attention
    from platoon.bus import read_events
    from platoon.bus.events import ModelCallFinished
    from platoon.models import loading

    torch.set_num_threads(args.threads)
    calls = [
        e
        for e in read_events(args.run_dir)
        if isinstance(e, ModelCallFinished) and e.policy_version == 0 and e.kind == "policy"
    ][: args.calls]
    model_dir = loading.resolve_model(args.model)
    sampled = sum(len(c.completion_tokens) for c in calls)
    print(f"{len(calls)} calls of step 1, {sampled} sampled tokens, model {model_dir}")
    for attention in ("sdpa", "eager", "rows", "rows+split"):
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager" if "rows" in attention else attention
        ).eval()
        worst, equal, started = 0.0, 0, time.perf_counter()
        with torch.no_grad():
            for call in calls:
                sequence = [*call.prompt_tokens, *call.completion_tokens]
                ids = torch.tensor([sequence[:-1]])
                if attention == "rows":
                    with per_row_attention(model):
                        logits = model(input_ids=ids, use_cache=False).logits.float()
                elif attention == "rows+split":
                    with per_row_attention(model), decode_shaped(len(call.prompt_tokens)):
                        logits = model(input_ids=ids, use_cache=False).logits.float()
                else:
                    logits = model(input_ids=ids, use_cache=False).logits.float()
                nll = torch.nn.functional.cross_entropy(
                    logits[0], torch.tensor(sequence[1:]), reduction="none"
                )
                scored = (-nll)[len(call.prompt_tokens) - 1 :].tolist()
                for trainer, sampler in zip(scored, call.logprobs, strict=True):
                    worst = max(worst, abs(trainer - sampler))
                    equal += trainer == sampler
        took = time.perf_counter() - started
        print(
            f"{attention:6s} max |Δ| {worst:.3g}  bit-equal {equal}/{sampled} ({equal / sampled:.1%})  forward {took:.2f} s"
        )


@contextlib.contextmanager
def decode_shaped(prompt: int) -> Iterator[None]:
    """Within: each linear layer multiplies the first `prompt` rows together and every later row
    alone, as a prefill of the prompt and then one decode step per sampled token do."""
    import torch

    plain = torch.nn.Linear.forward

    def forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[-2]
        if rows <= prompt:
            return plain(self, x)
        parts = [plain(self, x[..., :prompt, :])]
        parts += [plain(self, x[..., t : t + 1, :]) for t in range(prompt, rows)]
        return torch.cat(parts, dim=-2)

    torch.nn.Linear.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Linear.forward = plain  # type: ignore[method-assign]


if __name__ == "__main__":
    main()

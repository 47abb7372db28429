"""`platoon export RUN_DIR [--step N] --out DIR [--adapter]`: a trained policy as a model directory."""

from __future__ import annotations

from typing import Any

from platoon.cli import CommandError
from platoon.config import AssemblyError
from platoon.train.export import ExportError
from platoon.train.export import export as run_export

__all__ = ["export"]


def export(args: Any) -> int:

    try:
        done = run_export(
            args.run_dir,
            args.out,
            step=args.step,
            adapter_only=args.adapter,
            policy=args.policy,
            overwrite=args.overwrite,
        )
    except (ExportError, AssemblyError) as exc:
        raise CommandError(str(exc)) from None
    what = (
        "the PEFT adapter" if args.adapter else "the merged model (base + LoRA), tokenizer and chat template"
    )
    print(f"step {done['step']} of {done['run']}: {what} written to {done['out']}")
    if args.adapter:
        print(
            f"  load: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), {done['out']!r})"
        )
        print(f"  base model: {done['base_model']}")
    else:
        print(f"  load: AutoModelForCausalLM.from_pretrained({done['out']!r})")
    return 0

"""Run one tinker-cookbook recipe, as the cookbook ships it, against a Tinker server.

    python cookbook_run.py RECIPE BASE_URL LOG_PATH DATA_JSON STEPS

RECIPE is `rl_loop`, `sl_loop` or `rl_train` (the async `rl.train` loop, as `rl_basic` sets it
up). The recipe's code is imported and called with its own `Config`; the one thing changed is
where its dataset loader reads: `datasets.load_dataset` returns DATA_JSON's rows (`{hub name:
{split: [rows]}}`) instead of downloading. The model name is a hub name, so the recipe picks
its renderer as it would for the real model; its tokenizer comes from the Hugging Face cache the
environment names (HF_HOME, HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import datasets

MODEL = "Qwen/Qwen3-8B"


def _local_loader(rows: dict[str, dict[str, list[dict[str, object]]]]):
    def load_dataset(path: str, name: str | None = None, split: str | None = None, **_: object):
        splits = {s: datasets.Dataset.from_list(r) for s, r in rows[path].items()}
        return splits[split] if split is not None else datasets.DatasetDict(splits)

    return load_dataset


def main(recipe: str, base_url: str, log_path: str, data: str, steps: int) -> None:
    datasets.load_dataset = _local_loader(json.loads(Path(data).read_text()))
    if recipe == "rl_loop":
        from tinker_cookbook.recipes import rl_loop

        # The default loss (stable_reinforce) and everything else as shipped, but the sizes.
        config = rl_loop.Config(
            base_url=base_url, log_path=log_path, model_name=MODEL, batch_size=4, group_size=8,
            max_tokens=12, lora_rank=8, save_every=1, max_steps=steps,
        )  # fmt: skip
        rl_loop.main(config)
    elif recipe == "sl_loop":
        from tinker_cookbook.recipes import sl_loop

        config = sl_loop.Config(
            base_url=base_url, log_path=log_path, model_name=MODEL, batch_size=2, lora_rank=8,
            max_length=256, save_every=1, max_steps=steps,
        )  # fmt: skip
        sl_loop.main(config)
    elif recipe == "rl_train":
        from tinker_cookbook import model_info
        from tinker_cookbook.recipes.math_rl import math_env
        from tinker_cookbook.rl import train

        math_env.load_dataset = datasets.load_dataset  # the module holds the loader by name
        renderer = model_info.get_recommended_renderer_name(MODEL)
        builder = math_env.Gsm8kDatasetBuilder(
            batch_size=2, group_size=4, renderer_name=renderer, model_name_for_tokenizer=MODEL
        )
        # rl_basic's configuration, made small, in async (off-policy) mode: its default loss is
        # stable_reinforce.
        config = train.Config(
            learning_rate=4e-5, dataset_builder=builder, model_name=MODEL, recipe_name="recipe_rl_basic",
            renderer_name=renderer, max_tokens=12, log_path=log_path, eval_every=0, save_every=1,
            lora_rank=8, base_url=base_url, max_steps=steps,
            async_config=train.AsyncConfig(max_steps_off_policy=1, groups_per_batch=2),
        )  # fmt: skip
        asyncio.run(train.main(config))
    else:
        raise SystemExit(f"unknown recipe {recipe!r}")


if __name__ == "__main__":
    main(*sys.argv[1:5], int(sys.argv[5]))

"""A small real run, made once: the quickstart's guessing game trained for 3 steps on the
embedded backend with a scripted policy."""

import random
import sys
from pathlib import Path

import pytest

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def varied(messages: list[dict]) -> str:
    """The quickstart's binary search from a random first guess: with 4 guesses some episodes
    of a group find the number and some do not, so advantages are not all zero."""
    from scripted import binary_search

    if not any(m.get("role") == "assistant" for m in messages):
        import json

        call = {"name": "guess", "arguments": {"number": random.randint(1, 100)}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return binary_search(messages)


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory) -> Path:
    import anyio

    from platoon.api import train
    from platoon.assembly import import_packages
    from platoon.config import load_config
    from platoon.models.loading import load_tokenizer
    from platoon.testing.models import save_tiny_model
    from platoon.testing.policies import ScriptedSamplerFactory

    random.seed(5)
    model = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64, num_layers=2, seed=0)
    sys.path.insert(0, str(QUICKSTART))
    try:
        config = load_config(
            QUICKSTART / "train.yaml",
            [
                f"train.model_name={model}",
                "train.backend=local",
                "train.lora_rank=8",
                "train.batch_size=4",
                "train.max_training_steps=3",
                "train.save_every=0",
                "train.workflow_config.group_size=4",
                "train.workflow_config.remove_constant_reward_groups=false",
                "train.workflow_config.rollout_config.max_steps=4",
                "train.workflow_config.rollout_config.inference_params.max_completion_tokens=24",
                "eval.every=0",
            ],
        )
        import_packages(config, QUICKSTART)
        factory = ScriptedSamplerFactory(load_tokenizer(str(model)), varied)
        run_dir = tmp_path_factory.mktemp("runs") / "quickstart" / "guess"
        anyio.run(lambda: train(config, run_dir=run_dir, console=False, sampler_factory=factory))
    finally:
        sys.path.remove(str(QUICKSTART))
    return run_dir

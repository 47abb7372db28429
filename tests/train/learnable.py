"""The quickstart's vowels task (`examples/quickstart/vowels.py`), for the end-to-end training
tests: a task a tiny random-init model can learn.

The policy answers once; the `submit` tool rewards the share of the answer's letters that are
vowels. A random model scores about 0.2-0.3, and every sample gets a graded reward, so the signal
is dense enough for a few dozen steps of importance sampling to move it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import platoon as pt

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "quickstart"))

from vowels import Vowels, say

__all__ = ["Vowels", "learn_config"]

pt.harness("say-and-submit")(say)


def learn_config(tiny_model: str, steps: int, **train_overrides) -> dict:
    return {
        "environments": [
            {
                "name": "vowels",
                "service": "python://learnable:Vowels",
                "harness": "say-and-submit",
                "package": "learnable",
            }
        ],
        "train": {
            "backend": "local",
            # the same run to the last bit whatever the load (the embedded backend's switch)
            "reproducible": train_overrides.get("backend", "local") == "local",
            "model_name": tiny_model,
            "renderer_name": "qwen3_instruct",
            "lora_rank": 16,
            "batch_size": 4,
            "max_training_steps": steps,
            "save_every": 0,
            "seed": 1,
            "loss_fn": "importance_sampling",
            "optimizer": {"learning_rate": 0.02},
            "workflow_config": {
                "group_size": 8,
                # A step whose groups all tie (every answer all vowels, once learned) still trains,
                # so the policy version counts the steps whatever the pace of learning.
                "remove_constant_reward_groups": False,
                "rollout_config": {"max_steps": 1, "inference_params": {"max_completion_tokens": 8}},
            },
            **train_overrides,
        },
        "stats": {"experiment_name": "learn", "trial_name": "t"},
    }

"""The scripted policy: what it is handed, it cannot change for anyone else."""

import pytest

from platoon.policy.base import SampleParams
from platoon.policy.scripted import ScriptedSampler


@pytest.mark.anyio
async def test_a_script_that_edits_its_messages_leaves_the_callers_alone(toy_tokenizer):
    """The gateway records the very messages it hands the sampler (`ModelCallFinished`)."""

    def script(messages: list[dict]) -> str:
        messages[0]["content"] = "rewritten"
        messages.append({"role": "user", "content": "more"})
        return "ok"

    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    sampler = ScriptedSampler(toy_tokenizer, script, stop_token=None)
    completion = await sampler.sample([1, 2], SampleParams(), messages=messages)
    assert completion.tokens
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]

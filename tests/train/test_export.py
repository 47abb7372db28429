"""`platoon export`: a trained policy out of its run, as a merged model plain transformers loads
and as a PEFT adapter; and a finished run's checkpoint sampled again through the gateway.

The round trip: the quickstart's tiny model trained two steps, its checkpoint served by the
gateway on the embedded backend (`eval.model_path` = the run) and sampled at temperature 0; the
exported model's greedy `generate` writes the same tokens, with the same logprobs."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from platoon.cli import main

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of the quickstart's tiny model, two steps, a checkpoint after each."""
    pytest.importorskip("peft")
    home = tmp_path_factory.mktemp("export")
    profile = home / "site.yaml"
    profile.write_text(f"runs: {home / 'runs'}\ncache: {home / 'cache'}\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PLATOON_SITE", str(profile))
        patch.chdir(ROOT)
        overrides = ["train.max_training_steps=2", "train.save_every=1"]
        assert main(["train", "examples/quickstart/train-local.yaml", *overrides, "--quiet"]) == 0
    return home, home / "runs" / "quickstart" / "vowels-local"


@pytest.fixture
def site(trained, monkeypatch):
    home, _ = trained
    monkeypatch.setenv("PLATOON_SITE", str(home / "site.yaml"))
    return home


async def _sample_through_gateway(
    run_dir: Path, messages: list[dict]
) -> tuple[list[int], list[int], list[float]]:
    """(prompt, completion, logprobs) of one call at temperature 0 to the run's last checkpoint,
    served by the gateway on the embedded backend."""
    from platoon.assembly import RunOptions, assemble
    from platoon.bus.events import AgentOpened, AgentOpenRequested, ModelCallFinished, new_id
    from platoon.config import load_config

    config = load_config(run_dir / "config.yaml", [f"eval.model_path={run_dir}"])
    run = assemble(config, "gateway", RunOptions(gateway={"host": "127.0.0.1", "port": 0}))
    calls: list[ModelCallFinished] = []
    async with run.running() as bus:
        seen = anyio.Event()

        def record(call: ModelCallFinished) -> None:
            calls.append(call)
            seen.set()

        bus.subscribe(ModelCallFinished, record, name="test:calls")
        opened = await bus.request(AgentOpenRequested(episode_id=new_id(), agent_id="agent"))
        assert isinstance(opened, AgentOpened)
        async with httpx.AsyncClient(timeout=120) as client:
            response = await client.post(
                f"{opened.base_url}/chat/completions",
                headers={"Authorization": f"Bearer {opened.key}"},
                json={"model": "platoon-policy", "messages": messages, "temperature": 0, "max_tokens": 12},
            )
        assert response.status_code == 200, response.text
        await seen.wait()
    [call] = calls
    return call.prompt_tokens, call.completion_tokens, call.logprobs


def test_the_exported_model_generates_what_the_trained_policy_samples(trained, site, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, run_dir = trained
    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    assert main(["export", str(run_dir), "--out", str(merged)]) == 0
    assert main(["export", str(run_dir), "--step", "2", "--adapter", "--out", str(adapter)]) == 0
    facts = json.loads((merged / "platoon_export.json").read_text())
    assert (facts["step"], facts["kind"], facts["base_model"]) == (2, "merged", "platoon-tiny-qwen3")
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in merged.iterdir()
    }
    assert {p.name for p in adapter.iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
        "platoon_export.json",
    }

    messages = [{"role": "user", "content": "Say something with as many vowels as you can."}]
    prompt, completion, logprobs = anyio.run(_sample_through_gateway, run_dir, messages)
    assert completion

    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    with torch.no_grad():
        generated = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=len(completion),
            do_sample=False,
            eos_token_id=completion[-1] if len(completion) < 12 else None,
        )[0, len(prompt) :].tolist()
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    assert generated == completion
    exported = torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
    assert torch.allclose(exported, torch.tensor(logprobs), atol=1e-4), (exported.tolist(), logprobs)

    # The output layer, tied to the input embeddings in the base model, was untied to keep its update.
    assert json.loads((merged / "config.json").read_text())["tie_word_embeddings"] is False

    # The adapter alone, on its base model, is the same policy.
    from platoon.models.loading import resolve_model

    base = AutoModelForCausalLM.from_pretrained(resolve_model("platoon-tiny-qwen3"), dtype=torch.float32)
    with torch.no_grad():
        plain = base(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        adapted = PeftModel.from_pretrained(base, str(adapter)).eval()
        again = adapted(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    assert torch.allclose(again, logits, atol=1e-4)
    assert not torch.allclose(plain, logits, atol=1e-4)  # and training changed it


def test_export_refuses_what_it_cannot_do_in_one_line(trained, site, tmp_path, capsys):
    _, run_dir = trained
    assert main(["export", str(run_dir), "--step", "7", "--out", str(tmp_path / "x")]) == 1
    assert "has no checkpoint of step 7 (steps saved: 1, 2)" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "x")]) == 1
    assert "is not a training run with checkpoints" in capsys.readouterr().err
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("mine")
    assert main(["export", str(run_dir), "--adapter", "--out", str(taken)]) == 1
    assert "exists and is not empty (pass --overwrite" in capsys.readouterr().err
    assert (taken / "file").read_text() == "mine"
    assert not (tmp_path / "x").exists()


def test_eval_samples_a_finished_runs_checkpoint_without_a_server_started_by_hand(
    trained, site, capsys, monkeypatch
):
    """`eval.model_path` as the run wrote it (a tinker:// path), its checkpoint's directory, or
    the run itself: the embedded backend opens on the run's checkpoints."""
    _, run_dir = trained
    monkeypatch.chdir(ROOT)
    [line, *_] = reversed((run_dir / "checkpoints.jsonl").read_text().splitlines())
    tinker_path = json.loads(line)["sampler_path"]
    session, kind, name = tinker_path.removeprefix("tinker://").split("/")
    for ref in (tinker_path, str(run_dir / "tinker" / session / kind / name), str(run_dir)):
        overrides = [f"eval.model_path={ref}", "eval.max_tasks=2", "eval.group_size=1", "stats.trial_name=ev"]
        assert main(["eval", "examples/quickstart/train-local.yaml", *overrides]) == 0, (
            capsys.readouterr().err
        )
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["episodes"] == 2 and summary["failures"] == {}
    missing = "tinker://local-000000000000:train:0/sampler_weights/ckpt-000002"
    assert main(["eval", "examples/quickstart/train-local.yaml", f"eval.model_path={missing}"]) == 1
    assert f"no run directory under {site / 'runs'} holds {missing}" in capsys.readouterr().err

"""tinker-cookbook's own recipes, unchanged, against `platoon serve tinker`.

The cookbook (0.6.1) is installed as CI installs it (README's test command: `pip install
--no-deps tinker-cookbook==0.6.1` beside the `cookbook` extra); nothing is installed here. Each
recipe runs in a process of its own (`cookbook_run.py`), as a user runs it: `rl_loop` with its
default loss (stable_reinforce), `sl_loop`, and the async `rl.train` loop, 2 steps each, then the
async loop resumes from its checkpoint for a third. The server serves a tiny local model under
a hub name (`--name Qwen/Qwen3-8B`), so the recipes pick Qwen3's renderer as for the real model;
their tokenizer comes from an offline Hugging Face cache.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip(
    "tinker_cookbook",
    reason="tinker-cookbook is installed by README's test command (pip install --no-deps tinker-cookbook==0.6.1)",
)

pytestmark = [pytest.mark.slow, pytest.mark.torch]

HERE = Path(__file__).parent
HUB_NAME = "Qwen/Qwen3-8B"


def _answering_model(directory: Path) -> Path:
    """The tiny model, taught to answer `\\boxed{1}` or `\\boxed{2}` about half the time each
    after any chat prompt: the recipes' math rewards then differ within a group, so the RL
    loops have advantages to train on (a random model never writes `\\boxed{}`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from platoon.testing.models import save_tiny_model

    save_tiny_model(directory, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(0)
    words = "apples cows clips friends sold bought how many what is plus times farmer has the".split()
    rows = []
    for i in range(32):
        question = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "?"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        rows.append((tokenizer.encode(text), [*tokenizer.encode(f"\\boxed{{{1 + i % 2}}}"), end]))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), end)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (prompt, answer) in enumerate(rows):
        n = len(prompt) + len(answer)
        ids[r, :n] = torch.tensor(prompt + answer)
        labels[r, len(prompt) : n] = torch.tensor(answer)
        mask[r, :n] = 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(50):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(directory)
    return directory


def _hub_cache(model_dir: Path, hf_home: Path, name: str) -> Path:
    """An offline Hugging Face cache holding `model_dir`'s tokenizer as `name`'s."""
    repo = hf_home / "hub" / f"models--{name.replace('/', '--')}"
    revision = "0" * 40
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.suffix in {".json", ".jinja", ".txt"}:
            shutil.copy(path, snapshot / path.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return hf_home


def _data(path: Path) -> Path:
    """The recipes' datasets, local: GSM8K-shaped questions and No Robots-shaped chats."""
    questions = [
        {
            "question": f"A farmer has {n} cows and sells none. How many cows?",
            "answer": f"He keeps them.\n#### {n}",
        }
        for n in (1, 2, 1, 2, 2, 1, 1, 2)
    ]
    chats = [
        {
            "messages": [
                {"role": "user", "content": f"What is {n} times 1?"},
                {"role": "assistant", "content": f"\\boxed{{{n}}}"},
            ]
        }
        for n in (1, 2, 2, 1)
    ]
    rows = {
        "openai/gsm8k": {"train": questions, "test": questions[:2]},
        "HuggingFaceH4/no_robots": {"train": chats},
    }
    path.write_text(json.dumps(rows))
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """`platoon serve tinker` with the answering model under the hub name, and the environment a
    recipe runs in (the offline cache, a key, no telemetry)."""
    root = tmp_path_factory.mktemp("cookbook")
    model = _answering_model(root / "model")
    env = os.environ | {
        "HF_HOME": str(_hub_cache(model, root / "hf", HUB_NAME)),
        "HF_HUB_OFFLINE": "1",
        "TINKER_API_KEY": "tml-cookbook",
        "PLATOON_SERVER_API_KEY": "tml-cookbook",  # the key the server checks, on loopback too
        "TINKER_TELEMETRY": "0",
    }
    argv = [sys.executable, "-m", "platoon", "serve", "tinker", "--model", str(model), "--name", HUB_NAME]
    argv += ["--port", "0", "--device", "cpu", "--checkpoint-dir", str(root / "checkpoints")]
    server = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    assert server.stderr is not None
    log: list[str] = []
    drain = threading.Thread(target=lambda: log.extend(server.stderr), daemon=True)
    try:
        for line in server.stderr:  # it says where it listens once it does
            if line.startswith("Tinker API for "):
                url = line.split(" at ", 1)[1].split()[0]
                break
        else:
            pytest.fail("the server ended before it listened")
        drain.start()  # its log goes on, and must not fill the pipe
        yield url, env, _data(root / "data.json")
    finally:
        server.terminate()
        server.wait(timeout=60)
        if drain.is_alive():
            drain.join(timeout=60)
        server.stderr.close()


def _run(served, recipe: str, log_path: Path, steps: int) -> str:
    url, env, data = served
    argv = [sys.executable, str(HERE / "cookbook_run.py"), recipe, url, str(log_path), str(data), str(steps)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=540)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


def _metrics(log_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def _checkpoints(log_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]


def test_rl_loop_trains_with_its_default_loss(served, tmp_path):
    output = _run(served, "rl_loop", tmp_path, steps=2)
    assert "skipping training step" not in output  # each step had a group of mixed rewards
    steps = _metrics(tmp_path)
    assert [m["progress/batch"] for m in steps] == [0, 1]
    # stable_reinforce trained: the optimizer stepped with a gradient.
    assert all(float(m["grad_norm:mean"]) > 0 for m in steps)
    assert [c["name"] for c in _checkpoints(tmp_path)] == ["000001", "final"]


def test_sl_loop_trains(served, tmp_path):
    _run(served, "sl_loop", tmp_path, steps=2)
    steps = _metrics(tmp_path)
    assert [m["progress"] for m in steps] == [0.0, 0.5]
    assert all(0 < float(m["train_mean_nll"]) < 20 for m in steps)


def test_async_rl_train_trains_and_resumes(served, tmp_path):
    output = _run(served, "rl_train", tmp_path, steps=2)
    assert "Resumed training" not in output
    assert _checkpoints(tmp_path)[-1]["batch"] == 2
    resumed = _run(served, "rl_train", tmp_path, steps=3)
    assert "Resumed training from tinker://" in resumed
    assert _checkpoints(tmp_path)[-1]["batch"] == 3
    # Three optimizer steps in all, each once (the resumed run took up at step 2). A step with a
    # group of mixed rewards trains with stable_reinforce's gradient; one whose groups each scored
    # alike (the model learns to answer every question right within the three steps) has no
    # advantage, so no gradient. The first two steps, near 50/50, are mixed: every group of both
    # scoring alike has a chance of about 1 in 4,000.
    trained = [m for m in _metrics(tmp_path) if "optim/lr" in m]
    assert [m["step"] for m in trained] == [0, 1, 2]
    mixed = [float(m["env/all/by_group/frac_mixed"]) > 0 for m in trained]
    assert any(mixed), trained
    assert [float(m["grad_norm:mean"]) > 0 for m in trained] == mixed, trained

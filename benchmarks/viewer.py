"""How fast the trajectory viewer opens a large run, and what the event log costs on disk.

Writes a synthetic run shaped like a real one (tool-calling episodes whose prompts grow turn by
turn, their datums, step metrics) straight into an event log, then measures:

- indexing: the first open, which scans the whole log once;
- open: a new server (the index exists) answering the runs table, the run page and its steps;
- an episode page: the episode (agent tree, messages, tool results) and one model call's tokens
  with the datum values, through the HTTP app, for random episodes.

Targets (issue 16): open < 2 s after indexing, an episode page < 200 ms.

Run: python benchmarks/viewer.py [--gigabytes 1.0] [--dir /tmp/platoon-viewer-bench] [--keep]
     python benchmarks/viewer.py --sizes   # the size of the quickstart's event log per step
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import time
from pathlib import Path

from platoon.bus.codec import encode
from platoon.bus.eventlog import EVENT_LOG_NAME, MAGIC, Deltas, frame, scan
from platoon.bus.events import (
    AgentFinished,
    AgentSpawned,
    BatchReady,
    ChatReplied,
    ChatRequested,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    EpisodeStarted,
    Graded,
    GradeRequested,
    GroupCompleted,
    ModelCallFinished,
    PolicyUpdated,
    RunFinished,
    SessionOpened,
    SessionOpenRequested,
    TaskRef,
    ToolCalled,
    ToolReturned,
    TrainStepFinished,
    new_id,
)
from platoon.credit.datums import merge_calls, with_advantage
from platoon.credit.traces import Call

WORDS = "the secret is higher lower guess number tool call answer check file read write test pass".split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def write_synthetic_run(
    run_dir: Path,
    *,
    target_bytes: int,
    batch: int = 16,
    group: int = 8,
    turns: int = 8,
    first_prompt: int = 600,
    completion: int = 200,
    tool_tokens: int = 100,
    seed: int = 0,
) -> dict[str, int]:
    """Steps of `batch` tasks x `group` episodes of `turns` tool-calling turns, until the log
    holds `target_bytes`. Logprobs are random floats, as a model's are (they compress poorly)."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text("stats: {experiment_name: bench, trial_name: synthetic}\n")
    lock = {"platoon": "bench", "config": {"stats": {"experiment_name": "bench"}, "train": {}}}
    (run_dir / "lock.json").write_text(json.dumps(lock))
    path = run_dir / EVENT_LOG_NAME
    now = time.time()
    step = episodes = calls = 0
    metrics = []
    with path.open("wb") as log:
        log.write(MAGIC)
        written = len(MAGIC)

        deltas = Deltas()  # written as the event log writes: compressed, contexts as deltas
        raw = 0

        def put(event) -> None:
            nonlocal written, raw
            raw += len(encode(event)) + 18
            data = frame(event, now, deltas=deltas, offset=written)
            log.write(data)
            written += len(data)

        while written < target_bytes:
            rollouts = []
            for task in range(batch):
                group_id = new_id()
                ref = TaskRef(env="bench", split="train", task_id=f"task-{step}-{task}", index=task)
                rewards = []
                for _ in range(group):
                    episode_id, agent_id = new_id(), new_id()
                    put(EpisodeRequested(episode_id=episode_id, group_id=group_id, task=ref, step=step))
                    put(
                        EpisodeStarted(
                            episode_id=episode_id,
                            group_id=group_id,
                            task=ref,
                            root_agent_id=agent_id,
                            instruction=_text(rng, 40),
                        )
                    )
                    put(
                        AgentSpawned(
                            episode_id=episode_id,
                            agent_id=agent_id,
                            parent_id=None,
                            depth=0,
                            harness="bench",
                            instruction=_text(rng, 40),
                        )
                    )
                    request = SessionOpenRequested(episode_id=episode_id, agent_id=agent_id, task=ref)
                    put(request)
                    put(SessionOpened(reply_to=request.request_id, instruction=_text(rng, 40)))
                    prompt = [rng.randrange(150_000) for _ in range(first_prompt)]
                    messages = [{"role": "user", "content": _text(rng, 40)}]
                    agent_calls = []
                    for _ in range(turns):
                        chat = ChatRequested(
                            episode_id=episode_id, agent_id=agent_id, messages=list(messages)
                        )
                        put(chat)
                        sampled = [rng.randrange(150_000) for _ in range(completion)]
                        logprobs = [-rng.random() * 3 for _ in range(completion)]
                        call_id = new_id()
                        put(
                            ModelCallFinished(
                                call_id=call_id,
                                episode_id=episode_id,
                                agent_id=agent_id,
                                prompt_tokens=list(prompt),
                                completion_tokens=sampled,
                                logprobs=logprobs,
                                stop_reason="stop",
                                policy_version=step,
                                completion_text=_text(rng, 60),
                            )
                        )
                        agent_calls.append(
                            Call(
                                prompt_tokens=list(prompt),
                                completion_tokens=sampled,
                                logprobs=logprobs,
                                policy_version=step,
                            )
                        )
                        reply = {"role": "assistant", "content": _text(rng, 60)}
                        put(
                            ChatReplied(
                                reply_to=chat.request_id,
                                message=reply,
                                call_id=call_id,
                                prompt_tokens=len(prompt),
                                completion_tokens=completion,
                            )
                        )
                        tool = ToolCalled(
                            episode_id=episode_id,
                            agent_id=agent_id,
                            env="bench",
                            name="guess",
                            arguments={"number": rng.randrange(100)},
                        )
                        put(tool)
                        output = _text(rng, tool_tokens // 2)
                        put(
                            ToolReturned(
                                reply_to=tool.request_id,
                                episode_id=episode_id,
                                agent_id=agent_id,
                                name="guess",
                                output=output,
                                reward=0.0,
                            )
                        )
                        messages += [reply, {"role": "tool", "content": output}]
                        prompt = prompt + sampled + [rng.randrange(150_000) for _ in range(tool_tokens)]
                        calls += 1
                    reward = float(rng.random() < 0.4)
                    rewards.append(reward)
                    grade = GradeRequested(episode_id=episode_id, agent_id=agent_id, env="bench")
                    put(grade)
                    put(Graded(reply_to=grade.request_id, reward=reward))
                    put(
                        AgentFinished(
                            episode_id=episode_id, agent_id=agent_id, status="completed", reward=reward
                        )
                    )
                    put(
                        EpisodeFinished(
                            episode_id=episode_id,
                            group_id=group_id,
                            task=ref,
                            status="completed",
                            root_agent_id=agent_id,
                            num_model_calls=turns,
                            step=step,
                        )
                    )
                    put(
                        EpisodeGraded(
                            episode_id=episode_id, group_id=group_id, task=ref, reward=reward, step=step
                        )
                    )
                    rollouts.append((episode_id, group_id, agent_id, agent_calls, reward))
                    episodes += 1
                put(GroupCompleted(group_id=group_id, step=step, episode_ids=[], rewards=rewards))
            datums = []
            for index in range(0, len(rollouts), group):
                members = rollouts[index : index + group]
                average = statistics.fmean(r[4] for r in members)
                for episode_id, group_id, agent_id, agent_calls, reward in members:
                    for datum in merge_calls(
                        agent_calls, episode_id=episode_id, group_id=group_id, agent_id=agent_id
                    ):
                        datums.append(with_advantage(datum, reward - average))
            put(BatchReady(step=step, datums=datums))
            row = {
                "reward/mean": statistics.fmean(r[4] for r in rollouts),
                "train/datums": float(len(datums)),
                "time/step": 10.0 + rng.random(),
            }
            put(TrainStepFinished(step=step, metrics=row))
            metrics.append({"step": step, "time": now, **row})
            put(PolicyUpdated(version=step + 1, sampler_path=f"tinker://bench/{step}"))
            step += 1
        put(RunFinished(status="completed"))
    with (run_dir / "metrics.jsonl").open("w") as file:
        file.writelines(json.dumps(m) + "\n" for m in metrics)
    return {"bytes": path.stat().st_size, "raw": raw, "steps": step, "episodes": episodes, "calls": calls}


def measure(run_dir: Path, samples: int = 40) -> None:
    from starlette.testclient import TestClient

    from platoon.visualization import RunSet
    from platoon.visualization.app import make_app

    for stale in run_dir.glob("events.index.sqlite*"):
        stale.unlink()
    started = time.perf_counter()
    RunSet([run_dir]).get(run_dir.name).refresh()
    indexing = time.perf_counter() - started
    print(
        f"indexing (first open, once): {indexing:.1f} s ({run_dir.joinpath(EVENT_LOG_NAME).stat().st_size / indexing / 1e6:.0f} MB/s)"
    )

    started = time.perf_counter()
    client = TestClient(make_app(RunSet([run_dir])), base_url="http://127.0.0.1")
    run_id = run_dir.name
    for name in ("runs", "run", "metrics", "steps"):
        response = client.get(f"/api/{name}", params={"run": run_id})
        assert response.status_code == 200, response.text
    steps = response.json()["steps"]
    last = steps[-1]
    rows = client.get(
        "/api/episodes", params={"run": run_id, "purpose": "train", "step": last["step"]}
    ).json()
    opened = time.perf_counter() - started
    print(
        f"open after indexing (runs table, run page, metrics, steps, last step's episodes): {opened * 1000:.0f} ms"
    )

    rng = random.Random(1)
    episode_ids = []
    for step in rng.sample(steps, min(len(steps), samples)):
        listing = client.get(
            "/api/episodes", params={"run": run_id, "purpose": "train", "step": step["step"]}
        ).json()
        episode_ids.append(rng.choice(listing["episodes"])["episode_id"])
    latencies, call_latencies = [], []
    for episode_id in episode_ids:
        started = time.perf_counter()
        view = client.get("/api/episode", params={"run": run_id, "id": episode_id}).json()
        latencies.append(time.perf_counter() - started)
        call_id = next(i["call_id"] for i in view["agents"][0]["items"] if i["kind"] == "model_call")
        started = time.perf_counter()
        tokens = client.get(
            "/api/call", params={"run": run_id, "episode": episode_id, "call": call_id}
        ).json()
        call_latencies.append(time.perf_counter() - started)
        assert tokens["datum"] is not None
    for name, values in (("episode page", latencies), ("model call tokens", call_latencies)):
        values = sorted(values)
        print(
            f"{name}: median {statistics.median(values) * 1000:.0f} ms, "
            f"p95 {values[int(len(values) * 0.95) - 1] * 1000:.0f} ms, max {values[-1] * 1000:.0f} ms "
            f"({len(values)} random episodes)"
        )
    print(f"({len(rows['episodes'])} episodes in the last step)")


def quickstart_sizes(steps: int = 5) -> None:
    """The quickstart (examples/quickstart/train-local.yaml, scripted binary search) for a few
    steps: bytes per step as stored (PLTNEV03) and as PLTNEV02 stored them, times 1,000."""
    import sys
    import tempfile

    import anyio

    from platoon.api import train
    from platoon.assembly import import_packages
    from platoon.config import load_config
    from platoon.models.loading import load_tokenizer
    from platoon.testing.models import save_tiny_model
    from platoon.testing.policies import ScriptedSamplerFactory

    quickstart = Path(__file__).resolve().parents[1] / "examples" / "quickstart"
    sys.path.insert(0, str(quickstart))
    from scripted import binary_search

    with tempfile.TemporaryDirectory() as tmp:
        model = save_tiny_model(Path(tmp) / "model", hidden_size=64, num_layers=2, seed=0)
        sizes = {}
        for n in (1, 1 + steps):
            config = load_config(
                quickstart / "train-local.yaml",
                [f"train.model_name={model}", f"train.max_training_steps={n}", "train.save_every=0"],
            )
            import_packages(config, quickstart)
            factory = ScriptedSamplerFactory(load_tokenizer(str(model)), binary_search)
            run_dir = Path(tmp) / f"run{n}"
            anyio.run(lambda: train(config, run_dir=run_dir, console=False, sampler_factory=factory))  # noqa: B023
            log = run_dir / EVENT_LOG_NAME
            old = len(MAGIC) + sum(len(frame(r.event, r.time, compress=False)) for r in scan(log))
            sizes[n] = (log.stat().st_size, old)
    per_step = [(sizes[1 + steps][i] - sizes[1][i]) / steps for i in (0, 1)]
    print("quickstart (train-local.yaml: 4 tasks x 4 rollouts x up to 4 turns of 24 tokens), per step:")
    print(f"  stored (PLTNEV03: compressed, contexts as deltas): {per_step[0] / 1e3:.0f} kB")
    print(f"  as PLTNEV02 stored it:                            {per_step[1] / 1e3:.0f} kB")
    print(f"  1,000 steps: {per_step[0] * 1000 / 1e6:.0f} MB (was {per_step[1] * 1000 / 1e6:.0f} MB)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gigabytes", type=float, default=1.0, help="size of the synthetic event log")
    parser.add_argument("--dir", default="/tmp/platoon-viewer-bench")
    parser.add_argument("--keep", action="store_true", help="keep the synthetic run (and reuse it next time)")
    parser.add_argument("--sizes", action="store_true", help="only measure the quickstart's log per step")
    args = parser.parse_args()
    if args.sizes:
        quickstart_sizes()
        return
    run_dir = Path(args.dir) / "synthetic"
    log = run_dir / EVENT_LOG_NAME
    target = int(args.gigabytes * 1e9)
    if not (args.keep and log.exists() and log.stat().st_size >= target):
        shutil.rmtree(run_dir, ignore_errors=True)
        started = time.perf_counter()
        made = write_synthetic_run(run_dir, target_bytes=target)
        print(
            f"wrote {made['bytes'] / 1e9:.2f} GB of events ({made['raw'] / 1e9:.1f} GB as PLTNEV02 stored them): "
            f"{made['steps']} steps, {made['episodes']} episodes, {made['calls']} model calls "
            f"in {time.perf_counter() - started:.0f} s"
        )
    measure(run_dir)
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

"""`platoon.assembly`: a run is assembled in one place, from settings resolved once, and what
it will run is known before anything opens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from platoon.assembly import Part, RunOptions, assemble, import_packages, resolve
from platoon.bus import EventLog
from platoon.config import AssemblyError, validate_config
from platoon.envs.service import EnvService
from platoon.gateway import Gateway
from platoon.programs import EpisodeRunner, Grader
from platoon.train.evaluate import Evaluator
from platoon.train.loop import Scheduler
from platoon.train.trainer import Trainer

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart"

RAW = {
    "environments": [{"name": "numbers", "env": "platoon-number-search@1", "harness": "platoon-react"}],
    "train": {
        "backend": "local",
        "model_name": "platoon-tiny-qwen3",
        "renderer_name": "qwen3_instruct",
        "batch_size": 3,
        "max_training_steps": 5,
        "max_staleness": 1,
        "optimizer": {"learning_rate": 0.5, "beta1": 0.8},
        "workflow_config": {"group_size": 4},
    },
    "eval": {"every": 2, "at_start": True, "max_tasks": 7},
}


def note_grade(event) -> None:
    """A plugin handler (named by the config in a test below)."""


@pytest.fixture
def site(tmp_path, monkeypatch):
    profile = tmp_path / "site.yaml"
    profile.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    return tmp_path


def test_each_purpose_says_what_it_runs_before_anything_opens(site):
    names = lambda run: [p.name for p in run.parts]  # noqa: E731
    config = validate_config(RAW)
    train = assemble(config, "train", run_dir=site / "run")
    assert names(train) == [
        "event-log",
        "env:numbers",
        "gateway",
        "episode-runner",
        "grader",
        "credit-assigner",
        "trainer",
        "scheduler",
        "evaluator",
        "metrics",
    ]
    assert [p.kind for p in train.parts][:8] == [
        EventLog,
        EnvService,
        Gateway,
        EpisodeRunner,
        Grader,
        train.parts[5].kind,
        Trainer,
        Scheduler,
    ]
    assert names(assemble(config, "eval", run_dir=site / "e")) == [
        "event-log",
        "env:numbers",
        "gateway",
        "episode-runner",
        "grader",
        "evaluator",
    ]
    assert names(assemble(config, "rollout", run_dir=site / "r"))[-1] == "grader"
    distributed = validate_config({**RAW, "nats": {"url": "nats://127.0.0.1:4222"}})
    assert names(assemble(distributed, "train", run_dir=site / "d"))[2:6] == [
        "nats",
        "lease-keeper",
        "policy-announcer",
        "worker-registry",
    ]
    assert names(assemble(distributed, "worker"))[-2:] == ["nats:results", "nats:work"]
    # Nothing was built or opened: not even the built-in model, which a run builds on first use.
    assert not (site / "cache").exists()
    assert not (site / "run").exists()


def test_listing_a_run_imports_no_model_code(site):
    """What `platoon graph` needs: the parts of a training run of the built-in model, with
    neither torch nor transformers imported."""
    script = (
        "import sys, json\n"
        "from platoon.config import validate_config\n"
        "from platoon.assembly import assemble\n"
        f"run = assemble(validate_config(json.loads({json.dumps(json.dumps(RAW))})), 'train')\n"
        "print(len(run.declared()), 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["10", "False", "False"]


def test_the_config_is_resolved_once_into_each_components_settings(site):
    config = validate_config(RAW)
    settings = resolve(config, "train", run_dir=site / "run")
    trainer = settings.policy.trainer
    assert trainer is not None
    optimizer = trainer.train.optimizer
    assert (optimizer.learning_rate, optimizer.beta1, trainer.train.max_staleness) == (0.5, 0.8, 1)
    assert (settings.credit.group_size, settings.credit.batch_size, settings.credit.sealed) == (4, 3, False)
    scheduler = settings.scheduler
    assert (scheduler.splits, scheduler.total_steps, scheduler.max_staleness) == ({"numbers": "train"}, 5, 1)
    assert (scheduler.eval_every, scheduler.eval_at_start, scheduler.wait_for_workers) == (2, True, False)
    assert settings.eval.report == "evals/step-{step:06d}.json" and settings.eval.optional
    assert settings.eval.max_tasks == 7
    assert [e.name for e in settings.runner.entries] == ["numbers"]
    # An evaluation of the same config evaluates every task it finds, into eval.json.
    evaluation = resolve(config, "eval", RunOptions(split="test"), run_dir=site / "e")
    assert evaluation.eval.splits == {"numbers": "test"}
    assert evaluation.eval.report == "eval.json" and not evaluation.eval.optional
    assert evaluation.policy.trainer is None and evaluation.credit is None


def test_a_trainer_names_the_built_in_model_by_its_directory(site):
    run = assemble(validate_config(RAW), "train", run_dir=site / "run")
    model = str(site / "cache" / "models" / "platoon-tiny-qwen3")
    assert run.settings.policy.model_name == model and run.settings.policy.builtin == "platoon-tiny-qwen3"
    assert run.settings.policy.trainer.train.model_name == model
    assert run.settings.gateway.model_name == model


def test_what_cannot_be_assembled_is_said_at_once(site):
    with pytest.raises(AssemblyError, match="no such purpose 'serve'"):
        assemble(validate_config(RAW), "serve")
    with pytest.raises(AssemblyError, match="no train: section"):
        assemble(validate_config({"environments": RAW["environments"]}), "train")
    with pytest.raises(AssemblyError, match="no environments"):
        assemble(validate_config({}), "eval")
    hosted = {**RAW, "train": {**RAW["train"], "backend": "tinker", "reproducible": True}}
    with pytest.raises(AssemblyError, match=r"train\.reproducible: only the embedded backend"):
        assemble(validate_config(hosted), "train")


def test_a_reproducible_run_asks_its_embedded_server_for_sampling_row_by_row(site):
    reproducible = {**RAW, "train": {**RAW["train"], "reproducible": True}}
    assert assemble(validate_config(reproducible), "train", run_dir=site / "r").settings.policy.reproducible
    assert not assemble(validate_config(RAW), "train", run_dir=site / "d").settings.policy.reproducible


def test_a_plugin_is_listed_as_the_component_it_is(site):
    config = validate_config(
        {**RAW, "plugins": [{"handler": "test_assembly:note_grade", "events": ["EpisodeGraded"]}]}
    )
    [part] = [
        p for p in assemble(config, "rollout", run_dir=site / "r").parts if p.name.startswith("plugin:")
    ]
    assert isinstance(part, Part) and part.instance is not None and part.declares is part.instance


@pytest.mark.anyio
async def test_an_evaluation_builds_exactly_its_parts(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(QUICKSTART))
    config = validate_config(
        {
            "environments": [
                {
                    "name": "guess",
                    "service": "python://guess:GuessTheNumber",
                    "harness": "example-guesser",
                    "package": "guesser",
                }
            ],
            "eval": {"group_size": 1, "concurrency": 2, "max_tasks": 2},
        }
    )
    import_packages(config, QUICKSTART)
    run = assemble(
        config, "eval", RunOptions(policy="scripted:scripted:binary_search"), run_dir=tmp_path / "run"
    )
    async with run.running():
        built = run.components
        assert [type(c) for c in built] == [p.kind for p in run.parts]
        assert isinstance(run.component(Evaluator), Evaluator)
    assert (tmp_path / "run" / "lock.json").exists()


@pytest.mark.parametrize(
    "purpose, nats",
    [
        ("train", False),
        ("train", True),
        ("eval", False),
        ("rollout", False),
        ("worker", True),
        ("gateway", False),
        ("sft", False),
    ],
)
def test_every_part_of_every_purpose_declares_what_it_takes_and_publishes(site, purpose, nats):
    """What `platoon graph` draws is the parts' declarations: a part that declared nothing
    would be a component the map leaves out."""
    from platoon.bus import ComponentBase
    from platoon.bus.graph import event_graph

    raw = {**RAW, "plugins": [{"handler": "test_assembly:note_grade", "events": ["EpisodeGraded"]}]}
    config = validate_config({**raw, "nats": {"url": "nats://127.0.0.1:4222"}} if nats else raw)
    run = assemble(config, purpose, run_dir=site / "run")
    for part in run.parts:
        assert issubclass(part.kind, ComponentBase), f"{part.name} ({part.kind.__name__}) is no ComponentBase"
        declares = part.declares
        assert declares.subscribes or declares.publishes, (
            f"{part.name} declares neither what it takes nor publishes"
        )
    graph = event_graph(run.declared())
    assert not graph.undeclared


def test_a_harbor_entry_keeps_its_artifacts_in_the_run_folder(site):
    from platoon.assembly.builders import env_service

    def env_services(config, run_dir=None):
        return [env_service(e) for e in resolve(config, "rollout", run_dir=run_dir).envs]

    task = site / "tasks" / "t"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text('[environment]\ndocker_image = "x"\n')
    (task / "instruction.md").write_text("do\n")
    (task / "tests" / "test.sh").write_text("true\n")
    entry = {
        "service": "harbor",
        "service_kwargs": {"dataset": str(site / "tasks")},
        "harness": "platoon-bash",
    }
    own = {
        **entry,
        "name": "own",
        "service_kwargs": {**entry["service_kwargs"], "artifacts_dir": "/elsewhere"},
    }
    config = validate_config({**RAW, "environments": [{**entry, "name": "tasks"}, own]})
    services = env_services(config, site / "run")
    assert [s.backend.artifacts_dir for s in services] == [
        str(site / "run" / "artifacts" / "tasks"),
        "/elsewhere",
    ]
    assert [s.backend.artifacts_dir for s in env_services(config)] == [None, "/elsewhere"]

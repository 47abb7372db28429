"""Loading: the seed's examples, extends, overrides, relative paths, other formats, overlays."""

import json
import textwrap

import pytest
import yaml

from platoon.config import (
    Config,
    EnvironmentConfig,
    deep_merge,
    dumps_yaml,
    load_config,
    to_builtins,
    validate_config,
    workflow_for,
)

# The seed README's two example configs, verbatim.
QUICKSTART = """
environments:
  - name: guess
    service: python://guess:GuessTheNumber
    harness: example-guesser         # or platoon-react, platoon-codeact, or {example-guesser: 1, platoon-react: 1}
    package: guesser                 # imported first, so @pt.harness("example-guesser") registers
train:
  model_name: Qwen/Qwen3-4B-Instruct-2507
  renderer_name: qwen3_instruct
  batch_size: 8
  workflow_config:
    group_size: 4
    rollout_config:
      max_steps: 10
"""

HARBOR = """
environments:
  - name: data-questions
    service: harbor
    service_kwargs:
      dataset: ./dataset                          # a directory of Harbor tasks; or hf://<org>/<name>@<commit>
      index: [{metadata: [topic]}]                # record each task.toml's [metadata] topic
      holdout: {fraction: 0.25, group_by: topic}  # whole topics held out: the eval split; train gets the rest
    harness: platoon-bash

train:
  model_name: Qwen/Qwen3-4B-Instruct-2507
  renderer_name: qwen3_instruct
  batch_size: 6                                   # tasks per step: all six training tasks
  max_training_steps: 10
  workflow_config:
    group_size: 4                                 # rollouts per task; rewards are centered within the group
    rollout_config:
      max_steps: 10                               # model calls per episode
      inference_params: {max_completion_tokens: 1024}

eval:
  every: 5                                        # the held-out tasks every 5 steps,
  at_start: true                                  # and at step 0, before the first update: the base model

stats:
  experiment_name: harbor-dataset                 # the run directory: <runs>/harbor-dataset/qwen3-4b
  trial_name: qwen3-4b
  wandb: {mode: disabled}                         # or mode online, to log to Weights & Biases (needs WANDB_API_KEY)
"""


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(folder, name, text):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_seed_quickstart_validates(here):
    config = load_config(write(here, "examples/quickstart/train.yaml", QUICKSTART))
    [entry] = config.environments
    assert (entry.name, entry.service, entry.harness, entry.package) == (
        "guess",
        "python://guess:GuessTheNumber",
        "example-guesser",
        "guesser",
    )
    assert config.train.batch_size == 8
    assert config.train.workflow_config.group_size == 4
    assert config.train.workflow_config.rollout_config.max_steps == 10
    assert config.train.workflow_config.baseline == "mean"  # a default, not written
    assert config.eval is None


def test_seed_harbor_dataset_validates_and_its_dataset_is_found_from_anywhere(here):
    path = write(here, "examples/harbor-dataset/train.yaml", HARBOR)
    config = load_config("examples/harbor-dataset/train.yaml")
    kwargs = config.environments[0].service_kwargs
    assert kwargs["dataset"] == str(path.parent / "dataset")
    assert kwargs["index"] == [{"metadata": ["topic"]}]
    assert kwargs["holdout"] == {"fraction": 0.25, "group_by": "topic"}
    assert config.train.max_training_steps == 10
    assert config.train.workflow_config.rollout_config.inference_params.max_completion_tokens == 1024
    assert (config.eval.every, config.eval.at_start) == (5, True)
    assert (config.stats.experiment_name, config.stats.trial_name) == ("harbor-dataset", "qwen3-4b")
    assert config.stats.wandb.mode == "disabled"


def test_extends_bases_first_deep_merge_lists_replace(here):
    write(
        here,
        "bases/model.yaml",
        """
        train:
          model_name: base-model
          renderer_name: qwen3_instruct
          batch_size: 4
          workflow_config: {group_size: 2, rollout_config: {max_steps: 5}}
        stats: {experiment_name: from-model}
        """,
    )
    write(
        here,
        "bases/envs.yaml",
        """
        environments: [{name: a, service: x}, {name: b, service: y}]
        train: {batch_size: 16}
        stats: {experiment_name: from-envs}
        """,
    )
    write(
        here,
        "run.yaml",
        """
        extends: [bases/model.yaml, bases/envs.yaml]
        environments: [{name: c, service: z}]
        train:
          workflow_config: {rollout_config: {timeout: 60}}
        """,
    )
    config = load_config("run.yaml")
    assert [e.name for e in config.environments] == ["c"]  # lists replace
    assert config.train.model_name == "base-model"
    assert config.train.batch_size == 16  # the later base wins
    assert config.stats.experiment_name == "from-envs"
    rollout = config.train.workflow_config.rollout_config
    assert (config.train.workflow_config.group_size, rollout.max_steps, rollout.timeout) == (2, 5, 60.0)
    assert config.extends is None


def test_extends_chain_and_diamond(here):
    write(here, "root.yaml", "environments: [{service: s}]\nstats: {experiment_name: root, trial_name: r}\n")
    write(here, "left.yaml", "extends: root.yaml\nstats: {experiment_name: left}\n")
    write(here, "right.yaml", "extends: root.yaml\nstats: {trial_name: right}\n")
    write(here, "top.yaml", "extends: [left.yaml, right.yaml]\n")
    stats = load_config("top.yaml").stats
    # Each base is resolved whole before the next is laid over it: right.yaml brings root's
    # experiment_name back over left's.
    assert (stats.experiment_name, stats.trial_name) == ("root", "right")


def test_paths_resolve_relative_to_the_file_that_names_them(here):
    write(
        here,
        "shared/base.yaml",
        """
        log_path: ../runs
        nats: {credentials_file: creds/user.creds, tls: {ca_file: /etc/ca.pem}}
        checkpoint: {load_path: ./ckpt}
        environments: [{service: harbor, service_kwargs: {dataset: ./data, name: plain, nested: [../x]}}]
        """,
    )
    write(
        here,
        "project/run.yaml",
        """
        extends: ../shared/base.yaml
        train: {model_name: ./model, renderer_name: r, tokenizer: Qwen/Qwen3-8B}
        eval: {model_name: ~/models/m, model_path: tinker://run/sampler/1}
        """,
    )
    config = load_config("project/run.yaml")
    assert config.log_path == str(here / "runs")
    assert config.nats.credentials_file == str(here / "shared/creds/user.creds")
    assert config.nats.tls.ca_file == "/etc/ca.pem"
    assert config.checkpoint.load_path == str(here / "shared/ckpt")
    kwargs = config.environments[0].service_kwargs
    assert kwargs == {"dataset": str(here / "shared/data"), "name": "plain", "nested": [str(here / "x")]}
    assert config.train.model_name == str(here / "project/model")
    assert config.train.tokenizer == "Qwen/Qwen3-8B"  # a name, not a path
    assert config.eval.model_name.endswith("/models/m") and not config.eval.model_name.startswith("~")
    assert config.eval.model_path == "tinker://run/sampler/1"


def test_override_paths_resolve_against_the_current_directory(here):
    write(here, "sub/c.yaml", "log_path: ./runs\n")
    config = load_config("sub/c.yaml", ["checkpoint.load_path=./weights"])
    assert config.log_path == str(here / "sub/runs")
    assert config.checkpoint.load_path == str(here / "weights")


def test_overrides_with_list_indices_and_yaml_values(here):
    write(
        here,
        "c.yaml",
        QUICKSTART.replace(
            "train:", "  - {name: second, env: platoon-number-search@1, harness: platoon-react}\ntrain:"
        ),
    )
    config = load_config(
        "c.yaml",
        [
            "train.batch_size=16",
            "environments.0.harness_options.num_retries=5",
            "environments.-1.harness={platoon-react: 1, platoon-codeact: 2}",
            "environments.1.agents.max_depth=2",
            "train.workflow_config.rollout_config.inference_params.stop=['</s>', '\\n\\n']",
            "train.workflow_config.rollout_config.inference_params.temperature=0.7",
            "train.workflow_config.rollout_config.timeout=",
            "stats.wandb.mode=online",
            "stats.trial_name=007",
            "eval.every=5",
            "plugins+={handler: 'mod:log', events: [EpisodeGraded]}",
        ],
    )
    assert config.train.batch_size == 16
    assert config.environments[0].harness_options == {"num_retries": 5}
    assert config.environments[1].harness == {"platoon-react": 1.0, "platoon-codeact": 2.0}
    assert config.environments[1].agents.max_depth == 2
    params = config.train.workflow_config.rollout_config.inference_params
    assert params.stop == ["</s>", "\\n\\n"] and params.temperature == 0.7
    assert config.train.workflow_config.rollout_config.timeout is None
    assert config.stats.wandb.mode == "online"  # a missing mapping was created on the way
    assert config.stats.trial_name == "007"  # kept as text: the schema wants a str
    assert config.eval.every == 5  # eval: absent from the file, created by the override
    assert [(p.handler, p.events) for p in config.plugins] == [("mod:log", ["EpisodeGraded"])]


def test_override_can_replace_a_whole_list_entry(here):
    write(here, "c.yaml", QUICKSTART)
    config = load_config("c.yaml", ["environments.0={name: other, env: platoon-number-search@1}"])
    assert (config.environments[0].name, config.environments[0].service) == ("other", None)


def test_json_and_toml_files(here):
    data = {"environments": [{"service": "s"}], "train": {"model_name": "m", "renderer_name": "r"}}
    write(here, "c.json", json.dumps(data))
    write(
        here,
        "c.toml",
        """
        extends = "c.json"
        [train]
        batch_size = 3
        [train.optimizer]
        learning_rate = 1e-4
        """,
    )
    config = load_config("c.toml")
    assert (config.train.model_name, config.train.batch_size) == ("m", 3)
    assert config.train.optimizer.learning_rate == 1e-4


def test_empty_file_is_the_defaults(here):
    write(here, "c.yaml", "# nothing yet\n")
    assert load_config("c.yaml") == Config()


def test_dumped_config_reads_back_equal(here):
    config = load_config(write(here, "c.yaml", HARBOR), ["environments.0.workflow_config.group_size=2"])
    text = dumps_yaml(config)
    assert "extends" not in text
    assert validate_config(yaml.safe_load(text)) == config
    assert to_builtins(config)["train"]["optimizer"]["eps"] == 1e-8


def test_workflow_layers_train_then_environment_then_eval(here):
    write(
        here,
        "c.yaml",
        """
        environments:
          - {name: a, service: s, workflow_config: {rollout_config: {max_steps: 30, inference_params: {top_p: 0.9}}}}
          - {name: b, service: s}
        train:
          model_name: m
          renderer_name: r
          workflow_config: {group_size: 8, baseline: leave_one_out, rollout_config: {max_steps: 10}}
        eval:
          group_size: 3
          workflow_config: {rollout_config: {inference_params: {temperature: 0.0}}}
        """,
    )
    config = load_config("c.yaml")
    a, b = config.environments
    train_a = workflow_for(config, a)
    assert (train_a.group_size, train_a.baseline, train_a.rollout_config.max_steps) == (
        8,
        "leave_one_out",
        30,
    )
    assert train_a.rollout_config.inference_params.top_p == 0.9
    assert workflow_for(config, b).rollout_config.max_steps == 10
    eval_a = workflow_for(config, a, eval=True)
    assert (eval_a.group_size, eval_a.rollout_config.max_steps) == (3, 30)
    assert eval_a.rollout_config.inference_params.temperature == 0.0
    assert eval_a.rollout_config.inference_params.top_p == 0.9
    assert workflow_for(Config(), EnvironmentConfig(service="s")).group_size == 8


def test_deep_merge_leaves_its_inputs_alone():
    base = {"a": {"b": 1, "c": [1]}, "d": 1}
    top = {"a": {"b": 2}, "e": {"f": 1}}
    merged = deep_merge(base, top)
    assert merged == {"a": {"b": 2, "c": [1]}, "d": 1, "e": {"f": 1}}
    merged["a"]["b"] = 3
    merged["e"]["f"] = 3
    assert base == {"a": {"b": 1, "c": [1]}, "d": 1} and top == {"a": {"b": 2}, "e": {"f": 1}}

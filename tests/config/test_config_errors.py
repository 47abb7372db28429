"""Every kind of bad config, with the exact line the user sees."""

import textwrap

import pytest

from platoon.config import ConfigError, load_config, validate_config

GOOD_TRAIN = """
environments:
  - name: guess
    service: python://guess:GuessTheNumber
    harness: example-guesser
train:
  model_name: Qwen/Qwen3-4B-Instruct-2507
  renderer_name: qwen3_instruct
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


def problems_of(path, overrides=()):
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides)
    assert str(caught.value) == "\n".join(caught.value.problems)
    return caught.value.problems


def test_unknown_key_with_did_you_mean(here):
    write(here, "c.yaml", GOOD_TRAIN + "  batch_sise: 3\n")
    assert problems_of("c.yaml") == ["train.batch_sise: unknown key (did you mean train.batch_size?)"]


def test_unknown_key_found_deeper_is_suggested_with_its_full_path(here):
    write(here, "c.yaml", GOOD_TRAIN + "  learning_rate: 1.0e-4\n  max_steps: 3\n")
    assert problems_of("c.yaml") == [
        "train.learning_rate: unknown key (did you mean train.optimizer.learning_rate?)",
        "train.max_steps: unknown key (did you mean train.workflow_config.rollout_config.max_steps?)",
    ]


def test_misplaced_keys_and_typos_inside_overlays(here):
    write(
        here,
        "c.yaml",
        """
        batch_size: 3
        environments:
          - service: x
            max_steps: 3
            workflow_config: {group_sise: 2, rollout_config: {timeout: soon}}
        """,
    )
    assert problems_of("c.yaml") == [
        "batch_size: unknown key (did you mean train.batch_size?)",
        "environments.0.max_steps: unknown key "
        "(did you mean environments.0.workflow_config.rollout_config.max_steps?)",
        "environments.0.workflow_config.group_sise: unknown key "
        "(did you mean environments.0.workflow_config.group_size?)",
        "environments.0.workflow_config.rollout_config.timeout: expected float or null, got str",
    ]


def test_unknown_key_without_a_likely_meaning(here):
    write(here, "c.yaml", GOOD_TRAIN + "  zebra: 1\n")
    assert problems_of("c.yaml") == ["train.zebra: unknown key"]


def test_wrong_type_at_a_nested_list_path(here):
    write(
        here,
        "c.yaml",
        GOOD_TRAIN
        + """
eval:
  workflow_config:
    rollout_config: {max_steps: ten}
""",
    )
    write(here, "d.yaml", "extends: c.yaml\nenvironments: [{service: x, agents: {max_depth: deep}}]\n")
    assert problems_of("d.yaml") == [
        "environments.0.agents.max_depth: expected int, got str",
        "eval.workflow_config.rollout_config.max_steps: expected int, got str",
    ]


def test_free_form_options_take_any_key_but_overrides_name_the_path(here):
    write(here, "c.yaml", GOOD_TRAIN)
    config = load_config("c.yaml", ["environments.0.harness_options.num_retries=5"])
    assert config.environments[0].harness_options == {"num_retries": 5}


def test_missing_required_keys(here):
    write(here, "c.yaml", "environments: [{service: x}]\ntrain: {batch_size: 4}\n")
    assert problems_of("c.yaml") == [
        "train.model_name: missing required key",
        "train.renderer_name: missing required key",
    ]


def test_closed_choices_bounds_and_yaml_booleans(here):
    write(
        here,
        "c.yaml",
        GOOD_TRAIN
        + """
  loss_fn: cipso
  optimizer: {beta1: 2}
  workflow_config: {group_size: 0}
stats: {trial_name: 7, wandb: {mode: on}}
gateway: {port: 70000}
""",
    )
    assert problems_of("c.yaml") == [
        "train.loss_fn: expected one of 'cispo', 'cross_entropy', 'dro', 'importance_sampling', 'ppo', "
        "got 'cipso' (did you mean 'cispo'?)",
        "train.optimizer.beta1: expected float <= 1, got 2",
        "train.workflow_config.group_size: expected int >= 1, got 0",
        "stats.trial_name: expected str or null, got int (quote it to make it a string)",
        "stats.wandb.mode: expected one of 'disabled', 'offline', 'online', got True "
        "(quote it: YAML reads yes, no, on, off, true and false as booleans)",
        "gateway.port: expected int <= 65535, got 70000",
    ]


def test_union_and_mapping_shapes(here):
    write(
        here,
        "c.yaml",
        """
        environments:
          - {service: a, harness: [x, y]}
          - {service: b, harness: {react: 0}}
          - [not, a, mapping]
        stats: 3
        """,
    )
    assert problems_of("c.yaml") == [
        "environments.0.harness: expected str, mapping or null, got list",
        "environments.1.harness.react: expected float > 0, got 0",
        "environments.2: expected mapping, got list",
        "stats: expected mapping, got int",
    ]


def test_rules_across_keys(here):
    write(
        here,
        "c.yaml",
        """
        environments: [{name: a, service: x}, {name: a}]
        plugins: [{events: [EpisodeGraded]}, {handler: m:f, component: m:C}]
        stats: {experiment_name: ../up}
        """,
    )
    assert problems_of("c.yaml") == [
        "environments.1: set env or service",
        "environments.1.name: 'a' is already used by environments.0",
        "stats.experiment_name: '../up' must be a single folder name",
        "plugins.0: set exactly one of handler or component",
        "plugins.1: set exactly one of handler or component",
    ]


def test_training_without_environments(here):
    write(here, "c.yaml", "train: {model_name: m, renderer_name: r}\n")
    assert problems_of("c.yaml") == ["environments: at least one entry is needed to train or evaluate"]


def test_missing_file(here):
    assert problems_of("nowhere.yaml") == ["nowhere.yaml: file not found"]


def test_missing_base_names_the_file_that_extends_it(here):
    write(here, "c.yaml", "extends: [base.yaml, other/base2.yaml]\n")
    assert problems_of("c.yaml") == [
        "base.yaml: file not found (extended by c.yaml)",
        "other/base2.yaml: file not found (extended by c.yaml)",
    ]


def test_extends_cycle_names_the_chain(here):
    write(here, "a.yaml", "extends: sub/b.yaml\n")
    write(here, "sub/b.yaml", "extends: ../c.yaml\n")
    write(here, "c.yaml", "extends: a.yaml\n")
    assert problems_of("a.yaml") == ["extends cycle: a.yaml -> sub/b.yaml -> c.yaml -> a.yaml"]


def test_extends_must_be_paths(here):
    write(here, "c.yaml", "extends: {a: 1}\n")
    assert problems_of("c.yaml") == ["c.yaml: extends: expected a path or a list of paths, got mapping"]


def test_bad_yaml_gives_the_line(here):
    write(here, "c.yaml", "train:\n  model_name: m\n  renderer_name: r: x\n")
    assert problems_of("c.yaml") == ["c.yaml:3: bad YAML: mapping values are not allowed here"]


def test_duplicate_yaml_key_gives_the_line(here):
    write(here, "c.yaml", "train:\n  batch_size: 4\n  batch_size: 8\n")
    assert problems_of("c.yaml") == ["c.yaml:3: bad YAML: duplicate key 'batch_size'"]


def test_bad_json_and_toml(here):
    write(here, "c.json", '{"train": {\n  "batch_size": 4,\n}}')
    write(here, "c.toml", "[train\nbatch_size = 4\n")
    assert problems_of("c.json") == ["c.json:3: bad JSON: Expecting property name enclosed in double quotes"]
    [toml_problem] = problems_of("c.toml")
    assert toml_problem.startswith("c.toml: bad TOML: ")


def test_top_level_must_be_a_mapping(here):
    write(here, "c.yaml", "- a\n- b\n")
    assert problems_of("c.yaml") == ["c.yaml: expected a mapping at the top level, got list"]


def test_bad_override_path_through_a_scalar(here):
    write(here, "c.yaml", GOOD_TRAIN + "  batch_size: 4\n")
    assert problems_of("c.yaml", ["train.batch_size.value=1"]) == [
        "override train.batch_size.value=1: train.batch_size is an int, not a mapping or a list"
    ]


def test_bad_override_index(here):
    write(here, "c.yaml", GOOD_TRAIN)
    assert problems_of(
        "c.yaml", ["environments.1.name=x", "environments.-2.name=x", "environments.first.name=x"]
    ) == [
        "override environments.1.name=x: index 1 out of range for environments (length 1)",
        "override environments.-2.name=x: index -2 out of range for environments (length 1)",
        "override environments.first.name=x: environments is a list; expected an index, got 'first'",
    ]


def test_bad_override_syntax_and_value(here):
    write(here, "c.yaml", GOOD_TRAIN)
    assert problems_of(
        "c.yaml", ["train.batch_size", "train..seed=1", "train.stop=[1", "train.model_name+=x"]
    ) == [
        "override train.batch_size: expected key=value or key+=value with a dotted key",
        "override train..seed=1: expected key=value or key+=value with a dotted key",
        "override train.stop=[1: bad value: expected ',' or ']', but got '<stream end>'",
        "override train.model_name+=x: train.model_name is a str; += appends to a list",
    ]


def test_override_problems_and_file_problems_are_reported_together(here):
    write(here, "c.yaml", GOOD_TRAIN + "  batch_sise: 3\n")
    assert problems_of("c.yaml", ["environments.4.name=x", "train.lora_rank=big"]) == [
        "override environments.4.name=x: index 4 out of range for environments (length 1)",
        "train.batch_sise: unknown key (did you mean train.batch_size?)",
        "train.lora_rank: expected int, got str",
    ]


def test_plain_data_cannot_extend(here):
    with pytest.raises(ConfigError) as caught:
        validate_config({"extends": "base.yaml"})
    assert caught.value.problems == ["extends: only a config file can extend another"]


def test_error_carries_the_command_line_exit_code():
    assert ConfigError(["x: y"]).exit_code == 2

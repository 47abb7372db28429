"""`policies:` and `agents.policy` (RFC 0001): what each policy inherits from `train:`, which
policy plays an agent, and the configs that are refused before anything runs."""

from __future__ import annotations

import pytest

from platoon.config import ConfigError, validate_config
from platoon.config.policies import PolicyChoiceError, choose_policy, resolve_policies
from platoon.config.schema import PolicyChoice, policy_names

TRAIN = {"model_name": "Qwen/Qwen3-4B-Instruct-2507", "renderer_name": "qwen3_instruct", "lora_rank": 32}


def config(policies=None, choice=None, **more):
    entry = {"name": "duet", "env": "duet@1", "harness": "h", "program": "recursive"}
    if choice is not None:
        entry["agents"] = {"max_depth": 1, "policy": choice}
    data = {"environments": [entry], "train": dict(TRAIN), **more}
    if policies is not None:
        data["policies"] = policies
    return validate_config(data)


def test_without_policies_the_train_section_is_the_one_default_policy():
    cfg = config()
    assert policy_names(cfg) == ["default"]
    [(name, spec)] = resolve_policies(cfg).items()
    assert (name, spec.train, spec.frozen) == ("default", cfg.train, False)


def test_each_policy_is_train_with_its_own_keys_laid_over():
    cfg = config(
        {
            "planner": {"optimizer": {"learning_rate": 0.01}},
            "executor": {"model_name": "Qwen/Qwen3-1.7B", "renderer_name": "qwen3", "lora_rank": 8},
            "reference": {"frozen": True, "model_path": "tinker://run/sampler_weights/x"},
        },
        {"by": "depth", "map": {"0": "planner", "1": "executor"}},
    )
    specs = resolve_policies(cfg)
    assert list(specs) == policy_names(cfg) == ["planner", "executor", "reference"]
    planner, executor, reference = specs.values()
    assert (planner.train.model_name, planner.train.lora_rank) == (TRAIN["model_name"], 32)
    assert planner.train.optimizer.learning_rate == 0.01
    assert (executor.train.model_name, executor.train.renderer_name, executor.train.lora_rank) == (
        "Qwen/Qwen3-1.7B",
        "qwen3",
        8,
    )
    assert executor.train.optimizer == cfg.train.optimizer
    assert (reference.frozen, reference.model_path) == (True, "tinker://run/sampler_weights/x")
    # the schedule stays train:'s, for every policy
    assert {s.train.batch_size for s in specs.values()} == {cfg.train.batch_size}


@pytest.mark.parametrize(
    ("by", "key", "depth", "harness", "role"),
    [
        ("depth", "1", 1, "react", None),
        ("harness", "react", 3, "react", None),
        ("role", "executor", 1, "react", "executor"),
        ("role", "root", 0, "react", None),  # an agent its program names no role for is the root
    ],
)
def test_an_agent_gets_the_policy_its_depth_harness_or_role_maps_to(by, key, depth, harness, role):
    choice = PolicyChoice(by=by, map={key: "executor", "other": "planner"})
    assert choose_policy(choice, depth=depth, harness=harness, role=role) == "executor"


def test_an_agent_no_policy_is_mapped_for_is_an_error_never_a_fallback():
    choice = PolicyChoice(by="role", map={"root": "planner", "executor": "executor"})
    with pytest.raises(PolicyChoiceError, match="no policy for the agent with role 'opponent'"):
        choose_policy(choice, depth=1, harness="h", role="opponent", default="planner")
    assert choose_policy(None, depth=5, harness="h", role="x", default="solo") == "solo"


@pytest.mark.parametrize(
    ("policies", "choice", "more", "problem"),
    [
        (
            {"a": {}, "b": {}},
            None,
            {},
            "environments.0.agents.policy: the config has several policies; say which plays each agent",
        ),
        (
            {"a": {}, "b": {}},
            {"by": "role", "map": {"root": "a", "x": "c"}},
            {},
            "environments.0.agents.policy.map.x: 'c' is not one of policies: a, b",
        ),
        (
            {"a": {}, "b": {}},
            {"by": "depth", "map": {"root": "a"}},
            {},
            'environments.0.agents.policy.map.root: a depth is written as a quoted number, e.g. "0"',
        ),
        (None, {"by": "depth", "map": {"0": "a"}}, {}, "names policies, but the config has no policies:"),
        ({"a": {"frozen": True}}, None, {}, "policies: every policy is frozen, so nothing would train"),
        ({"a b": {}}, None, {}, "policies.a b: a policy's name is letters, digits, - and _ only"),
        ({"a": {"lora_rank": 0}}, None, {}, "policies.a.lora_rank"),
        ({"a": {"optimiser": {}}}, None, {}, "policies.a.optimiser: unknown key"),
        (
            {"a": {}},
            None,
            {"checkpoint": {"load_path": "tinker://r/weights/s"}},
            "checkpoint.load_path: one training state cannot start several policies; "
            "name each policy's own with policies.<name>.load_path",
        ),
        (
            {"a": {}, "b": {"frozen": True, "load_path": "tinker://r/weights/s"}},
            {"by": "depth", "map": {"0": "a", "1": "b"}},
            {},
            "policies.b.load_path: a frozen policy never trains; it samples model_path",
        ),
    ],
)
def test_configs_that_cannot_say_which_policy_plays_are_refused(policies, choice, more, problem):
    with pytest.raises(ConfigError) as caught:
        config(policies, choice, **more)
    assert problem in str(caught.value)


def test_each_trained_policy_may_start_from_a_training_state_of_its_own():
    state = "tinker://run-1/weights/state-000010"
    cfg = config({"a": {"load_path": state}, "b": {}}, {"by": "depth", "map": {"0": "a", "1": "b"}})
    specs = resolve_policies(cfg)
    assert (specs["a"].load_path, specs["b"].load_path) == (state, None)


DUET = {"by": "depth", "map": {"0": "a", "1": "b"}}
ANCHOR = {"frozen": True, "model_path": "tinker://run-1/sampler_weights/s"}


def test_a_policy_takes_train_kl_unless_it_has_a_kl_of_its_own():
    cfg = config(
        {"a": {"kl": {"coefficient": 0.1, "reference_policy": "anchor"}}, "b": {}, "anchor": ANCHOR},
        DUET,
        train={**TRAIN, "kl": {"coefficient": 0.02}},
    )
    specs = resolve_policies(cfg)
    assert (specs["a"].train.kl.coefficient, specs["a"].train.kl.reference_policy) == (0.1, "anchor")
    assert (specs["b"].train.kl.coefficient, specs["b"].train.kl.reference_policy) == (0.02, None)


@pytest.mark.parametrize(
    ("policies", "kl", "problem"),
    [
        (
            {"a": {"kl": {"reference_policy": "nobody"}}, "b": {}},
            None,
            "policies.a.kl.reference_policy: 'nobody' is not one of policies: a, b",
        ),
        (
            {"a": {}, "b": {}},
            {"reference_policy": "b"},
            "train.kl.reference_policy: 'b' trains; a KL reference is a frozen policy",
        ),
        (
            {
                "a": {"kl": {"reference_policy": "anchor", "reference_path": "tinker://x"}},
                "b": {},
                "anchor": ANCHOR,
            },
            None,
            "policies.a.kl: set reference_path or reference_policy, not both",
        ),
        (
            {"a": {}, "b": {}, "anchor": {**ANCHOR, "kl": {}}},
            None,
            "policies.anchor.kl: a frozen policy never trains, so it takes no KL penalty",
        ),
        (
            {
                "a": {"kl": {"reference_policy": "anchor"}},
                "b": {},
                "anchor": {**ANCHOR, "model_name": "Qwen/Qwen3-8B"},
            },
            None,
            "policies.a.kl.reference_policy: 'anchor' has the tokenizer 'Qwen/Qwen3-8B' and a "
            "'Qwen/Qwen3-4B-Instruct-2507'; the reference scores a's tokens",
        ),
        (
            {"a": {}, "b": {"renderer_name": "qwen3"}, "anchor": ANCHOR},
            {"reference_policy": "anchor"},
            "train.kl.reference_policy: 'anchor' renders with 'qwen3_instruct' and b with 'qwen3'",
        ),
    ],
)
def test_a_kl_reference_by_name_is_a_frozen_policy_with_the_same_tokens(policies, kl, problem):
    train = {**TRAIN, "kl": kl} if kl is not None else TRAIN
    with pytest.raises(ConfigError) as caught:
        config(policies, DUET, train=train)
    assert problem in str(caught.value)
    assert len(caught.value.problems) == 1, caught.value.problems


def test_a_kl_reference_of_the_wrong_type_is_one_problem():
    with pytest.raises(ConfigError) as caught:
        config({"a": {"kl": {"reference_policy": ["b"]}}, "b": {}}, DUET)
    assert [p.split(":")[0] for p in caught.value.problems] == ["policies.a.kl.reference_policy"]


def test_a_kl_reference_by_name_needs_policies():
    with pytest.raises(
        ConfigError, match=r"train\.kl\.reference_policy: names a frozen policy, but the config"
    ):
        config(train={**TRAIN, "kl": {"reference_policy": "anchor"}})


def test_models_that_share_a_tokenizer_may_be_a_reference_and_a_trained_policy():
    anchor = {**ANCHOR, "model_name": "Qwen/Qwen3-8B", "tokenizer": "Qwen/Qwen3-8B"}
    cfg = config(
        {
            "a": {"tokenizer": "Qwen/Qwen3-8B", "kl": {"reference_policy": "anchor"}},
            "b": {},
            "anchor": anchor,
        },
        DUET,
    )
    assert resolve_policies(cfg)["a"].train.kl.reference_policy == "anchor"


def test_a_single_policy_needs_no_choice():
    cfg = config({"solo": {"lora_rank": 4}})
    assert policy_names(cfg) == ["solo"]
    assert resolve_policies(cfg)["solo"].train.lora_rank == 4


def test_a_policy_distills_from_a_frozen_teacher_of_its_own_or_trains():
    cfg = config(
        {"a": {"distill": {"teacher": "anchor", "weight": 0.5}}, "b": {}, "anchor": ANCHOR},
        DUET,
        train={**TRAIN, "distill": {"teacher_path": "tinker://run-0/sampler_weights/t"}},
    )
    specs = resolve_policies(cfg)
    assert (specs["a"].train.distill.teacher, specs["a"].train.distill.weight) == ("anchor", 0.5)
    assert specs["b"].train.distill.teacher_path == "tinker://run-0/sampler_weights/t"
    assert specs["b"].train.distill.weight == 1.0


@pytest.mark.parametrize(
    ("policies", "distill", "problem"),
    [
        (
            {"a": {}, "b": {}},
            {"teacher": "b"},
            "train.distill.teacher: 'b' trains; a teacher is a frozen policy",
        ),
        (
            {"a": {"distill": {"teacher": "nobody"}}, "b": {}},
            None,
            "policies.a.distill.teacher: 'nobody' is not one of policies: a, b",
        ),
        (
            {
                "a": {"distill": {"teacher": "anchor", "teacher_path": "tinker://x"}},
                "b": {},
                "anchor": ANCHOR,
            },
            None,
            "policies.a.distill: set teacher_path or teacher, not both",
        ),
        (
            {"a": {}, "b": {}, "anchor": {**ANCHOR, "distill": {}}},
            None,
            "policies.anchor.distill: a frozen policy never trains, so it takes no teacher",
        ),
        (
            {
                "a": {"distill": {"teacher": "anchor"}},
                "b": {},
                "anchor": {**ANCHOR, "model_name": "Qwen/Qwen3-8B"},
            },
            None,
            "policies.a.distill.teacher: 'anchor' has the tokenizer 'Qwen/Qwen3-8B' and a "
            "'Qwen/Qwen3-4B-Instruct-2507'; the teacher scores a's tokens",
        ),
        (
            {"a": {"kl": {}, "distill": {"teacher": "anchor"}}, "b": {}, "anchor": ANCHOR},
            None,
            "policies.a: distill and kl at once; the teacher already keeps the policy near it",
        ),
    ],
)
def test_a_teacher_is_a_frozen_policy_with_the_same_tokens(policies, distill, problem):
    train = {**TRAIN, "distill": distill} if distill is not None else TRAIN
    with pytest.raises(ConfigError) as caught:
        config(policies, DUET, train=train)
    assert problem in str(caught.value)
    assert len(caught.value.problems) == 1, caught.value.problems


@pytest.mark.parametrize(
    ("train", "problem"),
    [
        ({"distill": {"weight": 1.5}}, "train.distill.weight"),
        ({"distill": {"teacher": "anchor"}}, "train.distill.teacher: names a frozen policy, but the config"),
        ({"distill": {}, "kl": {}}, "train: distill and kl at once"),
    ],
)
def test_a_single_policy_distill_is_refused_in_one_line(train, problem):
    with pytest.raises(ConfigError) as caught:
        config(train={**TRAIN, **train})
    assert problem in str(caught.value)
    assert len(caught.value.problems) == 1, caught.value.problems

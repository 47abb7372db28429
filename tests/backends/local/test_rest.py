"""The SDK's RestClient against the embedded server: runs, checkpoints, sessions, samplers."""

import pytest
import tinker
from tinker import types

LR = types.AdamParams(learning_rate=1e-2)


def datum(tokens: list[int]) -> types.Datum:
    inputs = {"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def train(client, data) -> None:
    fwd = client.forward_backward(data, "cross_entropy")
    opt = client.optim_step(LR)
    fwd.result()
    opt.result()


pytestmark = pytest.mark.torch


def test_training_runs_and_their_checkpoints(service, base_url, tiny_model):
    client = service.create_lora_training_client(
        base_model=str(tiny_model), rank=4, user_metadata={"purpose": "rest"}
    ).result()
    model_id = client.model_id
    train(client, [datum([3, 4, 5, 6, 7])])
    state = client.save_state("first").result().path
    sampler_path = client.save_weights_for_sampler("for-sampling").result().path
    short = client.save_state("short", ttl_seconds=3600).result().path
    rest = tinker.RestClient(base_url=base_url, api_key="tml-test")

    runs = rest.list_training_runs(limit=50).result()
    assert runs.cursor.total_count >= 1
    run = next(r for r in runs.training_runs if r.training_run_id == model_id)
    assert run.lora_rank == 4 and run.is_lora and run.user_metadata == {"purpose": "rest"}
    assert run.last_checkpoint.tinker_path == short
    assert run.last_sampler_checkpoint.tinker_path == sampler_path
    assert rest.get_training_run(model_id).result().training_run_id == model_id
    assert rest.get_training_run_by_tinker_path(state).result().training_run_id == model_id

    listed = rest.list_checkpoints(model_id).result().checkpoints
    assert {(c.checkpoint_type, c.tinker_path) for c in listed} == {
        ("training", state),
        ("training", short),
        ("sampler", sampler_path),
    }
    assert [c.expires_at is not None for c in listed if c.tinker_path == short] == [True]
    rest.delete_checkpoint_from_tinker_path(short).result()
    listed = [c for c in listed if c.tinker_path != short]
    assert all(c.size_bytes > 0 and not c.public for c in listed)
    assert {c.tinker_path for c in rest.list_user_checkpoints(limit=100).result().checkpoints} >= {
        state,
        sampler_path,
    }
    info = rest.get_weights_info_by_tinker_path(state).result()
    assert info.lora_rank == 4 and info.is_lora and info.train_mlp

    rest.publish_checkpoint_from_tinker_path(state).result()
    rest.set_checkpoint_ttl_from_tinker_path(sampler_path, 3600).result()
    marked = {c.tinker_path: c for c in rest.list_checkpoints(model_id).result().checkpoints}
    assert marked[state].public and marked[state].expires_at is None
    assert marked[sampler_path].expires_at is not None
    rest.unpublish_checkpoint_from_tinker_path(state).result()
    assert not next(
        c for c in rest.list_checkpoints(model_id).result().checkpoints if c.tinker_path == state
    ).public

    rest.delete_checkpoint_from_tinker_path(sampler_path).result()
    assert [c.tinker_path for c in rest.list_checkpoints(model_id).result().checkpoints] == [state]
    with pytest.raises(tinker.NotFoundError):
        rest.delete_checkpoint_from_tinker_path(sampler_path).result()
    with pytest.raises(tinker.APIStatusError):
        service.create_sampling_client(model_path=sampler_path).result().sample(
            types.ModelInput.from_ints([3, 4]), 1, types.SamplingParams(max_tokens=2)
        ).result()
    with pytest.raises(tinker.NotFoundError):
        rest.get_training_run("local-nothing:train:0").result()

    # A checkpoint still loads after its neighbours are gone.
    again = service.create_training_client_from_state_with_optimizer(state).result()
    again.optim_step(LR).result()


def test_an_expired_checkpoint_disappears(service, base_url, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=2).result()
    path = client.save_state("short-lived").result().path
    rest = tinker.RestClient(base_url=base_url, api_key="tml-test")
    rest.set_checkpoint_ttl_from_tinker_path(path, -1).result()  # already past
    assert rest.list_checkpoints(client.model_id).result().checkpoints == []


def test_sessions_and_samplers(service, base_url, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=2).result()
    sampler = client.save_weights_and_get_sampling_client().result()
    sampler.sample(types.ModelInput.from_ints([3, 4]), 1, types.SamplingParams(max_tokens=2)).result()
    rest = tinker.RestClient(base_url=base_url, api_key="tml-test")
    session_id = client.model_id.split(":train:")[0]
    assert session_id in rest.list_sessions(limit=100).result().sessions
    session = rest.get_session(session_id).result()
    assert session.training_run_ids == [client.model_id]
    assert len(session.sampler_ids) == 1
    got = rest.get_sampler(session.sampler_ids[0]).result()
    assert got.sampler_id == session.sampler_ids[0] and got.base_model == str(tiny_model)
    with pytest.raises(tinker.NotFoundError):
        rest.get_session("local-missing").result()

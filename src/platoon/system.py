"""Assembling the components a config describes.

A run is a set of components on one bus: an env service per environment entry, the model
gateway, the episode runner and the grader, the event log, the config's plugins, and for
training the trainer and its scheduler. This module builds them from a `Config`; the
commands (`platoon rollout|eval|train|worker`) and embedding applications pick what they need.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import structlog

from platoon import plugins
from platoon.config import Config
from platoon.config.schema import EnvironmentConfig, policy_names, workflow_for
from platoon.policy.base import SampleParams, SamplerFactory

__all__ = [
    "SystemError",
    "entry_names",
    "entry_settings",
    "env_services",
    "gateway_for",
    "import_packages",
    "load_tokenizer",
    "make_renderer",
    "model_and_renderer",
    "plugin_components",
    "policy_from_ref",
    "reward_processors",
    "rollout_system",
    "running",
    "sampler_factory",
    "tinker_service_client",
    "tokenizer_for",
]

log = structlog.get_logger("platoon.system")

TOY_TOKENIZER = "platoon-toy-qwen3"


class SystemError(RuntimeError):
    """The config describes something that cannot be assembled here."""


def entry_names(config: Config) -> list[str]:
    """Each environment entry's name: its `name`, else its env or service, made unique."""
    names: list[str] = []
    for i, entry in enumerate(config.environments):
        name = entry.name or (entry.env or entry.service or f"env{i}").split("@")[0]
        if name in names:
            name = f"{name}-{i}"
        names.append(name)
    return names


def import_packages(config: Config, config_dir: Path | None = None) -> None:
    """Import each entry's `package`, so the harnesses it defines register themselves."""
    import importlib
    import sys

    if config_dir is not None and str(config_dir) not in sys.path:
        sys.path.insert(0, str(config_dir))
    for entry in config.environments:
        if entry.package:
            try:
                importlib.import_module(entry.package)
            except ImportError as exc:
                raise SystemError(f"cannot import package {entry.package!r}: {exc}") from exc


def entry_settings(config: Config, *, eval: bool = False) -> list[Any]:
    """The runner's view of each environment entry."""
    from platoon.programs import EntrySettings

    settings = []
    for i, (name, entry) in enumerate(zip(entry_names(config), config.environments, strict=True)):
        workflow = workflow_for(config, entry, eval=eval)
        rollout = workflow.rollout_config
        inference = rollout.inference_params
        params = {
            "temperature": inference.temperature,
            "top_p": inference.top_p,
            "top_k": inference.top_k,
            "max_tokens": inference.max_completion_tokens,
            "stop": inference.stop,
            "seed": inference.seed,
        }
        if entry.harness is None:
            raise SystemError(f"environments.{i}.harness: an entry needs a harness to play it")
        settings.append(
            EntrySettings(
                name=name,
                harness=entry.harness if isinstance(entry.harness, str) else dict(entry.harness),
                harness_options=dict(entry.harness_options),
                program=entry.program,
                program_options=dict(entry.program_options),
                max_steps=rollout.max_steps,
                max_tokens=rollout.max_tokens_per_episode,
                timeout=rollout.timeout,
                params={k: v for k, v in params.items() if v is not None},
                agents=entry.agents,
                path=f"environments.{i}",
                default_policy=policy_names(config)[0],
            )
        )
    return settings


def env_services(config: Config, names: Sequence[str] | None = None) -> list[Any]:
    """One env service per environment entry (or per named entry)."""

    services = []
    for name, entry in zip(entry_names(config), config.environments, strict=True):
        if names is not None and name not in names:
            continue
        services.append(_service(name, entry))
    return services


def reward_processors(config: Config) -> dict[str, str]:
    """Each entry's `reward_processor` ref, by entry name, for the grader."""
    return {
        name: entry.reward_processor
        for name, entry in zip(entry_names(config), config.environments, strict=True)
        if entry.reward_processor
    }


def grader(config: Config, *, tinker_base_url: str | None = None, model_name: str | None = None) -> Any:
    """The config's grader: each entry's reward processor, reward rules and judges.

    `tinker_base_url` and `model_name` are the run's training service and base model, for
    `tinker` judges that name neither."""
    from platoon.programs import Grader
    from platoon.rewards import build_reward_rules

    rules = build_reward_rules(config, tinker_base_url=tinker_base_url, model_name=model_name)
    return Grader(reward_processors=reward_processors(config), rules=rules)


def _service(name: str, entry: EnvironmentConfig) -> Any:
    from platoon.envs import build_env_service

    return build_env_service(name, entry.service, entry.env, dict(entry.service_kwargs))


TINY_MODEL = "platoon-tiny-qwen3"


def resolve_model(name: str, *, seed: int = 0) -> str:
    """A model name as the loaders take it: a built-in model (`platoon-tiny-qwen3`, a tiny
    random-init Qwen3 with a Qwen3 tokenizer) is built into the site cache on first use and
    named by its directory; any other name is returned as it is."""
    if name != TINY_MODEL:
        return name
    from platoon.config import load_site

    directory = Path(load_site().cache).expanduser() / "models" / TINY_MODEL
    if not (directory / "config.json").exists():
        from platoon.testing.models import save_tiny_model

        log.info("building the tiny demo model", path=str(directory))
        save_tiny_model(directory, hidden_size=64, num_layers=2, seed=seed)
    return str(directory)


def load_tokenizer(name_or_path: str) -> Any:
    """A tokenizer from a local directory or the HF cache (or a built-in model's); never downloads."""
    if name_or_path == TOY_TOKENIZER:
        from platoon.testing.tokenizers import toy_tokenizer

        return toy_tokenizer()
    name_or_path = resolve_model(name_or_path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not Path(name_or_path).is_dir() and not _in_hf_cache(name_or_path):
        # Said at once: transformers would import torch (a second) only to fail the same way.
        raise SystemError(
            f"cannot load the tokenizer {name_or_path!r}: it is not a local directory and not in "
            "the Hugging Face cache (platoon never downloads at run time)"
        )
    try:
        return _tokenizer_class(name_or_path).from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise SystemError(
            f"cannot load the tokenizer {name_or_path!r} from a local directory or the HF cache "
            f"(platoon never downloads at run time): {str(exc).splitlines()[0]}"
        ) from None


def _in_hf_cache(repo_id: str) -> bool:
    """Whether the HF cache holds a tokenizer of `repo_id` (a cheap look, no import of torch)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return True  # let transformers decide
    try:
        return any(
            isinstance(try_to_load_from_cache(repo_id, name), str)
            for name in ("tokenizer_config.json", "tokenizer.json")
        )
    except ValueError:  # not a repo id at all (a path that does not exist)
        return False


def _tokenizer_class(name_or_path: str) -> Any:
    """The class a local tokenizer directory names, else `AutoTokenizer`.

    `AutoTokenizer` imports transformers' model configuration code, which imports torch: some
    200 MB that a rollout process never uses. The class named in `tokenizer_config.json` is
    the one `AutoTokenizer` would pick, and it loads without torch.
    """
    import json

    import transformers

    try:
        config = json.loads((Path(name_or_path) / "tokenizer_config.json").read_text())
        cls = getattr(transformers, config["tokenizer_class"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError):
        return transformers.AutoTokenizer
    return cls if hasattr(cls, "from_pretrained") else transformers.AutoTokenizer


def policy_from_ref(ref: str, tokenizer: Any) -> SamplerFactory:
    """`scripted:MODULE:ATTR`: a scripted policy (a list of texts or a function of the messages)."""
    from platoon.testing.policies import ScriptedSamplerFactory

    kind, _, target = ref.partition(":")
    if kind != "scripted" or ":" not in target:
        raise SystemError(f"--policy {ref!r}: expected scripted:MODULE:ATTR")
    return ScriptedSamplerFactory(tokenizer, plugins.import_ref(target))


def check_training_service(config: Config) -> None:
    """Raise at once, before any model or tokenizer loads, when a Tinker service is needed and
    none is named (the embedded backend needs none)."""
    if config.train is None:
        _tinker_endpoint(config)
        return
    from platoon.config.policies import resolve_policies

    for spec in resolve_policies(config).values():
        if spec.train.backend != "local" and spec.tinker_base_url is None:
            _tinker_endpoint(config)


_NO_SERVICE = (
    "no training service: set TINKER_API_KEY for hosted Tinker, TINKER_BASE_URL or "
    "tinker_base_url for a self-hosted one, or train.backend=local for the embedded one "
    "(rollout and eval also take --policy scripted:MODULE:ATTR)"
)


def tinker_service_client(config: Config) -> Any:
    """A `tinker.ServiceClient` for the config: `tinker_base_url`, else `$TINKER_BASE_URL`,
    else hosted Tinker (which needs `TINKER_API_KEY`)."""
    try:
        import tinker
    except ImportError:
        raise SystemError(
            "sampling a Tinker policy needs the tinker extra: pip install 'platoon[tinker]'"
        ) from None
    base_url, api_key = _tinker_endpoint(config)
    return tinker.ServiceClient(base_url=base_url, api_key=api_key or "tml-local")


def _tinker_endpoint(config: Config) -> tuple[str | None, str | None]:
    """(base URL, API key) of the config's Tinker service; raises when it names none."""
    base_url = config.tinker_base_url or os.environ.get("TINKER_BASE_URL")
    api_key = os.environ.get("TINKER_API_KEY")
    if base_url is None and not api_key:
        raise SystemError(_NO_SERVICE)
    return base_url, api_key


def gateway_for(
    config: Config,
    renderer: Any,
    factory: SamplerFactory,
    *,
    model_name: str = "platoon-policy",
    policy: str = "default",
    policies: Any = None,
) -> Any:
    """The gateway; `policy` names the policy `renderer` and `factory` serve, `policies` adds
    the others of a several-policy run (name -> `GatewayPolicy`)."""
    from platoon.gateway import Gateway

    return Gateway(
        renderer=renderer,
        sampler_factory=factory,
        defaults=SampleParams(),
        context_window=config.train.context_window_length if config.train else None,
        max_concurrent_samples=config.gateway.max_concurrent_samples,
        host=config.gateway.host,
        port=config.gateway.port,
        model_name=model_name,
        model_aliases=config.gateway.model_aliases,
        policy=policy,
        policies=policies,
    )


def plugin_components(config: Config) -> list[Any]:
    return [
        plugins.plugin_component(p.handler or p.component or "", event_names=p.events, options=p.options)
        for p in config.plugins
    ]


@contextlib.asynccontextmanager
async def running(bus: Any, components: Sequence[Any]) -> AsyncIterator[None]:
    """Run `components` on `bus` for the duration of the block, then cancel them.

    Every component is attached (subscribed) before any of them runs, so a request published
    inside the block always finds its responder.
    """
    from platoon.bus import attach, run_components

    attach(components, bus)
    async with anyio.create_task_group() as tg:
        await tg.start(run_components, bus, components)
        try:
            yield
        finally:
            tg.cancel_scope.cancel()


def make_renderer(
    renderer_name: str, tokenizer: Any, tool_call_parser: str = "auto"
) -> tuple[Any, str | None]:
    """The renderer, and the tool-call parser in force (recorded in lock.json).

    `auto` picks the first parser that reads a probe turn of this renderer back exactly; a
    format with no tool calls (role_colon) has none.
    """
    from platoon.gateway.autoparser import AutoParserError, choose_tool_call_parser
    from platoon.gateway.renderers import get_renderer

    parser: str | None = tool_call_parser
    if tool_call_parser == "auto":
        try:
            parser = choose_tool_call_parser(renderer_name, tokenizer)
        except AutoParserError:
            parser = None
    return get_renderer(renderer_name, tokenizer, tool_call_parser=parser), parser


def model_and_renderer(config: Config) -> tuple[str | None, str]:
    model = config.train.model_name if config.train else (config.eval.model_name if config.eval else None)
    renderer = (
        config.train.renderer_name if config.train else (config.eval.renderer_name if config.eval else None)
    )
    return model, renderer or "qwen3_instruct"


def tokenizer_for(config: Config, *, scripted: bool = False) -> Any:
    """The run's tokenizer; a scripted policy falls back to the toy Qwen3 tokenizer."""
    model, _ = model_and_renderer(config)
    name = (config.train.tokenizer if config.train else None) or model
    if name is None:
        if scripted:
            return load_tokenizer(TOY_TOKENIZER)
        raise SystemError("the config names no model: set train.model_name (or eval.model_name)")
    try:
        return load_tokenizer(name)
    except SystemError:
        if not scripted:
            raise
        log.warning(
            "tokenizer not available locally; the scripted policy uses platoon's toy Qwen3 tokenizer",
            wanted=name,
        )
        return load_tokenizer(TOY_TOKENIZER)


@contextlib.asynccontextmanager
async def sampler_factory(config: Config, tokenizer: Any, policy: str | None = None) -> AsyncIterator[Any]:
    """The sampler factory: a scripted policy, the embedded backend, or a Tinker service."""
    if policy:
        yield policy_from_ref(policy, tokenizer)
        return
    from platoon.policy.tinker import TinkerSamplerFactory, closing

    model, _ = model_and_renderer(config)
    model_path = config.eval.model_path if config.eval else None
    if config.train is not None and config.train.backend == "local":
        from platoon.backends.local import running_server_in_thread

        local = resolve_model(config.train.model_name, seed=config.train.seed)
        async with running_server_in_thread(local) as base_url:
            import tinker

            async with closing(tinker.ServiceClient(base_url=base_url, api_key="tml-local")) as client:
                yield TinkerSamplerFactory(client, local, model_path=model_path)
        return
    async with closing(tinker_service_client(config)) as client:
        yield TinkerSamplerFactory(client, model or "", model_path=model_path)


@contextlib.asynccontextmanager
async def _several_policies(
    config: Config, run_dir: Path, *, policy: str | None, eval: bool
) -> AsyncIterator[Any]:
    """`rollout_system` for a config with `policies:`: the gateway serves every policy."""
    from platoon.bus import Bus, EventLog
    from platoon.config import write_run_files
    from platoon.programs import EpisodeRunner
    from platoon.train.policies import serving_policies

    async with serving_policies(config, scripted=policy) as served:
        default, *_ = served
        write_run_files(run_dir, config, {"policies": list(served), "policy": policy})
        gateway = gateway_for(
            config,
            served[default].renderer,
            served[default].factory,
            model_name=served[default].model_name or "platoon-policy",
            policy=default,
            policies={name: p for name, p in served.items() if name != default},
        )
        runner = EpisodeRunner(
            entry_settings(config, eval=eval),
            max_concurrent=config.eval.concurrency if (eval and config.eval) else 256,
            seed=config.train.seed if config.train else 0,
        )
        components = [
            EventLog(run_dir),
            *env_services(config),
            gateway,
            runner,
            grader(config),
            *plugin_components(config),
        ]
        async with Bus() as bus, running(bus, components):
            yield bus


@contextlib.asynccontextmanager
async def rollout_system(
    config: Config, run_dir: Path, *, policy: str | None = None, eval: bool = False
) -> AsyncIterator[Any]:
    """A running bus with everything that plays and grades episodes (no trainer): env
    services, the gateway, the runner, the grader, the event log and the config's plugins."""
    from platoon.bus import Bus, EventLog
    from platoon.config import write_run_files
    from platoon.programs import EpisodeRunner

    if not config.environments:
        raise SystemError("the config has no environments")
    if config.policies and config.train is not None:
        async with _several_policies(config, run_dir, policy=policy, eval=eval) as bus:
            yield bus
        return
    tokenizer = tokenizer_for(config, scripted=bool(policy))
    _, renderer_name = model_and_renderer(config)
    renderer, parser = make_renderer(
        renderer_name, tokenizer, config.train.tool_call_parser if config.train else "auto"
    )
    runner = EpisodeRunner(
        entry_settings(config, eval=eval),
        max_concurrent=config.eval.concurrency if (eval and config.eval) else 256,
        seed=config.train.seed if config.train else 0,
    )
    write_run_files(
        run_dir, config, {"renderer": renderer_name, "tool_call_parser": parser, "policy": policy}
    )
    async with sampler_factory(config, tokenizer, policy) as factory:
        components = [
            EventLog(run_dir),
            *env_services(config),
            gateway_for(config, renderer, factory),
            runner,
            grader(config),
            *plugin_components(config),
        ]
        async with Bus() as bus, running(bus, components):
            yield bus

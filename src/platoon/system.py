"""What assembling a run needs that is not wiring: models, tokenizers, renderers, the
Tinker service's address, the names of the config's entries, and running components.

The run itself is assembled in one place, `platoon.assembly`; the commands and embedding
applications go through it.
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
from platoon.policy.base import SamplerFactory

__all__ = [
    "SystemError",
    "builtin_model_dir",
    "builtin_model_name",
    "check_training_service",
    "entry_names",
    "import_packages",
    "load_tokenizer",
    "make_renderer",
    "policy_from_ref",
    "resolve_model",
    "running",
    "tinker_service_client",
    "tiny_model_path",
    "tokenizer_named",
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


TINY_MODEL = "platoon-tiny-qwen3"
# The built-in model's weights: one model per name, whatever the seed of the run that builds it.
TINY_MODEL_SEED = 1


def resolve_model(name: str) -> str:
    """A model name as the loaders take it. A built-in name is made ready in the site cache on
    first use and named by its directory: `platoon-tiny-qwen3` (a tiny random-init Qwen3 with a
    Qwen3 tokenizer) is built, a catalogue model (`smollm2-135m`, `platoon models list`) is
    pulled and converted; any other name is returned as it is."""
    builtin = builtin_model_name(name)
    if builtin is None:
        return name
    if builtin == TINY_MODEL:
        return _tiny_model()
    from platoon import models

    entry = models.find_model(builtin)
    assert entry is not None
    if not models.is_pulled(entry):
        log.info("pulling a catalogue model into the site cache (once)", model=entry.name)
    try:
        return str(models.pull(entry, say=lambda line: log.info(line)))
    except models.ModelError as exc:
        raise SystemError(f"model {name!r}: {exc}") from None


def builtin_model_name(name: str | None) -> str | None:
    """The built-in model (the tiny one, or a catalogue model by its full name) that `name` or
    its cache directory names; None for any other name."""
    if not name:
        return None
    if name in (TINY_MODEL, tiny_model_path()):
        return TINY_MODEL
    from platoon import models

    entry = models.find_model(name)
    if entry is not None:
        return entry.name
    if "/" in name or os.sep in name:
        path = os.path.abspath(os.path.expanduser(name))
        for entry in models.catalogue():
            if path == os.path.abspath(models.model_dir(entry)):
                return entry.name
    return None


def builtin_model_dir(name: str | None) -> str | None:
    """The cache directory a built-in model name (or that directory itself) stands for,
    whether or not it is there yet; None for any other name."""
    builtin = builtin_model_name(name)
    if builtin is None:
        return None
    if builtin == TINY_MODEL:
        return tiny_model_path()
    from platoon import models

    return str(models.model_dir(builtin))


def _tiny_model() -> str:
    directory = Path(tiny_model_path())
    if not (directory / "config.json").exists():
        import shutil
        import tempfile

        from platoon.testing.models import save_tiny_model

        log.info("building the tiny demo model", path=str(directory))
        directory.parent.mkdir(parents=True, exist_ok=True)
        # Built aside and renamed into place: a trainer and its worker started together on one
        # machine share the cache, and neither may read a model the other is half-way writing.
        building = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
        try:
            save_tiny_model(building, hidden_size=64, num_layers=2, seed=TINY_MODEL_SEED)
            if directory.exists() and not (directory / "config.json").exists():
                shutil.rmtree(directory, ignore_errors=True)  # what a build cut short left
            try:
                building.rename(directory)
            except OSError:
                if not (directory / "config.json").exists():  # not another process's model
                    raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return str(directory)


def tiny_model_path() -> str:
    """Where the built-in tiny model is (or will be) built: the site cache."""
    from platoon.config import load_site

    return str(Path(load_site().cache).expanduser() / "models" / TINY_MODEL)


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
        _tinker_endpoint(config.tinker_base_url)
        return
    from platoon.config.policies import resolve_policies

    for spec in resolve_policies(config).values():  # `policies:` may put each on a service of its own
        if spec.train.backend != "local":
            _tinker_endpoint(spec.tinker_base_url)


_NO_SERVICE = (
    "no training service: set TINKER_API_KEY for hosted Tinker, TINKER_BASE_URL or "
    "tinker_base_url for a self-hosted one, or train.backend=local for the embedded one "
    "(rollout and eval also take --policy scripted:MODULE:ATTR)"
)


def tinker_service_client(base_url: str | None) -> Any:
    """A `tinker.ServiceClient` for `base_url`, else `$TINKER_BASE_URL`, else hosted Tinker."""
    try:
        import tinker
    except ImportError:
        raise SystemError(
            "sampling a Tinker policy needs the tinker extra: pip install 'platoon[tinker]'"
        ) from None
    base_url, api_key = _tinker_endpoint(base_url)
    return tinker.ServiceClient(base_url=base_url, api_key=api_key or "tml-local")


def _tinker_endpoint(configured: str | None) -> tuple[str | None, str | None]:
    """(base URL, API key) of the Tinker service; raises when none is named."""
    base_url = configured or os.environ.get("TINKER_BASE_URL")
    api_key = os.environ.get("TINKER_API_KEY")
    if base_url is None and not api_key:
        raise SystemError(_NO_SERVICE)
    return base_url, api_key


@contextlib.asynccontextmanager
async def running(bus: Any, components: Sequence[Any]) -> AsyncIterator[None]:
    """Run `components` on `bus` for the duration of the block, then cancel them.

    Every component is attached (subscribed) before any of them runs, so a request published
    inside the block always finds its responder. A block that ends normally first lets the
    components handle what was published (up to the bus's `drain_timeout`): the last step's
    metrics and events were often published a moment before the run ended.
    """
    from platoon.bus import attach, run_components

    attach(components, bus)
    async with anyio.create_task_group() as tg:
        await tg.start(run_components, bus, components)
        ended = False
        try:
            yield
            ended = True
        finally:
            if ended:
                with anyio.move_on_after(bus.drain_timeout) as waited:
                    await bus.drained()
                if waited.cancelled_caught:
                    log.warning("components still busy when the run ended", busy=bus.busy())
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


def tokenizer_named(name: str | None, *, scripted: bool = False) -> Any:
    """The tokenizer `name`; a scripted policy falls back to the toy Qwen3 tokenizer."""
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

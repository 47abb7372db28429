"""Loading a run's model and tokenizer by name: a local directory, the Hugging Face cache, or a
built-in model made ready in the site cache on first use (the tiny demo model, a catalogue
model). Nothing here downloads at run time.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Protocol

import structlog

from platoon import models
from platoon.config import AssemblyError, load_site
from platoon.gateway.autoparser import AutoParserError, choose_tool_call_parser
from platoon.gateway.renderers import get_renderer
from platoon.models.tiny import TINY_CONTEXT, save_tiny_model
from platoon.models.tokenizers import tokenizer_class, toy_tokenizer

__all__ = [
    "TINY_MODEL",
    "TINY_MODEL_SEED",
    "TOY_TOKENIZER",
    "TokenizerMissing",
    "builtin_model",
    "builtin_model_dir",
    "builtin_model_name",
    "load_tokenizer",
    "make_renderer",
    "model_window",
    "resolve_model",
    "tiny_model_path",
    "tokenizer_identity",
    "tokenizer_named",
]

log = structlog.get_logger("platoon.models")


class TokenizerMissing(AssemblyError):
    """A tokenizer that is neither a local directory nor in the Hugging Face cache."""


TOY_TOKENIZER = "platoon-toy-qwen3"
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
    entry = models.find_model(builtin)
    assert entry is not None
    if not models.is_pulled(entry):
        log.info("pulling a catalogue model into the site cache (once)", model=entry.name)
    try:
        return str(models.pull(entry, say=lambda line: log.info(line)))
    except models.ModelError as exc:
        raise AssemblyError(f"model {name!r}: {exc}") from None


def builtin_model_name(name: str | None) -> str | None:
    """The built-in model (the tiny one, or a catalogue model by its full name) that `name` or
    its cache directory names; None for any other name."""
    if not name:
        return None
    if name in (TINY_MODEL, tiny_model_path()):
        return TINY_MODEL
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
    return builtin_model(name)[0]


def builtin_model(name: str | None) -> tuple[str | None, str | None]:
    """The cache directory a built-in model name (or that directory itself) stands for, and the
    built-in model's name; (None, None) for any other name."""
    builtin = builtin_model_name(name)
    if builtin is None:
        return None, None
    return (tiny_model_path() if builtin == TINY_MODEL else str(models.model_dir(builtin))), builtin


def _tiny_model() -> str:
    directory = Path(tiny_model_path())
    if not (directory / "config.json").exists():
        import shutil
        import tempfile

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
    _widen_context(directory)
    return str(directory)


def _widen_context(directory: Path) -> None:
    """Give a tiny model an older platoon built (a 2,048-token window) today's window. Only the
    config changes (the weights do not depend on it), replaced whole so that a reader sees the
    old config or the new one, never half of one."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    if config.get("max_position_embeddings", 0) >= TINY_CONTEXT:
        return
    config["max_position_embeddings"] = TINY_CONTEXT
    partial = path.with_name(f".config-{os.getpid()}.json")
    partial.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(partial, path)


def tiny_model_path() -> str:
    """Where the built-in tiny model is (or will be) built: the site cache."""
    return str(Path(load_site().cache).expanduser() / "models" / TINY_MODEL)


def load_tokenizer(name_or_path: str) -> Any:
    """A tokenizer from a local directory or the HF cache (or a built-in model's); never downloads."""
    if name_or_path == TOY_TOKENIZER:
        return toy_tokenizer()
    name_or_path = resolve_model(name_or_path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not Path(name_or_path).is_dir() and not _in_hf_cache(name_or_path):
        # Said at once: transformers would import torch (a second) only to fail the same way.
        raise TokenizerMissing(
            f"cannot load the tokenizer {name_or_path!r}: it is not a local directory and not in "
            f"the Hugging Face cache, and platoon never downloads at run time. Put it there "
            f"(`hf download {name_or_path}` on a machine with network), point model_name or "
            "train.tokenizer at a local directory, or train a model built here (`platoon models "
            "list`; platoon-tiny-qwen3 needs nothing); `platoon prepare CONFIG` checks this"
        )
    try:
        return tokenizer_class(name_or_path).from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise AssemblyError(
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


def tokenizer_named(name: str | None, *, scripted: bool = False) -> Any:
    """The tokenizer `name`; a scripted policy falls back to the toy Qwen3 tokenizer."""
    if name is None:
        if scripted:
            return load_tokenizer(TOY_TOKENIZER)
        raise AssemblyError("the config names no model: set train.model_name (or eval.model_name)")
    try:
        return load_tokenizer(name)
    except AssemblyError:
        if not scripted:
            raise
        log.warning(
            "tokenizer not available locally; the scripted policy uses platoon's toy Qwen3 tokenizer",
            wanted=name,
        )
        return load_tokenizer(TOY_TOKENIZER)


def model_window(tokenizer: object) -> int | None:
    """The context window of the model a tokenizer belongs to: `max_position_embeddings` of the
    model directory it was loaded from, else the tokenizer's own `model_max_length` where it
    states a real one (transformers puts 1e30 there for "unknown")."""
    config = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "config.json"
    if config.is_file():
        try:
            value = json.loads(config.read_text()).get("max_position_embeddings")
        except (OSError, ValueError, AttributeError):
            value = None
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 10**8 else None


class _Vocabulary(Protocol):
    def get_vocab(self) -> dict[str, int]: ...


def tokenizer_identity(tokenizer: _Vocabulary, name: str | None = None) -> dict[str, str]:
    """What lock.json records of a run's tokenizer: its name, for people, and a fingerprint of
    its vocabulary (every token and its id, added tokens included), which is what decides whether
    tokens recorded with one tokenizer mean the same under another (`platoon sft` compares them).
    Two names for one vocabulary (the tiny model's directory and the toy tokenizer) match."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
    shown = name or getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    return {"name": str(shown), "fingerprint": f"sha256:{digest[:32]}"}


def make_renderer(
    renderer_name: str, tokenizer: Any, tool_call_parser: str = "auto"
) -> tuple[Any, str | None]:
    """The renderer, and the tool-call parser in force (recorded in lock.json).

    `auto` picks the first parser that reads a probe turn of this renderer back exactly; a
    format with no tool calls (role_colon) has none.
    """
    parser: str | None = tool_call_parser
    if tool_call_parser == "auto":
        try:
            parser = choose_tool_call_parser(renderer_name, tokenizer)
        except AutoParserError:
            parser = None
    return get_renderer(renderer_name, tokenizer, tool_call_parser=parser), parser

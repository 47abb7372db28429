"""`platoon prepare CONFIG`: fetch, build and pin what a config's models, Harbor and verifiers entries need.

A catalogue model the config names (`model_name: smollm2-135m`) is pulled into the site cache
and converted once (`platoon models pull`).

For each `service: harbor` entry: fetch an `hf://` dataset into the site cache, build what
the sandbox provider can (bwrap: each task's root filesystem layer; docker: each task's
image, where a Docker engine answers), check the harness, and pin it all in
`<cache>/locks/<entry>-<fingerprint>.json`, keyed by what was prepared (the dataset digest,
index, holdout, provider and harness): an entry prepared before is "up to date" and nothing is
rebuilt, a changed one is rebuilt, and two checkouts whose entries share a name never rebuild
each other's. Then the tokenizer is loaded, and each entry's held-out tasks are printed.
Nothing here is needed again at train time, which never fetches.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from platoon import models
from platoon.assembly import import_packages
from platoon.cli import CommandError
from platoon.config import AssemblyError, entry_names, load_config, load_site
from platoon.config.policies import resolve_policies
from platoon.config.schema import Config, EnvironmentConfig
from platoon.envs.harbor import HarborError, TaskDefect, load_dataset
from platoon.envs.harbor.prepare import (
    HF_SCHEME,
    build_image,
    build_layer,
    environment_key,
    fetch_hf_dataset,
    plan_dockerfile,
    resolve_dataset,
)
from platoon.harness import HarnessError, get_harness
from platoon.models.loading import builtin_model_name, load_tokenizer
from platoon.sandbox import SandboxError, default_provider, engine_answers, engine_url

__all__ = ["prepare"]


def prepare(args: Any) -> int:
    path = Path(args.config)
    config = load_config(path, args.overrides)
    import_packages(config, path.resolve().parent)
    site = load_site()
    entries = [
        (i, name, entry)
        for i, (name, entry) in enumerate(zip(entry_names(config), config.environments, strict=True))
        if entry.service == "harbor"
    ]
    verifiers = [
        (name, entry)
        for name, entry in zip(entry_names(config), config.environments, strict=True)
        if (entry.service or "").startswith("verifiers://")
    ]
    pulled = _pull_models(config)
    if not entries and not verifiers and not pulled:
        print(
            "nothing to fetch or build: the config has no `service: harbor` or `verifiers://` entries "
            "and no catalogue model"
        )

    async def main() -> None:
        for i, name, entry in entries:
            await _prepare_entry(i, name, entry, Path(site.cache), site.provider)
        for name, entry in verifiers:
            await _prepare_verifiers(name, entry, Path(site.cache), site.pythons)

    anyio.run(main)
    _load_tokenizer(config)
    return 0


async def _prepare_verifiers(name: str, entry: EnvironmentConfig, cache: Path, pythons: list[str]) -> None:
    """A verifiers entry's venv (Python 3.12, the verifiers version it needs, uv and its
    `packages`), built once: a line before the build, and one with its time after."""
    # only a config with a verifiers entry loads the verifiers backend's modules
    from platoon.envs.verifiers.venv import ToolchainError, resolve_version, venv_toolchain
    from platoon.harness.toolchain import build_toolchain, toolchain_dir

    kwargs = entry.service_kwargs
    packages = [str(p) for p in kwargs.get("packages") or []]
    paths = [str(p) for p in kwargs.get("paths") or []]
    named = kwargs.get("verifiers")
    started = time.monotonic()
    try:
        version = await resolve_version(
            packages, cache, pythons, named=None if named is None else str(named), paths=paths
        )
        toolchain = venv_toolchain(packages, version)
        pins = ", ".join(toolchain.pip)
        if not (toolchain_dir(toolchain, cache) / "bin" / "python").exists():
            print(f"{name}: building the verifiers venv ({pins}); a few minutes the first time", flush=True)
        folder = await build_toolchain(toolchain, cache, pythons)
    except ToolchainError as exc:
        raise CommandError(f"{name}: the verifiers venv did not build: {exc}") from None
    print(f"{name}: verifiers venv ready in {time.monotonic() - started:.1f} s at {folder} ({pins})")


async def _prepare_entry(
    i: int, name: str, entry: EnvironmentConfig, cache: Path, site_provider: str
) -> None:

    kwargs = dict(entry.service_kwargs)
    where = f"environments.{i}.service_kwargs"
    ref = kwargs.get("dataset")
    if not isinstance(ref, str) or not ref:
        raise CommandError(f"{where}.dataset: a harbor entry names its dataset (a directory or hf://...)")
    provider = kwargs.get("provider") or site_provider
    provider = default_provider() if provider == "auto" else provider
    options = dict(kwargs.get("provider_options") or {})
    try:
        if ref.startswith(HF_SCHEME):
            directory, fetched = await anyio.to_thread.run_sync(fetch_hf_dataset, ref, cache)
            print(f"{name}: {'fetched' if fetched else 'already fetched'} {ref} into {directory}")
        else:
            directory = resolve_dataset(ref, cache)
        dataset = load_dataset(directory, index=kwargs.get("index") or (), holdout=kwargs.get("holdout"))
    except HarborError as exc:
        raise CommandError(f"{name}: {exc}") from None
    harnesses = _harness_names(entry)
    inputs = {
        "dataset": ref,
        "digest": dataset.digest,
        "index": kwargs.get("index"),
        "holdout": kwargs.get("holdout"),
        "provider": provider,
        "harness": harnesses,
    }
    fingerprint = "sha256:" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    stem = re.sub(r"[^\w.-]", "_", name)
    lock_path = cache / "locks" / f"{stem}-{fingerprint.removeprefix('sha256:')[:16]}.json"
    old = _read_lock(lock_path)
    summary = f"{dataset.digest[:19]}..., {len(dataset.tasks)} tasks, provider {provider}"
    if old is not None and old.get("fingerprint") == fingerprint and _artefacts_present(old):
        print(f"{name}: up to date ({summary})")
    else:
        if any((cache / "locks").glob(f"{stem}-*.json")):
            print(f"{name}: the entry changed since it was prepared; rebuilding")
        print(f"{name}: dataset {directory} ({summary})")
        tasks = await _build(dataset, provider, cache, options)
        for harness in harnesses:
            print(f"  harness {harness}: {await _install_harness(harness)}")
        lock = {
            "entry": name,
            "fingerprint": fingerprint,
            **inputs,
            "path": str(directory),
            "tasks": tasks,
            "train": dataset.train,
            "eval": dataset.eval,
            "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock_path.write_text(json.dumps(lock, indent=2) + "\n")
        print(f"  lock: {lock_path}")
    _print_holdout(dataset, kwargs.get("holdout"))


async def _build(dataset: Any, provider: str, cache: Path, options: dict[str, Any]) -> dict[str, Any]:
    """Build each task's artefact for `provider`; returns the lock's record of each task."""

    records: dict[str, Any] = {}
    if provider == "bwrap":
        build = _build_layer
    elif provider == "docker":
        build = await _docker_builder(options)
    else:
        build = _nothing_to_build(provider)
    counts: dict[str, int] = {}
    for name, task in dataset.tasks.items():
        record = {"environment": environment_key(task), **await build(task, cache, options)}
        records[name] = record
        kind = record["built"] or "not built"
        counts[kind] = counts.get(kind, 0) + 1
        if record.get("note"):
            print(f"  {name}: {record['note']}")
    print("  built: " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())))
    return records


async def _build_layer(task: Any, cache: Path, options: dict[str, Any]) -> dict[str, Any]:

    if task.dockerfile is None:
        image = task.config.environment.docker_image
        note = f"bwrap cannot run the image {image}; the host is its base" if image else None
        return {"built": None, "note": note}
    try:
        plan = plan_dockerfile(task)
        path = await build_layer(task, plan, cache, **options)
    except TaskDefect as exc:
        # No engine builds a task that is wrong in itself: the advice is to fix the task.
        return {"built": None, "note": f"no layer: the task's own defect: {exc}; fix the task"}
    except (HarborError, SandboxError) as exc:
        return {"built": None, "note": f"no layer ({exc}); use a provider with a container engine"}
    return {"built": "layer", "path": str(path), "base": plan.base}


async def _docker_builder(options: dict[str, Any]) -> Any:

    url = options.get("url") or engine_url()
    answers = url is not None and await anyio.to_thread.run_sync(engine_answers, url)
    if not answers:
        # Nothing could be built, so nothing is pinned: a later prepare must not say "up to date".
        where = f" at {url}" if url else " (no DOCKER_HOST and no socket found)"
        raise CommandError(
            f"provider docker: no Docker engine answers{where}; start one (or podman's socket), "
            "or prepare for another provider (the site profile's provider: bwrap)"
        )

    async def build(task: Any, cache: Path, _options: dict[str, Any]) -> dict[str, Any]:
        image = task.config.environment.docker_image
        if image:
            return await _pull(image, url)
        if task.dockerfile is None:
            return {"built": None, "note": "a compose-only task: platoon builds Dockerfiles only"}
        try:
            return {"built": "image", "image": await build_image(task, url)}
        except HarborError as exc:
            return {"built": None, "note": str(exc)}

    return build


async def _pull(image: str, url: str | None) -> dict[str, Any]:
    import aiodocker

    docker = aiodocker.Docker(url=url)
    try:
        try:
            await docker.images.inspect(image)
            return {"built": "image", "image": image, "note": None}
        except aiodocker.DockerError:
            pass
        try:
            with anyio.fail_after(600):
                await docker.images.pull(image)
        except (aiodocker.DockerError, TimeoutError) as exc:
            reason = getattr(exc, "message", None) or "timed out"
            return {
                "built": None,
                "note": f"the image {image} could not be pulled ({reason}); no registry reachable?",
            }
        return {"built": "image", "image": image}
    finally:
        await docker.close()


def _nothing_to_build(provider: str) -> Any:
    async def build(task: Any, cache: Path, options: dict[str, Any]) -> dict[str, Any]:
        image = task.config.environment.docker_image
        note = None if image else f"provider {provider} runs prebuilt images only; this task has none"
        return {"built": None, "note": note}

    return build


def _artefacts_present(lock: dict[str, Any]) -> bool:
    for record in (lock.get("tasks") or {}).values():
        if record.get("built") == "layer" and not (Path(record["path"]) / "layer.json").is_file():
            return False
    return True


def _read_lock(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _harness_names(entry: EnvironmentConfig) -> list[str]:
    if entry.harness is None:
        return []
    return [entry.harness] if isinstance(entry.harness, str) else sorted(entry.harness)


async def _install_harness(name: str) -> str:
    """Run the harness's toolchain install (command-line harnesses; cached in the site cache)."""

    try:
        harness = get_harness(name)
    except HarnessError as exc:
        raise CommandError(str(exc)) from None
    install = getattr(harness, "install", None)
    if install is None:
        return "no toolchain to install"
    try:
        await install()
    except Exception as exc:
        raise CommandError(f"harness {name}: {exc}") from None
    return "toolchain ready"


def _print_holdout(dataset: Any, holdout: Any) -> None:
    if not dataset.eval:
        print("  held out: none (no holdout; the eval split is empty)")
        return
    group_by = holdout.get("group_by") if isinstance(holdout, dict) else None
    groups = ""
    if group_by:
        values = sorted(
            {
                str(dataset.records[n].get(group_by, dataset.tasks[n].metadata.get(group_by)))
                for n in dataset.eval
            }
        )
        groups = f" ({group_by}: {', '.join(values)})"
    print(f"  held out as the eval split, {len(dataset.eval)} of {len(dataset.tasks)} tasks{groups}:")
    print("    " + ", ".join(dataset.eval))


def _pull_models(config: Config) -> bool:
    """Pull each catalogue model the config names into the site cache (once); whether there was one."""

    named = [spec.train.model_name for spec in resolve_policies(config).values()]
    named += [config.eval.model_name] if config.eval and config.eval.model_name else []
    found: dict[str, tuple[str, models.ModelEntry]] = {}
    for name in named:
        builtin = builtin_model_name(name)
        entry = models.find_model(builtin) if builtin else None
        if entry is not None:
            found.setdefault(entry.name, (name, entry))
    for name, entry in found.values():
        already = models.is_pulled(entry)

        def say(line: str, name: str = name) -> None:
            print(f"model {name}: {line}", flush=True)

        try:
            directory = models.pull(entry, say=say)
        except models.ModelError as exc:
            raise CommandError(f"model {name}: {exc}") from None
        print(f"model {name}: {'already pulled' if already else 'pulled'} into {directory} ({entry.license})")
    return bool(found)


def _load_tokenizer(config: Config) -> None:
    model = config.train.model_name if config.train else (config.eval.model_name if config.eval else None)
    name = (config.train.tokenizer if config.train else None) or model
    if name is None:
        return
    try:
        tokenizer = load_tokenizer(name)  # a built-in model is built into the cache here
    except AssemblyError:
        print(
            f"tokenizer {name}: not in a local directory or the Hugging Face cache; put it in the "
            f"cache (`hf download {name}` on a machine with network) or set train.tokenizer to a "
            "local directory before training"
        )
        return
    print(f"tokenizer {name}: loaded ({len(tokenizer)} tokens)")

"""Opening a run's policies: each one's tokenizer and renderer (`load_policy`), then its training
service, training client (resumed from a checkpoint), trainer and sampler factory
(`open_policies`). A policy's training service is opened here and only here.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import structlog

from platoon.assembly.settings import (
    PolicySettings,
)
from platoon.config import AssemblyError
from platoon.gateway.renderers import Renderer
from platoon.models import loading
from platoon.policy.base import SamplerFactory
from platoon.policy.scripted import policy_from_ref
from platoon.policy.tinker import (
    TinkerSamplerFactory,
    closing,
    sampling_client,
    sdk_call,
    service_key,
    tinker_endpoint,
    tinker_service_client,
    wait_future,
)
from platoon.serving import new_key, published_key
from platoon.train.checkpoints import (
    Checkpoint,
    CheckpointNotFound,
    CheckpointStore,
    ResumeError,
    checkpoint_problem,
    locate_weights,
    manifest_digest,
)
from platoon.train.recorded import recorded_tokenizers
from platoon.train.trainer import Trainer, TrainerSettings

if TYPE_CHECKING:
    import tinker
    from transformers import PreTrainedTokenizerBase

    from platoon.backends.local import ServeOptions


log = structlog.get_logger("platoon.assembly")


@dataclass
class OpenPolicy:
    """A policy while its run is open: what the gateway and the trainer take from it."""

    settings: PolicySettings
    tokenizer: PreTrainedTokenizerBase
    renderer: Renderer
    tool_call_parser: str | None
    sampler_factory: SamplerFactory | None = None
    base_url: str | None = None  # the training service, as samplers and judges reach it
    api_key: str | None = None  # the key of the run's own embedded service (None: the environment's)
    trainer: Trainer | None = None  # the trainer component, when the policy trains here
    checkpoint: Checkpoint | None = None  # the checkpoint it resumed from
    start_path: str | None = None  # the sampler weights it trains from: its checkpoint's or load_path's

    def factory(self) -> SamplerFactory:
        """Its sampler factory, which an opened policy always has."""
        assert self.sampler_factory is not None, f"policy {self.settings.name!r} is not open"
        return self.sampler_factory


def load_policy(policy: PolicySettings) -> OpenPolicy:
    """A policy's tokenizer and renderer (a built-in model is built first); no service yet.

    The tool-call parser `auto` is chosen by a probe of the tokenizer, the same on a trainer and
    its workers (the identity handshake compares the choice)."""
    if policy.builtin:
        loading.resolve_model(policy.builtin)
    if policy.trainer is not None:
        tokenizer = loading.load_tokenizer(policy.tokenizer or policy.model_name or "")
    else:
        name = policy.tokenizer or policy.model_name
        tokenizer = loading.tokenizer_named(name, scripted=bool(policy.scripted))
    renderer, chosen = loading.make_renderer(policy.renderer_name, tokenizer, policy.tool_call_parser)
    return OpenPolicy(policy, tokenizer, renderer, chosen)


@contextlib.asynccontextmanager
async def _service(
    policy: PolicySettings, checkpoint_dir: Path | None
) -> AsyncIterator[tuple[tinker.ServiceClient, str | None]]:
    """The policy's Tinker service (a client, and the URL others reach it at): the embedded
    server (`train.backend: local`), a self-hosted one, or hosted Tinker. Opened once per run.

    The embedded server has a key of its own, made up for the run: loopback is open to every user
    of the machine and to a sandbox on the host's network. The run's clients get it here; its
    workers and judges on this machine find it published for this user (`published_key`)."""
    if policy.backend == "local":
        assert policy.model_name is not None
        key = new_key("tml-")
        options: ServeOptions = {"batch_invariant": policy.reproducible, "api_key": key}
        if checkpoint_dir is not None:
            options["checkpoint_dir"] = checkpoint_dir
        from platoon.backends.local import running_server_in_thread  # the local extra: torch

        async with running_server_in_thread(policy.local_model(), **options) as base_url:
            import tinker  # the tinker extra, and it imports torch: only where a service opens

            with published_key(base_url, key):
                async with closing(tinker.ServiceClient(base_url=base_url, api_key=key)) as client:
                    yield client, base_url
        return
    async with closing(tinker_service_client(policy.base_url)) as client:
        yield client, policy.base_url


@contextlib.asynccontextmanager
async def open_policies(
    loaded: Mapping[str, OpenPolicy],
    *,
    run_dir: Path | None = None,
    stores: Mapping[str, CheckpointStore] | None = None,
    candidates: Mapping[str, Sequence[Checkpoint]] | None = None,
    sampler_factory: SamplerFactory | None = None,
) -> AsyncIterator[dict[str, OpenPolicy]]:
    """Open a run's policies (one, or several: RFC 0001): each one's training service and, when
    it trains (`settings.trainer`), its training client (resumed from the newest of its
    `candidates` that loads, its checkpoints in its `stores` entry) and trainer; and its sampler
    factory (`sampler_factory`, in tests, replaces a trained one's). Call it once per run:
    everything a policy owns is made here.

    Policies that share a training service share one client: two policies on one base model of
    the embedded backend are two LoRA adapters on one server; each other service is opened once
    (the checkpoints of a second embedded server go to `run_dir/tinker-<policy>`). A trained
    policy whose KL reference or teacher is a frozen one (`kl.reference_policy`, `distill.teacher`)
    scores against the weights that policy samples, on its service."""
    keys = {name: _service_key(p.settings) for name, p in loaded.items()}
    async with contextlib.AsyncExitStack() as stack:
        services: dict[tuple[str, str], _Service] = {}
        for name, policy in loaded.items():
            key = keys[name]
            if key not in services and not policy.settings.scripted:
                on_it = [p for p in loaded.values() if keys[p.settings.name] == key]
                where = _service_folder(on_it, run_dir, first=not services, name=name, stack=stack)
                client, base_url = await stack.enter_async_context(_service(policy.settings, where))
                services[key] = _Service(client, base_url, where)
        opened: dict[str, OpenPolicy] = {}
        for name, policy in loaded.items():
            key, trains = keys[name], policy.settings.trainer is not None
            frozen = {"kl": policy.settings.kl_policy, "distill": policy.settings.teacher_policy}
            scorers: dict[str, tinker.SamplingClient | None] = {"kl": None, "distill": None}
            for role, by in frozen.items():
                if by is not None and trains and keys[by] in services:
                    scorers[role] = await _frozen_reference(services[keys[by]].client, loaded[by].settings)
            opened[name] = await _open(
                policy,
                services.get(key),
                store=(stores or {}).get(name),
                candidates=(candidates or {}).get(name, ()),
                sampler_factory=sampler_factory,
                reference=scorers["kl"],
                teacher=scorers["distill"],
            )
        yield opened


@dataclass(frozen=True)
class _Service:
    """A training service open for a run: its client, the URL others reach it at, and its
    checkpoint folder (the embedded server's; None: the service keeps its own)."""

    client: tinker.ServiceClient
    base_url: str | None
    folder: Path | None


def _service_folder(
    on_it: list[OpenPolicy], run_dir: Path | None, *, first: bool, name: str, stack: contextlib.AsyncExitStack
) -> Path | None:
    """The checkpoint folder of the service the policies `on_it` share, with the weights they
    start from or sample made loadable there: the run's `tinker/` (a later service's
    `tinker-<name>/`) where one trains or samples a finished run's weights; for one policy alone
    that samples a finished run's weights, that run's own folder; else a folder of the session's
    own for the copies (an evaluation of several), or none."""
    trains = any(p.settings.trainer is not None for p in on_it)
    sampled = [p for p in on_it if _samples_finished_weights(p.settings)]
    if sampled == on_it and len(on_it) == 1 and run_dir is None:
        found, path = _finished_weights(on_it[0].settings)
        on_it[0].settings = replace(on_it[0].settings, model_path=path)
        return found
    where: Path | None = None
    if (trains or sampled) and run_dir is not None:
        where = run_dir / ("tinker" if first else f"tinker-{name}")
    elif sampled:
        where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="platoon-tinker-")))
    for p in on_it:  # the training states they start from, on this service
        if p.settings.load_path and p.settings.trainer:
            p.settings = _start_state(p.settings, where)
    for p in sampled:
        assert where is not None
        p.settings = _finished_weights_in(p.settings, where)
    return where


async def _open(
    loaded: OpenPolicy,
    service: _Service | None,
    *,
    store: CheckpointStore | None,
    candidates: Sequence[Checkpoint],
    sampler_factory: SamplerFactory | None,
    reference: tinker.SamplingClient | None,
    teacher: tinker.SamplingClient | None,
) -> OpenPolicy:
    """One policy opened on its service (a scripted one has none): see `open_policies`.
    `reference`, `teacher`: the sampling client of its KL reference or teacher when another
    policy of the run is that; else made here from the weights its settings name."""
    policy = loaded.settings
    if policy.scripted:
        loaded.sampler_factory = policy_from_ref(policy.scripted, loaded.tokenizer)
        return loaded
    assert service is not None
    loaded.base_url = service.base_url
    loaded.api_key = service_key(service.client) if policy.backend == "local" else None
    if policy.trainer is None:
        model = policy.local_model() if policy.backend == "local" else policy.model_name or ""
        loaded.sampler_factory = TinkerSamplerFactory(service.client, model, model_path=policy.model_path)
        return loaded
    assert store is not None, "a policy that trains here needs its checkpoint store"
    client, checkpoint = await _resumed_client(
        service.client, policy, store, list(candidates), service.folder
    )
    version = checkpoint.policy_version if checkpoint else 0
    if policy.kl and reference is None:
        weights = _weights_here(
            policy, policy.kl_reference, service.folder, loaded.tokenizer, "train.kl.reference_path"
        )
        reference = await _sampling(service.client, policy, weights)
    if policy.distill and teacher is None:
        weights = _weights_here(
            policy, policy.teacher_path, service.folder, loaded.tokenizer, "train.distill.teacher_path"
        )
        teacher = await _sampling(service.client, policy, weights)
    loaded.trainer = Trainer(
        client,
        _with_base_url(policy.trainer, service.base_url),
        store,
        version=version,
        reference=reference,
        teacher=teacher,
        policy=policy.name,
        prefix=policy.prefix,
        delete=_deleter(service.base_url, loaded.api_key, local=policy.backend == "local"),
        digest=manifest_digest(service.folder) if service.folder is not None else None,
    )
    loaded.checkpoint = checkpoint
    loaded.start_path = checkpoint.sampler_path if checkpoint else await _loaded_sampler(client, policy)
    loaded.sampler_factory = sampler_factory or TinkerSamplerFactory(
        service.client, policy.model_name or "", model_path=loaded.start_path, version=version
    )
    return loaded


def _start_state(policy: PolicySettings, checkpoint_dir: Path | None) -> PolicySettings:
    """The policy with the training state it starts from (`load_path`) made loadable: a run
    directory (an SFT run's, say) names its newest checkpoint's state, and on the embedded
    backend the state's files are copied from the run that wrote them into this run's
    checkpoint folder, where this run's own server finds them. A `tinker://` path that no run
    here holds is left to the service (hosted Tinker, or a server the runs share)."""
    assert policy.load_path is not None
    ref, roots = policy.load_path, list(policy.runs)
    directory = Path(ref).expanduser()
    if not ref.startswith("tinker://") and directory.is_dir():
        ref, roots = _newest_state(directory, policy.name), [str(directory)]
    if policy.backend != "local" or checkpoint_dir is None:
        return replace(policy, load_path=ref)
    try:
        found, path = locate_weights(ref, roots)
    except CheckpointNotFound as exc:
        if directory.is_dir():
            raise AssemblyError(f"checkpoint.load_path: {exc}") from None
        return replace(policy, load_path=ref)  # perhaps already on this run's service
    _copy_in(found, path, checkpoint_dir)
    return replace(policy, load_path=path)


def _copy_in(found: Path, path: str, checkpoint_dir: Path) -> None:
    """Copy the weights `path` (tinker://<session>/<kind>/<name>) from the checkpoint folder
    `found` of the run that wrote them into this run's, where this run's own server finds them."""
    session, kind, name = path.removeprefix("tinker://").split("/")
    source, target = found / session / kind / name, checkpoint_dir / session / kind / name
    if source.resolve() != target.resolve() and not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target)
        log.info("weights copied in", weights=path, source=str(source))


def _weights_here(
    policy: PolicySettings,
    ref: str | None,
    checkpoint_dir: Path | None,
    tokenizer: PreTrainedTokenizerBase,
    key: str,
) -> str | None:
    """The sampler weights a reference or teacher of `policy` names (`key`), as a path its
    service loads: on the embedded backend a finished run's weights (a tinker:// path, a
    checkpoint's or a run's directory) are copied in; elsewhere a run directory names its newest
    checkpoint's. Weights of a run that recorded another tokenizer are refused, naming both.
    None: the base model."""
    if not ref:
        return None
    directory = Path(ref).expanduser()
    if policy.backend != "local" or checkpoint_dir is None:
        if not ref.startswith("tinker://") and (directory / "checkpoints.jsonl").is_file():
            _check_tokenizer(directory, "", policy, tokenizer, key)
            latest = CheckpointStore(directory).latest()
            if latest is None:
                raise AssemblyError(f"{key}: {directory} saved no checkpoint")
            return latest.sampler_path
        return ref
    try:
        found, path = locate_weights(ref, policy.runs)
    except CheckpointNotFound as exc:
        if directory.is_dir():
            raise AssemblyError(f"{key}: {exc}") from None
        return ref  # perhaps already on this run's service
    _check_tokenizer(
        found.parent, found.name.removeprefix("tinker").removeprefix("-"), policy, tokenizer, key
    )
    _copy_in(found, path, checkpoint_dir)
    return path


def _check_tokenizer(
    run_dir: Path, recorded: str, policy: PolicySettings, tokenizer: PreTrainedTokenizerBase, key: str
) -> None:
    """Refuse the weights of a run whose lock.json records another vocabulary than the policy's:
    they would score other text under the same token ids."""
    tokenizers = recorded_tokenizers(run_dir)
    theirs = tokenizers.get(recorded) or tokenizers.get("")
    mine = loading.tokenizer_identity(tokenizer, policy.tokenizer or policy.model_name)
    if theirs is not None and theirs["fingerprint"] != mine["fingerprint"]:
        raise AssemblyError(
            f"{key}: {run_dir} was trained with the tokenizer {theirs['name']!r} and {policy.name} "
            f"uses {mine['name']!r}; its logprobs of {policy.name}'s tokens would be of other text "
            "(name weights of a model with the same tokenizer)"
        )


def _newest_state(run_dir: Path, policy: str) -> str:
    """The newest checkpoint's training state of a run directory (of `policy`'s, or of its one
    policy, in a run of several)."""
    stores = [CheckpointStore(run_dir)]
    several = sorted(p.parent for p in run_dir.glob("checkpoints/*/checkpoints.jsonl"))
    if several:
        named = [d for d in several if d.name == policy]
        if not named and len(several) > 1:
            names = ", ".join(d.name for d in several)
            raise AssemblyError(
                f"checkpoint.load_path: {run_dir} holds the states of {names}; name one's directory"
            )
        stores = [CheckpointStore((named or several)[0])]
    latest = stores[0].latest()
    if latest is None:
        raise AssemblyError(f"checkpoint.load_path: {run_dir} saved no checkpoint to start from")
    return latest.state_path


def _finished_weights(policy: PolicySettings) -> tuple[Path, str]:
    """(checkpoint directory, tinker:// path) of the weights a policy on the embedded backend
    samples: a finished run's checkpoint, named by its tinker:// path, its directory or the run's."""
    assert policy.model_path is not None
    try:
        return locate_weights(policy.model_path, policy.runs)
    except CheckpointNotFound as exc:
        raise AssemblyError(f"model_path: {exc}") from None


def _samples_finished_weights(policy: PolicySettings) -> bool:
    """Whether a policy that does not train here samples a finished run's weights on the
    embedded backend (a frozen policy's, or an evaluation's, `model_path`)."""
    local = policy.backend == "local" and not policy.scripted
    return local and policy.trainer is None and bool(policy.model_path)


def _finished_weights_in(policy: PolicySettings, checkpoint_dir: Path) -> PolicySettings:
    """The policy with the finished run's weights it samples copied into `checkpoint_dir`, the
    folder of the embedded server it shares with other policies of the run."""
    found, path = _finished_weights(policy)
    _copy_in(found, path, checkpoint_dir)
    return replace(policy, model_path=path)


def _service_key(policy: PolicySettings) -> tuple[str, str]:
    if policy.backend == "local":
        return ("local", policy.model_name or "")
    return ("tinker", policy.base_url or "")


def _deleter(base_url: str | None, run_key: str | None, *, local: bool) -> Callable[[str], Awaitable[None]]:
    """How a trainer deletes weights it no longer needs (old checkpoints, `checkpoint.keep`;
    step sampler weights nothing samples any more): the Tinker REST API's DELETE, on the
    policy's own service (`run_key`: the embedded one's)."""
    url, key = (base_url, run_key) if local else tinker_endpoint(base_url)
    rest: list[tinker.RestClient] = []  # made at the first delete: its connections stay open for the process

    async def delete(path: str) -> None:
        import tinker  # the tinker extra, and it imports torch: only where a service opens

        if not rest:
            rest.append(tinker.RestClient(base_url=url, api_key=key or "tml-local"))
        await rest[0].delete_checkpoint_from_tinker_path(path)

    return delete


def _with_base_url(settings: TrainerSettings, base_url: str | None) -> TrainerSettings:
    return msgspec.structs.replace(settings, base_url=base_url)


async def _resumed_client(
    service: tinker.ServiceClient,
    policy: PolicySettings,
    store: CheckpointStore,
    candidates: list[Checkpoint],
    files: Path | None = None,
) -> tuple[tinker.TrainingClient, Checkpoint | None]:
    """The training client, from the newest checkpoint whose files are as they were saved (their
    digests, when `files` holds them: the embedded server's folder) and load; older ones next."""
    failures = []
    for checkpoint in candidates:
        problem = checkpoint_problem(checkpoint, files) if files is not None else None
        if problem is not None:
            log.warning(
                "checkpoint missing or damaged; trying the one before",
                after_step=checkpoint.step,
                problem=problem,
            )
            failures.append(f"after step {checkpoint.step}: {problem}")
            continue
        try:
            client = await _training_client(service, policy, checkpoint)
        except Exception as exc:
            log.warning(
                "checkpoint did not load; trying the one before",
                after_step=checkpoint.step,
                error=str(exc),
            )
            failures.append(f"after step {checkpoint.step}: {exc}")
            continue
        if failures:
            store.keep_through(checkpoint)
        log.info("resuming", trains_from_step=checkpoint.step + 1, state=checkpoint.state_path)
        return client, checkpoint
    if failures:
        raise ResumeError("no checkpoint of this run loads: " + "; ".join(failures))
    return await _training_client(service, policy, None), None


async def _training_client(
    service: tinker.ServiceClient, policy: PolicySettings, checkpoint: Checkpoint | None
) -> tinker.TrainingClient:
    def create() -> tinker.TrainingClient:
        if checkpoint is not None:
            return service.create_training_client_from_state_with_optimizer(checkpoint.state_path).result()
        if policy.load_path:
            return service.create_training_client_from_state(policy.load_path).result()
        return service.create_lora_training_client(
            base_model=policy.model_name or "", rank=policy.lora_rank, seed=policy.seed
        ).result()

    return await sdk_call(create)


async def _loaded_sampler(client: tinker.TrainingClient, policy: PolicySettings) -> str | None:
    """Sampler weights of a training client started from `load_path` (a training state is no
    sampler path), so that the first rollouts sample the weights that train; else None."""
    if not policy.load_path:
        return None
    saved = await wait_future(client.save_weights_for_sampler(name="loaded"))
    return saved.path


async def _sampling(
    service: tinker.ServiceClient, policy: PolicySettings, path: str | None
) -> tinker.SamplingClient:
    """A sampling client of a KL reference or teacher: the weights `path`, else the base model."""
    return await (
        sampling_client(service, model_path=path)
        if path
        else sampling_client(service, base_model=policy.model_name)
    )


async def _frozen_reference(service: tinker.ServiceClient, frozen: PolicySettings) -> tinker.SamplingClient:
    """The KL reference a trained policy names by `kl.reference_policy`: a sampling client on
    the weights the frozen policy samples (its `model_path`, else its base model)."""
    if frozen.model_path:
        return await sampling_client(service, model_path=frozen.model_path)
    model = frozen.local_model() if frozen.backend == "local" else frozen.model_name
    return await sampling_client(service, base_model=model)

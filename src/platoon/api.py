"""The Python API's entry points: `run`, `train` and `evaluate` a config from your own async
application, as the `platoon` commands do.

    import platoon as pt
    metrics = await pt.run("config.yaml", "train.max_training_steps=3")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog

from platoon.assembly import RunOptions, SftSources, assemble, import_packages
from platoon.bus.events import EvalRequested
from platoon.config import Config, load_config, load_site, run_dir
from platoon.policy.base import SamplerFactory
from platoon.train.evaluate import EvalReport
from platoon.train.loop import Scheduler
from platoon.train.sft import SftFeeder

__all__ = ["evaluate", "run", "sft", "train"]


async def run(
    config: Config | str | Path,
    *overrides: str,
    run_dir_path: str | Path | None = None,
    policy: str | None = None,
) -> dict[str, Any] | EvalReport:
    """Run what a config describes from your own async application: train (with its evals)
    when it has `train:`, else evaluate (`policy="scripted:MODULE:ATTR"` evaluates a scripted
    policy). Returns the last step's metrics, or the eval report."""
    if not isinstance(config, Config):
        path = anyio.Path(config)
        config = load_config(Path(config), overrides)
        import_packages(config, Path(await path.resolve()).parent)
    purpose = "train" if config.train is not None else "eval"
    directory = Path(run_dir_path) if run_dir_path else run_dir(config, load_site(), purpose=purpose)
    if config.train is not None:
        if policy is not None:
            raise ValueError(
                "policy= plays a scripted policy in an evaluation; this config trains (it has "
                "train:), and training samples the policy it trains"
            )
        return await train(config, run_dir=directory)
    return await evaluate(config, directory, policy=policy)


async def train(
    config: Config,
    *,
    run_dir: Path,
    resume: bool = False,
    console: bool = True,
    sampler_factory: SamplerFactory | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Train as `config` says, writing into `run_dir`; returns the last step's metrics.

    `sampler_factory` replaces the training service's sampler for rollouts (a scripted policy
    in tests and demos). With `nats:` in the config the trainer plays no rollouts: workers
    (`platoon worker`) do, see `platoon.train.distributed`."""
    if config.train is None:
        raise ValueError("the config has no train: section")
    asked = RunOptions(resume=resume, console=console, live=progress)
    run = assemble(config, "train", asked, run_dir=run_dir, sampler_factory=sampler_factory)
    async with run.running():
        scheduler = run.component(Scheduler)
        await scheduler.done.wait()
    return scheduler.last


async def sft(
    config: Config,
    *,
    run_dir: Path,
    sources: Sequence[str | Path],
    where: Sequence[str] = (),
    agent: str | None = None,
    resume: bool = False,
    console: bool = True,
) -> dict[str, float]:
    """Everything `platoon sft` does: train the config's policy with the cross-entropy loss on
    the recorded episodes of `sources` (run directories) that pass `where`, writing into
    `run_dir`; returns the last step's metrics, with the last held-out loss when `sft.heldout`
    holds episodes out."""
    if config.train is None:
        raise ValueError("the config has no train: section (it names the policy that trains)")
    asked = SftSources(tuple(str(s) for s in sources), tuple(where), agent)
    run = assemble(config, "sft", RunOptions(resume=resume, console=console, sft=asked), run_dir=run_dir)
    async with run.running():
        feeder = run.component(SftFeeder)
        await feeder.done.wait()
    return {**feeder.last, **(feeder.heldout[-1] if feeder.heldout else {})}


async def evaluate(
    config: Config,
    run_dir: str | Path,
    *,
    policy: str | None = None,
    split: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """Everything `platoon eval` does: play the eval split and write `eval.json` in `run_dir`.

    An evaluation replaces the one before it in `run_dir`, its event log with its report: the
    episodes there are always the ones `eval.json` reports (what `platoon sft --from` and the
    viewer read), never a mix of two evaluations."""
    log = Path(run_dir) / "events.msgpack"
    if log.exists():
        structlog.get_logger("platoon").info("replacing the evaluation before this one", run_dir=str(run_dir))
        log.unlink()
    asked = RunOptions(policy=policy, split=split, progress=progress)
    run = assemble(config, "eval", asked, run_dir=Path(run_dir))
    async with run.running() as bus:
        done = await bus.request(EvalRequested(step=0), timeout=None)
    assert done.report_path is not None
    report = await anyio.Path(done.report_path).read_bytes()
    return msgspec.json.decode(report, type=EvalReport)

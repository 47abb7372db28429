"""Where step metrics go: `metrics.jsonl` in the run directory, a line on the console, and
Weights & Biases when `stats.wandb.mode` is `online` or `offline`.

In W&B every metric is plotted against `platoon/step`, not W&B's own step counter: an eval runs
while training goes on and may finish after later steps were logged, which W&B would otherwise
drop. Each eval also logs `eval/table`, a table of its episodes (task, reward, status, calls,
tokens, final message) to read next to its pass@k.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import (
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    EvalFinished,
    Event,
    ModelCallFinished,
    TrainStepFinished,
    step_number,
)
from platoon.config.rundir import make_private_dir, open_private
from platoon.config.schema import WandbConfig

__all__ = [
    "EVAL_TABLE_COLUMNS",
    "HealthLimits",
    "MetricsSink",
    "counted_from_zero",
    "is_eval_row",
    "step_line",
]

STEP_KEY = "platoon/step"
EVAL_TABLE_COLUMNS = (
    "episode_id",
    "env",
    "split",
    "task_id",
    "reward",
    "status",
    "reason",
    "model_calls",
    "completion_tokens",
    "duration_s",
    "final_message",
)
_FINAL_MESSAGE_CHARS = 2000

# The health of the learning signal (`platoon.train.health`), as a step line shows it.
_HEALTH_KEYS = (
    ("mismatch/max_abs", "mismatch {:.2g}"),
    ("ratio/clipped_fraction", "clipped {:.2f}"),
    ("entropy/mean", "entropy {:.2f}"),
)

_CONSOLE_KEYS = (
    ("reward/mean", "reward {:.3f}"),
    ("reward/pass_rate", "pass {:.2f}"),
    ("train/datums", "datums {:.0f}"),
    ("train/trained_tokens", "tokens {:.0f}"),
    ("train/loss", "loss {:.4g}"),
    ("train/loss_per_token", "per token {:.3f}"),
    ("sft/epoch", "epoch {:.0f}"),
    ("staleness/mean", "stale {:.2f}"),
    *_HEALTH_KEYS,
    ("replies/truncated_fraction", "cut {:.2f}"),
    ("time/step", "{:.1f}s"),
)


_POLICY_KEYS = (
    ("train/datums", "datums {:.0f}"),
    ("train/trained_tokens", "tokens {:.0f}"),
    ("train/loss", "loss {:.4g}"),
    *_HEALTH_KEYS,
    ("time/step", "{:.1f}s"),
)


@dataclass(frozen=True)
class HealthLimits:
    """Past these a step's line (and the closing summary) warns: `stats.warn_mismatch_kl` and
    `stats.warn_clipped_fraction`; None never warns."""

    mismatch_kl: float | None = 0.01
    clipped_fraction: float | None = 0.2

    def warnings(self, metrics: Mapping[str, float]) -> list[str]:
        """What passed its limit in one step's metrics (each policy's own too)."""
        out = []
        for key, limit, what in (
            ("mismatch/kl", self.mismatch_kl, "sampler-trainer mismatch kl"),
            ("ratio/clipped_fraction", self.clipped_fraction, "clipped share"),
        ):
            if limit is None:
                continue
            for name, value in metrics.items():
                if (name == key or name.endswith(f"/{key}")) and value > limit:
                    who = name.removesuffix(key).rstrip("/")
                    out.append(f"{what} {value:.3g} > {limit:g}" + (f" ({who})" if who else ""))
        return out


@dataclass(frozen=True)
class MetricsSettings:
    """The metrics sink's: where metrics go besides `metrics.jsonl`, and how a step's line reads."""

    wandb: WandbConfig | None = None
    experiment: str = "platoon"  # the W&B project where `wandb.project` names none
    trial: str = ""  # the W&B run's name
    console: bool = True  # a line per step on stderr
    progress: bool = False  # the live display (it prints the step lines then)
    total_steps: int | None = None
    limits: HealthLimits = field(
        default_factory=HealthLimits
    )  # where a step's line warns of the learning signal's health


class MetricsSink(ComponentBase):
    """A component that writes every `TrainStepFinished` and `EvalFinished`."""

    name = "metrics"
    # With what the W&B eval table shows of eval episodes.
    subscribes = (
        TrainStepFinished,
        EvalFinished,
        EpisodeRequested,
        ModelCallFinished,
        EpisodeFinished,
        EpisodeGraded,
    )

    def __init__(
        self,
        run_dir: str | Path,
        settings: MetricsSettings | None = None,
        *,
        config: dict[str, Any] | None = None,
    ) -> None:
        """`config`: what the W&B run records as its config."""
        self.path = Path(run_dir) / "metrics.jsonl"
        self.settings = settings or MetricsSettings()
        self._config = config or {}
        self._run: Any = None
        self._events: Stream[Event] | None = None
        self._eval_episodes: dict[str, dict[str, Any]] = {}  # what the W&B eval table shows

    def on_attach(self, bus: Bus) -> None:
        self._events = bus.stream(self.subscribes, name=self.name).open()

    def _start_wandb(self) -> None:
        cfg = self.settings.wandb
        if cfg is None or cfg.mode == "disabled":
            return
        try:
            import wandb
        except ImportError:
            raise RuntimeError(
                "stats.wandb.mode is set but wandb is not installed: pip install wandb"
            ) from None
        self._run = wandb.init(
            project=cfg.project or self.settings.experiment,
            entity=cfg.entity,
            name=self.settings.trial,
            mode=cfg.mode,
            tags=list(cfg.tags),
            config=self._config,
            dir=str(self.path.parent),
        )
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY)

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._events is not None
        self._start_wandb()
        make_private_dir(self.path.parent)
        try:
            with open_private(self.path, "a") as file, self._events as events:
                async for event in events:
                    if self._run is not None:
                        self._track_eval(event)
                    # A step as users read it (`step_number`): train steps from 1, evals at
                    # the number of steps trained.
                    if isinstance(event, TrainStepFinished):
                        record = {"step": step_number(event.step), "time": time.time(), **event.metrics}
                        self._console_line(event)
                    elif isinstance(event, EvalFinished):
                        record = {
                            "step": step_number(event.step, "eval"),
                            "time": time.time(),
                            **event.metrics,
                        }
                        if self.settings.console:
                            shown = {
                                k: round(v, 4)
                                for k, v in event.metrics.items()
                                if "/" in k and k.count("/") == 1
                            }
                            print(
                                f"eval  step {event.step}: {json.dumps(shown)}", file=sys.stderr, flush=True
                            )
                    else:
                        continue
                    file.write(json.dumps(record) + "\n")
                    file.flush()
                    if self._run is not None:
                        logged: dict[str, Any] = {
                            k: v for k, v in record.items() if k not in ("step", "time")
                        }
                        logged[STEP_KEY] = record["step"]
                        if isinstance(event, EvalFinished):
                            logged["eval/table"] = self._eval_table(
                                event.step
                            )  # "eval/episodes" is the count
                        self._run.log(logged)
        finally:
            if self._run is not None:
                self._run.finish()

    def _track_eval(self, event: Event) -> None:
        """Gather what the eval table shows, for eval episodes only."""
        if isinstance(event, EpisodeRequested):
            if event.purpose == "eval":
                self._eval_episodes[event.episode_id] = {
                    "step": event.step,
                    "episode_id": event.episode_id,
                    "env": event.task.env,
                    "split": event.task.split,
                    "task_id": event.task.task_id,
                    "model_calls": 0,
                    "completion_tokens": 0,
                }
            return
        row = self._eval_episodes.get(getattr(event, "episode_id", ""))
        if row is None:
            return
        if isinstance(event, ModelCallFinished):
            row["model_calls"] += 1
            row["completion_tokens"] += len(event.completion_tokens)
        elif isinstance(event, EpisodeFinished):
            row.update(status=event.status, reason=event.reason, duration_s=event.duration_s)
            row["final_message"] = (event.final_message or "")[:_FINAL_MESSAGE_CHARS]
        elif isinstance(event, EpisodeGraded):
            row["reward"] = event.reward
            if event.reason and not row.get("reason"):
                row["reason"] = event.reason

    def _eval_table(self, step: int) -> Any:
        """The episodes of the eval at `step`, as a W&B table (and forgotten here)."""
        import wandb

        rows = [row for row in self._eval_episodes.values() if row["step"] == step]
        for row in rows:
            del self._eval_episodes[row["episode_id"]]
        rows.sort(key=lambda r: (r["env"], r["task_id"], r["episode_id"]))
        return wandb.Table(
            columns=list(EVAL_TABLE_COLUMNS), data=[[row.get(c) for c in EVAL_TABLE_COLUMNS] for row in rows]
        )

    def _console_line(self, event: TrainStepFinished) -> None:
        if self.settings.console:
            line = step_line(event.step, self.settings.total_steps, event.metrics, self.settings.limits)
            print(line, file=sys.stderr, flush=True)


def step_line(
    step: int, total_steps: int | None, metrics: dict[str, float], limits: HealthLimits | None = None
) -> str:
    """The one line a finished step (`step`: its index) leaves on the console; with `limits`,
    a warning where the learning signal's health passed one."""
    of = f"/{total_steps}" if total_steps else ""
    parts = [fmt.format(metrics[key]) for key, fmt in _CONSOLE_KEYS if _shown(key, metrics)]
    total, graded = metrics.get("episodes/total", 0), metrics.get("episodes/graded", 0)
    if graded < total:
        failed = sorted(
            (
                (int(v), k.removeprefix("episodes/failed/"))
                for k, v in metrics.items()
                if k.startswith("episodes/failed/")
            ),
            key=lambda item: (-item[0], item[1]),
        )
        why = (
            f" ({', '.join(f'{n} {reason}' for n, reason in failed if n)})"
            if any(n for n, _ in failed)
            else ""
        )
        parts.insert(0, f"graded {graded:.0f}/{total:.0f}{why}" + ("" if graded else ", reward n/a"))
    # Several policies (RFC 0001): each trainer's own figures, under its name.
    policies = [k.removesuffix("/policy/version") for k in metrics if k.endswith("/policy/version")]
    for policy in policies:
        own = [
            fmt.format(metrics[f"{policy}/{key}"])
            for key, fmt in _POLICY_KEYS
            if _shown(f"{policy}/{key}", metrics)
        ]
        if own:
            parts.append(f"[{policy}: {' '.join(own)}]")
    groups, constant = metrics.get("credit/groups", 0), metrics.get("credit/groups_removed_constant", 0)
    if constant:
        parts.append(
            "no group told its rollouts apart: nothing to learn"
            if constant == groups
            else f"{constant:.0f}/{groups:.0f} groups alike"
        )
    warnings = (limits or HealthLimits()).warnings(metrics)
    if warnings:
        parts.append("WARNING " + "; ".join(warnings))
    return f"step {step_number(step)}{of}  " + "  ".join(parts)


def _shown(key: str, metrics: Mapping[str, float]) -> bool:
    """Whether a step line shows `key`: when the step has it (a share of clipped or cut tokens
    only when it is not 0, the usual case for a loss that does not clip)."""
    if key not in metrics:
        return False
    return not (key.endswith(("clipped_fraction", "truncated_fraction")) and metrics[key] == 0)


def is_eval_row(row: Mapping[str, object]) -> bool:
    """A row of metrics.jsonl that an evaluation wrote (its metrics are all `eval/...`), not a step's."""
    keys = [k for k in row if k not in ("step", "time")]
    return bool(keys) and all(k.startswith("eval/") for k in keys)


def counted_from_zero(rows: Sequence[Mapping[str, object]]) -> bool:
    """Whether metrics.jsonl's rows count training steps from 0, as platoon 0.2 wrote them: a
    step's row at step 0, where the first is step 1 now (evaluations were already at the number
    of steps trained). Their training steps, plus 1, are the steps users read."""
    return any(row.get("step") == 0 and not is_eval_row(row) for row in rows)

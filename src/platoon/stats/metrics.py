"""Where step metrics go: `metrics.jsonl` in the run directory, a line on the console, and
Weights & Biases when `stats.wandb.mode` is `online` or `offline`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from platoon.bus import Bus, Stream
from platoon.bus.events import EvalFinished, Event, TrainStepFinished
from platoon.config.rundir import open_private

__all__ = ["MetricsSink"]

_CONSOLE_KEYS = (
    ("reward/mean", "reward {:.3f}"),
    ("reward/pass_rate", "pass {:.2f}"),
    ("train/datums", "datums {:.0f}"),
    ("train/trained_tokens", "tokens {:.0f}"),
    ("train/loss", "loss {:.4g}"),
    ("staleness/mean", "stale {:.2f}"),
    ("time/step", "{:.1f}s"),
)


class MetricsSink:
    """A component that writes every `TrainStepFinished` and `EvalFinished`."""

    name = "metrics"

    def __init__(
        self,
        run_dir: str | Path,
        *,
        wandb: Any = None,
        experiment: str = "platoon",
        trial: str = "",
        config: dict[str, Any] | None = None,
        console: bool = True,
        total_steps: int | None = None,
    ) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.console = console
        self.total_steps = total_steps
        self._wandb_cfg = wandb
        self._experiment = experiment
        self._trial = trial
        self._config = config or {}
        self._run: Any = None
        self._events: Stream[Event] | None = None

    def attach(self, bus: Bus) -> None:
        if self._events is None:
            self._events = bus.stream(Event, name=self.name).open()

    def _start_wandb(self) -> None:
        cfg = self._wandb_cfg
        if cfg is None or cfg.mode == "disabled":
            return
        try:
            import wandb
        except ImportError:
            raise RuntimeError(
                "stats.wandb.mode is set but wandb is not installed: pip install wandb"
            ) from None
        self._run = wandb.init(
            project=cfg.project or self._experiment,
            entity=cfg.entity,
            name=self._trial,
            mode=cfg.mode,
            tags=list(cfg.tags),
            config=self._config,
            dir=str(self.path.parent),
        )

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._events is not None
        self._start_wandb()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open_private(self.path, "a") as file, self._events as events:
                async for event in events:
                    if isinstance(event, TrainStepFinished):
                        record = {"step": event.step, "time": time.time(), **event.metrics}
                        self._console_line(event)
                    elif isinstance(event, EvalFinished):
                        record = {"step": event.step, "time": time.time(), **event.metrics}
                        if self.console:
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
                        self._run.log(
                            {k: v for k, v in record.items() if k not in ("step", "time")}, step=event.step
                        )
        finally:
            if self._run is not None:
                self._run.finish()

    def _console_line(self, event: TrainStepFinished) -> None:
        if not self.console:
            return
        of = f"/{self.total_steps}" if self.total_steps else ""
        parts = [fmt.format(event.metrics[key]) for key, fmt in _CONSOLE_KEYS if key in event.metrics]
        total, graded = event.metrics.get("episodes/total", 0), event.metrics.get("episodes/graded", 0)
        if graded < total:
            parts.insert(0, f"graded {graded:.0f}/{total:.0f}" + ("" if graded else ", reward n/a"))
        print(f"step {event.step + 1}{of}  " + "  ".join(parts), file=sys.stderr, flush=True)

"""Live progress of a training run on a terminal (rich): a bar per step with its ETA, the
episodes done and in flight, the rolling reward, and the last step's metrics in a small table.

A component on the bus like any other: it counts `EpisodeRequested` and `EpisodeGraded` of
training episodes and reads each `TrainStepFinished`. Each finished step also leaves its one
line above the live display, so the terminal keeps the run's history. Off a terminal (or with
`--quiet`) it is not used and `MetricsSink` prints the plain step lines.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import anyio

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import EpisodeGraded, EpisodeRequested, Event, TrainStepFinished
from platoon.stats.metrics import HealthLimits, step_line

__all__ = ["TrainProgress"]

_TABLE = (
    ("reward/mean", "reward", "{:.3f}"),
    ("reward/pass_rate", "pass", "{:.2f}"),
    ("train/datums", "datums", "{:.0f}"),
    ("train/trained_tokens", "tokens", "{:.0f}"),
    ("train/loss", "loss", "{:.3g}"),
    ("train/loss_per_token", "per token", "{:.3f}"),
    ("staleness/mean", "stale", "{:.2f}"),
    ("mismatch/max_abs", "mismatch", "{:.2g}"),
    ("mismatch/kl", "mismatch kl", "{:.2g}"),
    ("ratio/clipped_fraction", "clipped", "{:.2f}"),
    ("entropy/mean", "entropy", "{:.2f}"),
    ("replies/truncated_fraction", "cut", "{:.2f}"),
    ("time/rollout", "rollout s", "{:.1f}"),
    ("time/train", "train s", "{:.1f}"),
    ("time/step", "step s", "{:.1f}"),
)


class TrainProgress(ComponentBase):
    """The live display of a training run (see the module docstring)."""

    name = "progress"
    subscribes = (EpisodeRequested, EpisodeGraded, TrainStepFinished)

    def __init__(
        self,
        total_steps: int,
        *,
        start_step: int = 0,
        console: Any = None,
        limits: HealthLimits | None = None,
    ) -> None:
        from rich.console import Console

        self.total_steps = total_steps
        self.limits = limits or HealthLimits()
        self.console = console or Console(stderr=True)
        self.requested: collections.Counter[int] = collections.Counter()
        self.graded: collections.Counter[int] = collections.Counter()
        self.rewards: collections.deque[float] = collections.deque(maxlen=64)
        self.current = start_step
        self.started = time.monotonic()
        self.step_started = self.started
        self.last: dict[str, float] = {}
        self.step_times: list[float] = []
        self._events: Stream[Event] | None = None

    def on_attach(self, bus: Bus) -> None:
        self._events = bus.stream(self.subscribes, name=self.name).open()

    async def run(self, bus: Bus) -> None:
        from rich.live import Live

        self.attach(bus)
        assert self._events is not None
        with Live(self.render(), console=self.console, refresh_per_second=4, transient=True) as live:
            async with anyio.create_task_group() as tg:

                async def tick() -> None:  # the ETA and in-flight counts move between events
                    while True:
                        await anyio.sleep(0.5)
                        live.update(self.render())

                tg.start_soon(tick)
                with self._events as events:
                    async for event in events:
                        self.see(event, live)
                        live.update(self.render())

    def see(self, event: Event, live: Any = None) -> None:
        match event:
            case EpisodeRequested(purpose="train"):
                self.requested[event.step] += 1
            case EpisodeGraded(purpose="train"):
                self.graded[event.step] += 1
                if event.reward is not None:
                    self.rewards.append(event.reward)
            case TrainStepFinished():
                now = time.monotonic()
                self.step_times.append(now - self.step_started)
                self.step_started = now
                self.current = event.step + 1
                self.last = dict(event.metrics)
                if live is not None:
                    live.console.print(
                        step_line(event.step, self.total_steps, event.metrics, self.limits), highlight=False
                    )

    def render(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        step = min(self.current, max(self.total_steps - 1, 0))
        requested, graded = self.requested[step], self.graded[step]
        in_flight = max(requested - graded, 0)
        eta = ""
        if self.step_times:
            per_step = sum(self.step_times[-5:]) / len(self.step_times[-5:])
            left = max(self.total_steps - self.current, 0) * per_step
            eta = f"  ETA {_duration(left)}"
        rolling = (
            f"  reward {sum(self.rewards) / len(self.rewards):.3f} (last {len(self.rewards)})"
            if self.rewards
            else ""
        )
        head = Text(
            f"step {step + 1}/{self.total_steps}  episodes {graded}/{requested or '?'}, {in_flight} in flight"
            f"{rolling}{eta}  {_duration(time.monotonic() - self.started)}"
        )
        bar = ProgressBar(total=max(requested, 1), completed=graded, width=40)
        parts: list[Any] = [head, bar]
        # Several policies (RFC 0001): a row of each one's own figures under the run's.
        policies = [k.removesuffix("/policy/version") for k in self.last if k.endswith("/policy/version")]
        rows = [("run", self.last)] + [
            (name, {k.removeprefix(f"{name}/"): v for k, v in self.last.items() if k.startswith(f"{name}/")})
            for name in policies
        ]
        columns = [(key, label, fmt) for key, label, fmt in _TABLE if any(key in row for _, row in rows)]
        if columns:
            table = Table(
                box=None, padding=(0, 1), show_edge=False, title=f"step {self.current}", title_justify="left"
            )
            if policies:
                table.add_column("")
            for _, label, _ in columns:
                table.add_column(label, justify="right")
            for name, row in rows:
                cells = [fmt.format(row[key]) if key in row else "" for key, _, fmt in columns]
                table.add_row(*([name] if policies else []), *cells)
            parts.append(table)
        return Group(*parts)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds}s"

"""The few lines `platoon train` ends with: how the reward moved (and each policy's, with
several), and where the run is."""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from platoon.stats.metrics import HealthLimits, is_eval_row

__all__ = ["sft_summary", "sparkline", "train_summary"]

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 60) -> str:
    """A one-line curve of `values` (averaged into at most `width` columns)."""
    if not values:
        return ""
    if len(values) > width:
        size = len(values) / width  # > 1, so no column is empty
        values = [statistics.fmean(values[int(i * size) : int((i + 1) * size)]) for i in range(width)]
    low, high = min(values), max(values)
    span = high - low
    return "".join(_BARS[0 if span == 0 else round((v - low) / span * (len(_BARS) - 1))] for v in values)


def train_summary(run_dir: Path, seconds: float | None = None, limits: HealthLimits | None = None) -> str:
    """The end-of-training summary of the run in `run_dir`, from its `metrics.jsonl` (`limits`: `stats.warn_*`)."""
    rows = []
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill: the others still tell the story
    rewards = _series(rows, "reward/mean")
    lines = []
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    steps = [r for r in rows if not is_eval_row(r)]
    resumed = _resumed_after(run_dir)
    if resumed and len(steps) > resumed:  # the time is this session's: say which steps it trained
        lines.append(
            f"trained {len(steps)} steps: {len(steps) - resumed}{took}, resumed after step {resumed}"
        )
    else:
        lines.append(f"trained {len(steps)} step{'s' * (len(steps) != 1)}{took}")
    if rewards:
        lines.append(f"reward  {_span(rewards)}")
        lines.append(f"        {sparkline(rewards)}  {min(rewards):.2f}–{max(rewards):.2f}")
    else:
        lines.append("reward  no step was graded (see the step lines above)")
    constant = sum(r.get("credit/groups_removed_constant", 0) for r in steps)
    groups = sum(r.get("credit/groups", 0) for r in steps)
    if groups and constant == groups:
        lines.append(
            "signal  none: in every group all rollouts of a task got one reward, so every advantage "
            "was 0 and nothing trained. Raise group_size, shape the reward so that partial success "
            "scores in between, or start from a model that sometimes succeeds (or sample hotter)"
        )
    elif constant:
        lines.append(f"signal  {constant:.0f} of {groups:.0f} groups had one reward for all their rollouts")
    lines += _health_lines(steps, limits or HealthLimits())
    lines += _tree_lines(steps)
    for policy in _policies(rows):  # several policies: each one's own (RFC 0001)
        own = _series(rows, f"{policy}/reward/mean")
        parts = [f"reward {_span(own)}" if own else "no step graded its agents"]
        for key, shape in (("policy/version", "version {:g}"), ("kl/mean", "kl {:.4f}")):
            series = _series(rows, f"{policy}/{key}")
            if series:  # the last step's
                parts.append(shape.format(series[-1]))
        lines.append(f"policy  {policy}: {', '.join(parts)}")
    lines += _eval_lines(run_dir)
    lines.append(f"run     {run_dir}")
    if importlib.util.find_spec("platoon.visualization") is not None:
        lines.append(f"view    platoon view {run_dir}")
    else:
        lines.append(f"events  platoon events {run_dir}")
    return "\n".join(lines)


def _eval_lines(run_dir: Path) -> list[str]:
    """The held-out curve over the run's evaluations, and the first and last one in full."""
    lines: list[str] = []
    evals = sorted((run_dir / "evals").glob("step-*.json")) if (run_dir / "evals").is_dir() else []
    reports = {path: _report(path) for path in evals}
    curve = [
        (path, r["reward_mean"])
        for path, r in reports.items()
        if isinstance(r.get("reward_mean"), int | float)
    ]
    if len(curve) > 1:  # the held-out curve, as the reward's above
        (first, low), (last, high) = curve[0], curve[-1]
        lines.append(
            f"eval    {sparkline([v for _, v in curve])}  {low:.2f} at step {_step(first)} → {high:.2f} at step "
            f"{_step(last)}  ({len(curve)} evaluations)"
        )
    for path in evals[:1] + evals[-1:] if len(evals) > 1 else evals:
        report = reports[path]
        if not report:
            continue
        mean = report.get("reward_mean")
        passes = report.get("pass_at_k") or {}
        shown = f"reward {mean:.3f}" if isinstance(mean, int | float) else "reward n/a"
        if "1" in passes:
            shown += f", pass@1 {passes['1']:.3f}"
        by_policy = report.get("by_policy") or {}
        own_rewards = [
            f"{name} {row['own_reward_mean']:.3f}"
            for name, row in by_policy.items()
            if isinstance(row, dict) and isinstance(row.get("own_reward_mean"), int | float)
        ]
        if own_rewards:
            shown += "; own reward " + ", ".join(own_rewards)
        shown += _eval_tree(report)
        lines.append(f"eval    step {_step(path)}: {shown}")
    return lines


def _tree_lines(steps: list[dict]) -> list[str]:
    """What a recursive run's orchestration learned: how often the root delegated, and each
    depth's reward (a subagent's own, or the episode's it answers to), first steps to last."""
    delegated = _series(steps, "agents/delegated")
    if not delegated:
        return []
    parts = [f"delegated {_span(delegated)}"]
    depth = 0
    while series := _series(steps, f"credit/depth/{depth}/reward_mean"):
        n = min(3, len(series))
        parts.append(f"depth {depth} reward {sum(series[:n]) / n:.2f} → {sum(series[-n:]) / n:.2f}")
        depth += 1
    return [f"tree    {'; '.join(parts)}"]


def _eval_tree(report: dict) -> str:
    """An evaluation's model calls per episode (the turns an agent took, its subagents' too), and
    how many episodes delegated where a tree grew."""
    episodes = report.get("episodes")
    by_depth = report.get("by_depth") or {}
    if not isinstance(episodes, int | float) or not episodes or not isinstance(by_depth, dict):
        return ""
    rows = [row for row in by_depth.values() if isinstance(row, dict)]
    calls = sum(row.get("model_calls", 0) for row in rows)
    shown = f", {calls / episodes:.1f} model calls an episode"
    children = by_depth.get("1")
    if isinstance(children, dict) and children.get("agents"):
        shown += f" ({children['agents']:.0f} subagents in {episodes:.0f} episodes)"
    return shown


def _health_lines(steps: list[dict], limits: HealthLimits) -> list[str]:
    """The learning signal's health over the run (`platoon.train.health`): the sampler-trainer
    mismatch, the clipped share, the entropy and the replies cut, the steps that passed a
    limit, and the episodes the system failed, by cause (left out of every baseline)."""
    lines = []
    parts = []
    for key, shape in (
        ("mismatch/max_abs", "mismatch max |Δlogprob| {:.2g}"),
        ("mismatch/kl", "kl {:.2g}"),
        ("ratio/clipped_fraction", "clipped {:.2f}"),
        ("entropy/mean", "entropy {:.2f}"),
        ("replies/truncated_fraction", "cut by max_tokens {:.2f}"),
        ("train/grad_norm", "grad norm {:.3g}"),
    ):
        series = _series(steps, key)
        if series:
            parts.append(shape.format(max(series) if key.startswith(("mismatch", "ratio")) else series[-1]))
    if parts:
        lines.append(
            f"health  {', '.join(parts)}  (mismatch and clipped: the run's worst step; others: the last)"
        )
    warned = [(step.get("step"), limits.warnings(step)) for step in steps]
    warned = [(n, w) for n, w in warned if w]
    if warned:
        first, what = warned[0]
        lines.append(
            f"WARNING {len(warned)} step{'s' * (len(warned) != 1)} passed a health limit, first step "
            f"{first}: {'; '.join(what)} (stats.warn_mismatch_kl, stats.warn_clipped_fraction)"
        )
    failed: dict[str, float] = {}
    for step in steps:
        for key, value in step.items():
            if key.startswith("episodes/failed/") and isinstance(value, int | float) and value:
                kind = key.removeprefix("episodes/failed/")
                failed[kind] = failed.get(kind, 0) + value
    if failed:
        shown = ", ".join(f"{n:.0f} {kind}" for kind, n in sorted(failed.items(), key=lambda kv: -kv[1]))
        lines.append(f"failed  {shown}  (never graded: left out of their groups' baselines)")
    return lines


def _resumed_after(run_dir: Path) -> int:
    """The step a resumed run went on after (lock.json's `resumed_from_step`); 0 for a new run."""
    try:
        lock = json.loads((run_dir / "lock.json").read_text())
    except (OSError, ValueError):
        return 0
    step = lock.get("resumed_from_step") if isinstance(lock, dict) else None
    return step if isinstance(step, int) else 0


def sft_summary(run_dir: Path, seconds: float | None = None) -> str:
    """The end of `platoon sft`: how the loss per token moved in training and on the held-out
    episodes, and the checkpoint that `platoon train` starts from (`checkpoint.load_path`)."""
    rows = _rows(run_dir)
    steps = [r for r in rows if any(k.endswith("policy/version") for k in r)]  # not the held-out rows
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    lines = [f"trained {len(steps)} step{'s' * (len(steps) != 1)}{took}"]
    for prefix in ["", *(f"{p}/" for p in _policies(rows))]:
        losses = _series(steps, f"{prefix}train/loss_per_token")
        if losses:
            lines.append(f"loss    {prefix}{losses[0]:.3f} → {losses[-1]:.3f} per token  {sparkline(losses)}")
        heldout = _series(rows, f"{prefix}sft/heldout_loss")
        if heldout:
            lines.append(f"heldout {prefix}{' → '.join(f'{v:.3f}' for v in heldout)} per token, by epoch")
    checkpoints = sorted(run_dir.glob("checkpoints/*/checkpoints.jsonl")) or [run_dir / "checkpoints.jsonl"]
    for path in checkpoints:
        last = _rows_of(path)[-1:] if path.exists() else []
        if last and isinstance(last[0].get("state_path"), str):
            who = f" ({path.parent.name})" if path.parent != run_dir else ""
            lines.append(f"state   {last[0]['state_path']}{who}")
    lines.append(f"run     {run_dir}")
    lines.append(f"then    platoon train CONFIG checkpoint.load_path={run_dir}")
    if importlib.util.find_spec("platoon.visualization") is not None:
        lines.append(f"view    platoon view {run_dir}")
    return "\n".join(lines)


def _rows(run_dir: Path) -> list[dict]:
    return _rows_of(run_dir / "metrics.jsonl")


def _rows_of(path: Path) -> list[dict]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill: the others still tell the story
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _report(path: Path) -> dict:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def _step(path: Path) -> int:
    return int(path.stem.removeprefix("step-"))


def _series(rows: list[dict], key: str) -> list[float]:
    """The values of one metric over the steps that have it."""
    return [r[key] for r in rows if isinstance(r.get(key), int | float)]


def _span(values: list[float]) -> str:
    """How a reward moved: the means of the first and last (up to) 3 steps, first → last."""
    n = min(3, len(values))
    first, last = sum(values[:n]) / n, sum(values[-n:]) / n
    steps = f"{n} step{'s' * (n != 1)}"
    return f"first {steps} {first:.3f}, last {steps} {last:.3f}  ({values[0]:.2f} → {values[-1]:.2f})"


def _policies(rows: list[dict]) -> list[str]:
    """The trained policies of a run with several, in the order their metrics name them: each
    reports `<policy>/policy/version` every step (a run of one reports `policy/version`)."""
    found: dict[str, None] = {}
    for row in rows:
        for key in row:
            policy, _, rest = key.partition("/")
            if rest == "policy/version":
                found[policy] = None
    return list(found)

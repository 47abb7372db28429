"""The viewer in a real browser: headless Chromium (Debian's `chromium`) driven by Playwright.

A person's path through a run (runs, run, step, episode, model call) is clicked through, and what
the page shows is checked against the event log: rewards, token counts, tokens with their
advantages, tool results. Screenshots of each page go to the test's tmp dir.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from platoon.bus import read_events
from platoon.bus.events import (
    BatchReady,
    DatumsScored,
    EpisodeGraded,
    ModelCallFinished,
    ToolReturned,
    step_number,
)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="needs Debian's chromium (apt-get install chromium)"
    ),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install 'platoon[dev]')")


@pytest.fixture
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


class Viewer:
    """`platoon view` in its own process, as a user starts it."""

    def __init__(self, *run_dirs: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "platoon", "view", *map(str, run_dirs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.process.stdout is not None
        lines = []
        for line in self.process.stdout:  # after indexing, it prints the address to open, with its key
            lines.append(line)
            found = re.search(r"http://127\.0\.0\.1:\d+/\?key=\S+", line)
            if found:
                self.url = found.group(0)
                return
        self.close()
        raise AssertionError(f"platoon view printed no URL: {''.join(lines)!r}")

    def close(self) -> None:
        self.process.terminate()
        self.process.communicate(timeout=30)  # waits, and closes its pipe


@pytest.fixture
def viewer():
    started = []

    def start(*run_dirs):
        started.append(Viewer(*run_dirs))
        return started[-1]

    yield start
    for v in started:
        v.close()


def _log(run_dir):
    events = list(read_events(run_dir))
    graded = {e.episode_id: e for e in events if isinstance(e, EpisodeGraded)}
    calls, tools = defaultdict(list), defaultdict(list)
    for e in events:
        if isinstance(e, ModelCallFinished):
            calls[e.episode_id].append(e)
        elif isinstance(e, ToolReturned):
            tools[e.episode_id].append(e.output)
    datums = [(step_number(e.step), d) for e in events if isinstance(e, BatchReady) for d in e.datums]
    batches = {e.step: e for e in events if isinstance(e, BatchReady)}
    scores = {  # the trainer's logprobs of each datum, by (step, episode)
        (step_number(e.step), d.episode_id): row
        for e in events
        if isinstance(e, DatumsScored)
        for d, row in zip(batches[e.step].datums, e.logprobs, strict=True)
    }
    return graded, calls, tools, datums, scores


def _shown(value: float) -> str:
    """How the page writes a reward."""
    return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def _walk(page, log, shots: Path, name: str) -> None:
    """runs -> run -> step 2 -> the best episode -> its first model call, checking each page.
    Steps are as the terminal said them: train steps 1, 2, 3."""
    graded, calls, tools, datums, scores = log
    page.wait_for_selector("[data-testid=runs]")
    assert "quickstart" in page.inner_text("[data-testid=runs]")
    page.screenshot(path=shots / f"{name}-1-runs.png", full_page=True)

    page.click("[data-run] a")
    page.wait_for_selector("[data-testid=steps]")
    assert page.locator("[data-plot=reward] svg").count() == 1
    for health in ("sampler-trainer mismatch", "importance ratio", "entropy (nats a token)", "grad norm"):
        assert page.locator(f"[data-plot='{health}'] svg").count() == 1, health
    steps = page.locator("[data-testid=steps] tbody tr").evaluate_all("els => els.map(e => e.dataset.step)")
    assert steps == ["1", "2", "3"]
    page.screenshot(path=shots / f"{name}-2-run.png", full_page=True)

    page.click("[data-testid=steps] tr[data-step='2']")
    page.wait_for_selector("[data-testid=episodes]")
    shown = [
        float(x)
        for x in page.locator("[data-testid=episodes] td[data-reward]").evaluate_all(
            "els => els.map(e => e.dataset.reward)"
        )
    ]
    assert shown == sorted((e.reward for e in graded.values() if step_number(e.step) == 2), reverse=True)
    page.screenshot(path=shots / f"{name}-3-step.png", full_page=True)

    page.click("[data-testid=episodes] tbody tr:first-child td:first-child")
    page.wait_for_selector("[data-testid=timeline] [data-call]")
    episode_id = re.search(r"id=([0-9a-f]+)", page.url).group(1)
    assert page.inner_text("[data-testid=reward]") == _shown(graded[episode_id].reward)
    assert page.locator("[data-testid=tool-output]").all_inner_texts() == tools[episode_id]
    counts = page.locator("[data-testid=call-tokens]").all_inner_texts()
    assert counts == [
        f"{len(c.prompt_tokens)} prompt + {len(c.completion_tokens)} sampled tokens"
        for c in calls[episode_id]
    ]
    page.screenshot(path=shots / f"{name}-4-episode.png", full_page=True)

    call = calls[episode_id][0]
    page.click(f"[data-call='{call.call_id}'] .head")
    page.wait_for_selector("[data-testid=tokens] .tok")
    box = page.locator("[data-testid=tokens]")
    assert int(box.get_attribute("data-token-count")) == len(call.completion_tokens)
    tokens = page.locator("[data-testid=tokens] .tok").evaluate_all(
        "els => els.map(e => [Number(e.dataset.id), Number(e.dataset.advantage), Number(e.dataset.weight),"
        " Number(e.dataset.trainedAdvantage)])"
    )
    ((step, datum),) = [
        (step, d)
        for step, d in datums
        if d.agent_id == call.agent_id and d.model_input[: len(call.prompt_tokens)] == call.prompt_tokens
    ]
    start = len(call.prompt_tokens) - 1
    span = slice(start, start + len(call.completion_tokens))
    assert [t[0] for t in tokens] == call.completion_tokens
    assert [t[3] for t in tokens] == pytest.approx(datum.advantages[span])  # what the loss used
    assert [t[2] for t in tokens] == datum.weights[span]
    # Shown as the rollout's advantage (the quickstart: the mean baseline), the token-mean
    # normalisation said apart from it.
    group = [e.reward for e in graded.values() if e.group_id == graded[episode_id].group_id]
    advantage = graded[episode_id].reward - sum(group) / len(group)
    batch = sum(d.num_trained_tokens for s, d in datums if s == step)
    trained = [t for t in tokens if t[2]]
    assert trained and all(t[1] == pytest.approx(advantage, abs=1e-9) for t in trained)
    shown = f"{batch:,}".replace(",", " ")  # the page writes 1 439
    assert f"÷ {shown} (loss_normalization token_mean" in page.inner_text("[data-testid=normalization]")
    assert int(box.get_attribute("data-trained")) == sum(datum.weights[span])
    page.click("button:has-text('advantage')")  # shade by advantage instead of logprob
    page.screenshot(path=shots / f"{name}-5-call.png", full_page=True)
    # The trainer's own logprob of each trained token (DatumsScored), against the sampler's: the
    # scripted sampler says -0.25 for every token, the tiny model far less, so every one differs.
    page.click("button:has-text('mismatch')")
    shades = page.locator("[data-testid=tokens] .tok").evaluate_all(
        "els => els.map(e => [e.dataset.mismatch, e.style.backgroundColor])"
    )
    scored = scores[(step, call.episode_id)]
    expected = [scored[i] - lp for i, lp in zip(range(span.start, span.stop), call.logprobs, strict=True)]
    shown = [float(m) if m else None for m, _ in shades]
    assert [m for m, w in zip(shown, datum.weights[span], strict=True) if w] == pytest.approx(
        [e for e, w in zip(expected, datum.weights[span], strict=True) if w]
    )
    assert all(color not in ("", "transparent", "rgba(0, 0, 0, 0)") for (m, color) in shades if m)
    worst = max(range(len(shown)), key=lambda i: abs(shown[i] or 0))
    assert f"at token {worst} " in page.inner_text("[data-testid=mismatch]")
    page.screenshot(path=shots / f"{name}-5-call-mismatch.png", full_page=True)
    page.click("button:has-text('entropy')")
    assert "more surprising" in page.inner_text("[data-testid=tokens]")


@pytest.mark.slow
def test_click_through_a_run_and_see_what_the_log_holds(browser, viewer, quickstart_run, tmp_path):
    server = viewer(quickstart_run)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(server.url)
    _walk(page, _log(quickstart_run), tmp_path, "live")
    page.click("text=group's 4 episodes")
    page.wait_for_selector("[data-testid=group] .card")
    assert page.locator("[data-testid=group] .card").count() == 4
    page.screenshot(path=tmp_path / "live-6-group.png", full_page=True)
    assert errors == []
    assert len(list(tmp_path.glob("live-*.png"))) == 7


@pytest.mark.slow
def test_a_run_still_writing_updates_in_the_open_page(browser, viewer, quickstart_run, tmp_path):
    data = (quickstart_run / "events.msgpack").read_bytes()
    live = tmp_path / "quickstart" / "live"
    live.mkdir(parents=True)
    for name in ("config.yaml", "lock.json"):
        shutil.copy(quickstart_run / name, live / name)
    # Stop mid-way through the second step's episodes.
    cut = data.index(b"step-000001") if b"step-000001" in data else len(data) // 2
    (live / "events.msgpack").write_bytes(data[:cut])
    server = viewer(live)
    page = browser.new_page()
    # The rest of the log lands at the worst moment: after the page drew its data, just as its
    # first check for changes goes out. Each check says how many rows the page showed then.
    page.add_init_script(
        "const fetched = window.fetch; window.fetch = (url, options = {}) => {"
        " const rows = document.querySelectorAll('[data-testid=steps] tbody tr').length;"
        " return fetched(url, { ...options, headers: { 'x-rows-shown': String(rows) } }); };"
    )
    shown = []

    def on_poll(route):
        rows = int(route.request.headers.get("x-rows-shown", "0"))
        if rows and not shown:
            shown.append(rows)
            with (live / "events.msgpack").open("ab") as file:
                file.write(data[cut:])
        route.continue_()

    page.route("**/api/poll?*", on_poll)
    page.goto(server.url + "#/run?run=quickstart/live")
    page.wait_for_function(
        "document.querySelectorAll('[data-testid=steps] tbody tr').length === 3", timeout=30_000
    )
    assert 0 < shown[0] < 3  # the partial run was on the page when the rest was written
    page.screenshot(path=tmp_path / "updated.png", full_page=True)


@pytest.mark.slow
def test_the_export_opens_from_disk(browser, quickstart_run, tmp_path):
    from platoon.cli import main

    out = tmp_path / "export"
    assert main(["view", str(quickstart_run), "--export", str(out)]) == 0
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto((out / "index.html").as_uri())
    _walk(page, _log(quickstart_run), tmp_path, "export")
    assert errors == []


def _metrics_run(run_dir: Path, rows: list[dict]) -> Path:
    """A run directory with nothing but its metrics.jsonl (what the plots read)."""
    import json

    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_dir


def _ticks(page, plot: str) -> list[str]:
    return page.locator(f"[data-plot='{plot}'] text.ytick").evaluate_all("els => els.map(e => e.textContent)")


@pytest.mark.slow
def test_plot_axes_read_plainly_and_curves_smooth_on_request(browser, viewer, tmp_path):
    # A loss about 0 (what the tiny model's runs log), and counts that stay at 0.
    losses = [-0.0068, -0.0002, 2e-10, -1e-4, 3e-4, -5e-5]
    rewards = [0.2, 0.6, 0.1, 0.7, 0.3, 0.9]
    rows = [
        {
            "step": step,
            "reward/mean": reward,
            "train/loss": loss,
            "train/datums": 0,
            "staleness/mean": 0.0,
            "staleness/max": 0.0,
            "time/step": 1.5,
        }
        for step, (reward, loss) in enumerate(zip(rewards, losses, strict=True), start=1)
    ]
    run = _metrics_run(tmp_path / "runs" / "tiny" / "flat", rows)
    server = viewer(run)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(server.url + "#/run?run=tiny/flat")
    page.wait_for_selector("[data-plot=loss] svg")
    loss = _ticks(page, "loss")
    assert len(loss) >= 3 and len(set(loss)) == len(loss), loss  # no "-0, -0"
    assert "-0" not in loss and not any(re.fullmatch(r"-0(\.0*)?", t) for t in loss), loss
    for plot in ("datums", "staleness", "step time (s)"):
        ticks = _ticks(page, plot)
        assert ticks and not any(t.startswith("-") for t in ticks), (plot, ticks)  # counts: 0 and up
        assert ticks[0] == "0" or plot == "step time (s)", (plot, ticks)  # all 0: the axis starts there
    page.screenshot(path=tmp_path / "axes.png", full_page=True)

    # Off by default; 0.9 draws the smoothed curve (debiased: it starts at the first value).
    assert page.locator("[data-plot=reward] polyline[data-smoothed]").count() == 0
    page.select_option("[data-testid=smoothing]", "0.9")
    line = page.locator("[data-plot=reward] polyline[data-smoothed]")
    smoothed, last = [], 0.0
    for i, reward in enumerate(rewards, start=1):
        last = 0.9 * last + 0.1 * reward
        smoothed.append(last / (1 - 0.9**i))
    assert [float(v) for v in json.loads(line.get_attribute("data-values"))] == pytest.approx(smoothed)
    assert smoothed[0] == pytest.approx(rewards[0])
    page.reload()  # the choice is kept
    page.wait_for_selector("[data-plot=reward] polyline[data-smoothed]")
    assert page.locator("[data-testid=smoothing]").input_value() == "0.9"
    page.screenshot(path=tmp_path / "smoothed.png", full_page=True)


@pytest.mark.slow
def test_compare_names_runs_by_experiment_and_trial_and_plots_each_policys_loss(browser, viewer, tmp_path):
    runs = tmp_path / "runs"
    one = [
        {"step": s, "reward/mean": 0.1 * s, "train/loss": -0.01 * s, "time/step": 1.0 + s} for s in (1, 2, 3)
    ]
    several = [
        {
            "step": s,
            "reward/mean": 0.2 * s,
            **{f"{p}/policy/version": float(s) for p in ("planner", "executor")},
            **{f"{p}/train/loss": -0.02 * s for p in ("planner", "executor")},
            **{f"{p}/time/step": 2.0 * s for p in ("planner", "executor")},
        }
        for s in (1, 2, 3)
    ]
    _metrics_run(runs / "duel" / "cpu", one)
    _metrics_run(runs / "planner-executor" / "cpu", several)
    server = viewer(runs / "duel" / "cpu", runs / "planner-executor" / "cpu")
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(server.url)
    page.wait_for_selector("[data-testid=runs]")
    ids = page.locator("[data-run]").evaluate_all("els => els.map(e => e.dataset.run)")
    assert ids == ["duel/cpu", "planner-executor/cpu"]  # not "cpu" and "cpu~2"
    for box in page.locator("[data-run] input[type=checkbox]").all():
        box.check()
    page.click("text=compare selected")
    page.wait_for_selector("[data-plot='train/loss'] svg")
    for metric in ("train/loss", "time/step"):
        series = page.locator(f"[data-plot='{metric}'] polyline").evaluate_all(
            "els => els.map(e => e.dataset.series)"
        )
        assert series == ["duel/cpu", "planner-executor/cpu · executor", "planner-executor/cpu · planner"]
    page.screenshot(path=tmp_path / "compare.png", full_page=True)

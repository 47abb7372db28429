"""The viewer in a real browser: headless Chromium (Debian's `chromium`) driven by Playwright.

A person's path through a run (runs, run, step, episode, model call) is clicked through, and what
the page shows is checked against the event log: rewards, token counts, tokens with their
advantages, tool results. Screenshots of each page go to the test's tmp dir.
"""

import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from platoon.bus import read_events
from platoon.bus.events import BatchReady, EpisodeGraded, ModelCallFinished, ToolReturned

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
        for line in self.process.stdout:  # after indexing, it prints the address to open
            lines.append(line)
            found = re.search(r"http://127\.0\.0\.1:\d+/", line)
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
    datums = [d for e in events if isinstance(e, BatchReady) for d in e.datums]
    return graded, calls, tools, datums


def _shown(value: float) -> str:
    """How the page writes a reward."""
    return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def _walk(page, log, shots: Path, name: str) -> None:
    """runs -> run -> step 2 -> the best episode -> its first model call, checking each page."""
    graded, calls, tools, datums = log
    page.wait_for_selector("[data-testid=runs]")
    assert "quickstart" in page.inner_text("[data-testid=runs]")
    page.screenshot(path=shots / f"{name}-1-runs.png", full_page=True)

    page.click("[data-run] a")
    page.wait_for_selector("[data-testid=steps]")
    assert page.locator("[data-plot=reward] svg").count() == 1
    assert page.locator("[data-testid=steps] tbody tr").count() == 3
    page.screenshot(path=shots / f"{name}-2-run.png", full_page=True)

    page.click("[data-testid=steps] tr[data-step='2']")
    page.wait_for_selector("[data-testid=episodes]")
    shown = [
        float(x)
        for x in page.locator("[data-testid=episodes] td[data-reward]").evaluate_all(
            "els => els.map(e => e.dataset.reward)"
        )
    ]
    assert shown == sorted((e.reward for e in graded.values() if e.step == 2), reverse=True)
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
        "els => els.map(e => [Number(e.dataset.id), Number(e.dataset.advantage), Number(e.dataset.weight)])"
    )
    (datum,) = [
        d
        for d in datums
        if d.agent_id == call.agent_id and d.model_input[: len(call.prompt_tokens)] == call.prompt_tokens
    ]
    start = len(call.prompt_tokens) - 1
    span = slice(start, start + len(call.completion_tokens))
    assert [t[0] for t in tokens] == call.completion_tokens
    assert [t[1] for t in tokens] == pytest.approx(datum.advantages[span])
    assert [t[2] for t in tokens] == datum.weights[span]
    assert int(box.get_attribute("data-trained")) == sum(datum.weights[span])
    page.click("button:has-text('advantage')")  # shade by advantage instead of logprob
    page.screenshot(path=shots / f"{name}-5-call.png", full_page=True)


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
    assert len(list(tmp_path.glob("live-*.png"))) == 6


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
    page.goto(server.url + "#/run?run=live")
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

"""`platoon harness list` and `platoon harness show`: names, kinds, options and providers."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from platoon.cli import main

SPEC = Path(__file__).resolve().parents[1] / "harness" / "agents" / "openai_mcp_agent.toml"


@pytest.fixture
def installed_harness(tmp_path, monkeypatch):
    """A distribution `acme-agents` 1.2.3 whose entry point provides the harness `acme`."""
    (tmp_path / "acme_agents.py").write_text(
        'async def acme(ctx):\n    """Acme\'s agent, from an installed package."""\n'
    )
    info = tmp_path / "acme_agents-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-agents\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text("[platoon.harnesses]\nacme = acme_agents:acme\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "acme"


def lines(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


@pytest.mark.slow
def test_list_shows_each_harness_with_its_kind_and_provider(capsys, installed_harness):
    assert main(["harness", "list"]) == 0
    rows = {line.split()[0]: line.split() for line in lines(capsys)}
    assert rows["NAME"][:3] == ["NAME", "KIND", "PROVIDED"]
    assert rows["platoon-react"][1:3] == ["function", "platoon"]
    assert rows["platoon-codeact"][1:3] == ["function", "platoon"]
    assert rows["acme"][1:4] == ["function", "acme-agents", "1.2.3"]
    assert " ".join(rows["acme"][4:]) == "Acme's agent, from an installed package."


def test_show_a_builtin(capsys):
    assert main(["harness", "show", "platoon-react"]) == 0
    out = lines(capsys)
    assert out[0] == "platoon-react (function harness)"
    assert out[1].split()[:3] == ["provided", "by:", "platoon"]
    assert out[2].split() == ["defined", "in:", "platoon.harness.builtin.react:react"]
    options = {line.split()[0]: line for line in out[out.index("options (harness_options):") + 1 :]}
    assert options["max_tool_output_chars"].split()[:5] == [
        "max_tool_output_chars",
        "int",
        ">=",
        "1",
        "default",
    ]
    assert "default true" in options["stop_on_text"]
    assert "default none" in options["system_prompt"]


def test_show_a_spec(capsys):
    assert main(["harness", "show", str(SPEC)]) == 0
    out = lines(capsys)
    assert out[:3] == ["test-openai-mcp (spec harness)", "  provided by: -", f"  defined in:  {SPEC}"]
    assert "  An agent script using the openai client (model) and the mcp client (tools)." in out
    options = {line.split()[0]: line for line in out[out.index("options (harness_options):") + 1 :]}
    assert options["max_turns"].split()[:7] == ["max_turns", "int", ">=", "1", "<=", "100", "default"]
    assert options["max_turns"].endswith("model calls before the agent gives up (exit code 3)")
    assert (
        "one of 'platoon-policy', 'policy'" in options["model"]
        and "default 'platoon-policy'" in options["model"]
    )


def test_show_an_installed_harness(capsys, installed_harness):
    assert main(["harness", "show", installed_harness]) == 0
    out = lines(capsys)
    assert out[:3] == [
        "acme (function harness)",
        "  provided by: acme-agents 1.2.3",
        "  defined in:  acme_agents:acme",
    ]
    assert out[-1] == "options: none"


def test_an_unknown_harness_is_a_one_line_error(capsys):
    assert main(["harness", "show", "no-such-agent"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("platoon: error: unknown harness 'no-such-agent'") and "(known: " in err[0]
    assert len(err) == 1
    assert main(["harness", "show", "codx"]) == 1
    assert "unknown harness 'codx'; did you mean 'codex'? (known: " in capsys.readouterr().err


def test_install_builds_a_specs_toolchain_once_and_says_so(tmp_path, monkeypatch, capsys):
    """`platoon harness install` runs a spec's install command into the site cache, once."""
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    spec = tmp_path / "builder.toml"
    spec.write_text(
        'name = "builder"\nruns_in = "host"\ncommand = ["true"]\n'
        'install = ["{python}", "-c", "open(\\"{cache_dir}/built\\", \\"a\\").write(\\"x\\")"]\n'
    )
    assert main(["harness", "install", str(spec), "platoon-react"]) == 0
    assert main(["harness", "install", str(spec)]) == 0
    out = lines(capsys)
    assert out[0] == "platoon-react: nothing to build (a function harness)"
    assert out[1].startswith("builder: ready (") and out[2].startswith("builder: ready (")
    [built] = list((tmp_path / "cache").rglob("built"))
    assert built.read_text() == "x"  # the second install found it done


def test_install_of_an_unknown_harness_is_a_one_line_error(capsys):
    assert main(["harness", "install", "nope"]) == 1
    [err] = capsys.readouterr().err.splitlines()
    assert err.startswith("platoon: error: unknown harness 'nope'")


def test_install_runs_a_function_harness_s_own_install(capsys):
    """A function harness registered with `install=` (as `verifiers` builds its worker's venv)
    has it run by `platoon harness install`; one without says there is nothing to build."""
    from platoon.harness import AgentContext
    from platoon.harness.registry import harness

    built = []

    async def install() -> None:
        built.append("venv")

    @harness("test-installs", install=install)
    async def installs(ctx: AgentContext) -> None:
        return None

    assert main(["harness", "install", "test-installs"]) == 0
    assert built == ["venv"] and lines(capsys)[0].startswith("test-installs: ready (")


def test_install_builds_at_once_and_a_failure_stops_no_other(tmp_path, monkeypatch, capsys):
    """The named harnesses build side by side: each waits for the other to have started, which
    only builds run at once can do. A failed one is named and the others still finish."""
    import threading

    from platoon.harness import AgentContext
    from platoon.harness.registry import harness

    started = threading.Barrier(2, timeout=30)
    built = []

    def install_of(name: str, fails: bool = False):
        async def install() -> None:
            await anyio.to_thread.run_sync(started.wait)  # broken (an error) when built one by one
            if fails:
                raise ValueError(f"harness {name!r}: its toolchain did not build: exit 1")
            built.append(name)

        return install

    for name, fails in (("test-side-a", False), ("test-side-b", True)):

        @harness(name, install=install_of(name, fails))
        async def side(ctx: AgentContext) -> None:
            return None

    assert main(["harness", "install", "test-side-a", "test-side-b"]) == 1
    out, err = capsys.readouterr()
    assert built == ["test-side-a"] and out.startswith("test-side-a: ready (")
    assert err.splitlines() == ["platoon: error: harness 'test-side-b': its toolchain did not build: exit 1"]

import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from platoon import plugins
from platoon.bus import Bus, run_components
from platoon.bus.events import RunFinished, TrainStepFinished

SAMPLE = Path(__file__).parent / "plugins" / "sample_plugin"


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    """Install the sample plugin distribution into a directory on sys.path, as pip would."""
    target = tmp_path_factory.mktemp("site")
    # Built from a copy: setuptools writes build/ beside the sources, and another xdist worker
    # may be building the same plugin at the same time.
    source = shutil.copytree(SAMPLE, tmp_path_factory.mktemp("plugin") / SAMPLE.name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
    )
    sys.path.insert(0, str(target))
    yield target
    sys.path.remove(str(target))
    for name in list(sys.modules):
        if name.startswith("platoon_sample_plugin"):
            del sys.modules[name]


@pytest.mark.slow
def test_entry_points_are_listed_without_importing(installed_plugin):
    for name in [n for n in sys.modules if n.startswith("platoon_sample_plugin")]:
        del sys.modules[name]  # a test of the module before this one loaded it
    found = plugins.available("event_handlers")
    assert {"sample-counter", "sample-recorder"} <= set(found)
    assert "platoon_sample_plugin" not in sys.modules


@pytest.mark.anyio
async def test_installed_handler_plugin_receives_the_events_it_declares(installed_plugin):
    counter = plugins.plugin_component("sample-counter")
    recorder = plugins.plugin_component("sample-recorder", options={"prefix": "x"})
    async with Bus() as bus:
        await run_components(bus, [counter, recorder])
        await bus.publish(TrainStepFinished(step=1, metrics={}))
        await bus.publish(RunFinished(status="completed"))
        await anyio.lowlevel.checkpoint()
    import platoon_sample_plugin

    assert platoon_sample_plugin.seen[-1] == TrainStepFinished(step=1, metrics={})
    assert recorder.events == [RunFinished(status="completed")]


def test_unknown_names_and_refs_are_clear_errors():
    with pytest.raises(plugins.PluginError, match="unknown event handler 'nope'"):
        plugins.load("event_handlers", "nope")
    with pytest.raises(plugins.PluginError, match="cannot import 'no_such_module'"):
        plugins.import_ref("no_such_module:x")
    with pytest.raises(plugins.PluginError, match="unknown name 'missing'"):
        plugins.import_ref("platoon.plugins:missing")
    with pytest.raises(plugins.PluginError, match="not a reference"):
        plugins.import_ref("platoon.plugins")


def test_handler_ref_with_event_names():
    component = plugins.plugin_component("platoon.plugins:available", event_names=["RunFinished"])
    assert component.types == (RunFinished,)
    with pytest.raises(plugins.PluginError, match="unknown event type 'Nope'"):
        plugins.plugin_component("platoon.plugins:available", event_names=["Nope"])

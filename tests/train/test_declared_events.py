"""A training run publishes only what its components declare.

`platoon graph` draws a run from the components' declarations (`publishes`); this runs a short
training run of a tiny model on the embedded backend, with an eval, and checks that every event
type its log holds (the event log takes every event published on the bus) is declared by a
component of that run, and that every component of the run declares what it takes and publishes.
"""

import anyio
import pytest
from learnable import learn_config

from platoon.api import train
from platoon.bus import read_events
from platoon.bus.graph import event_graph
from platoon.cli.graph import run_components
from platoon.config import validate_config

pytestmark = pytest.mark.torch


def test_every_event_a_training_run_publishes_is_declared(site, tiny_model):
    import learnable  # noqa: F401 - registers the harness

    raw = learn_config(tiny_model, steps=2, batch_size=2)
    raw["train"]["workflow_config"]["group_size"] = 2
    raw["eval"] = {"every": 1, "max_tasks": 2}
    config = validate_config(raw)
    run_dir = site / "run"
    anyio.run(lambda: train(config, run_dir=run_dir, console=False))

    published = {type(event) for event in read_events(run_dir)}
    graph = event_graph(run_components(config, "train"))
    declared = {t for node in graph.nodes for t in (node.publishes or ())}
    assert not graph.undeclared
    undeclared = published - declared
    assert not undeclared, f"published but declared by no component: {sorted(t.__name__ for t in undeclared)}"
    # The run did what the graph says a training run does, eval included.
    names = {t.__name__ for t in published}
    assert {"ModelCallFinished", "EpisodeGraded", "BatchReady", "PolicyUpdated", "EvalFinished"} <= names

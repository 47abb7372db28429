import contextlib
import gc
import importlib
import importlib.util
import os
import pkgutil
import sys

import coverage
import pytest

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
# One torch thread per process: the xdist workers (one per core) and the `platoon` processes the
# tests start do not oversubscribe the cores, and a matrix product sums in the same order
# whatever machine runs it (set before anything imports torch; children inherit it).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# And the same kernels on every x86-64 machine: MKL's AVX2 branch in its strict reproducible mode
# (without a branch, MKL picks kernels by CPU and by the memory alignment of the operands, so a
# learning curve changed with the machine and with what ran before it in the process), and
# torch's own AVX2 kernels, not AVX-512's (its reductions sum in another order). Measured on an
# AVX-512 machine: no slower than MKL's own choice; MKL's COMPATIBLE branch would be 2.3x slower.
os.environ.setdefault("MKL_CBWR", "AVX2,STRICT")
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
# The suite starts hundreds of interpreters: let them (and pytest's rewritten test modules) keep
# compiled bytecode, even where the machine's environment says not to (a fresh clone has none).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import anyio  # noqa: E402 - after the environment above, which torch reads on import

# pytest rewrites the assertions of its plugins' packages (anyio, hypothesis) as they are first
# imported, and anyio imports its submodules on first use, deep in a test. If a garbage collection
# runs while such a module is parsed, and a finalizer in it warns (an error here), CPython 3.11.7
# fails the parse with "SystemError: AST constructor recursion depth mismatch"
# (python/cpython#106905). So they are all imported now, with the collector off.
gc.disable()
try:
    for _module in pkgutil.walk_packages(anyio.__path__, "anyio."):
        if not _module.name.startswith("anyio.pytest_plugin"):
            with contextlib.suppress(ImportError):
                importlib.import_module(_module.name)
    with contextlib.suppress(ImportError):
        import hypothesis  # noqa: F401 - its pytest plugin imports it at the end of the session
finally:
    gc.enable()

# The openreward SDK's loggers keep the `sys.stdout` of the moment its modules are imported. First
# imported inside a test that captures output (an in-process `platoon train` under capsys), they
# would keep that test's stream, which pytest closes after it, and a later test whose environment
# logs a tool's error would fail with "I/O operation on closed file". Imported now, they keep the
# session's stream. (platoon.envs quiets the SDK and defers its model clients first.)
with contextlib.suppress(ImportError):
    import platoon.envs._sdk  # noqa: F401


# Tests marked by where they are: what `nox -s flaky` reruns besides the learning tests.
_BY_PATH = {
    "distributed": (
        "train/test_distributed",
        "train/test_nats_auth",
        "bus/test_nats",
        "cli/test_worker",  # and test_worker_keys
    ),
    "server": (
        "backends/",
        "gateway/test_http",
        "gateway/test_conformance",
        "envs/test_env_server",
        "policy/test_tinker",
        "test_serving",
    ),
}


# The longest tests, which xdist should start first (longest-first scheduling): started last,
# one of them runs alone on one core while the other cores have nothing left to do.
_LONGEST = ("examples/", "docs/test_doc_blocks", "train/test_distributed", "train/test_resume", "test_types")


def pytest_itemcollected(item):
    """Mark tests by where they are (before `-m` selects by marker)."""
    root = item.config.rootpath / "tests"
    where = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
    for marker, prefixes in _BY_PATH.items():
        if where.startswith(prefixes):
            item.add_marker(marker)


@pytest.hookimpl(trylast=True)  # after pytest-randomly has shuffled
def pytest_collection_modifyitems(config, items):
    """Start the longest tests first, and skip `torch` tests without torch."""
    root = config.rootpath / "tests"

    def order(item):
        where = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if where.startswith(_LONGEST) or "learning" in item.keywords:
            return 0
        return 1 if "slow" in item.keywords else 2

    items.sort(key=order)  # stable: the shuffled order stays within each class
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("peft") is None:
        skip = pytest.mark.skip(reason="needs torch and peft (pip install 'platoon[local]')")
        for item in items:
            if "torch" in item.keywords:
                item.add_marker(skip)


# The cyclic garbage collector scans every object it tracks at each full collection, and a worker
# holds millions of them once torch, transformers and the model clients are imported: a full
# collection took about 0.9 s, 17% of the quick tests' CPU. What survives a full collection is
# nearly all modules, classes and caches, so it is frozen (moved out of the collector's sight)
# before the next test: later full collections scan only what the tests made since. Only cyclic
# garbage among the survivors is kept for good (refcounting still frees the rest), a few MB.
_full_collection_done = False


def _note_full_collection(phase, info):
    global _full_collection_done
    if phase == "stop" and info["generation"] == 2:
        _full_collection_done = True


gc.callbacks.append(_note_full_collection)


def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()


def pytest_runtest_logfinish(nodeid, location):
    global _full_collection_done
    if _full_collection_done:
        _full_collection_done = False
        gc.freeze()


@pytest.fixture(autouse=True)
def _untraced_when_learning(request):
    """A learning test runs with line coverage paused.

    What it proves is the rise of a reward, and its lines are the quick tests' lines too: traced,
    the learning tests took about 40% longer (a minute of the suite) for a tenth of a percent
    of coverage. Under xdist a worker holds two started `Coverage` objects (pytest-cov starts one
    from the `-n` it reads in the worker's options, then the worker's own); stopping only the
    newest resumes the other, so every one is stopped, and started again in its order after.
    """
    stopped: list[coverage.Coverage] = []
    if "learning" in request.keywords:
        while (running := coverage.Coverage.current()) is not None:
            running.stop()
            stopped.append(running)
    try:
        yield
    finally:
        for running in reversed(stopped):
            running.start()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


from sandbox_fixtures import image, podman_url, rootfs  # noqa: E402, F401
from tokenizer_fixtures import llama3_tokenizer, qwen3_tokenizer, toy_tokenizer  # noqa: E402, F401

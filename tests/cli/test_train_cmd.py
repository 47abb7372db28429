"""`platoon train`: a run folder that holds a trained step needs a choice; one whose attempt
trained nothing is reused; names a run needs are checked before anything opens."""

from __future__ import annotations

from pathlib import Path

import pytest

from platoon.cli import CommandError, main
from platoon.cli.train import _claimed
from platoon.config import validate_config

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"
CONFIG = validate_config(
    {
        "environments": [{"env": "platoon-number-search@1", "harness": "platoon-react"}],
        "train": {"backend": "local", "model_name": "platoon-tiny-qwen3", "renderer_name": "qwen3_instruct"},
    }
)


def _attempt(directory: Path, *, trained: bool) -> None:
    """What a run leaves: its identity and events, and a step's metrics when one trained."""
    directory.mkdir(parents=True)
    (directory / "identity.json").write_text("{}")
    (directory / "events.jsonl").write_text('{"first": "attempt"}\n')
    (directory / "metrics.jsonl").write_text('{"step": 0, "reward/mean": 0.5}\n' if trained else "")


def test_a_folder_whose_attempt_trained_no_step_is_reused_and_the_attempt_kept(tmp_path, capsys):
    run = tmp_path / "run"
    _attempt(run, trained=False)
    config, directory = _claimed(CONFIG, run, new_trial=False, overwrite=False)
    assert directory == run and config is CONFIG
    assert sorted(p.name for p in run.iterdir()) == [".failed-attempt"]
    assert (run / ".failed-attempt" / "events.jsonl").read_text() == '{"first": "attempt"}\n'
    assert ".failed-attempt" in capsys.readouterr().err
    # a second failed attempt replaces the first one's files
    (run / "identity.json").write_text("{}")
    (run / "events.jsonl").write_text('{"second": "attempt"}\n')
    _claimed(CONFIG, run, new_trial=False, overwrite=False)
    assert (run / ".failed-attempt" / "events.jsonl").read_text() == '{"second": "attempt"}\n'
    assert not (run / ".failed-attempt" / ".failed-attempt").exists()


def test_a_folder_with_a_trained_step_still_asks(tmp_path):
    run = tmp_path / "run"
    _attempt(run, trained=True)
    with pytest.raises(CommandError, match="already holds a run: pass --resume"):
        _claimed(CONFIG, run, new_trial=False, overwrite=False)
    assert (run / "metrics.jsonl").exists()
    # a new trial beside it that an attempt left untrained is used, its attempt set aside
    _attempt(tmp_path / "run-2", trained=False)
    config, directory = _claimed(CONFIG, run, new_trial=True, overwrite=False)
    assert directory == tmp_path / "run-2" and config.stats.trial_name == "run-2"
    assert (directory / ".failed-attempt" / "identity.json").exists()


def test_a_misnamed_harness_is_said_before_any_model_is_built(site, capsys):
    argv = ["train", "train-local.yaml", "environments.0.harness=example-sey", "stats.trial_name=typo"]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "unknown harness 'example-sey'; did you mean 'example-say'" in err
    assert not (site / "cache" / "models").exists()  # the tiny model was never built
    assert not (site / "runs" / "quickstart" / "typo" / "identity.json").exists()


def test_a_tokenizer_that_is_not_here_says_every_way_on(site, capsys, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(site / "hf"))  # an empty Hugging Face cache
    argv = ["train", "train.yaml", "train.backend=local", "stats.trial_name=hosted"]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "cannot load the tokenizer 'Qwen/Qwen3-4B-Instruct-2507'" in err
    for way in ("hf download Qwen/Qwen3-4B-Instruct-2507", "platoon models list", "platoon prepare"):
        assert way in err
    assert "train-local.yaml" in err
    assert not (site / "runs" / "quickstart" / "hosted" / "identity.json").exists()  # no run to resume


def test_a_tinker_server_of_an_older_api_is_named_with_what_to_use_instead(site, capsys):
    """skyrl-tx 0.3 (and any server of the SDKs before 0.25) has no client/config, the SDK's
    first call: a server here answers 404 to everything, as it does to that."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NotFound(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = b'{"detail":"Not Found"}'
            self.send_response(404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        argv = [
            "train",
            "train-local.yaml",
            "train.backend=tinker",
            "train.reproducible=false",
            f"tinker_base_url={url}",
            "stats.trial_name=old",
        ]
        assert main(argv) != 0
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert f"the Tinker server at {url} has no /api/v1/client/config" in err
    assert "SDKs before 0.25" in err and "train.backend=local" in err
    assert "Traceback" not in err

"""The attack script (`attack.py`), run as an auditor runs it: every attack is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def test_every_attack_of_the_script_is_refused(tiny_model):
    script = Path(__file__).with_name("attack.py")
    done = subprocess.run(
        [sys.executable, str(script), "--model", str(tiny_model)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip().endswith("every attack was refused")
    assert "FAILED" not in done.stdout

"""The framework examples run end to end in their CI setting (--small): train on real data,
commit through the integration, survive a simulated failure, resume from mvc, finish."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from locations import ROOT

EXAMPLES = ROOT / "examples"


def _run(script: str, workdir: Path) -> str:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), "--workdir", str(workdir), "--small"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


# End-to-end runs in a fresh interpreter (importing lightning / transformers alone is seconds):
# slow-marked, so `make test-fast` skips them and `make test` runs them.
@pytest.mark.slow
def test_lightning_example(tmp_path):
    pytest.importorskip("lightning")
    out = _run("train_lightning.py", tmp_path / "run")
    assert "simulated failure at step 12" in out
    assert "resuming from epoch=0-step=8.ckpt (step 8)" in out
    assert "finished at step 24" in out and "a plain Lightning checkpoint at step 24" in out
    assert out.count("lightning: epoch=") == 3  # one commit per checkpoint: steps 8, 16, 24


@pytest.mark.slow
def test_hf_example(tmp_path):
    pytest.importorskip("transformers")
    out = _run("train_hf.py", tmp_path / "run")
    assert "simulated failure at step 6" in out
    assert "commits at steps [4]; checkpoint directories left on disk: []" in out
    assert "resumed from mvc, finished at step 8" in out
    assert out.count("checkpoint-8") == 1 and out.count("checkpoint-4") == 1

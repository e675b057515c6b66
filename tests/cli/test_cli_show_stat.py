"""mvc show: a summary by layer type, and --stat for the summary alone (issue 19 item 5)."""
from __future__ import annotations

import torch

from cli_helpers import run
from mvc.cli.commands_history import layer_type
from mvc.repo.repository import Repo


def test_layer_types() -> None:
    assert layer_type("model/embed.weight", [100, 16]) == "embedding"
    assert layer_type("model/fc1.weight", [16, 16]) == "linear weight"
    assert layer_type("model/conv.weight", [8, 3, 3, 3]) == "conv weight"
    assert layer_type("model/fc1.bias", [16]) == "bias"
    assert layer_type("model/ln_f.weight", [16]) == "norm"
    assert layer_type("optimizer/state/0/exp_avg_sq", [16, 16]) == "optimizer exp_avg_sq"


def test_show_summary_and_stat(tmp_path) -> None:
    g = torch.Generator().manual_seed(0)
    state = {"model": {"embed.weight": torch.randn(300, 32, generator=g),
                       "fc1.weight": torch.randn(64, 32, generator=g), "fc1.bias": torch.zeros(64)}}
    with Repo.init(tmp_path) as repo:
        repo.commit(state, "one")
    code, out, _ = run(tmp_path, "show")
    assert code == 0
    assert "layer type" in out and "embedding" in out and "linear weight" in out and "bias" in out
    assert "model/fc1.bias" in out  # the per-tensor table follows
    code, stat, _ = run(tmp_path, "show", "--stat")
    assert code == 0 and "layer type" in stat and "model/fc1.bias" not in stat
    assert stat.rstrip().splitlines()[-1].startswith("3 tensors")

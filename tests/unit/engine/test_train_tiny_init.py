"""bench/train_tiny.py --init-out: the model as initialised, written before training, beside
the trained folder (the same config and tokenizer), so the serving kernels of the trained
shape can compile while it trains."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.timeout(120)


def test_init_out_holds_the_initial_weights_of_the_trained_folder_s_model(tmp_path: Path) -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    train_tiny = importlib.import_module("bench.train_tiny")
    out, init = tmp_path / "trained", tmp_path / "init"
    argv = ["--out", str(out), "--init-out", str(init), "--smoke", "--device", "cpu"]
    assert train_tiny.main(argv) == 0

    assert json.loads((init / "config.json").read_text()) == json.loads((out / "config.json").read_text())
    assert (init / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()
    assert not (init / "training.json").exists()

    initial = LlamaForCausalLM.from_pretrained(init).state_dict()
    trained = LlamaForCausalLM.from_pretrained(out).state_dict()
    args = train_tiny.parse_args(argv)
    fresh = train_tiny.make_model(args, AutoTokenizer.from_pretrained(init)).state_dict()
    assert initial.keys() == trained.keys() == fresh.keys()
    for name, tensor in initial.items():
        assert torch.equal(tensor, fresh[name]), name  # the seed's initialisation, untouched
        assert not torch.equal(tensor, trained[name]), name  # every tensor was trained after it

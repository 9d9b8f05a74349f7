"""Training resume files are loaded with weights_only=True (issue 10 #13): a planted pickle runs no code."""

import os
import pickle
import random

import numpy as np
import pytest
import torch

from specrt.core.errors import CheckpointError
from specrt.recipes.common import load_checkpoint, save_checkpoint


class Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_planted_resume_file_runs_no_code(tmp_path):
    marker = str(tmp_path / "pwned")
    path = tmp_path / "ckpt.pt"
    with open(path, "wb") as f:
        pickle.dump({"model": Planted(marker)}, f)
    module = torch.nn.Linear(2, 2)
    with pytest.raises(CheckpointError, match="refusing"):
        load_checkpoint(path, module, torch.optim.AdamW(module.parameters()))
    assert not os.path.exists(marker)


def test_resume_round_trip_restores_rng_states(tmp_path):
    module = torch.nn.Linear(3, 3)
    opt = torch.optim.AdamW(module.parameters())
    module(torch.randn(2, 3)).sum().backward()
    opt.step()
    np.random.seed(3)
    random.seed(4)
    save_checkpoint(tmp_path / "c.pt", module, opt, 5, {"wall_s": 1.0})
    expected = (np.random.rand(), random.random(), torch.rand(1))
    np.random.seed(0)
    random.seed(0)
    torch.manual_seed(0)
    assert load_checkpoint(tmp_path / "c.pt", module, opt) == (5, {"wall_s": 1.0})
    assert (np.random.rand(), random.random(), torch.rand(1)) == expected

"""The random-weight target for --simulate-acceptance."""

import json

import pytest
from click.testing import CliRunner

from specrt.bench import random_target
from specrt.cli.main import main
from specrt.core.errors import InvalidArgument


def test_parse_params_and_shape():
    assert random_target.parse_params("120M") == 120_000_000
    assert random_target.parse_params("1.5B") == 1_500_000_000
    assert random_target.parse_params("800k") == 800_000
    with pytest.raises(InvalidArgument):
        random_target.parse_params("lots")
    s = random_target.shape_for(120_000_000)
    h, i, L, v = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], random_target.VOCAB
    params = L * (4 * h * h + 3 * h * i + 2 * h) + 2 * v * h + h
    assert (h, L, s["num_attention_heads"]) == (768, 12, 12)
    assert params == pytest.approx(120_000_000, rel=0.05)


@pytest.mark.slow
def test_make_compile_and_simulate(tmp_path):
    out = tmp_path / "rand"
    res = CliRunner().invoke(main, ["bench", "--make-random-target", str(out), "--params", "300k"])
    assert res.exit_code == 0, res.output
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == random_target.VOCAB
    assert (out / "tokenizer.json").exists() and (out / "model.safetensors").exists()
    bundle = tmp_path / "bundle"
    res = CliRunner().invoke(main, ["compile", "--target", str(out), "-o", str(bundle), "--max-seq-len", "128",
                                    "--max-draft-tokens", "4", "--json"])
    assert res.exit_code == 0, res.output
    js = tmp_path / "sim.json"
    res = CliRunner().invoke(main, ["bench", str(bundle), "--simulate-acceptance", "0.8", "--k", "2", "--suite", "open",
                                    "--prompts-per-suite", "1", "--repeats", "1", "--max-new-tokens", "24", "--quiet",
                                    "--json", str(js)])
    assert res.exit_code == 0, res.output
    rows = json.loads(js.read_text())["results"]
    assert any(r["method"] == "replay" and r["identical"] for r in rows)

"""`specrt generate --method hybrid`: the shared --method option offers it; the stats line and --json say which
branch proposed; the output equals plain decoding."""

import json

from helpers import run_cli

PROMPT = "import os\nimport sys\nimport os\nimport sys\ndef main(argv):\n    "


specrt = run_cli  # in-process: tests/helpers.py


def test_generate_hybrid_reports_branches(pair_bundle):
    plain = specrt("generate", pair_bundle, "--prompt", PROMPT, "--max-new-tokens", 32, "--method", "none", "--json")
    assert plain.returncode == 0, plain.stderr
    proc = specrt("generate", pair_bundle, "--prompt", PROMPT, "--max-new-tokens", 32, "--method", "hybrid",
                  "--num-speculative-tokens", 3, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["token_ids"] == json.loads(plain.stdout)["token_ids"]
    branches = out["stats"]["branches"]
    assert out["stats"]["method"] == "hybrid" and branches["ngram"]["steps"] > 0 and branches["draft"]["steps"] > 0
    proc = specrt("generate", pair_bundle, "--prompt", PROMPT, "--max-new-tokens", 32, "--method", "hybrid",
                  "--num-speculative-tokens", 3)
    assert proc.returncode == 0, proc.stderr
    assert "[hybrid, k=3" in proc.stderr and "ngram " in proc.stderr and " steps (acceptance " in proc.stderr


def test_hybrid_is_a_choice_of_the_shared_option():
    proc = specrt("generate", "--help")
    assert proc.returncode == 0 and "hybrid" in proc.stdout

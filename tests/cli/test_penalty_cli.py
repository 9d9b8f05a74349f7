"""`specrt generate --presence-penalty / --frequency-penalty / --repetition-penalty` (#53)."""

import json

from helpers import run_cli


def test_generate_with_penalties_equals_the_api(pair_bundle, pair_generator):
    proc = run_cli("generate", str(pair_bundle), "--prompt", "import os", "--max-new-tokens", "16", "--method", "draft",
                   "--num-speculative-tokens", "3", "--presence-penalty", "1.5", "--repetition-penalty", "1.3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    ref = pair_generator.generate("import os", 16, method="none", presence_penalty=1.5, repetition_penalty=1.3)
    assert out["token_ids"] == ref.token_ids
    assert ref.token_ids != pair_generator.generate("import os", 16, method="none").token_ids


def test_a_penalty_out_of_range_names_the_flag(pair_bundle):
    proc = run_cli("generate", str(pair_bundle), "--prompt", "hi", "--repetition-penalty", "0")
    assert proc.returncode == 2 and "--repetition-penalty must be a number in (0, 2]" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr

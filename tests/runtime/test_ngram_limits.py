"""--ngram-min / --ngram-max are bounded (issue 10 #12): no table per size up to a billion."""


import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime.proposers.ngram import MAX_N_LIMIT, NgramProposer


@pytest.mark.parametrize("kwargs", [dict(ngram_max=1_000_000_000), dict(ngram_min=1, ngram_max=MAX_N_LIMIT + 1),
                                    dict(ngram_min=0), dict(ngram_max=2.5)])
def test_out_of_range_ngram_sizes_are_refused(pair_generator, kwargs):
    with pytest.raises(InvalidArgument, match="ngram"):
        pair_generator.generate("import os", 4, method="ngram", **kwargs)


def test_largest_allowed_size_works(pair_generator):
    res = pair_generator.generate("import os\nimport os\n", 6, method="ngram", ngram_min=1, ngram_max=MAX_N_LIMIT)
    assert res.token_ids == pair_generator.generate("import os\nimport os\n", 6, method="none").token_ids
    with pytest.raises(InvalidArgument):
        NgramProposer(min_n=1, max_n=MAX_N_LIMIT + 1)


def test_cli_ngram_max_exits_2(pair_bundle):
    from helpers import run_cli

    proc = run_cli("generate", pair_bundle, "--prompt", "x", "--method", "ngram", "--ngram-max", "1000000000",
                   "--backend", "ort")
    assert proc.returncode == 2 and "ngram" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1

"""Bad calls raise InvalidArgument with the value in the message, and the generator stays usable."""

import pytest

from specrt.core.errors import InvalidArgument


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompt=""), "empty prompt"),
    (dict(prompt=[1, 2, 99999]), "token id 99999 is outside the vocabulary"),
    (dict(prompt=[-1]), "token id -1"),
    (dict(prompt="x " * 400), "compiled for max_seq_len=128"),
    (dict(num_speculative_tokens=-1), r"num_speculative_tokens must be >= 0 or 'auto', got -1"),
    (dict(num_speculative_tokens=9), r"num_speculative_tokens=9 is outside \[0, 8\]"),
    (dict(num_speculative_tokens="many"), "integer or 'auto'"),
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.01), r"top_p must be in \(0, 1\]"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
    (dict(method="beam"), "unknown method 'beam'"),
    (dict(stop=[""]), "stop strings must be non-empty"),
    (dict(ngram_min=4, ngram_max=2), "1 <= ngram_min <= ngram_max"),
])
def test_bad_calls(pair_generator, kwargs, match):
    args = dict(prompt="hello", max_new_tokens=5) | kwargs
    with pytest.raises(InvalidArgument, match=match):
        pair_generator.generate(args.pop("prompt"), args.pop("max_new_tokens"), **args)
    ok = pair_generator.generate("hello", 5, method="draft", num_speculative_tokens=2)
    assert 1 <= len(ok.token_ids) <= 5


def test_draft_method_needs_a_draft(target_only_bundle):
    from specrt.runtime import load

    gen = load(target_only_bundle)
    with pytest.raises(InvalidArgument, match="needs a bundle compiled with --draft"):
        gen.generate("hello", 5, method="draft")
    assert gen.default_method == "auto"

"""GenerationRequest: one default and one validation for every front end (runtime/request.py)."""

import json

import pytest

from specrt.core.errors import InvalidArgument
from specrt.runtime.request import DEFAULT_K, GenerationRequest, RequestFieldError, generation_defaults, parse_k


def test_defaults_and_k_parsing():
    r = GenerationRequest()
    assert r.num_speculative_tokens == DEFAULT_K == "auto" and r.max_new_tokens == 128
    assert GenerationRequest(num_speculative_tokens="4").num_speculative_tokens == 4
    assert parse_k("auto") == "auto" and parse_k(0) == 0
    for bad in ("many", -1, 1.5, True):
        with pytest.raises(RequestFieldError) as exc:
            parse_k(bad)
        assert exc.value.field == "num_speculative_tokens"


@pytest.mark.parametrize("fields, field", [
    (dict(temperature=-1.0), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_k=-2), "top_k"),
    (dict(seed=-5), "seed"), (dict(max_new_tokens=0), "max_new_tokens"), (dict(method="beam"), "method"),
    (dict(stop=("",)), "stop"), (dict(stop=["x"] * 17), "stop"), (dict(temperature="hot"), "temperature"),
])
def test_bad_fields_name_the_field(fields, field):
    with pytest.raises(RequestFieldError) as exc:
        GenerationRequest(**fields)
    assert exc.value.field == field and isinstance(exc.value, InvalidArgument)


def test_frozen_and_stop_normalised():
    r = GenerationRequest(stop="END")
    assert r.stop == ("END",)
    with pytest.raises(Exception):
        r.temperature = 1.0  # frozen


def test_unknown_option_names_the_method():
    with pytest.raises(TypeError, match=r"Generator.generate\(\) got an unexpected keyword argument 'temprature'"):
        GenerationRequest.from_options("Generator.generate", temprature=0.5)


def test_generation_config_defaults_fill_only_omitted_fields(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "generation_config.json").write_text(
        json.dumps({"temperature": 0.2, "top_p": 0.9, "top_k": "bad", "eos_token_id": 2}))
    defaults = generation_defaults(tmp_path)
    assert defaults == {"temperature": 0.2, "top_p": 0.9}
    r = GenerationRequest(top_p=0.5).with_defaults(defaults)
    assert (r.temperature, r.top_p, r.top_k) == (0.2, 0.5, 0)
    assert GenerationRequest().with_defaults({}).sampling.greedy
    assert GenerationRequest().with_defaults({}, fallback_temperature=1.0).temperature == 1.0
    assert generation_defaults(tmp_path / "missing") == {}


def test_check_for_bundle_limits():
    GenerationRequest(num_speculative_tokens=4).check_for(4, ["ngram", "none"])
    with pytest.raises(RequestFieldError, match=r"num_speculative_tokens=5 is outside \[0, 4\]"):
        GenerationRequest(num_speculative_tokens=5).check_for(4)
    with pytest.raises(RequestFieldError, match="needs a bundle compiled with --draft"):
        GenerationRequest(method="draft").check_for(4, ["ngram", "none"])


def test_generator_uses_bundle_generation_config(pair_generator):
    """A call that omits temperature samples at the bundle's default; an explicit 0 stays greedy."""
    gen = pair_generator
    saved = gen.sampling_defaults
    try:
        gen.sampling_defaults = {"temperature": 0.8}
        assert gen.request().temperature == 0.8
        assert gen.request(temperature=0).sampling.greedy
        gen.sampling_defaults = {}
        assert gen.request().sampling.greedy
        req = GenerationRequest(max_new_tokens=6, method="ngram", num_speculative_tokens=2)
        a = gen.generate("hello", request=req)
        b = gen.generate("hello", 6, method="ngram", num_speculative_tokens=2)
        assert a.token_ids == b.token_ids and len(a.token_ids) <= 6
        with pytest.raises(TypeError, match="not both"):
            gen.generate("hello", request=req, temperature=0.5)
    finally:
        gen.sampling_defaults = saved

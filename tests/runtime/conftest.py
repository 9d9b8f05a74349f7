"""The runtime tests run on both ONNX Runtime graph variants: the fused graph ("ort", the default for a
bundle that has one) and the portable graph ("ort-portable")."""

import pytest


@pytest.fixture(scope="session", params=["ort", "ort-portable"])
def pair_generator(request, pair_bundle):
    from specrt.runtime import load

    gen = load(pair_bundle, backend=request.param)
    assert (gen.target.describe().get("graph") == "fused") == (request.param == "ort")
    return gen


@pytest.fixture(scope="session", params=["ort", "ort-portable"])
def self_generator(request, self_bundle):
    from specrt.runtime import load

    return load(self_bundle, backend=request.param)

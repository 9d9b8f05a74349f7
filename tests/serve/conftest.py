"""Serve fixtures: real compiled bundles behind a real uvicorn server on a loopback port."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

@pytest.fixture(scope="module", autouse=True)
def _ray_modules_one_at_a_time(request):
    """test_ray_*.py modules start local Ray instances: one such module at a time on this machine (ray_helpers)."""
    if not request.module.__name__.rsplit(".", 1)[-1].startswith("test_ray"):
        yield
        return
    from ray_helpers import one_ray_instance_at_a_time

    with one_ray_instance_at_a_time():
        yield


from serve_helpers import ServerThread, openai_client, serving  # noqa: E402  (after the importorskips)


@pytest.fixture(scope="session")
def slot_generators(pair_bundle):
    """Two generators (two slots) on the pair bundle, one thread each."""
    from specrt.serve import load_generators

    return load_generators(pair_bundle, max_concurrency=2, backend="ort", threads=2)


@pytest.fixture(scope="module")
def server(slot_generators):
    """max-concurrency 2, max-queue 64, no API key."""
    with serving(slot_generators, max_queue=64, served_model_name="tiny") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)

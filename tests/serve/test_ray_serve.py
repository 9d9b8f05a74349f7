"""`specrt serve --ray` as a library: 2 replicas of a real bundle on a local Ray instance (loopback only).

One Ray instance and one deployment serve the whole module (Ray takes tens of seconds to start); the last
test shuts it down and checks that no Ray process of the test is left.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from serve_helpers import K
from ray_helpers import free_port, ray_processes, small_ray, wait_gone

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ray = pytest.importorskip("ray", reason="needs Ray Serve: pip install 'specrt[ray]'")
serve = pytest.importorskip("ray.serve", reason="needs Ray Serve: pip install 'specrt[ray]'")

from specrt.serve.ray_config import RayConfig  # noqa: E402
from specrt.serve.ray_deploy import RayDeployError, RayServer, app_builder, load_failure  # noqa: E402
from specrt.serve.ray_replica import LOAD_FAILED, REPLICA_HEADER  # noqa: E402

PROMPT = "def main(args):\n    "
APP = {"max_concurrency": 1, "num_speculative_tokens": K, "served_model_name": "tiny", "backend": "ort"}


@pytest.fixture(scope="module")
def ray_server(pair_bundle):
    init = small_ray()
    try:
        server = RayServer.start(pair_bundle, RayConfig(replicas=2, cpus_per_replica=0.5), host="127.0.0.1",
                                 port=free_port(), app_kwargs=APP, init_kwargs=init)
    except RayDeployError as exc:
        if "cannot start" in str(exc):
            pytest.skip(f"Ray cannot start here: {exc}")
        raise
    server.temp_dir, server.bundle = init["_temp_dir"], pair_bundle
    server.processes = ray_processes(psutil.Process())
    yield server
    server.shutdown()
    shutil.rmtree(init["_temp_dir"], ignore_errors=True)


@pytest.fixture(scope="module")
def reference(pair_generator):
    return pair_generator.generate(PROMPT, 12, temperature=0, method="draft", num_speculative_tokens=K)


def complete(url: str, max_tokens: int = 12, timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=timeout,
                      json={"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0})


def replica_ids(url: str, want: int = 2, probes: int = 20, wait_s: float = 0.0) -> set[str]:
    """The replicas that answer /health probes: at least `probes` of them, and until `want` replicas have answered
    or `wait_s` has passed (each probe reaches one replica; on 2 busy cores a replica can be slow to take one)."""
    seen: set[str] = set()
    deadline = time.monotonic() + wait_s
    for n in range(10_000):
        seen.add(httpx.get(f"{url}/health", timeout=10).headers[REPLICA_HEADER])
        if n + 1 >= probes and (len(seen) >= want or time.monotonic() > deadline):
            break
        if n + 1 >= probes:
            time.sleep(0.2)
    return seen


def test_health_reports_replicas(ray_server):
    resp = httpx.get(f"{ray_server.url}/health", timeout=10)
    body = resp.json()
    assert resp.status_code == 200 and body["status"] == "ok" and body["slots"] == 1
    assert body["replicas"] == 2 and body["replica_states"] == {"RUNNING": 2}
    assert resp.headers[REPLICA_HEADER] == body["replica"] and body["node"]
    assert ray_server.replica_states() == {"RUNNING": 2}


def test_openai_client_completion_chat_stream(ray_server, reference):
    import openai

    client = openai.OpenAI(base_url=f"{ray_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    resp = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    assert resp.choices[0].text == reference.text and resp.usage.completion_tokens == len(reference.token_ids)
    assert resp.model_extra["speculative_stats"]["method"] == "auto"  # the default (#51)
    pieces = [c.choices[0].text for c in client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12,
                                                                     temperature=0, stream=True)]
    assert "".join(pieces) == reference.text and len(pieces) > 1
    chat = client.chat.completions.create(model="tiny", max_tokens=8, temperature=0,
                                          messages=[{"role": "user", "content": "import os"}])
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens > 0
    streamed = client.chat.completions.create(model="tiny", max_tokens=8, temperature=0, stream=True,
                                              messages=[{"role": "user", "content": "import os"}])
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == chat.choices[0].message.content
    assert [m.id for m in client.models.list().data] == ["tiny"]


def replica_metrics(url: str, wait_s: float = 60) -> dict[str, float]:
    """Completions answered with 200 per replica, from /metrics scrapes (each scrape reaches one replica) until both
    replicas have answered or `wait_s` has passed."""
    from prometheus_client.parser import text_string_to_metric_families

    seen: dict[str, float] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text)}
        replica = families["specrt_replica_info"].samples[0].labels["replica"]
        seen[replica] = sum(s.value for s in families["specrt_requests"].samples
                            if s.name == "specrt_requests_total" and s.labels == {"endpoint": "/v1/completions",
                                                                                  "status": "200"})
        if len(seen) == 2:
            break
    return seen


def test_concurrent_requests_are_spread_over_both_replicas(ray_server, reference):
    assert len(replica_ids(ray_server.url, wait_s=60)) == 2
    before = replica_metrics(ray_server.url)
    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda _: complete(ray_server.url), range(16)))
    assert [r.status_code for r in responses] == [200] * 16
    assert {r.json()["choices"][0]["text"] for r in responses} == {reference.text}
    served = [r.headers[REPLICA_HEADER] for r in responses]
    assert len(set(served)) == 2, served
    after = replica_metrics(ray_server.url)
    assert set(after) == set(served) == set(before)
    for replica in after:  # each replica's own /metrics counted the requests its header claimed
        assert after[replica] - before[replica] == served.count(replica)


def replica_actor(replica: str):
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["name"].startswith("SERVE_REPLICA::") and entry["name"].endswith(f"#{replica}"):
            return ray.get_actor(entry["name"], namespace=entry["namespace"])
    raise AssertionError(f"no actor for replica {replica}")


def test_killed_replica_is_restarted_while_the_service_answers(ray_server, reference):
    old = replica_ids(ray_server.url, wait_s=60)
    assert len(old) == 2
    victim = sorted(old)[0]
    results: list[tuple[float, int, str]] = []  # (start time, status, replica)
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            t = time.monotonic()
            try:
                r = complete(ray_server.url, max_tokens=24, timeout=30)
                results.append((t, r.status_code, r.headers.get(REPLICA_HEADER, "")))
            except httpx.HTTPError as exc:
                results.append((t, -1, type(exc).__name__))

    workers = [threading.Thread(target=traffic) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        time.sleep(1.0)  # requests in flight on both replicas
        killed_at = time.monotonic()
        ray.kill(replica_actor(victim), no_restart=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # Serve replaces the dead replica with a new one
            if ray_server.replica_states() == {"RUNNING": 2} and len(replica_ids(ray_server.url, wait_s=5) - old) == 1:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the killed replica was not replaced: {ray_server.replica_states()}")
        # traffic until the new replica has answered some (before: 1 s of it, a few requests on a loaded machine,
        # all of which the router could send to the surviving replica)
        deadline = time.monotonic() + 60
        while not any(r[1] == 200 and r[2] not in old for r in results) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)
    after_kill = [r for r in results if r[0] > killed_at]
    failed = [r for r in results if r[1] != 200]
    # at most the requests in flight on the killed replica fail (one per traffic thread); the rest is answered
    assert len(failed) <= len(workers), failed
    assert sum(r[1] == 200 for r in after_kill) >= 3
    assert any(r[2] not in old for r in after_kill if r[1] == 200)  # the new replica serves
    body = httpx.get(f"{ray_server.url}/health", timeout=10).json()
    assert body["replicas"] == 2 and victim not in replica_ids(ray_server.url)
    assert complete(ray_server.url).json()["choices"][0]["text"] == reference.text


def test_replica_that_cannot_load_is_a_clear_error(ray_server, pair_bundle, tmp_path):
    broken = shutil.copytree(pair_bundle, tmp_path / "broken")
    manifest = json.loads((broken / "manifest.json").read_text())
    name = next(f for f in manifest["files"] if f.endswith(".onnx.data"))
    with open(broken / name, "r+b") as f:  # same size, other bytes: only the checksum can tell
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    t = time.monotonic()
    with pytest.raises(RuntimeError) as info:  # deployed as a Serve config file would: through app_builder
        serve.run(app_builder({"bundle": str(broken), "replicas": "1", "cpus_per_replica": 0.5, **APP}),
                  name="broken", route_prefix="/broken")
    message = load_failure(info.value, "broken")
    try:
        assert message and message.startswith(f"{LOAD_FAILED} {broken}"), str(info.value)[-2000:]
        assert "ChecksumMismatch" in message and name in message and "\n" not in message
        assert time.monotonic() - t < 120  # a few attempts, then the failure: no endless crash loop
        assert complete(ray_server.url).status_code == 200  # the healthy application is untouched
    finally:
        serve.delete("broken")


def test_full_replica_answers_429(ray_server):
    """1 slot, no queue: Ray hands the replica one request more than it can hold, and the replica refuses it."""
    serve.run(app_builder({"bundle": str(ray_server.bundle), "replicas": 1, "cpus_per_replica": 0.5, **APP,
                           "max_queue": 0}), name="full", route_prefix="/full")
    try:
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 100, "temperature": 0}
        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(lambda _: httpx.post(f"{ray_server.url}/full/v1/completions", json=body,
                                                           timeout=60), range(4)))
        codes = sorted(r.status_code for r in responses)
        assert codes[0] == 200 and codes[-1] == 429, codes
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.json()["error"]["code"] == "queue_full" and refused.headers["retry-after"] == "1"
    finally:
        serve.delete("full")


def test_shutdown_leaves_no_ray_processes(ray_server):
    procs = ray_server.processes | ray_processes(psutil.Process())  # with the replica started after the kill
    assert len(procs) >= 4, procs  # GCS, raylet, controller, proxy, replicas...
    ray_server.shutdown()
    assert not ray.is_initialized()
    assert wait_gone(procs, ray_server.temp_dir) == []
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{ray_server.url}/health", timeout=5)

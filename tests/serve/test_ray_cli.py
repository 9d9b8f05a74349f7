"""`specrt serve --ray` from the command line: options, errors without Ray, a real run stopped by Ctrl-C, and a
replica that cannot load its bundle."""

from __future__ import annotations

import importlib.util
import json
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from serve_helpers import K
from ray_helpers import free_port, ray_processes, wait_gone
from specrt.core.errors import InvalidArgument
from specrt.serve.ray_config import RayConfig

SPECRT = str(Path(sys.executable).with_name("specrt"))


@pytest.mark.parametrize("kwargs, message", [
    ({"replicas": 2, "min_replicas": 1, "max_replicas": 2}, "not both"),
    ({"min_replicas": 1}, "both --min-replicas and --max-replicas"),
    ({"min_replicas": 3, "max_replicas": 2}, "min_replicas <= max_replicas"),
    ({"replicas": 0}, "replicas must be >= 1"),
    ({"cpus_per_replica": 0}, "cpus_per_replica must be > 0"),
    ({"cpus_per_replica": float("nan")}, "cpus_per_replica must be > 0"),
    ({"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 0}, "target_ongoing_requests"),
])
def test_ray_config_rejects(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        RayConfig(**kwargs)


def test_ray_config_deployment_options():
    fixed = RayConfig(replicas=3, cpus_per_replica=0.5).deployment_options(slots=2, max_queue=8)
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 0.5} and fixed["max_ongoing_requests"] == 11
    auto = RayConfig(min_replicas=1, max_replicas=4).deployment_options(slots=2, max_queue=8)
    assert "num_replicas" not in auto
    assert auto["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
                                          "target_ongoing_requests": 2}
    assert RayConfig().initial_replicas == 1 and RayConfig().threads_per_replica() == 1
    assert RayConfig(cpus_per_replica=2.5).threads_per_replica() == 3
    assert RayConfig(cpus_per_replica=2.5).threads_per_replica(5) == 5


def test_app_builder_args():
    """The Serve-config entry point (KubeRay, `serve run`): typed args, one-line errors; no Ray instance needed."""
    pytest.importorskip("ray", reason="needs Ray Serve: pip install 'specrt[ray]'")
    from specrt.serve.ray_deploy import app_builder

    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary as build  # as `serve run` does

    app = build(app_builder, {"bundle": "/b", "min_replicas": "1", "max_replicas": 3, "cpus_per_replica": "0.5",
                              "max_concurrency": "2", "num_speculative_tokens": "auto"})
    assert type(app).__name__ == "Application"
    for args, message in [({"replicas": 1}, "args.bundle is required"),
                          ({"bundle": "/b", "replica": 2}, "unknown args ['replica']"),
                          ({"bundle": "/b", "replicas": "two"}, "args.replicas must be int, got 'two'"),
                          ({"bundle": "/b", "num_speculative_tokens": "x"}, "num_speculative_tokens must be int"),
                          ({"bundle": "/b", "min_replicas": 2}, "both --min-replicas and --max-replicas")]:
        with pytest.raises(InvalidArgument, match=re.escape(message)):
            app_builder(args)


def test_plain_serve_does_not_import_ray():
    code = ("import sys, specrt.serve, specrt.serve.ray_config; from specrt.cli import main; "
            "from specrt.serve import create_app; main(['serve', '--help'], standalone_mode=False); "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("False") and "--ray" in out.stdout, out.stderr


def test_serve_ray_usage_errors(pair_bundle, tmp_path):
    """Each is refused before any Ray process starts (in-process: a subprocess per case costs seconds)."""
    from click.testing import CliRunner

    from specrt.cli.main import main

    for args, message in [
        ((pair_bundle, "--replicas", 2), "--replicas only apply with --ray"),
        ((pair_bundle, "--ray-address", "auto"), "--ray-address only apply with --ray"),
        ((pair_bundle, "--ray", "--replicas", 2, "--min-replicas", 1, "--max-replicas", 2), "not both"),
        ((pair_bundle, "--ray", "--cpus-per-replica", 0), "Invalid value for '--cpus-per-replica'"),
        ((tmp_path / "missing", "--ray"), "does not exist"),
    ] + ([((pair_bundle, "--ray", "--port", 0), "--port must be 1..65535 with --ray")]
         if importlib.util.find_spec("ray") else []):
        res = CliRunner().invoke(main, ["serve", *map(str, args)])
        assert res.exit_code == 2 and message in res.stderr, (args, res.stderr, res.exception)
        assert isinstance(res.exception, SystemExit), (args, res.exception)  # exited cleanly, no traceback
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_serve_ray_without_ray_installed(pair_bundle):
    code = ("import sys; sys.modules['ray'] = None; from specrt.cli.main import main; "
            f"main(['serve', {str(pair_bundle)!r}, '--ray'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "ray is not installed: pip install 'specrt[ray]'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.ray
@pytest.mark.slow
def test_serve_ray_subprocess_until_ctrl_c(pair_bundle, pair_generator):
    pytest.importorskip("ray", reason="needs Ray Serve: pip install 'specrt[ray]'")
    import openai

    port = free_port()
    proc = subprocess.Popen([SPECRT, "serve", str(pair_bundle), "--ray", "--replicas", "1", "--cpus-per-replica",
                             "0.5", "--port", str(port), "--num-speculative-tokens", str(K), "--served-model-name",
                             "demo", "--threads", "1"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    procs: set = set()
    try:
        seen, deadline = [], time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
            if "on Ray Serve at" in seen[-1]:
                break
        else:
            if "cannot start or reach a local Ray instance" in "".join(seen):
                pytest.skip("Ray cannot start here: " + "".join(seen[-3:]))
            pytest.fail("".join(seen[-40:]))
        assert f"http://127.0.0.1:{port}/v1: 1 replica(s) x 1 slot(s), 0.5 CPU(s) each" in seen[-1]
        procs = ray_processes(psutil.Process(proc.pid))
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, api_key="-", timeout=60)
        resp = client.completions.create(model="demo", prompt="import os", max_tokens=8, temperature=0)
        ref = pair_generator.generate("import os", 8, temperature=0, method="draft", num_speculative_tokens=K)
        assert resp.choices[0].text == ref.text
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("specrt serve --ray did not shut down on SIGINT")
    assert rc == 0
    assert len(procs) >= 4 and wait_gone(procs) == []


@pytest.mark.ray
@pytest.mark.slow
def test_serve_ray_replica_load_failure_is_one_line(pair_bundle, tmp_path):
    """A bundle whose copy is corrupted on the node: the replica's checksum check fails, the command says so in
    one line and exits 1 after a few attempts, and leaves no Ray process behind."""
    pytest.importorskip("ray", reason="needs Ray Serve: pip install 'specrt[ray]'")
    broken = shutil.copytree(pair_bundle, tmp_path / "broken")
    name = next(f for f in json.loads((broken / "manifest.json").read_text())["files"] if f.endswith(".onnx.data"))
    data = bytearray((broken / name).read_bytes())
    data[0] ^= 0xFF  # same size, other bytes: only the sha256 can tell
    (broken / name).write_bytes(bytes(data))
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:  # a file, not a pipe: Ray's logs must never block the command
        proc = subprocess.Popen([SPECRT, "serve", str(broken), "--ray", "--cpus-per-replica", "0.5", "--port",
                                 str(free_port())], stderr=stderr, stdout=subprocess.DEVNULL)
    procs: set = set()
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        procs |= ray_processes(psutil.Process(proc.pid))
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
        pytest.fail("specrt serve --ray kept running with a corrupted bundle")
    err = log.read_text()
    if "cannot start or reach a local Ray instance" in err:
        pytest.skip("Ray cannot start here: " + err.strip().splitlines()[-1])
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 1, err[-3000:]
    assert last.startswith(f"error: specrt replica could not load the bundle {broken} (replica "), err[-3000:]
    assert "ChecksumMismatch" in last and name in last
    assert "Traceback" not in err.split("error: specrt replica")[-1]
    assert len(procs) >= 3 and wait_gone(procs) == []

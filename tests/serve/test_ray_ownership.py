"""Issue 26 (--ray): the driver starts its own Ray instance, removes only its own application, and what it
started dies with it even on SIGKILL. The watchdog is tested on a plain process tree (no cluster needed);
the start/shutdown rules on Ray's real module functions, recorded instead of run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

DRIVER = textwrap.dedent("""
    import subprocess, sys, time
    import psutil
    from specrt.serve.ray_watchdog import spawn_watchdog
    # a child that starts a grandchild, as raylet starts Ray's agents
    child = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        "time.sleep(300)"])
    deadline = time.monotonic() + 120
    while not psutil.Process(child.pid).children() and time.monotonic() < deadline:
        time.sleep(0.01)  # the grandchild started (before: 1 s allowed for it)
    dog = spawn_watchdog()
    print(child.pid, dog.proc.pid, flush=True)
    time.sleep(300)
""")


def _wait_for_a_record(dog_pid: int) -> None:
    """Until the watchdog has recorded the driver's descendants: it loads psutil for its first record (after
    POLL_S), which takes milliseconds, so one more POLL_S after psutil is loaded covers it. Before: 1.5 s from the
    watchdog's spawn, which a loaded machine's interpreter start-up could spend."""
    from specrt.serve.ray_watchdog import POLL_S

    deadline = time.monotonic() + 120
    while not any("_psutil_linux" in m.path for m in psutil.Process(dog_pid).memory_maps()):
        assert time.monotonic() < deadline, "the watchdog never loaded psutil (never recorded the tree)"
        time.sleep(0.01)
    time.sleep(POLL_S + 0.1)


def test_sigkill_of_the_driver_ends_what_it_started():
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    child_pid, dog_pid = map(int, driver.stdout.readline().split())
    tree = [psutil.Process(child_pid), *psutil.Process(child_pid).children(recursive=True)]
    assert len(tree) == 2
    _wait_for_a_record(dog_pid)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(10)
    gone, alive = psutil.wait_procs(tree, timeout=15)
    assert not alive, f"left behind: {alive}"
    psutil.wait_procs([psutil.Process(dog_pid)], timeout=10) if psutil.pid_exists(dog_pid) else None


def test_start_owns_a_fresh_instance_and_shutdown_deletes_only_its_app(monkeypatch, pair_bundle):
    pytest.importorskip("ray")
    import ray
    from ray import serve

    from specrt.serve import ray_deploy
    from specrt.serve.ray_config import RayConfig

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(("init", kw.get("address"))))
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append(("ray.shutdown",)))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(serve, "start", lambda http_options: calls.append(("serve.start", http_options["port"])))
    monkeypatch.setattr(serve, "run", lambda app, **kw: calls.append(("serve.run", kw["name"])))
    monkeypatch.setattr(serve, "delete", lambda name: calls.append(("serve.delete", name)))
    monkeypatch.setattr(serve, "shutdown", lambda: calls.append(("serve.shutdown",)))
    monkeypatch.setattr(ray_deploy, "build_application", lambda *a: "app")
    config = RayConfig()
    server = ray_deploy.RayServer.start(pair_bundle, config, port=18123)
    assert ("init", "local") in calls  # never joins a cluster that merely runs on this machine
    assert ("serve.start", 18123) in calls and server.url.endswith(":18123")
    assert server.watchdog is not None and server.watchdog.proc.poll() is None
    server.shutdown()
    assert ("serve.delete", config.app_name) in calls and ("serve.shutdown",) not in calls
    assert calls[-1] == ("ray.shutdown",) and server.watchdog.proc.poll() is not None

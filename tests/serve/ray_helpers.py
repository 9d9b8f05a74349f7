"""Helpers of the Ray Serve tests: a free port, a small local Ray instance, and the Ray processes a test started."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import psutil

RAY_NAMES = ("raylet", "gcs_server", "ray::", "ray/", "default_worker", "dashboard", "log_monitor", "monitor.py")


RAY_WORKER_PORTS = range(10002, 20000)  # Ray's default min_worker_port..max_worker_port


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def free_port() -> int:
    """A free loopback port for a server that binds it only later (the Ray Serve proxy, after ray.init): above Ray's
    worker ports and below the kernel's ephemeral range. A port from that range (a port-0 bind, as before) could be
    handed meanwhile to another port-0 bind: ray.init alone binds ~13 of them (odd ports, as a port-0 bind gets: ~1
    in 1,000 to take the test's port), and the other test worker's servers bind more."""
    low = _ephemeral_low()
    candidates = list(range(RAY_WORKER_PORTS.stop, low))
    random.Random(os.getpid() ^ time.monotonic_ns()).shuffle(candidates)  # two callers at once: other ports
    for port in candidates[:200]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no such range on this machine (an ephemeral range starting low): any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def one_ray_instance_at_a_time() -> Iterator[None]:
    """Hold a machine-wide lock while a test module runs Ray: the full run spreads test files over two pytest-xdist
    workers, and two local Ray instances at once on 2 cores miss Ray Serve's own 5 s health checks."""
    with open(Path(tempfile.gettempdir()) / "specrt-tests-ray.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def small_ray(num_cpus: int = 2) -> dict[str, Any]:
    """ray.init arguments for a light local instance. The temp dir is short: Ray's socket paths live in it."""
    return {"num_cpus": num_cpus, "include_dashboard": False, "object_store_memory": 80 << 20,
            "_temp_dir": tempfile.mkdtemp(prefix="rt", dir="/tmp"), "log_to_driver": False}


def is_ray(proc: psutil.Process) -> bool:
    try:
        text = " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return any(name in text for name in RAY_NAMES)


def ray_processes(root: psutil.Process) -> set[tuple[int, float]]:
    """(pid, create_time) of the Ray processes below `root` (raylet, GCS, workers, replicas...)."""
    found = set()
    for proc in root.children(recursive=True):
        try:
            if is_ray(proc):
                found.add((proc.pid, proc.create_time()))
        except psutil.NoSuchProcess:
            continue
    return found


def alive(procs: set[tuple[int, float]], temp_dir: str = "") -> list[str]:
    """Those of `procs` still running (zombies count as gone), plus any process naming `temp_dir`."""
    left = []
    for pid, created in procs:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    if temp_dir:
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if temp_dir in cmd and proc.pid not in {p for p, _ in procs}:
                left.append(f"{proc.pid} {cmd[:120]}")
    return left


def wait_gone(procs: set[tuple[int, float]], temp_dir: str = "", timeout: float = 30.0) -> list[str]:
    """Wait (bounded) until none of `procs` runs; returns those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        left = alive(procs, temp_dir)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.25)

"""Fate sharing for `specrt serve --ray`: when the driver dies, even by SIGKILL, the Ray processes it started
die with it (Ray's own agents otherwise outlive a killed driver).

`spawn_watchdog()` starts a small process in its own session that holds the read end of a pipe whose write
end only the driver holds. While the driver lives, the watchdog records the driver's descendants (Ray's GCS,
raylet, agents, workers: (pid, start time), so a reused pid is never touched); when the pipe reaches EOF (the
driver exited, however), it terminates every recorded process still alive, then kills what is left after
`GRACE_S`.

    watchdog = spawn_watchdog()     # after ray.init: the processes to watch exist
    ...
    watchdog.stop()                 # normal exit: ray.shutdown() already stopped them; stragglers are ended
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

GRACE_S = 3.0
POLL_S = 0.5


class Watchdog:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def stop(self, timeout: float = 10.0) -> None:
        """Close the pipe (as the driver's death would) and wait for the watchdog to finish its cleanup."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def spawn_watchdog(driver_pid: int | None = None) -> Watchdog:
    """Start the watchdog for `driver_pid` (default: this process), which must hold the pipe's write end."""
    pid = os.getpid() if driver_pid is None else driver_pid
    # run as a plain script: importing the specrt.serve package (FastAPI, ONNX Runtime) would take seconds
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(pid)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return Watchdog(proc)


def _descendants(pid: int, seen: dict[int, float]) -> None:
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        if child.pid == os.getpid():
            continue
        try:
            seen.setdefault(child.pid, child.create_time())
        except psutil.Error:
            pass


def end_processes(seen: dict[int, float], grace_s: float = GRACE_S) -> None:
    """Terminate the recorded processes (and their children) still alive as the same process, then kill."""
    import psutil

    procs = []
    for pid, started in seen.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - started) < 1e-3:
                procs += [p, *p.children(recursive=True)]
        except psutil.Error:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


def main(driver_pid: int) -> None:
    seen: dict[int, float] = {}
    closed = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.buffer.read()  # returns when every write end is closed: the driver is gone or done
        closed.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    while not closed.wait(POLL_S):
        _descendants(driver_pid, seen)
    end_processes(seen)


if __name__ == "__main__":
    main(int(sys.argv[1]))

"""The explorer's lifecycle as a reader runs it: ``make explore`` prints its URL, serves the page, and
nothing it started (launcher, Voilà, a page's kernel, their temporary folders) outlives its stop.

On the small registered run of ``analysis_fixtures`` (all four states; the browser test covers the smoke
book's page): each page load starts a kernel, and that kernel is what must not be left behind.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from analysis_fixtures import build_run

from cropcop_utils.core.config import REPO_ROOT
from cropcop_utils.explorer import app as explorer_app

URL_TIMEOUT_S = 240  # make, the launcher's imports, Voilà's start: ~40 s measured on a busy 2-core machine
KERNEL_TIMEOUT_S = 180
URL_LINE = re.compile(r"open (http://\S+) \(Ctrl-C stops it\)")  # what `explore` prints


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    return build_run(tmp_path_factory.mktemp("explorer_lifecycle"))


def _as_a_terminal_job() -> None:
    # An interactive shell starts a foreground job with Ctrl-C's default action; a suite launched in the
    # background (`make test &`) ignores SIGINT, and every child would inherit that and never stop
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def fetch_page(url: str) -> str:
    """GET the app's page (this is what starts a kernel); its status must be 200."""
    host, port = url.split("//", 1)[1].strip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=KERNEL_TIMEOUT_S)
    try:
        connection.request("GET", "/")
        response = connection.getresponse()
        body = response.read().decode("utf-8", "replace")
    finally:
        connection.close()
    assert response.status == 200, f"the explorer's page answered {response.status}: {body[:500]}"
    return body


def answers_http(url: str) -> bool:
    try:
        fetch_page(url)
        return True
    except (OSError, http.client.HTTPException, AssertionError):
        return False


@dataclass
class Started:
    """What a running app had started, seen while it ran."""

    processes: list[psutil.Process]  # every descendant of the launched process
    kernels: list[psutil.Process]
    notebook_folder: Path  # the kernels' working folder: the parameterised copy's temporary folder
    connection_dir: Path  # Voilà's folder of kernel connection files


def started_by(root_pid: int) -> Started:
    """The process tree under ``root_pid`` once a page's kernel runs in it (waits for the kernel)."""
    deadline = time.monotonic() + KERNEL_TIMEOUT_S
    while True:
        processes = psutil.Process(root_pid).children(recursive=True)
        kernels = [p for p in processes if _is_kernel(p)]
        if kernels:
            break
        assert time.monotonic() < deadline, f"no kernel started under {root_pid} after the page load"
        time.sleep(0.5)
    command = kernels[0].cmdline()
    connection_file = Path(command[command.index("-f") + 1])
    return Started(processes=processes, kernels=kernels, notebook_folder=Path(kernels[0].cwd()),
                   connection_dir=connection_file.parent)


def _is_kernel(process: psutil.Process) -> bool:
    try:
        return any("ipykernel" in part for part in process.cmdline())
    except psutil.Error:
        return False


def still_running(processes: list[psutil.Process]) -> list[str]:
    """Those still alive (a zombie waits only for its parent to reap it: not running)."""
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{process.pid} {' '.join(process.cmdline()[:4])}")
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.slow
def test_kernels_are_gone_when_the_server_stops(run, tmp_path: Path) -> None:
    with explorer_app.serving(run.run_dir, log_path=tmp_path / "voila.log") as server:
        assert "<title>explore_errors</title>" in fetch_page(server.url)  # the explorer notebook's page
        started = started_by(server.process.pid)
        assert started.notebook_folder == server.notebook.parent
        assert started.connection_dir.is_dir()
    # No grace period: Voilà shuts its kernels down (and waits for them) before it exits, and `serving`
    # waits for Voilà.  A Voilà killed instead leaves its kernels until they notice, and its folder.
    assert server.process.poll() is not None
    left = still_running(started.processes)
    for process in started.processes:  # nothing of a failed check stays behind on the machine
        if still_running([process]):
            process.kill()
    assert not left, f"left running: {left}"
    assert not started.notebook_folder.exists() and not started.connection_dir.exists()
    assert not answers_http(server.url)


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGHUP], ids=["ctrl-c", "closed-terminal"])
def test_make_explore_serves_the_page_and_stops_everything(run, tmp_path: Path, stop: signal.Signals) -> None:
    """``make explore RUN_DIR=... PORT=...`` as a reader types it; stopped the way a terminal stops it."""
    port = explorer_app.free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout is a pipe, as in `| tee`
    # -o: the venv stamp is taken as it is (`make test` refreshed it already; no pip run inside a test)
    command = ["make", "--no-print-directory", "-o", ".venv/.installed", "explore",
               f"RUN_DIR={run.run_dir}", f"PORT={port}"]
    make = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_as_a_terminal_job,
                            start_new_session=True)  # its own group, as a terminal's foreground job
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(make.stdout), daemon=True)
    reader.start()
    started = None
    try:
        deadline = time.monotonic() + URL_TIMEOUT_S
        url = None
        while url is None:
            found = [m for line in list(lines) if (m := URL_LINE.search(line))]
            url = found[0].group(1) if found else None
            if url is None:
                assert make.poll() is None, f"make explore exited ({make.returncode}):\n{''.join(lines)}"
                assert time.monotonic() < deadline, f"no URL line within {URL_TIMEOUT_S} s:\n{''.join(lines)}"
                time.sleep(0.3)
        assert url == f"http://127.0.0.1:{port}/"
        assert "<title>explore_errors</title>" in fetch_page(url)
        started = started_by(make.pid)
        os.killpg(make.pid, stop)  # what the terminal sends to its foreground group
        make.wait(timeout=120)
        psutil.wait_procs(started.processes, timeout=60)  # make may exit before its children are done
    finally:
        if make.poll() is None:  # the test's own clean-up on a failure: a stop, then a kill
            os.killpg(make.pid, signal.SIGTERM)
            try:
                make.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(make.pid, signal.SIGKILL)
        reader.join(timeout=10)
    log = "".join(lines)
    left = still_running(started.processes)
    for process in started.processes:  # nothing of a failed check stays behind on the machine
        if still_running([process]):
            process.kill()
    assert not left, f"left running: {left}\n{log}"
    assert not started.notebook_folder.exists(), f"{started.notebook_folder} outlived the app\n{log}"
    assert not started.connection_dir.exists(), f"{started.connection_dir} outlived the app\n{log}"
    assert not answers_http(url)

"""The error explorer on one run folder as a Voilà app: ``python -m cropcop_utils explore --run-dir DIR``.

The explorer notebook is copied with its parameters injected (papermill's prepare-only mode: nothing
executes) into a temporary folder, so a reader never edits a cell to point it at a run; Voilà executes
that copy in a fresh kernel for each page load and shows only its outputs and widgets.  The server
listens on 127.0.0.1 only, its cells run under a time limit, and :func:`serving` always stops it: with
SIGTERM, on which Voilà shuts its kernels down and removes its connection files.  Voilà ignores a closed
terminal's SIGHUP (this process, which gets it too, stops Voilà as above) and, on Linux, gets SIGTERM if
this process dies first (``PR_SET_PDEATHSIG``), so no server or kernel outlives the app.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..core.config import REPO_ROOT

NOTEBOOK = REPO_ROOT / "notebooks" / "explore_errors.ipynb"
HOST = "127.0.0.1"  # never a public interface: the app reads a run folder and the corpus it points at
CELL_TIMEOUT_S = 600   # one cell loads and verifies a run; minutes at most even on a real corpus
KERNEL_START_TIMEOUT_S = 120
SERVER_START_TIMEOUT_S = 180  # Voilà imports jupyter_server and its extensions first (slow on a busy machine)


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    notebook: Path  # the parameterised copy Voilà serves


def prepare(run_dir: str | os.PathLike, folder: str | os.PathLike, state: str = "pte",
            max_images: int = 12) -> Path:
    """Write the explorer notebook into ``folder`` with ``run_dir`` (absolute) and the app's parameters."""
    import papermill

    target = Path(folder) / NOTEBOOK.name
    # the kernel's working folder is the copy's folder, so the run folder must not be relative
    parameters = {"run_dir": str(Path(run_dir).resolve()), "state": state, "max_images": int(max_images),
                  "static_view": False}
    papermill.execute_notebook(str(NOTEBOOK), str(target), parameters=parameters, prepare_only=True,
                               kernel_name="python3", progress_bar=False)
    return target


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def voila_command(notebook: str | os.PathLike, port: int) -> list[str]:
    """Voilà on ``notebook``: loopback only, no browser opened, bounded cells, tracebacks shown."""
    return [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}",
            f"--Voila.ip={HOST}", "--Voila.port_retries=0", "--show_tracebacks=True",
            f"--NotebookClient.timeout={CELL_TIMEOUT_S}",
            f"--NotebookClient.startup_timeout={KERNEL_START_TIMEOUT_S}"]


def _wait_listening(process: subprocess.Popen, port: int, timeout_s: float) -> None:
    # a TCP connect, not an HTTP GET: every GET of the page starts a kernel and runs the notebook
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Voilà exited with status {process.returncode} before listening on "
                               f"port {port}")
        try:
            with socket.create_connection((HOST, port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"Voilà did not listen on {HOST}:{port} within {timeout_s:.0f} s")


def _server_preexec() -> Callable[[], None]:
    """What Voilà's process does between fork and exec (Linux: see the module docstring)."""
    prctl = None
    if sys.platform.startswith("linux"):
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: no imports after the fork

    def preexec() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # kept across exec; this process stops Voilà instead
        if prctl is not None:
            prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG: SIGTERM when the launcher dies

    return preexec


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()  # Voilà shuts its kernels down on SIGTERM
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@contextmanager
def serving(run_dir: str | os.PathLike, port: int | None = None, state: str | None = None,
            max_images: int = 12, log_path: str | os.PathLike | None = None,
            start_timeout_s: float = SERVER_START_TIMEOUT_S) -> Iterator[Server]:
    """Run the app on ``run_dir`` until the block ends; the server (and its kernels) is then stopped.

    The run folder is opened first, so a wrong path or an unfinished run fails here with the explorer's
    message, not inside a page.  ``state`` None: the last state the run has (the ``.pte`` once it exists).
    """
    from .logic import load

    data = load(run_dir)
    state = state or data.states[-1]
    if state not in data.states:
        raise ValueError(f"state {state!r} has no predictions in {run_dir}; available: "
                         f"{', '.join(data.states)}")
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="cropcop-explorer-") as folder:
        notebook = prepare(run_dir, folder, state, max_images)
        log = open(log_path, "ab") if log_path else None  # noqa: SIM115 (closed in finally)
        process = subprocess.Popen(voila_command(notebook, port), cwd=folder, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT if log else None,
                                   preexec_fn=_server_preexec() if os.name == "posix" else None)
        try:
            _wait_listening(process, port, start_timeout_s)
            yield Server(url=f"http://{HOST}:{port}/", process=process, notebook=notebook)
        finally:
            _stop(process)
            if log:
                log.close()


def _say(line: str) -> None:
    print(line, flush=True)  # the URL line must reach a pipe (`make explore | tee`, a test) at once


def serve(run_dir: str | os.PathLike, port: int | None = None, state: str | None = None, max_images: int = 12,
          say: Callable[[str], None] = _say) -> int:
    """The ``explore`` command: serve until Ctrl-C, SIGTERM, SIGHUP or Voilà's own exit, then stop Voilà."""
    # SIGTERM (a `kill`) and SIGHUP (a closed terminal) unwind like Ctrl-C, so `serving` still stops the
    # server and removes the notebook's temporary folder
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), lambda *_: sys.exit(0))
    with serving(run_dir, port, state, max_images) as server:
        say(f"Error explorer on {Path(run_dir).resolve()}: open {server.url} (Ctrl-C stops it)")
        try:
            return server.process.wait()
        except KeyboardInterrupt:
            say("stopping the explorer")
            return 0

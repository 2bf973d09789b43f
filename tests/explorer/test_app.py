"""The explorer's launcher: the parameterised notebook copy, the loopback-only server, its stop."""

from __future__ import annotations

import socket
from pathlib import Path

import nbformat
import pytest
from analysis_fixtures import build_run

from cropcop_utils.__main__ import build_parser
from cropcop_utils.explorer import app as explorer_app


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    return build_run(tmp_path_factory.mktemp("explorer_app"))


def test_prepare_injects_the_run_without_executing(run, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(run.run_dir.parent)
    notebook = explorer_app.prepare(Path(run.run_dir.name), tmp_path, state="int8", max_images=5)
    copy = nbformat.read(notebook, as_version=4)
    injected = [c for c in copy.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1
    source = injected[0].source
    assert f"run_dir = {str(run.run_dir)!r}".replace("'", '"') in source  # made absolute
    assert 'state = "int8"' in source and "max_images = 5" in source and "static_view = False" in source
    assert all(not c.get("outputs") for c in copy.cells if c.cell_type == "code")  # prepared, not run


def test_voila_listens_on_loopback_only() -> None:
    command = explorer_app.voila_command("x.ipynb", 8123)
    assert "--Voila.ip=127.0.0.1" in command and "--port=8123" in command and "--no-browser" in command
    assert not any("0.0.0.0" in part for part in command)
    assert any(part.startswith("--NotebookClient.timeout=") for part in command)


def test_cli_names_the_explore_command() -> None:
    args = build_parser().parse_args(["explore", "--run-dir", "runs/x", "--port", "8999"])
    assert (args.command, args.run_dir, args.port, args.state) == ("explore", "runs/x", 8999, None)


def test_a_wrong_run_folder_fails_before_any_server(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a CropCop run folder"):
        with explorer_app.serving(tmp_path / "nowhere"):
            pass
    with pytest.raises(ValueError, match="available"):
        with explorer_app.serving(build_run(tmp_path, states=("reference",)).run_dir, state="pte"):
            pass


@pytest.mark.slow
def test_server_listens_then_stops(run, tmp_path: Path) -> None:
    log = tmp_path / "voila.log"
    with explorer_app.serving(run.run_dir, log_path=log) as server:
        assert server.url.startswith("http://127.0.0.1:")
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        assert server.process.poll() is None and server.notebook.is_file()
        assert _answers_http(port)  # the check below can see a live server
    assert server.process.poll() is not None, "the server outlived its block"
    assert not server.notebook.exists()  # the temporary copy is gone with it
    # Not "nothing listens there": under pytest-xdist another worker's Jupyter kernels may bind the freed
    # port.  What must be gone is a web server answering on it.
    assert not _answers_http(port), f"something still serves HTTP on the explorer's port {port}"


def _answers_http(port: int) -> bool:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
    try:
        connection.request("GET", "/")
        return connection.getresponse().status < 500
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()

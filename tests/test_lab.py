"""`make lab`, started headless once for this module: it prints a URL that opens notebook 01, serves the
notebook and its images, and a save from the lab writes exactly the clean file the repo holds. `make workshop`
opens the student edition's notebook 01 the same way."""

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

import test_project

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "notebooks/01_linear.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
TOKEN = secrets.token_hex(16)
START_TIMEOUT = 120  # seconds; a loaded CI machine is slow to import JupyterLab


@dataclass
class Lab:
    base: str
    port: int
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


@contextmanager
def _exclusive(timeout: float = 600):
    """One lab test run at a time per checkout: two servers saving notebook 01 at once would trip each other."""
    if fcntl is None:  # not POSIX: no lock
        yield
        return
    key = hashlib.sha256(str(REPO).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"transformer-from-scratch-lab-{key}.lock", "w") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, f"another lab test run held the lock for {timeout} s"
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def _started(target: str, log: Path):
    """`make <target>` running headless on a free port, until the block ends."""
    port = _free_port()
    args = f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={TOKEN}"
    with _exclusive():
        with log.open("wb") as out:  # a file, not a pipe: nobody has to drain it while the tests run
            process = subprocess.Popen(["make", "--no-print-directory", target, f"LAB_ARGS={args}"], cwd=REPO,
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while _request(f"{base}/api/status")[0] != 200 or "Use Control-C" not in log.read_text(errors="replace"):
                assert process.poll() is None, f"make {target} exited early:\n{log.read_text(errors='replace')}"
                assert time.monotonic() < deadline, f"JupyterLab did not start within {START_TIMEOUT} s"
                time.sleep(0.5)
            yield Lab(base, port, log)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with _started("lab", tmp_path_factory.mktemp("lab") / "make_lab.log") as started:
        yield started


def test_make_workshop_opens_the_student_edition_of_notebook_01(tmp_path):
    """`make workshop` writes the exercise edition (keeping a learner's edits) and opens its notebook 01."""
    student = "notebooks/student/01_linear.ipynb"
    with _started("workshop", tmp_path / "make_workshop.log") as workshop:
        urls = re.findall(rf"https?://[^\s/]+:{workshop.port}\S*", workshop.log.read_text(errors="replace"))
        assert urls and all(f"/lab/tree/{student}?token=" in url for url in urls), urls
        status, body = _request(f"{workshop.base}/api/contents/{student}")
        assert status == 200 and "YOUR CODE HERE" in body.decode()
        assert _request(f"{workshop.base}/api/contents/notebooks/student/my_transformer/linear.py")[0] == 200


_saved: list[bytes] = []  # what the current test's saves wrote to notebook 01


@contextmanager
def _notebook_restored():
    """Yield notebook 01's bytes; put them back afterwards whatever happens (and drop a new checkpoint).

    Once the test's own save has landed, only that save is undone: an edit someone made meanwhile stays.
    The bytes go back in one rename, so nobody reading the notebook meanwhile sees half a file.
    """
    path, checkpoints = REPO / NOTEBOOK, REPO / "notebooks" / ".ipynb_checkpoints"
    before, had_checkpoints = path.read_bytes(), checkpoints.exists()
    _saved.clear()
    try:
        yield before
    finally:
        now = path.read_bytes() if path.exists() else None
        if now != before and (now is None or not _saved or now in _saved):
            restore = path.with_name(f".{path.name}.{os.getpid()}.restore")
            restore.write_bytes(before)
            os.replace(restore, path)
        if not had_checkpoints:
            shutil.rmtree(checkpoints, ignore_errors=True)


def _open_in_jupyterlab(lab: Lab) -> dict:
    """Notebook 01 as JupyterLab holds it after opening it and running it: what its autosave sends back."""
    status, body = _request(f"{lab.base}/api/contents/{NOTEBOOK}")
    assert status == 200
    notebook = json.loads(body)["content"]
    notebook["metadata"]["language_info"]["version"] = "3.11.7"  # the kernel's, filled in on opening
    views = [output["data"][WIDGET_VIEW] for cell in notebook["cells"] for output in cell.get("outputs", [])
             if WIDGET_VIEW in output.get("data", {})]
    assert views, f"{NOTEBOOK} no longer shows a widget: this test would not exercise widget ids"
    for view in views:
        view["model_id"] = uuid.uuid4().hex  # live models, which no later kernel has
    notebook["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {view["model_id"]: {"model_module": "@jupyter-widgets/controls", "model_name": "FloatSliderModel",
                                     "model_module_version": "2.0.0", "state": {"value": 1.0}} for view in views},
        "version_major": 2, "version_minor": 0}}
    return notebook


def _save_from_jupyterlab(lab: Lab, notebook: dict) -> None:
    status, body = _request(f"{lab.base}/api/contents/{NOTEBOOK}", "PUT",
                            {"type": "notebook", "format": "json", "content": notebook})
    _saved.append((REPO / NOTEBOOK).read_bytes())
    assert status == 200, body.decode(errors="replace")


def test_make_lab_prints_a_url_that_opens_notebook_01(lab):
    urls = re.findall(rf"https?://[^\s/]+:{lab.port}\S*", lab.log.read_text(errors="replace"))
    assert urls and all(f"/lab/tree/{NOTEBOOK}?token=" in url for url in urls), urls


def test_make_lab_serves_notebook_01(lab):
    page_status, page = _request(f"{lab.base}/lab/tree/{NOTEBOOK}")
    assert page_status == 200
    assert _request(f"{lab.base}/api/contents/{NOTEBOOK}")[0] == 200
    assert _request(f"{lab.base}/api/contents/images/architecture_linear.svg")[0] == 200
    # nbgrader is there for `make student` only: no Nbgrader menus, Validate button or Formgrader in the lab.
    disabled = re.search(rb'"disabledExtensions": \[[^\]]*\]', page)
    assert disabled and b'"@jupyter/nbgrader"' in disabled.group(), "nbgrader's lab extension is enabled"
    assert b'"@jupyterlab/apputils-extension:announcements"' in disabled.group(), "the news pop-up is on"
    assert _request(f"{lab.base}/formgrader")[0] == 404


def test_saving_notebook_01_from_the_lab_writes_the_file_the_repo_holds(lab):
    with _notebook_restored() as before:
        _save_from_jupyterlab(lab, _open_in_jupyterlab(lab))
        assert (REPO / NOTEBOOK).read_bytes() == before, "a save from JupyterLab changed the notebook"
        test_project.test_notebook_is_saved_clean(REPO / NOTEBOOK)


def test_a_learners_change_saved_from_the_lab_is_kept(lab):
    with _notebook_restored() as before:
        notebook = _open_in_jupyterlab(lab)
        cell = next(cell for cell in notebook["cells"] if cell["cell_type"] == "code")
        cell["source"] += "\n# my own note"
        _save_from_jupyterlab(lab, notebook)
        saved = json.loads((REPO / NOTEBOOK).read_text(encoding="utf-8"))
        expected = json.loads(before)
        changed = next(c for c in expected["cells"] if c["id"] == cell["id"])
        changed["source"] = ("".join(changed["source"]) + "\n# my own note").splitlines(keepends=True)
        assert saved == expected, "the save lost or changed something besides the learner's edit"

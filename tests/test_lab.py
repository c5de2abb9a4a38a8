"""`make lab`, started headless once for this module: it prints a URL that opens notebook 01, serves the
notebook and its images, brings back no earlier session's workspace, serves each notebook with the Python version
its kernel will report (so opening it changes nothing), and a save from the lab writes exactly the clean file the
repo holds. `make workshop` opens the student edition's notebook 01 the same way. (``test_browser.py`` opens the
notebooks in Chromium: no unsaved-changes dot, one kernel per notebook, the editions' notes on the first screen.)"""

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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from jupyterlab_server.workspaces_handler import WorkspacesManager

import test_project
from transformer_from_scratch._project import repo_root
from transformer_from_scratch.nbtools.tidy import clean, dumps, opened

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

REPO = repo_root()
NOTEBOOK = "notebooks/01_linear.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
TOKEN = secrets.token_hex(16)
START_TIMEOUT = 120  # seconds; a loaded CI machine is slow to import JupyterLab
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def kernel_language_info() -> dict:
    """The ``language_info`` the python3 kernel of `make lab` (ipykernel, on this interpreter) reports, which
    JupyterLab writes into every notebook it opens as soon as the kernel starts."""
    from ipykernel.ipkernel import IPythonKernel
    return json.loads(json.dumps(IPythonKernel.language_info))


def earlier_session(workspaces: Path, notebook: str) -> None:
    """Write into ``workspaces`` what JupyterLab keeps of an earlier session that had ``notebook`` open (its default
    workspace: the tab and the layout), which a lab that restored it would open again, starting a kernel for it."""
    key = f"notebook:{notebook}"
    workspace = {"data": {"layout-restorer:data": {"main": {"dock": {"type": "tab-area", "currentIndex": 0,
                                                                     "widgets": [key]}, "current": key}},
                          key: {"data": {"path": notebook, "factory": "Notebook"}}},
                 "metadata": {"id": "default"}}
    WorkspacesManager(str(workspaces)).save("default", json.dumps(workspace))


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
def _started(target: str, log: Path, root: Path | None = None, env: dict[str, str] | None = None):
    """`make <target>` running headless on a free port, until the block ends.

    With ``root``, JupyterLab serves that folder instead of the checkout (``LAB_ROOT``), and needs no lock: nothing
    it saves can land in the checkout. ``env`` is added to the environment."""
    port = _free_port()
    args = f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={TOKEN}"
    command = ["make", "--no-print-directory", target, f"LAB_ARGS={args}"] + ([f"LAB_ROOT={root}"] if root else [])
    with _exclusive() if root is None else nullcontext():
        with log.open("wb") as out:  # a file, not a pipe: nobody has to drain it while the tests run
            process = subprocess.Popen(command, cwd=REPO,
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                       env={**os.environ, **(env or {})})
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


EARLIER_NOTEBOOK = "notebooks/02_embedding.ipynb"  # open in the earlier session the lab must not restore


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`make lab`, where JupyterLab's workspaces folder (``JUPYTERLAB_WORKSPACES_DIR``, else ~/.jupyter/lab/workspaces)
    holds an earlier session with notebook 02 open."""
    folder = tmp_path_factory.mktemp("lab")
    earlier_session(folder / "workspaces", EARLIER_NOTEBOOK)
    earlier = {"JUPYTERLAB_WORKSPACES_DIR": str(folder / "workspaces")}
    with _started("lab", folder / "make_lab.log", env=earlier) as started:
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


_saved: list[bytes] = []  # what the current test's saves wrote to its notebook


@contextmanager
def _notebook_restored(notebook: str = NOTEBOOK):
    """Yield the notebook's bytes; put them back afterwards whatever happens (and drop a new checkpoint).

    Once the test's own save has landed, only that save is undone: an edit someone made meanwhile stays.
    The bytes go back in one rename, so nobody reading the notebook meanwhile sees half a file.
    """
    path, checkpoints = REPO / notebook, REPO / "notebooks" / ".ipynb_checkpoints"
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


def _open_in_jupyterlab(lab: Lab, path: str = NOTEBOOK) -> dict:
    """The notebook as JupyterLab holds it after opening it and running it: what its autosave sends back."""
    status, body = _request(f"{lab.base}/api/contents/{path}")
    assert status == 200
    notebook = json.loads(body)["content"]
    # Served with the kernel's language_info, so the kernel's start (which writes it) changes nothing.
    assert notebook["metadata"]["language_info"] == kernel_language_info()
    views = [output["data"][WIDGET_VIEW] for cell in notebook["cells"] for output in cell.get("outputs", [])
             if WIDGET_VIEW in output.get("data", {})]
    assert views or path != NOTEBOOK, f"{NOTEBOOK} no longer shows a widget: this test would not exercise widget ids"
    for view in views:
        view["model_id"] = uuid.uuid4().hex  # live models, which no later kernel has
    notebook["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {view["model_id"]: {"model_module": "@jupyter-widgets/controls", "model_name": "FloatSliderModel",
                                     "model_module_version": "2.0.0", "state": {"value": 1.0}} for view in views},
        "version_major": 2, "version_minor": 0}}
    return notebook


def _save_from_jupyterlab(lab: Lab, notebook: dict, path: str = NOTEBOOK) -> None:
    status, body = _request(f"{lab.base}/api/contents/{path}", "PUT",
                            {"type": "notebook", "format": "json", "content": notebook})
    _saved.append((REPO / path).read_bytes())
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


def test_make_lab_restores_no_earlier_session(lab):
    """Each `make lab` starts with an empty workspace: an earlier session's tabs (and their kernels) stay closed."""
    status, body = _request(f"{lab.base}/lab/api/workspaces")
    assert status == 200
    assert EARLIER_NOTEBOOK not in body.decode(), "JupyterLab would restore the earlier session's notebook"
    status, body = _request(f"{lab.base}/lab/api/workspaces/default")
    assert status == 200 and EARLIER_NOTEBOOK not in body.decode()
    assert _request(f"{lab.base}/api/sessions")[1] == b"[]", "a kernel runs before any notebook was opened"


def test_make_lab_serves_every_notebook_as_its_kernel_will_see_it(lab):
    """The stored files leave out the Python version; the lab serves it (the kernel's), the download is the file."""
    for notebook in (NOTEBOOK, "notebooks/12_kv_cache.ipynb"):
        status, body = _request(f"{lab.base}/api/contents/{notebook}")
        assert status == 200
        assert json.loads(body)["content"]["metadata"]["language_info"] == kernel_language_info(), notebook
        assert _request(f"{lab.base}/files/{notebook}")[1] == (REPO / notebook).read_bytes()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_opening_then_saving_a_notebook_changes_no_byte(notebook):
    """`tidy.opened` (what the lab serves) and `tidy.clean` (what a save keeps) undo each other on every notebook."""
    text = notebook.read_text(encoding="utf-8")
    served = opened(nbformat.reads(text, as_version=nbformat.NO_CONVERT))
    assert served["metadata"]["language_info"] == kernel_language_info()
    assert dumps(clean(served)) == text


def test_opened_leaves_other_kernels_and_languages_alone():
    notebook = {"metadata": {"language_info": {"name": "julia"}}}
    assert opened(notebook) == {"metadata": {"language_info": {"name": "julia"}}}
    assert opened({"metadata": {}}) == {"metadata": {}}
    kept = {"metadata": {"language_info": {"name": "python", "version": "3.12.1"}}}
    assert opened(kept)["metadata"]["language_info"]["version"] == "3.12.1"
    unknown = {"metadata": {"language_info": {"name": "python"}}}
    assert opened(unknown, kernel_version=None) == {"metadata": {"language_info": {"name": "python"}}}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_saving_a_notebook_from_the_lab_writes_the_file_the_repo_holds(lab, notebook):
    """Open, run (its widgets get live ids) and save every notebook through the lab's server: `git status` stays
    clean."""
    path = notebook.relative_to(REPO).as_posix()
    with _notebook_restored(path) as before:
        _save_from_jupyterlab(lab, _open_in_jupyterlab(lab, path), path)
        assert (REPO / path).read_bytes() == before, f"a save from JupyterLab changed {path}"
        test_project.test_notebook_is_saved_clean(REPO / path)


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

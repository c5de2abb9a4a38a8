"""`make lab` serves notebook 01 (and the images it embeds), checked headless over HTTP."""

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def test_make_lab_serves_notebook_01():
    port = _free_port()
    args = f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token="
    lab = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while _status(f"{base}/api/status") != 200:
            assert lab.poll() is None, f"make lab exited early:\n{lab.stdout.read().decode()}"
            assert time.monotonic() < deadline, "JupyterLab did not answer within 90 s"
            time.sleep(0.5)
        assert _status(f"{base}/lab/tree/notebooks/01_linear.ipynb") == 200
        assert _status(f"{base}/api/contents/notebooks/01_linear.ipynb") == 200
        assert _status(f"{base}/api/contents/images/architecture_linear.svg") == 200
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=30)

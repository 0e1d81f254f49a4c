"""State helpers: atomic writes (mode 0600, all or nothing) and an flock
that really excludes another process."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest

from cni_skel.state import FileLock, atomic_write


def test_atomic_write_mode_and_content(tmp_path):
    p = tmp_path / "f"
    atomic_write(str(p), b"one")
    atomic_write(str(p), b"two")
    assert p.read_bytes() == b"two"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["f"], "no temp file left behind"


def test_atomic_write_failure_leaves_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "f"
    atomic_write(str(p), b"old")

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(str(p), b"new")
    assert p.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_file_lock_excludes_another_process(tmp_path):
    lock = tmp_path / "lock"
    marker = tmp_path / "child-got-it"
    child = (
        f"import sys, time; sys.path.insert(0, {os.getcwd()!r})\n"
        "from cni_skel.state import FileLock\n"
        f"with FileLock({str(lock)!r}):\n"
        f"    open({str(marker)!r}, 'w').write(str(time.monotonic()))\n"
    )
    with FileLock(str(lock)):
        proc = subprocess.Popen([sys.executable, "-c", child])
        time.sleep(0.5)
        assert not marker.exists(), "the child must wait for our lock"
        released = time.monotonic()
    assert proc.wait(timeout=10) == 0
    assert float(marker.read_text()) >= released
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600

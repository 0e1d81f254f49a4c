"""On-disk state: an flock-based lock and atomic file writes.

Runtimes run different containers' operations at once (spec section
"Lifecycle"), so plugin state shared across containers is changed only under
`FileLock`, and every file is replaced atomically (`atomic_write`) so a crash
never leaves a half-written one. Stdlib only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["FileLock", "atomic_write"]


class FileLock:
    """Exclusive ``flock(2)`` on ``path`` (created 0600 if missing), as a
    context manager. The same file the Go host-local locks, so Go and Python
    plugins exclude each other. Blocks until the lock is free."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def atomic_write(path: str, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically: temp file in the same
    directory, fsync, chmod ``mode``, rename over, fsync the directory.

    ``durable=False`` skips both fsyncs: still atomic (readers see the old
    file or the new one, never a part), but a power loss may forget the
    write. For state that does not outlive a reboot in any useful way (IPAM
    allocations of pods that die with the node, as Go's host-local, which
    never syncs); an fsync costs 5-20 ms on a busy disk, held under a lock.

    Raises:
        OSError: from the filesystem; ``path`` is then unchanged.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = _temp_file(directory)
    try:
        with os.fdopen(fd, "wb") as fp:
            fp.write(data)
            fp.flush()
            os.fchmod(fp.fileno(), mode)
            if durable:
                os.fsync(fp.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _temp_file(directory: str, prefix: str = ".tmp-") -> tuple[int, str]:
    """``tempfile.mkstemp(prefix=prefix, dir=directory)`` without importing
    tempfile (shutil, bz2, lzma...: a one-shot plugin pays each import): a new
    file, mode 0600, opened O_EXCL, never through a symlink."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        name = os.path.join(directory, prefix + os.urandom(6).hex())
        try:
            return os.open(name, flags, 0o600), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name in {directory}")

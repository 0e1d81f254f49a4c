"""On-disk state: directories held open, files never reached through a
symlink, an flock-based lock, atomic writes, and the clean-up of what a
killed writer leaves.

Runtimes run different containers' operations at once (spec section
"Lifecycle"), so plugin state shared across containers is changed only under
`FileLock`, and every file is replaced atomically (`StateDir.write`) so a
crash never leaves a half-written one.

Safety rules, whatever the caller's umask and whoever can write nearby:

* A configured directory (a plugin's ``dataDir``) is opened once by path
  (`StateDir.open`: symlinks in it are followed, as an admin may have
  ``/var/run -> /run``); everything below it is reached through that
  directory's fd and opened with ``O_NOFOLLOW``. A symlink planted under it
  is refused: `OSError` with errno ``ELOOP``, `SYMLINK_REFUSED` as strerror
  and the full path as filename; nothing is read or written through it.
* Everything created here gets the mode the caller names, set with
  ``fchmod`` after creation, so the umask can neither widen nor narrow it.
  Directories made by `StateDir.open` and `StateDir.subdir` get
  ``create_mode``; atomic writes' temp files are 0600 until they get the
  target's mode; lock files are 0600.
* Temp files of atomic writes are named ``.tmp-<12 hex>`` and flocked by
  their writer while they exist under that name, so `StateDir.remove_stale_temps`
  can tell a killed writer's leftover (nobody holds its flock) from a write in
  progress, without a directory lock.

Reads take the whole file, whatever its size. Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from types import TracebackType

__all__ = ["NAME_MAX", "SYMLINK_REFUSED", "TEMP_PREFIX", "FileLock", "StateDir",
           "atomic_write", "attachment_file_name", "collect_attachment_files", "is_refused"]

#: Bytes of one file name (Linux).
NAME_MAX = 255

#: strerror of the `OSError` (errno ELOOP) raised for a symlink in a state directory.
SYMLINK_REFUSED = "is a symbolic link (state files are never read or written through one)"
#: Name prefix of atomic writes' temp files.
TEMP_PREFIX = ".tmp-"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted in the store must not hang the plugin.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def is_refused(exc: OSError) -> bool:
    """``exc`` is the refusal of a symlink (see `SYMLINK_REFUSED`)."""
    return exc.errno == errno.ELOOP


def _refused(path: str) -> OSError:
    return OSError(errno.ELOOP, SYMLINK_REFUSED, path)


def _read_all(fd: int) -> bytes:
    """Everything from ``fd`` to end of file."""
    chunks = []
    size = max(os.fstat(fd).st_size + 1, 4096)
    while True:
        chunk = os.read(fd, size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


class FileLock:
    """Exclusive ``flock(2)`` on ``path`` (relative to ``dir_fd`` when
    given), as a context manager; blocks until the lock is free. The file is
    created 0600 (whatever the umask) when missing, never opened through a
    symlink (`OSError` ELOOP, see `SYMLINK_REFUSED`), and must be a regular
    file. ``display`` names it in errors (default ``path``). The same file
    the Go host-local locks, so Go and Python plugins exclude each other."""

    def __init__(self, path: str, *, dir_fd: int | None = None,
                 display: str | None = None) -> None:
        self.path = path
        self.dir_fd = dir_fd
        self.display = display or path
        self._fd: int | None = None

    def _open(self) -> int:
        for _ in range(100):
            try:
                return os.open(self.path, _READ_FLAGS, dir_fd=self.dir_fd)
            except FileNotFoundError:
                pass
            try:
                fd = os.open(self.path, _READ_FLAGS | os.O_CREAT | os.O_EXCL, 0o600,
                             dir_fd=self.dir_fd)
            except FileExistsError:
                continue  # created by another process meanwhile: open that one
            os.fchmod(fd, 0o600)
            return fd
        raise FileExistsError(errno.EEXIST, "created and removed over and over", self.display)

    def acquire(self) -> None:
        try:
            fd = self._open()
        except OSError as exc:
            if is_refused(exc):
                raise _refused(self.display) from None
            raise OSError(exc.errno, exc.strerror, self.display) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", self.display)
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


class StateDir:
    """A directory of state files held by its fd (``fd``; ``path`` for
    messages). Every method takes a plain name (one path component) and
    reaches it through the fd, never through a symlink. Errors are `OSError`
    whose filename is the full path; a symlink is refused with errno ELOOP
    (`SYMLINK_REFUSED`). A context manager: closes the fd on exit."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open(cls, path: str, create_mode: int | None = None) -> StateDir:
        """The configured directory ``path`` (symlinks in it are followed:
        the configuration is trusted). With ``create_mode``, missing
        directories along it are created with exactly that mode.

        Raises:
            OSError: FileNotFoundError when missing (and not to be created),
                NotADirectoryError, a symlink refused while creating...
        """
        path = os.path.abspath(path)
        try:
            return cls(os.open(path, _DIR_FLAGS), path)
        except FileNotFoundError:
            if create_mode is None or path == os.path.dirname(path):
                raise
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
        parent = cls.open(os.path.dirname(path), create_mode)
        try:
            return parent.subdir(os.path.basename(path), create_mode)
        finally:
            parent.close()

    def join(self, name: str) -> str:
        """The full path of ``name``, for messages."""
        return os.path.join(self.path, name)

    def _error(self, exc: OSError, name: str) -> OSError:
        """``exc`` naming the full path; ENOTDIR from an O_DIRECTORY open of
        a symlink is a refusal too."""
        path = self.join(name)
        if is_refused(exc):
            return _refused(path)
        if exc.errno == errno.ENOTDIR:
            with contextlib.suppress(OSError):
                if stat.S_ISLNK(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode):
                    return _refused(path)
        return OSError(exc.errno, exc.strerror, path)

    def subdir(self, name: str, create_mode: int | None = None) -> StateDir:
        """Directory ``name`` in this one, never through a symlink; with
        ``create_mode``, created with exactly that mode when missing."""
        created = False
        try:
            if create_mode is not None:
                try:
                    os.mkdir(name, create_mode, dir_fd=self.fd)
                    created = True
                except FileExistsError:
                    pass
            fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self.fd)
        except OSError as exc:
            raise self._error(exc, name) from None
        if created:
            assert create_mode is not None
            try:
                os.fchmod(fd, create_mode)  # the umask took bits off, or would have
            except BaseException:
                os.close(fd)
                raise
        return StateDir(fd, self.join(name))

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> StateDir:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- reading -----------------------------------------------------------------

    def names(self) -> list[str]:
        """The directory's entries (``.`` and ``..`` left out)."""
        return os.listdir(self.fd)

    def stat(self) -> os.stat_result:
        """The directory's own stat (of the inode we hold)."""
        return os.fstat(self.fd)

    def exists(self, name: str) -> bool:
        """An entry ``name`` exists, of any type but a symlink (refused).
        One lstat."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._error(exc, name) from None
        if stat.S_ISLNK(st.st_mode):
            raise _refused(self.join(name))
        return True

    def read(self, name: str) -> bytes:
        """The whole regular file ``name``.

        Raises:
            OSError: FileNotFoundError; ELOOP for a symlink; EINVAL "not a
                regular file"; other I/O errors.
        """
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            raise self._error(exc, name) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", self.join(name))
            return _read_all(fd)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self.join(name)) from None
        finally:
            os.close(fd)

    # --- writing -----------------------------------------------------------------

    def lock(self, name: str) -> FileLock:
        """`FileLock` on ``name`` in this directory (keep the directory open
        while it is held)."""
        return FileLock(name, dir_fd=self.fd, display=self.join(name))

    def write(self, name: str, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
        """Replace ``name`` with ``data`` atomically: a flocked temp file in
        this directory, fsync, fchmod ``mode``, rename over, fsync the
        directory. A symlink named ``name`` is replaced, never written
        through.

        ``durable=False`` skips both fsyncs: still atomic (readers see the old
        file or the new one, never a part), but a power loss may forget the
        write. For state that does not outlive a reboot in any useful way (IPAM
        allocations of pods that die with the node, as Go's host-local, which
        never syncs); an fsync costs 5-20 ms on a busy disk, held under a lock.

        Raises:
            OSError: from the filesystem; ``name`` is then unchanged.
        """
        fd, tmp = self._temp()
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, mode)
                if durable:
                    os.fsync(fd)
                os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            finally:
                os.close(fd)  # after the rename: the temp name never exists unlocked
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            if isinstance(exc, OSError):
                raise self._error(exc, name) from None
            raise
        if durable:
            os.fsync(self.fd)

    def unlink(self, name: str) -> bool:
        """Remove ``name`` (a symlink itself, never its target); False when
        it was already gone."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._error(exc, name) from None
        return True

    def probe_write(self) -> None:
        """Create and remove a temp file: a real write (root ignores mode
        bits, a read-only mount does not)."""
        fd, tmp = self._temp()
        try:
            os.unlink(tmp, dir_fd=self.fd)
        finally:
            os.close(fd)

    def _temp(self) -> tuple[int, str]:
        """A new temp file ``.tmp-<hex>``: O_EXCL, mode 0600, flocked (see
        `remove_stale_temps`). Returns (fd, name)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        for _ in range(100):
            name = TEMP_PREFIX + os.urandom(6).hex()
            try:
                fd = os.open(name, flags, 0o600, dir_fd=self.fd)
            except FileExistsError:
                continue
            except OSError as exc:
                raise self._error(exc, name) from None
            try:
                os.fchmod(fd, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_nlink:
                    return fd, name
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # a sweeper removed it before our flock: take another name
        raise FileExistsError(errno.EEXIST, "no free temporary file name", self.path)

    def remove_stale_temps(self) -> list[str]:
        """Remove the temp files of writers that were killed (nobody holds
        their flock); a write in progress keeps its file. A symlink with a
        temp name is removed (no writer makes one); other non-files are
        left. Costs a directory listing: for GC, not for every call.
        Returns what could not be removed ("<path>: <reason>")."""
        problems = []
        for name in self.names():
            if not name.startswith(TEMP_PREFIX):
                continue
            try:
                self._remove_if_stale(name)
            except OSError as exc:
                problems.append(f"{self.join(name)}: {exc.strerror or exc}")
        return problems

    def _remove_if_stale(self, name: str) -> None:
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            if is_refused(exc):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=self.fd)
                return
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # its writer is alive
            with contextlib.suppress(FileNotFoundError):
                now = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                    os.unlink(name, dir_fd=self.fd)
        finally:
            os.close(fd)


def atomic_write(path: str, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
    """`StateDir.write` of ``path``'s last component in its directory (which
    must exist; it is opened by path, the file never through a symlink)."""
    with StateDir.open(os.path.dirname(os.path.abspath(path))) as d:
        d.write(os.path.basename(path), data, mode, durable=durable)


def open_fds() -> set[int]:
    """This process's open file descriptors, as ints. The fd ``listdir`` used
    on ``/proc/self/fd`` is left out: it is closed by the time the names are
    read, and its number is the next one any other open gets."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue
        out.add(int(name))
    return out


# --------------------------------------------------------------------------
# one file per attachment


def attachment_file_name(container_id: str, ifname: str) -> str:
    """``<containerID>_<ifname>.json``, the name Go's tuning gives the file
    it keeps for one attachment; for a container ID so long that the name
    would pass `NAME_MAX`, ``_<sha256 of the ID>_<ifname>.json`` (a leading
    ``_`` no container ID can have). The skel has vetted both parts (no
    ``/``)."""
    name = f"{container_id}_{ifname}.json"
    if len(name.encode()) <= NAME_MAX:
        return name
    return f"_{hashlib.sha256(container_id.encode()).hexdigest()}_{ifname}.json"


def collect_attachment_files(directory: StateDir | str, network: str,
                             keep: Collection[tuple[str, str]],
                             owner: Callable[[bytes], tuple[str, str, str] | None], *,
                             release: Callable[[bytes], bool] | None = None) -> list[str]:
    """GC of a directory of `attachment_file_name` files: remove those of
    ``network`` whose ``(containerID, ifname)`` is not in ``keep``, then
    killed writers' temp files (`StateDir.remove_stale_temps`).

    ``directory``: an open `StateDir`, or the configured path of one
    (opened and closed here; a missing directory has nothing to collect).

    ``owner(content)``: ``(network, containerID, ifname)`` a file records,
    None when it records none (damaged, or another program's): such files,
    files of other networks and files whose name is not their attachment's
    are left alone (a directory may be shared by networks, and by Go's
    plugin). ``release(content)``, when given, is asked before a file of
    an attachment not kept goes (after undoing what it describes, say):
    False keeps it. The caller holds the directory's lock if it has one.

    Returns:
        the problems met, ``"<path>: <reason>"`` (unreadable files, symlinks
        among them); the rest goes on.
    """
    if isinstance(directory, str):
        try:
            opened = StateDir.open(directory)
        except FileNotFoundError:
            return []
        except OSError as exc:
            return [f"{directory}: {exc.strerror or exc}"]
        with opened:
            return collect_attachment_files(opened, network, keep, owner, release=release)
    problems: list[str] = []
    try:
        names = sorted(directory.names())
    except OSError as exc:
        return [f"{directory.path}: {exc.strerror or exc}"]
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            owned = owner(directory.read(name))
        except FileNotFoundError:
            continue  # removed meanwhile (a DEL)
        except OSError as exc:
            problems.append(f"{directory.join(name)}: {exc.strerror or exc}")
            continue
        if owned is None:
            continue
        net, cid, ifname = owned
        if net != network or name != attachment_file_name(cid, ifname) or (cid, ifname) in keep:
            continue
        try:
            if release is not None and not release(directory.read(name)):
                continue
            directory.unlink(name)
        except OSError as exc:
            problems.append(f"{directory.join(name)}: {exc.strerror or exc}")
    try:
        problems.extend(directory.remove_stale_temps())
    except OSError as exc:
        problems.append(f"{directory.path}: {exc.strerror or exc}")
    return problems

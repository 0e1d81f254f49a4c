"""host-local's on-disk store, byte-compatible with the Go plugin's.

Layout (Go backend/disk/backend.go), one directory per network:

    <dataDir>/<network>/<ip>                  "<containerID>\\r\\n<ifname>"
    <dataDir>/<network>/last_reserved_ip.<n>  the address last reserved in range set n
    <dataDir>/<network>/lock                  flock(2)ed around every read-modify-write

Files written by Go host-local before ifnames were recorded hold the
container ID alone; they belong to that container whatever its ifname
(`Owner.ifname` is None), as in Go. The caller holds `Store.lock` around
every method but `exists`/`ensure`. Writes go through
`cni_skel.state.StateDir.write` (unsynced, like Go's writes: a power loss
may forget an allocation, whose pod is gone after the reboot anyway), so a
crash leaves either no file or a whole one (and at worst a ``.tmp-*``
leftover, which GC removes: `Store.remove_temp_files`). Files are read
whole, whatever their length: a container ID has no length limit in the
spec.

Files and modes, set explicitly whatever the umask (Go: directories 0755,
files 0644 and a 0750 lock, all minus the umask): ``dataDir`` and any
missing parent we create, and the network directory, 0755 (as Go); address
files, ``last_reserved_ip.N``, ``lock`` 0600 (they name containers; only
root, which runs the plugins, needs them); temp files 0600; our index
directory 0700, its files 0600. Directories that already exist keep their
mode.

Symlinks: ``dataDir`` is configuration and is followed; the network
directory and everything in it are opened through directory fds with
``O_NOFOLLOW``. A symlink where the network directory, ``lock``,
``last_reserved_ip.N`` or an address file should be is refused with
`OSError` ELOOP naming its path (`cni_skel.state.SYMLINK_REFUSED`; the verbs
answer code 5), and nothing is read or written through it. A symlink in
place of our index directory only disables the index (every call scans).

The owner index (ours only; Go neither writes nor needs it). Finding a
container's addresses in Go's layout means reading every file, so each verb
would cost O(allocations). We keep, next to Go's files, a cache of who holds
what, so ADD, CHECK and DEL read two small files whatever the store's size:

    <network>/.cni-skel-index/stamp  "<MAGIC> <dev> <ino> <mtime_ns> <len>:<crc>,... <crc>"
    <network>/.cni-skel-index/bNN    "<MAGIC> bucket" then "<key>\\t<ip>" lines

A container ID hashes to one of 61 buckets; ``key`` is the escaped ID, plus
``/<ifname>`` unless the file is an old ID-only one. The stamp gives each
bucket's length and CRC-32, and ends with its own CRC. The index is trusted
only while the network directory's (st_dev, st_ino, st_mtime_ns) equal the
stamp's. Every change to the set of allocations, by us or by Go, creates or
removes a file there and so moves the directory's mtime. After our own
changes we *seal*: set the directory's mtime to an odd nanosecond value just
below the kernel's coarse clock (the clock file timestamps come from), read
it back, and record it in the stamp. Any later change, in the same clock
tick or not, stamps the directory with a time at or above that clock, so it
can never look unchanged. (Read back unequal: a filesystem that rounds
times; no stamp is written and every call scans, as before.) Index files
are overwritten in place, unsynced: only while the stamp is stale or gone,
so a crash or power loss at worst leaves a stamp that does not match (the
directory moved, or a length or CRC is off). A stale, missing or damaged
index is rebuilt by one scan under the lock, and the addresses it names are
checked against their files before use. Go's directory walks read these
files too: they start with ``#``, which no container ID does, so they never
match a Go key and Go leaves them alone.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import time
import zlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

from cni_skel.env import is_valid_name
from cni_skel.state import StateDir, is_refused

from .allocator import IP

__all__ = [
    "DEFAULT_DATA_DIR",
    "INDEX_DIR",
    "LAST_IP_PREFIX",
    "LINE_BREAK",
    "Owner",
    "Scan",
    "Store",
]

DEFAULT_DATA_DIR = "/var/lib/cni/networks"
LAST_IP_PREFIX = "last_reserved_ip."
LINE_BREAK = "\r\n"
LOCK_NAME = "lock"
DIR_MODE = 0o755    # dataDir and the network directory, as Go
FILE_MODE = 0o600   # address files, last_reserved_ip.N (the lock: cni_skel.state)
INDEX_DIR_MODE = 0o700

INDEX_DIR = ".cni-skel-index"  # a dot name: never an address, never a network
INDEX_MAGIC = "#cni-skel-host-local-index-v1"  # "#": never equal to a Go key
_STAMP = "stamp"
_BUCKETS = 61  # prime: the hash below is the ID's bytes as an integer mod this
_BUCKET_HEAD = INDEX_MAGIC + " bucket\n"
# Linux's CLOCK_REALTIME_COARSE (not in the time module): file timestamps
# are taken from it, or later from a finer clock; never from below it.
_COARSE_CLOCK = getattr(time, "CLOCK_REALTIME_COARSE", 5)


class Owner(NamedTuple):
    """Who holds an address: ``ifname`` None for an old Go file (ID only)."""

    container_id: str
    ifname: str | None

    def matches(self, container_id: str, ifname: str) -> bool:
        """Go's new-format match: exactly this (ID, ifname)."""
        return self.ifname is not None and self.container_id == container_id.strip() \
            and self.ifname == ifname

    def matches_legacy(self, container_id: str) -> bool:
        """Go's fallback: an ID-only file of this container."""
        return self.ifname is None and self.container_id == container_id.strip()


def parse_owner(data: bytes) -> Owner | None:
    """Decode an address file the way Go compares it (whitespace trimmed);
    None when it names nobody (empty)."""
    text = data.decode("utf-8", "surrogateescape").strip()
    if not text:
        return None
    cid, sep, ifname = text.partition(LINE_BREAK)
    return Owner(cid, ifname if sep else None)


def _address(name: str) -> IP | None:
    # Only names that are an address in Go's String() form are allocations;
    # "lock", "last_reserved_ip.N" and temp files are not.
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return None
    return ip if str(ip) == name else None


class Scan(NamedTuple):
    """What `Store.scan` found: ``owners`` maps each allocated address to its
    owner (None: the file names nobody, e.g. empty); ``problems`` maps
    entries named like an address that could not be read (a directory, a
    symlink, an I/O error) to the reason. Both count as taken."""

    owners: dict[IP, Owner | None]
    problems: dict[IP, str]

    def taken(self) -> set[IP]:
        return set(self.owners) | set(self.problems)


class Store:
    """The directory of one network under ``data_dir`` (default
    /var/lib/cni/networks, as Go).

    Raises:
        ValueError: a network name that is not one path component of the
            CNI name charset (the skel rejects those first, with code 7).
    """

    def __init__(self, data_dir: str, network: str) -> None:
        # The skel checked this already; checked again because it becomes a path.
        if not is_valid_name(network):
            raise ValueError(f"invalid network name {network!r}")
        self.data_dir = data_dir or DEFAULT_DATA_DIR
        self.network = network
        self.dir = os.path.join(self.data_dir, network)
        self._sd: StateDir | None = None      # the network directory, held open
        self._idx: _Index | None = None       # the index as this lock section knows it
        self._stamp_mtime: int | None = None  # the mtime in the stamp last read or written

    def path(self, name: str) -> str:
        """``<dir>/<name>``, for messages."""
        return os.path.join(self.dir, name)

    def _d(self) -> StateDir:
        """The network directory, opened on first use (never through a
        symlink) and held until `close`."""
        if self._sd is None:
            with StateDir.open(self.data_dir) as top:
                self._sd = top.subdir(self.network)
        return self._sd

    def close(self) -> None:
        """Let go of the directory (`lock` does at the end of its section)."""
        if self._sd is not None:
            sd, self._sd = self._sd, None
            sd.close()

    def exists(self) -> bool:
        """The network directory exists (DEL, CHECK and GC create nothing).

        Raises:
            OSError: ELOOP when it is a symlink; other errors opening it.
        """
        try:
            self._d()
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def ensure(self) -> None:
        """Create the network directory and missing parents (0755, as Go)."""
        if self._sd is None:
            with StateDir.open(self.data_dir, DIR_MODE) as top:
                self._sd = top.subdir(self.network, DIR_MODE)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """The flock Go takes, ``<dir>/lock`` (the directory must exist), for
        one section; the directory is let go of at its end, and the index is
        re-read in each section.

        Raises:
            OSError: ELOOP when the directory or ``lock`` is a symlink.
        """
        self._idx = None
        try:
            with self._d().lock(LOCK_NAME):
                yield
        finally:
            self.close()

    # --- reading -----------------------------------------------------------

    def scan(self) -> Scan:
        """Every allocation in the directory. Tolerant: an entry that cannot
        be read (a symlink among them) is listed in ``problems`` and the scan
        goes on."""
        owners: dict[IP, Owner | None] = {}
        problems: dict[IP, str] = {}
        try:
            d = self._d()
            names = d.names()
        except FileNotFoundError:
            return Scan(owners, problems)
        for name in names:
            ip = _address(name)
            if ip is None:
                continue
            try:
                owners[ip] = parse_owner(self._read_record(name))
            except OSError as exc:
                problems[ip] = f"{self.path(name)}: {exc.strerror or exc}"
        return Scan(owners, problems)

    def _read_record(self, name: str) -> bytes:
        """The whole address file ``name`` (no length limit: a container ID
        has none); never through a symlink, regular files only."""
        return self._d().read(name)

    def occupied(self, ip: IP) -> bool:
        """An entry named ``ip`` exists, whatever it is (as `scan`, an entry
        that cannot be read counts as taken). One lstat: allocation never
        scans.

        Raises:
            OSError: ELOOP when it is a symlink (planted: refused loudly).
        """
        return self._d().exists(str(ip))

    def last_reserved(self, set_index: int) -> IP | None:
        """``last_reserved_ip.<n>``, None when missing, unreadable or not an
        address (Go then starts the walk at the first range, losing
        round-robin once).

        Raises:
            OSError: ELOOP when it is a symlink.
        """
        try:
            data = self._d().read(f"{LAST_IP_PREFIX}{set_index}")
        except OSError as exc:
            if is_refused(exc):
                raise
            return None
        try:
            return ipaddress.ip_address(data.decode("ascii").strip())
        except ValueError:  # UnicodeDecodeError included
            return None

    # --- writing (under the lock) ---------------------------------------------

    def reserve(self, ip: IP, container_id: str, ifname: str) -> None:
        """Write ``<ip>`` for (ID, ifname), Go's bytes. The caller has checked,
        under the lock, that the address is free."""
        record = f"{container_id.strip()}{LINE_BREAK}{ifname}".encode()
        # unsynced, as Go's: allocations die with the node's pods anyway
        self._d().write(str(ip), record, FILE_MODE, durable=False)

    def set_last_reserved(self, set_index: int, ip: IP) -> None:
        """Record the round-robin position of set N (Go's bytes: the address, no newline)."""
        self._d().write(f"{LAST_IP_PREFIX}{set_index}", str(ip).encode(), FILE_MODE,
                        durable=False)

    def release(self, ip: IP) -> bool:
        """Remove ``<ip>``; False when it was already gone."""
        return self._d().unlink(str(ip))

    def probe_write(self) -> None:
        """Create and remove a temp file in the directory: a real write (root
        ignores mode bits, a read-only mount does not). A fresh index stays
        fresh (sealed again)."""
        idx = self._load_index()
        self._d().probe_write()
        if idx is not None:
            with contextlib.suppress(OSError):
                dfd = self._index_dir()
                try:
                    self._seal(dfd, idx)
                finally:
                    os.close(dfd)

    def remove_temp_files(self) -> list[str]:
        """Remove the temp files of killed writers (`StateDir.remove_stale_temps`;
        under the lock every temp file is one, as every writer holds it).
        Returns what could not be removed."""
        try:
            return self._d().remove_stale_temps()
        except FileNotFoundError:
            return []

    # --- the owner index (under the lock; see the module docstring) -------------

    def owned(self, container_id: str, ifname: str) -> tuple[list[IP], list[IP]]:
        """The addresses of this container: (the files of exactly (ID, ifname),
        the old ID-only files of ID), as a scan would find them, from the
        index (rebuilt first when stale). What the index names is checked
        against the files; a disagreement rebuilds it."""
        idx = self._index()
        if not idx.checked:
            try:
                return self._owned(idx, container_id, ifname, check=True)
            except (_Stale, OSError, ValueError):
                idx = self.rebuild_index(self.scan())
        return self._owned(idx, container_id, ifname, check=False)

    def index_add(self, container_id: str, ifname: str, ips: list[IP]) -> None:
        """Record that (ID, ifname) now holds ``ips`` (written by `reserve`).
        Best effort: on failure the index is left stale and rebuilt next time."""
        ckey = _esc(container_id.strip())
        lines = "".join(f"{ckey}/{_esc(ifname)}\t{ip}\n" for ip in ips)
        self._update(ckey, lambda text: text + lines)

    def index_remove(self, container_id: str, ips: list[IP]) -> None:
        """Record that the container's ``ips`` were released. Best effort."""
        def edit(text: str) -> str:
            for ip in ips:
                pat = f"\t{ip}\n"
                i = text.find(pat)
                if i >= 0:
                    start = text.rfind("\n", 0, i) + 1
                    text = text[:start] + text[i + len(pat):]
            return text

        self._update(_esc(container_id.strip()), edit)

    def rebuild_index(self, scan: Scan) -> _Index:
        """Rebuild the index from ``scan`` (the store as it is now) and write it
        (best effort: when that fails, this locked section still uses it)."""
        groups: dict[int, list[str]] = {}
        for ip, owner in scan.owners.items():
            if owner is None:  # names nobody: no container's
                continue
            ckey = _esc(owner.container_id)
            key = ckey if owner.ifname is None else f"{ckey}/{_esc(owner.ifname)}"
            groups.setdefault(_bucket_of(ckey), []).append(f"{key}\t{ip}\n")
        texts = {b: _BUCKET_HEAD + "".join(sorted(groups.get(b, ()))) for b in range(_BUCKETS)}
        idx = _Index([_summary(t) for t in texts.values()], texts, checked=True)
        self._idx = idx
        try:
            dfd = self._index_dir(create=True)
        except OSError:
            return idx
        try:
            self._write_all(dfd, idx)
        except OSError:
            idx.on_disk = False
        finally:
            os.close(dfd)
        return idx

    def _index(self) -> _Index:
        if self._idx is None:
            self._idx = self._load_index() or self.rebuild_index(self.scan())
        return self._idx

    def _index_dir(self, create: bool = False) -> int:
        """An fd of the index directory (never through a symlink), created
        0700 when ``create``; the caller closes it."""
        return self._d().subdir(INDEX_DIR, INDEX_DIR_MODE if create else None).fd

    def _load_index(self) -> _Index | None:
        """The index when its stamp is whole and matches the directory."""
        try:
            dfd = self._index_dir()
        except OSError:
            return None
        try:
            data = _read_at(dfd, _STAMP)
        except OSError:
            return None
        finally:
            os.close(dfd)
        try:
            text = data.decode("ascii")
            body, check = text.rstrip("\n").rsplit(" ", 1)
            magic, dev, ino, mtime, sums = body.split(" ")
            stamp = (int(dev), int(ino), int(mtime))
            summaries = sums.split(",")
            whole = int(check, 16) == zlib.crc32(body.encode()) and text.endswith("\n")
        except ValueError:  # UnicodeDecodeError included
            return None
        if magic != INDEX_MAGIC or len(summaries) != _BUCKETS or not whole:
            return None
        self._stamp_mtime = stamp[2]
        st = self._d().stat()
        if (st.st_dev, st.st_ino, st.st_mtime_ns) != stamp:
            return None  # the directory changed since we sealed it (Go, a crash, a hand)
        return _Index(summaries, {}, checked=False, on_disk=True)

    def _bucket(self, idx: _Index, b: int) -> str:
        text = idx.texts.get(b)
        if text is None:
            size, crc = _parse_summary(idx.sums[b])
            if size == 0:
                text = _BUCKET_HEAD
            else:
                dfd = self._index_dir()
                try:
                    data = _read_at(dfd, _bucket_name(b))
                finally:
                    os.close(dfd)
                if len(data) != size or zlib.crc32(data) != crc:
                    raise _Stale(f"bucket {b} is not the one the stamp describes")
                text = data.decode("ascii")
            idx.texts[b] = text
        return text

    def _owned(self, idx: _Index, cid: str, ifname: str,
               check: bool) -> tuple[list[IP], list[IP]]:
        ckey = _esc(cid.strip())
        text = self._bucket(idx, _bucket_of(ckey))
        new = [ipaddress.ip_address(t) for t in _find(text, f"{ckey}/{_esc(ifname)}")]
        old = [ipaddress.ip_address(t) for t in _find(text, ckey)]
        if check:
            for ip in new + old:
                owner = parse_owner(self._read_record(str(ip)))
                if owner is None or not (owner.matches(cid, ifname) if ip in new
                                         else owner.matches_legacy(cid)):
                    raise _Stale(f"{ip} is not {cid}'s")
        return new, old

    def _update(self, ckey: str, edit: Callable[[str], str]) -> None:
        """Edit the bucket of ``ckey`` after a change of ours to the
        directory (which made the stamp stale), then seal."""
        idx = self._idx
        if idx is None or not idx.on_disk:
            return  # no trusted index to keep up to date: it stays stale on disk
        b = _bucket_of(ckey)
        try:
            text = edit(self._bucket(idx, b))
            dfd = self._index_dir()
            try:
                _put_bucket(dfd, b, text)
                idx.texts[b] = text
                idx.sums[b] = _summary(text)
                self._seal(dfd, idx)
            finally:
                os.close(dfd)
        except (OSError, ValueError, _Stale):
            idx.on_disk = False

    def _write_all(self, dfd: int, idx: _Index) -> None:
        """Write every bucket (keeping those already right), then seal."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_STAMP, dir_fd=dfd)  # no stamp until every bucket is written
        stray = set(os.listdir(dfd))
        for b in range(_BUCKETS):
            name, text = _bucket_name(b), idx.texts[b]
            if name in stray:
                stray.discard(name)
                try:
                    old = _read_at(dfd, name).decode("ascii")
                except (OSError, ValueError):
                    old = ""
                    _remove(dfd, name)  # not a file (or unreadable): make room
                if old.startswith(_BUCKET_HEAD) and old != _BUCKET_HEAD and \
                        sorted(old.splitlines()) == sorted(text.splitlines()):
                    idx.texts[b] = old  # same entries in another order: keep
                    idx.sums[b] = _summary(old)
                    continue
            elif text == _BUCKET_HEAD:
                continue
            _put_bucket(dfd, b, text)
        for name in stray:  # strangers
            _remove(dfd, name)
        self._seal(dfd, idx)

    def _seal(self, dfd: int, idx: _Index) -> None:
        """Set the directory's mtime to a value no later change can give it and
        record it in the stamp; no stamp when the filesystem rounds it."""
        now = time.clock_gettime_ns(_COARSE_CLOCK)
        chosen = now - 1 if now & 1 == 0 else now - 2  # odd, below the coarse clock
        if chosen == self._stamp_mtime:
            chosen -= 2  # never the value of a stamp that might survive a failure
        d = self._d()
        st = d.stat()
        os.utime(d.fd, ns=(st.st_atime_ns, chosen))
        st = d.stat()
        if st.st_mtime_ns != chosen:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_STAMP, dir_fd=dfd)
            idx.on_disk = False
            return
        body = f"{INDEX_MAGIC} {st.st_dev} {st.st_ino} {chosen} {','.join(idx.sums)}"
        _put(dfd, _STAMP, f"{body} {zlib.crc32(body.encode()):x}\n".encode("ascii"))
        self._stamp_mtime = chosen
        idx.on_disk = True


class _Stale(Exception):
    """The index on disk disagrees with the store."""


class _Index:
    """The index in one locked section: ``sums`` "<length>:<CRC-32 hex>" of
    each bucket file ("0:0": none), ``texts`` the buckets read or built so far.
    ``checked``: built from a scan just now; ``on_disk``: the files are
    current, so changes are written through."""

    __slots__ = ("checked", "on_disk", "sums", "texts")

    def __init__(self, sums: list[str], texts: dict[int, str], checked: bool,
                 on_disk: bool = False) -> None:
        self.sums = sums
        self.texts = texts
        self.checked = checked
        self.on_disk = on_disk


def _esc(text: str) -> str:
    """``text`` as key characters: printable ASCII but space, ``%`` and ``/``
    kept, every other UTF-8 byte %XX (odd bytes of foreign files survive
    through surrogateescape). A valid container ID is kept as is."""
    if text.isascii() and text.isprintable() and " " not in text and "%" not in text \
            and "/" not in text:
        return text
    return "".join(chr(c) if 0x21 <= c <= 0x7E and c not in (0x25, 0x2F) else f"%{c:02X}"
                   for c in text.encode("utf-8", "surrogateescape"))


def _bucket_of(ckey: str) -> int:
    return int.from_bytes(ckey.encode("ascii"), "little") % _BUCKETS


def _bucket_name(b: int) -> str:
    return f"b{b:02d}"


def _summary(text: str) -> str:
    if text == _BUCKET_HEAD:
        return "0:0"
    data = text.encode("ascii")
    return f"{len(data)}:{zlib.crc32(data):x}"


def _parse_summary(field: str) -> tuple[int, int]:
    size, _, crc = field.partition(":")
    return int(size), int(crc, 16)


def _find(text: str, key: str) -> list[str]:
    """The addresses on ``key``'s lines of a bucket."""
    pat = f"\n{key}\t"
    found = []
    i = text.find(pat)
    while i >= 0:
        start = i + len(pat)
        end = text.index("\n", start)
        found.append(text[start:end])
        i = text.find(pat, end)
    return found


def _read_at(dfd: int, name: str) -> bytes:
    """The whole regular file ``name`` of directory ``dfd`` (never a symlink)."""
    return StateDir(dfd, "").read(name)


def _put(dfd: int, name: str, data: bytes) -> None:
    """Overwrite ``name`` in ``dfd`` in place, without fsync. Safe for the
    index: only ever done while the stamp is stale or absent, and what is
    read back is checked against the stamp's lengths and CRCs."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except FileNotFoundError:
        fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, FILE_MODE, dir_fd=dfd)
        try:
            os.fchmod(fd, FILE_MODE)  # whatever the umask
        except BaseException:
            os.close(fd)
            raise
    try:
        view = memoryview(data)
        offset = 0
        while offset < len(data):
            offset += os.pwrite(fd, view[offset:], offset)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _remove(dfd: int, name: str) -> None:
    """Remove a file or an empty directory from ``dfd``, quietly."""
    try:
        os.unlink(name, dir_fd=dfd)
    except IsADirectoryError:
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=dfd)
    except OSError:
        pass


def _put_bucket(dfd: int, b: int, text: str) -> None:
    if text == _BUCKET_HEAD:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_bucket_name(b), dir_fd=dfd)
    else:
        _put(dfd, _bucket_name(b), text.encode("ascii"))

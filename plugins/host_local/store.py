"""host-local's on-disk store, byte-compatible with the Go plugin's.

Layout (Go backend/disk/backend.go), one directory per network:

    <dataDir>/<network>/<ip>                  "<containerID>\\r\\n<ifname>", mode 0600
    <dataDir>/<network>/last_reserved_ip.<n>  the address last reserved in range set n
    <dataDir>/<network>/lock                  flock(2)ed around every read-modify-write

Files written by Go host-local before ifnames were recorded hold the
container ID alone; they belong to that container whatever its ifname
(`Owner.ifname` is None), as in Go. The caller holds `Store.lock` around
every method but `exists`/`ensure`. Writes go through
`cni_skel.state.atomic_write`, so a crash leaves either no file or a whole
one (and at worst a ``.tmp-*`` leftover, which `Store.remove_temp_files`
clears). Stdlib only.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import stat
from typing import NamedTuple

from cni_skel.env import is_valid_name
from cni_skel.state import FileLock, atomic_write

from .allocator import IP

__all__ = [
    "DEFAULT_DATA_DIR",
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
_TEMP_PREFIX = ".tmp-"  # atomic_write's temp files
_MAX_RECORD = 4096  # an ID and an ifname; anything longer is not ours


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
        self.dir = os.path.join(self.data_dir, network)

    def path(self, name: str) -> str:
        """``<dir>/<name>``; callers pass only addresses and our fixed names."""
        return os.path.join(self.dir, name)

    def exists(self) -> bool:
        """The network directory exists (DEL, CHECK and GC create nothing)."""
        return os.path.isdir(self.dir)

    def ensure(self) -> None:
        """Create the network directory (0755, as Go)."""
        os.makedirs(self.dir, mode=0o755, exist_ok=True)

    def lock(self) -> FileLock:
        """The flock Go takes: ``<dir>/lock`` (the directory must exist)."""
        return FileLock(self.path(LOCK_NAME))

    # --- reading -----------------------------------------------------------

    def scan(self) -> Scan:
        """Every allocation in the directory. Tolerant: an entry that cannot
        be read is listed in ``problems`` and the scan goes on."""
        owners: dict[IP, Owner | None] = {}
        problems: dict[IP, str] = {}
        try:
            entries = list(os.scandir(self.dir))
        except FileNotFoundError:
            return Scan(owners, problems)
        for entry in entries:
            ip = _address(entry.name)
            if ip is None:
                continue
            try:
                owners[ip] = parse_owner(self._read_record(entry.path))
            except OSError as exc:
                problems[ip] = f"{entry.path}: {exc.strerror or exc}"
        return Scan(owners, problems)

    @staticmethod
    def _read_record(path: str) -> bytes:
        # O_NOFOLLOW and a regular-file check: we never read through a link
        # planted in the store.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(0, "not a regular file")
            return os.read(fd, _MAX_RECORD)
        finally:
            os.close(fd)

    def last_reserved(self, set_index: int) -> IP | None:
        """``last_reserved_ip.<n>``, None when missing or unreadable (Go then
        starts the walk at the first range, losing round-robin once)."""
        try:
            with open(self.path(f"{LAST_IP_PREFIX}{set_index}"), "rb") as fp:
                text = fp.read(128).decode("ascii", "replace").strip()
            return ipaddress.ip_address(text)
        except (OSError, ValueError):
            return None

    # --- writing (under the lock) ---------------------------------------------

    def reserve(self, ip: IP, container_id: str, ifname: str) -> None:
        """Write ``<ip>`` for (ID, ifname), Go's bytes. The caller has checked,
        under the lock, that the address is free."""
        record = f"{container_id.strip()}{LINE_BREAK}{ifname}".encode()
        atomic_write(self.path(str(ip)), record, 0o600)

    def set_last_reserved(self, set_index: int, ip: IP) -> None:
        """Record the round-robin position of set N (Go's bytes: the address, no newline)."""
        atomic_write(self.path(f"{LAST_IP_PREFIX}{set_index}"), str(ip).encode(), 0o600)

    def release(self, ip: IP) -> bool:
        """Remove ``<ip>``; False when it was already gone."""
        try:
            os.unlink(self.path(str(ip)))
        except FileNotFoundError:
            return False
        return True

    def remove_temp_files(self) -> list[str]:
        """Remove atomic_write leftovers of a crashed writer. Only safe under
        the lock (every writer holds it). Returns what could not be removed."""
        failed = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.dir):
                if entry.name.startswith(_TEMP_PREFIX):
                    try:
                        os.unlink(entry.path)
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        failed.append(f"{entry.path}: {exc.strerror or exc}")
        return failed

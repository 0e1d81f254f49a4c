"""What DEL needs to put a device back as ADD found it:
``<dataDir>/<containerID>_<ifname>.json`` (``dataDir`` default
/run/cni/host-device)::

    {
     "name": "eth1",                 the device's name on the node
     "mtu": 1500,                    its MTU, bytes
     "up": true,                     administratively up (IFF_UP)
     "alias": "",                    its alias (IFLA_IFALIAS) before ours
     "mac": "aa:bb:cc:dd:ee:ff",     to know it again (null without one)
     "network": "net", "containerID": "...", "ifname": "eth0"   for GC
    }

Why a file and not the link alone: the link's alias holds the original
name, exactly as Go writes it, so that Go's DEL can put back a device our
ADD moved and ours one that Go's moved (each then restores what it knows).
An alias holding more than the name would make Go's DEL rename the device
to that text, which it refuses, and fail for ever. The MTU and the up state
have no other place on the link.

Writes are atomic (`cni_skel.state.StateDir.write`: temp file, rename), not
synced (a tmpfs under /run: the pods it describes end with the boot), the
directory 0700 and the files 0600 whatever the umask. ADD and DEL hold
``<dataDir>/lock`` (flock) while they move a device, so that two calls about
the same device never interleave their steps. A file is never read or
written through a symlink.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from cni_skel import netlink
from cni_skel.errors import ERR_IO_FAILURE, CNIError
from cni_skel.state import (
    FileLock,
    StateDir,
    attachment_file_name,
    collect_attachment_files,
)

__all__ = ["Saved", "Store", "listing"]

DIR_MODE = 0o700
FILE_MODE = 0o600
LOCK = "lock"


@dataclass(frozen=True)
class Saved:
    """A device as ADD found it on the node (see the module docstring)."""

    name: str
    mtu: int | None
    up: bool
    alias: str
    mac: str | None
    network: str = ""
    container_id: str = ""
    ifname: str = ""

    @classmethod
    def of(cls, link: netlink.Link, alias: str | None, *, network: str, container_id: str,
           ifname: str) -> Saved:
        return cls(name=link.name, mtu=link.mtu, up=link.up, alias=alias or "", mac=link.mac,
                   network=network, container_id=container_id, ifname=ifname)

    def to_json(self) -> bytes:
        doc = asdict(self)
        doc["containerID"] = doc.pop("container_id")
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Saved | None:
        """The saved device, None for a file that is not one (a damaged file
        restores nothing rather than failing DEL for ever)."""
        try:
            doc = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        name, mtu, up = doc.get("name"), doc.get("mtu"), doc.get("up")
        alias, mac = doc.get("alias"), doc.get("mac")
        if not isinstance(name, str) or not name or not isinstance(up, bool):
            return None
        if not isinstance(mtu, int) or isinstance(mtu, bool) or mtu <= 0:
            mtu = None
        strings = {k: doc.get(k) if isinstance(doc.get(k), str) else ""
                   for k in ("network", "containerID", "ifname")}
        return cls(name=name, mtu=mtu, up=up, alias=alias if isinstance(alias, str) else "",
                   mac=mac if isinstance(mac, str) and mac else None,
                   network=strings["network"], container_id=strings["containerID"],
                   ifname=strings["ifname"])


def _io(what: str, exc: OSError) -> CNIError:
    return CNIError(ERR_IO_FAILURE, f"host-device: {what}: {exc.strerror or exc}",
                    getattr(exc, "filename", None) or "")


class Store:
    """The data dir, open and locked for one call (`open`)."""

    def __init__(self, directory: StateDir | None, lock: FileLock | None) -> None:
        self._dir = directory
        self._lock = lock

    @classmethod
    @contextlib.contextmanager
    def open(cls, data_dir: str, *, create: bool) -> Iterator[Store]:
        """``data_dir`` with its lock held for the block. ``create``: make
        the directory (0700) when missing (ADD); without, a missing one is
        an empty store, unlocked (DEL: nothing of ours to restore).

        Raises:
            CNIError: 5 when the directory or lock can not be opened.
        """
        try:
            directory = StateDir.open(data_dir, DIR_MODE if create else None)
        except FileNotFoundError:
            yield cls(None, None)
            return
        except OSError as exc:
            raise _io(f"cannot open {data_dir}", exc) from None
        with directory:
            try:
                lock = directory.lock(LOCK)
                lock.acquire()
            except OSError as exc:
                raise _io("cannot lock", exc) from None
            try:
                yield cls(directory, lock)
            finally:
                lock.release()

    def read_raw(self, container_id: str, ifname: str) -> bytes | None:
        """The attachment's file as it is, None when there is none.
        Raises CNIError 5 (also for a symlink)."""
        if self._dir is None:
            return None
        try:
            return self._dir.read(attachment_file_name(container_id, ifname))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _io("cannot read the saved device", exc) from None

    def read(self, container_id: str, ifname: str) -> Saved | None:
        """The attachment's saved device, None when none (or damaged)."""
        raw = self.read_raw(container_id, ifname)
        return None if raw is None else Saved.from_json(raw)

    def write_raw(self, container_id: str, ifname: str, data: bytes | None) -> None:
        """Replace the attachment's file with ``data`` (None: remove it).
        Raises CNIError 5."""
        if self._dir is None:
            if data is None:
                return
            raise CNIError(ERR_IO_FAILURE, "host-device: no data directory to save to")
        name = attachment_file_name(container_id, ifname)
        try:
            if data is None:
                self._dir.unlink(name)
            else:
                self._dir.write(name, data, FILE_MODE, durable=False)
        except OSError as exc:
            raise _io("cannot save the device's state" if data else
                      "cannot remove the device's saved state", exc) from None

    def collect(self, network: str, keep: set[tuple[str, str]],
                release: Callable[[Saved], bool] | None = None) -> list[str]:
        """GC: remove files of ``network`` whose (containerID, ifname) is not
        in ``keep`` (and for which ``release(saved)`` says True, when
        given), then killed writers' temp files. Returns the problems met
        ("<path>: <reason>"); the rest goes on."""
        if self._dir is None:
            return []
        gate = None if release is None else (
            lambda raw: (saved := Saved.from_json(raw)) is None or release(saved))
        return collect_attachment_files(self._dir, network, keep, _owner, release=gate)


def _owner(raw: bytes) -> tuple[str, str, str] | None:
    saved = Saved.from_json(raw)
    return None if saved is None else (saved.network, saved.container_id, saved.ifname)


def listing(data_dir: str) -> list[str]:
    """The saved files' names in ``data_dir`` (none when it is missing)."""
    try:
        return sorted(n for n in os.listdir(data_dir) if n.endswith(".json"))
    except OSError:
        return []

"""The saved original values: ``<dataDir>/<containerID>_<ifname>.json``.

Written atomically by ADD before anything is changed, read and removed by
DEL. The link keys are the Go plugin's (``configToRestore``), so either
implementation can restore what the other saved; Go ignores our extra keys::

    {
     "mac": "aa:bb:cc:dd:ee:ff",     original MAC        (only when ADD sets one)
     "promisc": false,               original IFF_PROMISC  (idem)
     "mtu": 1500,                    original MTU, bytes   (idem)
     "allmulti": false,              original IFF_ALLMULTI (idem)
     "txQLen": 1000,                 original queue length, packets (idem)
     "sysctl": {"net/core/somaxconn": "4096"},   originals by /proc/sys path
     "network": "dbnet", "containerID": "...", "ifname": "eth0"   for GC
    }

Files and modes, set explicitly whatever the umask: ``dataDir`` (default
/run/cni/tuning) and any missing parent we create 0700 (Go: 0600 minus the
umask, a directory only root can enter anyway), the saved files 0600 (as
Go), temp files of the atomic writes 0600. A directory that exists keeps
its mode.

``dataDir`` is configuration and is followed; a saved file is never read or
written through a symlink: one planted under its name is refused, code 5
naming the path (`cni_skel.state.SYMLINK_REFUSED`). A killed writer's temp
file (``.tmp-*``) is removed by the next GC (`collect`), whichever network
it runs for; a write in progress keeps its own (it holds its flock).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_IO_FAILURE, CNIError
from cni_skel.state import StateDir, attachment_file_name, collect_attachment_files

__all__ = ["collect", "link_value", "merge", "parse", "path", "put_back", "read_raw",
           "remove", "save", "sysctls"]

LINK_KEYS = ("mac", "promisc", "mtu", "allmulti", "txQLen")
DIR_MODE = 0o700
FILE_MODE = 0o600


def _io(what: str, exc: OSError) -> CNIError:
    return CNIError(ERR_IO_FAILURE, f"tuning: {what}: {exc.strerror or exc}",
                    getattr(exc, "filename", None) or "")


def path(data_dir: str, container_id: str, ifname: str) -> str:
    """The file of one attachment (the skel has vetted both names: no ``/``)."""
    return os.path.join(data_dir, attachment_file_name(container_id, ifname))


def _split(file: str) -> tuple[str, str]:
    return os.path.dirname(file) or ".", os.path.basename(file)


def read_raw(file: str) -> bytes | None:
    """The whole file, None when it (or ``dataDir``) does not exist.
    Raises CNIError 5, also for a symlink."""
    directory, name = _split(file)
    try:
        with StateDir.open(directory) as d:
            return d.read(name)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _io(f"cannot read {file}", exc) from None


def parse(raw: bytes | None) -> dict[str, Any]:
    """The decoded object; {} for None or anything that is not a JSON object
    (a corrupt file restores nothing rather than failing DEL forever)."""
    if raw is None:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        print("tuning: ignoring a saved-values file that is not a JSON object", file=sys.stderr)
        return {}
    return doc


def merge(old: dict[str, Any], network: str, args: CmdArgs, sys_orig: dict[str, str],
          link_orig: dict[str, Any]) -> dict[str, Any]:
    """The new file: values already saved win (a repeated ADD must not take
    the tuned values for the originals), new ones are added."""
    doc = {k: old[k] for k in LINK_KEYS if k in old}
    for key, value in link_orig.items():
        doc.setdefault(key, value)
    saved = sysctls(old)
    for rel, value in sys_orig.items():
        saved.setdefault(rel, value)
    if saved:
        doc["sysctl"] = saved
    doc.update(network=network, containerID=args.container_id, ifname=args.ifname)
    return doc


def _write(file: str, data: bytes) -> None:
    directory, name = _split(file)
    # Not synced: the file lives in /run (tmpfs), gone at a reboot with the
    # pods it describes; Go's tuning never syncs either.
    with StateDir.open(directory, DIR_MODE) as d:
        d.write(name, data, FILE_MODE, durable=False)


def save(file: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` atomically (0600), creating the directory (0700).
    Raises CNIError 5."""
    try:
        _write(file, json.dumps(doc, indent=1).encode())
    except OSError as exc:
        raise _io(f"cannot save the original values to {file}", exc) from None


def put_back(file: str, previous: bytes | None) -> None:
    """Undo `save` after a failed ADD: the earlier content, or no file."""
    try:
        if previous is None:
            remove(file)
        else:
            _write(file, previous)
    except (OSError, CNIError) as exc:
        print(f"tuning: cannot put back {file}: {exc}", file=sys.stderr)


def remove(file: str) -> None:
    """Delete the file (a symlink itself, never its target); missing is
    fine. Raises CNIError 5."""
    directory, name = _split(file)
    try:
        with StateDir.open(directory) as d:
            d.unlink(name)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise _io(f"cannot remove {file}", exc) from None


def link_value(doc: dict[str, Any], key: str) -> Any:
    """A saved link value of the right type, else None (skip it)."""
    value = doc.get(key)
    if key in ("promisc", "allmulti"):
        return value if isinstance(value, bool) else None
    if key == "mac":
        return value if isinstance(value, str) and value else None
    ok = isinstance(value, int) and not isinstance(value, bool)
    if key == "mtu":
        return value if ok and value > 0 else None  # Go omits an MTU of 0
    return value if ok and value >= 0 else None


def sysctls(doc: dict[str, Any]) -> dict[str, str]:
    """The saved sysctls (path relative to /proc/sys -> value), in order."""
    saved = doc.get("sysctl")
    if not isinstance(saved, dict):
        return {}
    return {k: v for k, v in saved.items() if isinstance(k, str) and isinstance(v, str)}


def collect(data_dir: str, network: str, valid: set[tuple[str, str]]) -> list[str]:
    """GC: remove files of ``network`` whose (containerID, ifname) is not in
    ``valid``. Files without our ``network`` key (the Go plugin's) are left:
    the directory is shared by every network, and only the owner may decide.
    Then remove killed writers' temp files (any network's: they belong to
    no one). Returns the problems met ("<path>: <reason>"; the rest goes
    on): unreadable files, symlinks among them
    (`cni_skel.state.collect_attachment_files`)."""
    return collect_attachment_files(data_dir, network, valid, _owner)


def _owner(raw: bytes) -> tuple[str, str, str] | None:
    doc = parse(raw)
    owned = doc.get("network"), doc.get("containerID"), doc.get("ifname")
    return owned if all(isinstance(v, str) for v in owned) else None

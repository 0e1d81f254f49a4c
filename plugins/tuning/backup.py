"""The saved original values: ``<dataDir>/<containerID>_<ifname>.json``.

Written (atomically, mode 0600, directory 0700) by ADD before anything is
changed, read and removed by DEL. The link keys are the Go plugin's
(``configToRestore``), so either implementation can restore what the other
saved; Go ignores our extra keys::

    {
     "mac": "aa:bb:cc:dd:ee:ff",     original MAC        (only when ADD sets one)
     "promisc": false,               original IFF_PROMISC  (idem)
     "mtu": 1500,                    original MTU, bytes   (idem)
     "allmulti": false,              original IFF_ALLMULTI (idem)
     "txQLen": 1000,                 original queue length, packets (idem)
     "sysctl": {"net/core/somaxconn": "4096"},   originals by /proc/sys path
     "network": "dbnet", "containerID": "...", "ifname": "eth0"   for GC
    }
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_IO_FAILURE, CNIError
from cni_skel.state import atomic_write

__all__ = ["collect", "link_value", "merge", "parse", "path", "put_back", "read_raw",
           "remove", "save", "sysctls"]

LINK_KEYS = ("mac", "promisc", "mtu", "allmulti", "txQLen")


def _io(what: str, exc: OSError) -> CNIError:
    return CNIError(ERR_IO_FAILURE, f"tuning: {what}: {exc.strerror or exc}",
                    getattr(exc, "filename", None) or "")


def path(data_dir: str, container_id: str, ifname: str) -> str:
    """The file of one attachment (the skel has vetted both names: no ``/``)."""
    return os.path.join(data_dir, f"{container_id}_{ifname}.json")


def read_raw(file: str) -> bytes | None:
    """The file's bytes, None when it does not exist. Raises CNIError 5."""
    try:
        with open(file, "rb") as fp:
            return fp.read()
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


def save(file: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` atomically (0600), creating the directory (0700)."""
    try:
        os.makedirs(os.path.dirname(file) or ".", mode=0o700, exist_ok=True)
        atomic_write(file, json.dumps(doc, indent=1).encode(), 0o600)
    except OSError as exc:
        raise _io(f"cannot save the original values to {file}", exc) from None


def put_back(file: str, previous: bytes | None) -> None:
    """Undo `save` after a failed ADD: the earlier content, or no file."""
    try:
        if previous is None:
            remove(file)
        else:
            atomic_write(file, previous, 0o600)
    except (OSError, CNIError) as exc:
        print(f"tuning: cannot put back {file}: {exc}", file=sys.stderr)


def remove(file: str) -> None:
    """Delete the file; missing is fine. Raises CNIError 5."""
    try:
        os.unlink(file)
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
    Returns the problems met (the rest goes on)."""
    problems: list[str] = []
    try:
        entries = sorted(os.scandir(data_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return problems
    except OSError as exc:
        return [f"{data_dir}: {exc.strerror or exc}"]
    for entry in entries:
        if not entry.name.endswith(".json") or entry.name.startswith("."):
            continue
        try:
            doc = parse(read_raw(entry.path))
        except CNIError as exc:
            problems.append(exc.msg)
            continue
        cid, ifname = doc.get("containerID"), doc.get("ifname")
        if doc.get("network") != network or not isinstance(cid, str) \
                or not isinstance(ifname, str) or entry.name != f"{cid}_{ifname}.json":
            continue
        if (cid, ifname) in valid:
            continue
        try:
            remove(entry.path)
        except CNIError as exc:
            problems.append(exc.msg)
    return problems

"""What an ADD let through, kept for its DEL and for GC:
``<dataDir>/<containerID>_<ifname>.json`` (default dataDir /run/cni/firewall)::

    {
     "network": "podnet", "containerID": "...", "ifname": "eth0",
     "ipset": {"CNI-FW-POD4": ["10.1.0.5"]},          entries it added
     "nftables": [{"family": "inet", "table": "filter",
                   "set": "cni_firewall_pods4", "address": "10.1.0.5"}],
     "firewalld": {"zone": "trusted", "sources": ["10.1.0.5/32"]}
    }

Only what this attachment added is listed: an entry another attachment
had made already stays its own. The file lives in /run (tmpfs), as the
kernel state it describes does not survive a reboot either; written
atomically (0600 in a 0700 directory), never through a symlink
(`cni_skel.state`). DEL reads one file: its cost does not grow with the
pods.
"""

from __future__ import annotations

import json
import os
from typing import Any

from cni_skel.errors import ERR_IO_FAILURE, CNIError
from cni_skel.state import StateDir, attachment_file_name, collect_attachment_files

__all__ = ["DEFAULT_DIR", "collect", "merge", "read", "remove", "write"]

DEFAULT_DIR = "/run/cni/firewall"
_DIR_MODE = 0o700
_FILE_MODE = 0o600


def _io(what: str, exc: OSError) -> CNIError:
    return CNIError(ERR_IO_FAILURE, f"firewall: {what}: {exc.strerror or exc}",
                    getattr(exc, "filename", None) or "")


def _doc(raw: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _in_dir(data_dir: str, container_id: str, ifname: str, what: str, op: Any) -> Any:
    """``op(dir, name)`` on the attachment's file; None when ``dataDir`` or
    the file is missing. Raises CNIError 5 (a symlink among them)."""
    name = attachment_file_name(container_id, ifname)
    try:
        with StateDir.open(data_dir) as d:
            return op(d, name)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _io(f"cannot {what} {os.path.join(data_dir, name)}", exc) from None


def read(data_dir: str, container_id: str, ifname: str) -> dict[str, Any] | None:
    """The attachment's record; None when there is none (or it is not a
    JSON object: a damaged file undoes nothing rather than failing DEL
    for good). Raises CNIError 5 (a symlink among them)."""
    raw = _in_dir(data_dir, container_id, ifname, "read", lambda d, n: d.read(n))
    return None if raw is None else _doc(raw)


def merge(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` plus what ``old`` (the record of an earlier ADD of the same
    attachment) listed: a repeated ADD finds its own entries there and
    must not drop them from the record."""
    if not old:
        return new
    doc = dict(new)
    sets: dict[str, list[str]] = {}
    for src in (old.get("ipset"), new.get("ipset")):
        for name, addrs in (src or {}).items():
            if isinstance(addrs, list):
                sets.setdefault(name, [])
                sets[name] += [a for a in addrs if a not in sets[name]]
    doc["ipset"] = sets
    nft = [r for r in old.get("nftables") or [] if isinstance(r, dict)]
    doc["nftables"] = nft + [r for r in new.get("nftables") or [] if r not in nft]
    fwd_old, fwd_new = old.get("firewalld"), new.get("firewalld")
    if isinstance(fwd_old, dict) and fwd_new and fwd_old.get("zone") == fwd_new.get("zone"):
        srcs = list(fwd_old.get("sources") or [])
        doc["firewalld"] = {"zone": fwd_new["zone"],
                            "sources": srcs + [s for s in fwd_new["sources"] if s not in srcs]}
    return doc


def write(data_dir: str, container_id: str, ifname: str, doc: dict[str, Any]) -> None:
    """Write the record atomically, creating ``dataDir`` (0700).
    Raises CNIError 5."""
    name = attachment_file_name(container_id, ifname)
    try:
        # Not synced: tmpfs, and gone at a reboot with what it describes.
        with StateDir.open(data_dir, _DIR_MODE) as d:
            d.write(name, json.dumps(doc, indent=1).encode(), _FILE_MODE, durable=False)
    except OSError as exc:
        raise _io(f"cannot write {os.path.join(data_dir, name)}", exc) from None


def remove(data_dir: str, container_id: str, ifname: str) -> None:
    """Delete the record; missing is fine. Raises CNIError 5."""
    _in_dir(data_dir, container_id, ifname, "remove", lambda d, n: d.unlink(n))


def _owner(raw: bytes) -> tuple[str, str, str] | None:
    doc = _doc(raw) or {}
    parts = (doc.get("network"), doc.get("containerID"), doc.get("ifname"))
    return parts if all(isinstance(p, str) for p in parts) else None  # type: ignore[return-value]


def collect(data_dir: str, network: str, keep: set[tuple[str, str]],
            undo: Any) -> list[str]:
    """GC: for each record of ``network`` whose attachment is not in
    ``keep``, ``undo(doc)`` (True: undone) and then remove the file.
    Returns the problems met (`collect_attachment_files`)."""
    return collect_attachment_files(data_dir, network, keep, _owner,
                                    release=lambda raw: bool(undo(_doc(raw) or {})))

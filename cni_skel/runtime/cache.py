"""libcni's result cache: what a runtime remembers of each attachment.

After a successful ADD the runtime writes one file per attachment,
``<cache_dir>/results/<network>-<containerID>-<ifname>``, holding a JSON
object of kind ``cniCacheV1``: the list config as it was at ADD (base64),
the CNI_ARGS, capability args and netns it ran with, and the final result.
CHECK and DEL give that result to the plugins as ``prevResult``; GC DELs the
cached attachments no longer valid. The format is libcni's (``api.go``:
``cachedInfo``), byte for byte where it matters, so containerd, cnitool and
this runtime share one cache on a node.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..env import validate_container_id, validate_ifname, validate_network_name
from ..errors import ERR_DECODING_FAILURE, ERR_IO_FAILURE, CNIError
from ..state import atomic_write
from .conf import dir_names

__all__ = ["CACHE_KIND", "DEFAULT_CACHE_DIR", "CachedInfo", "ResultCache"]

#: libcni's default cache root (containerd's too).
DEFAULT_CACHE_DIR = "/var/lib/cni"
#: ``kind`` of libcni's cache files.
CACHE_KIND = "cniCacheV1"


@dataclass(frozen=True)
class CachedInfo:
    """One cache file as read (libcni ``cachedInfo``).

    Attributes:
        path: the file.
        doc: its ``cniCacheV1`` object; None when the file holds something
            else, such as a bare result written before cniCacheV1 existed.
        data: the file's bytes.
    """

    path: str
    doc: dict[str, Any] | None
    data: bytes

    def _get(self, key: str) -> Any:
        return self.doc.get(key) if self.doc is not None else None

    @property
    def container_id(self) -> str:
        """``containerId`` ("" when absent)."""
        return str(self._get("containerId") or "")

    @property
    def network(self) -> str:
        """``networkName`` ("" when absent)."""
        return str(self._get("networkName") or "")

    @property
    def ifname(self) -> str:
        """``ifName`` ("" when absent)."""
        return str(self._get("ifName") or "")

    @property
    def netns(self) -> str:
        """``netns`` ("" when absent: libcni omits it when empty)."""
        return str(self._get("netns") or "")

    @property
    def args(self) -> list[tuple[str, str]] | None:
        """``cniArgs`` as ``(key, value)`` pairs; None when absent."""
        pairs = self._get("cniArgs")
        return None if pairs is None else [(str(k), str(v)) for k, v in pairs]

    @property
    def capability_args(self) -> dict[str, Any]:
        """``capabilityArgs`` (empty when absent)."""
        return dict(self._get("capabilityArgs") or {})

    @property
    def result(self) -> Any:
        """The cached result as decoded JSON; for a file that is not
        cniCacheV1, its bytes (an old bare result); None when there is none."""
        return self.data if self.doc is None else self.doc.get("result")

    def config(self) -> bytes:
        """The list config cached at ADD (``config``, base64-decoded).

        Raises:
            CNIError: code 6 when it is not base64.
        """
        value = self._get("config")
        if not value:
            return b""
        try:
            return base64.b64decode(value, validate=True)
        except (ValueError, TypeError) as exc:
            raise CNIError(ERR_DECODING_FAILURE,
                           f"cached config is not base64: {exc}") from None


class ResultCache:
    """The cache files under ``cache_dir`` (libcni's ``CacheDir``).

    An attachment is named by ``(network, container_id, ifname)``; those
    three make up the file name, so each is checked against the spec's rule
    first (code 7 for the network name, code 4 for the others).
    """

    def __init__(self, cache_dir: str = DEFAULT_CACHE_DIR) -> None:
        self.cache_dir = cache_dir

    @property
    def results_dir(self) -> str:
        """``<cache_dir>/results``."""
        return os.path.join(self.cache_dir, "results")

    def path(self, network: str, container_id: str, ifname: str) -> str:
        """``<cache_dir>/results/<network>-<containerID>-<ifname>``.

        Raises:
            CNIError: code 7 for a bad network name, code 4 for a bad
                container ID or ifname.
        """
        validate_network_name(network)
        validate_container_id(container_id)
        validate_ifname(ifname)
        return os.path.join(self.results_dir, f"{network}-{container_id}-{ifname}")

    def write(self, network: str, container_id: str, ifname: str, *, config: bytes,
              netns: str, args: Sequence[tuple[str, str]], capability_args: dict[str, Any],
              result: dict[str, Any]) -> None:
        """Write the attachment's file (atomically, mode 0600): keys in the
        order of libcni's ``cachedInfo``, the empty ``omitempty`` ones left
        out. ``result`` is the final ADD result as JSON, in the list's
        version.

        Raises:
            CNIError: code 5 when the file cannot be written.
        """
        doc: dict[str, Any] = {
            "kind": CACHE_KIND,
            "containerId": container_id,
            "config": base64.b64encode(config).decode("ascii"),
            "ifName": ifname,
            "networkName": network,
        }
        if netns:
            doc["netns"] = netns
        if args:
            doc["cniArgs"] = [[k, v] for k, v in args]
        if capability_args:
            doc["capabilityArgs"] = capability_args
        doc["result"] = result
        path = self.path(network, container_id, ifname)
        data = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            atomic_write(path, data, 0o600)
        except OSError as exc:
            raise CNIError(ERR_IO_FAILURE, f'failed to set network "{network}" cached '
                           f"result: {exc.strerror}", path) from None

    def read(self, network: str, container_id: str, ifname: str) -> CachedInfo | None:
        """The attachment's file; None when it is missing or unreadable
        (libcni: no cache then). A file that is not cniCacheV1 comes back
        with ``doc`` None."""
        path = self.path(network, container_id, ifname)
        try:
            with open(path, "rb") as fp:
                data = fp.read()
        except OSError:
            return None
        return CachedInfo(path, _cache_doc(data), data)

    def remove(self, network: str, container_id: str, ifname: str) -> None:
        """Remove the attachment's file; missing is fine."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(network, container_id, ifname))

    def entries(self, container_id: str = "") -> list[CachedInfo]:
        """Every cniCacheV1 file naming a network and an ifname, sorted by
        file name; only those of ``container_id`` when given (libcni
        ``GetCachedAttachments``). Other files are skipped.

        Raises:
            CNIError: code 5 when the directory cannot be listed.
        """
        out = []
        for name in dir_names(self.results_dir, "cache directory"):
            path = os.path.join(self.results_dir, name)
            try:
                with open(path, "rb") as fp:
                    data = fp.read()
            except OSError:
                continue
            info = CachedInfo(path, _cache_doc(data), data)
            if info.doc is None or not info.ifname or not info.network:
                continue
            if container_id and info.container_id != container_id:
                continue
            out.append(info)
        return out


def _cache_doc(data: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == CACHE_KIND else None

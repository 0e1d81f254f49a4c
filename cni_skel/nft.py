"""nftables through libnftables' JSON API: one transaction per call.

Plugins describe what they want as libnftables JSON command objects
(``{"add": {"set": {...}}}``), never as ``nft`` text, and never parse ``nft``
output: listings come back as JSON objects too. ``libnftables.so.1`` is loaded
through the ``nftables`` Python binding (PyPI ``pip-nftables``, the same
module Debian ships as python3-nftables), imported lazily so that VERSION and
plugins that do not need nftables never pay for it.

The context acts in the network namespace of the *calling thread* (libnftables
opens its netlink socket per command); wrap calls in `cni_skel.netns.NetNS.run`
to act elsewhere.

Elements of sets that plugins share between containers carry an *attachment
tag* (`attachment_tag`) as their nftables comment, so DEL and GC can find a
container's entries without being told what they were.

Source: libnftables-json(5); nftables 1.0.x (Debian 12).
"""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from .errors import ERR_INTERNAL, ERR_PLUGIN_NOT_AVAILABLE, CNIError

__all__ = [
    "COMMENT_MAX",
    "Nft",
    "NftError",
    "Table",
    "attachment_tag",
    "nft_status",
]

# The kernel keeps comments as NFTA_*_USERDATA (NFT_USERDATA_MAXLEN 256, with
# a type/length header and the trailing NUL inside it).
COMMENT_MAX = 250


def attachment_tag(container_id: str, ifname: str) -> str:
    """The comment that marks nftables entries of one attachment.

    ``"<containerID>/<ifname>"``, or, when that would not fit an nftables
    comment (`COMMENT_MAX`), ``"sha256:<hex>"`` of it. Compare tags, not
    parsed IDs: GC computes the tags of the valid attachments and removes the
    entries whose tag is not among them.
    """
    tag = f"{container_id}/{ifname}"
    if len(tag.encode()) <= COMMENT_MAX:
        return tag
    return "sha256:" + hashlib.sha256(tag.encode()).hexdigest()


class NftError(CNIError):
    """A failed libnftables command. ``errno`` is the kernel's errno when the
    message names one (ENOENT for a missing table/set/chain, EEXIST for a
    ``create`` of something that exists), else None."""

    def __init__(self, msg: str, err: int | None, code: int = ERR_INTERNAL) -> None:
        super().__init__(code, msg)
        self.errno = err


_ERRNO_TEXT = {
    "No such file or directory": errno.ENOENT,
    "File exists": errno.EEXIST,
    "Operation not permitted": errno.EPERM,
    "Device or resource busy": errno.EBUSY,
    "Operation not supported": errno.EOPNOTSUPP,
    "Protocol not supported": errno.EPROTONOSUPPORT,
}


def _errno_from(text: str) -> int | None:
    # libnftables reports kernel errors as strerror() text in its error buffer.
    for words, err in _ERRNO_TEXT.items():
        if words in text:
            return err
    return None


class Nft:
    """A libnftables context with JSON output.

    Raises:
        NftError: code 50 when libnftables can not be loaded (package
            libnftables1 missing, or the binding absent).
    """

    def __init__(self) -> None:
        try:
            import nftables  # ctypes + libnftables.so.1: loaded only when used
        except ImportError as e:
            raise NftError(f"nftables Python binding not available: {e}", None,
                           ERR_PLUGIN_NOT_AVAILABLE) from e
        try:
            ctx = nftables.Nftables()
        except OSError as e:
            raise NftError(f"libnftables not available: {e}", None,
                           ERR_PLUGIN_NOT_AVAILABLE) from e
        ctx.set_json_output(True)
        ctx.set_handle_output(True)
        self._ctx = ctx

    def run(self, commands: Iterable[dict[str, Any]], *, what: str = "nftables") -> list[dict]:
        """Run ``commands`` as one batch; the kernel commits them atomically
        (all or nothing). Returns the output objects (listings), metainfo
        removed. An empty batch does nothing and costs nothing.

        Raises:
            NftError: the batch failed; nothing of it was applied. The message
                starts with ``what``.
        """
        cmds = list(commands)
        if not cmds:
            return []
        rc, out, err = self._ctx.json_cmd({"nftables": cmds})
        if rc != 0:
            text = " ".join(str(err).split()) or f"libnftables returned {rc}"
            raise NftError(f"{what}: {text}", _errno_from(str(err)))
        if not isinstance(out, dict):
            return []
        return [o for o in out.get("nftables", ()) if "metainfo" not in o]

    def table(self, family: str, name: str) -> Table | None:
        """List one table (its sets with their elements, chains and rules);
        None when it does not exist."""
        try:
            objs = self.run([{"list": {"table": {"family": family, "name": name}}}],
                            what=f"list table {family} {name}")
        except NftError as e:
            if e.errno == errno.ENOENT:
                return None
            raise
        return Table(family, name, objs)


class Table:
    """A listed table: ``sets`` (name -> set object, ``elem`` included),
    ``chains`` (name -> chain object) and ``rules`` (in listing order), all as
    libnftables JSON objects."""

    def __init__(self, family: str, name: str, objects: list[dict]) -> None:
        self.family = family
        self.name = name
        self.sets: dict[str, dict] = {}
        self.maps: dict[str, dict] = {}
        self.chains: dict[str, dict] = {}
        self.rules: list[dict] = []
        for obj in objects:
            if "set" in obj:
                self.sets[obj["set"]["name"]] = obj["set"]
            elif "map" in obj:
                self.maps[obj["map"]["name"]] = obj["map"]
            elif "chain" in obj:
                self.chains[obj["chain"]["name"]] = obj["chain"]
            elif "rule" in obj:
                self.rules.append(obj["rule"])

    def chain_rules(self, chain: str) -> list[dict]:
        """The rules of one chain, in order."""
        return [r for r in self.rules if r.get("chain") == chain]

    def elements(self, name: str) -> Iterator[tuple[Any, str | None]]:
        """``(value, comment)`` of each element of set or map ``name`` (none
        when it does not exist). For maps the value is ``[key, data]``."""
        for key, data, comment in self.entries(name):
            yield (key if data is None else [key, data]), comment

    def entries(self, name: str) -> Iterator[tuple[Any, Any, str | None]]:
        """``(key, data, comment)`` of each element of set or map ``name``
        (none when it does not exist); ``data`` is None for a set element.
        (libnftables lists a commented map element as
        ``[{"elem": {"val": key, "comment": c}}, data]``.)"""
        obj = self.sets.get(name) or self.maps.get(name) or {}
        for item in obj.get("elem", ()):
            data = None
            if isinstance(item, list) and len(item) == 2:
                item, data = item
            if isinstance(item, dict) and "elem" in item:
                yield item["elem"].get("val"), data, item["elem"].get("comment")
            else:
                yield item, data, None

    def tagged(self, name: str, tags: set[str] | None = None, *,
               keep: set[str] | None = None) -> list[Any]:
        """Keys of the elements of set or map ``name`` whose comment is in
        ``tags`` (with ``keep``: whose comment is *not* in ``keep``; an element
        with no comment is never selected): what a ``delete element`` needs."""
        out = []
        for val, _data, comment in self.entries(name):
            if comment is None:
                continue
            if (tags is not None and comment in tags) or (keep is not None and comment not in keep):
                out.append(val)
        return out


def nft_status() -> None:
    """Raise when nftables can not be used from here (for STATUS).

    Raises:
        NftError: code 50 (plugin not available) when libnftables can not be
            loaded or the kernel refuses a listing (no nf_tables, no
            CAP_NET_ADMIN).
    """
    nft = Nft()
    try:
        nft.run([{"list": {"tables": None}}], what="nftables")
    except NftError as e:
        raise NftError(e.msg, e.errno, ERR_PLUGIN_NOT_AVAILABLE) from e

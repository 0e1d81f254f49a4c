"""nftables through libnftables' JSON API: one transaction per call.

Plugins describe what they want as libnftables JSON command objects
(``{"add": {"set": {...}}}``), never as ``nft`` text, and never parse ``nft``
output: listings come back as JSON objects too. ``libnftables.so.1`` is loaded
through the ``nftables`` Python binding (PyPI ``pip-nftables``, the same
module Debian ships as python3-nftables); only the plugins that use nftables
import this module (attachment tags live in `cni_skel.tags`).

A libnftables context opens its netlink socket when it is created, in the
network namespace of the thread creating it, and acts there for its whole
life. `Nft` therefore acts in the namespace its creator thread was in when
it was made; make it inside `cni_skel.netns.NetNS.run` to act elsewhere.
Contexts are costly to make (loading and initialising libnftables), so this
module keeps a few per process, reused by every `Nft` made in the same
namespace and thread: at most `CONTEXTS_MAX`, keyed by the namespace's
identity (st_dev, st_ino of ``/proc/thread-self/ns/net``) and the thread,
least recently used dropped first, all dropped in a forked child (their
sockets are the parent's). They hold no data of a request (each command's
output and error buffers are read and reset with it). `release_contexts`
drops them (a long-lived process keeps its own namespace's only: a
context's socket pins its namespace).

Elements of sets that plugins share between containers carry an *attachment
tag* (`attachment_tag`) as their nftables comment, so DEL and GC can find a
container's entries without being told what they were.

Point reads: libnftables 1.0.6 has no ``get`` in its JSON input (and prints a
text ``get element`` as text whatever the output flag), and a listing costs
O(elements). `lookup` asks the kernel directly (``NFT_MSG_GETSETELEM``,
``NFT_MSG_GETCHAIN``, ...; one netlink round trip for many queries, no
libnftables): the cost of finding an element does not grow with its set.
Its nfnetlink socket is kept like the contexts (same key, limit and fork
rule): opening one is cheap, but closing one waits for the kernel (~3.5 ms
of wall time here, an RCU grace period), which a DEL paid per lookup.

Source: libnftables-json(5); nftables 1.0.x (Debian 12).
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
import threading
import typing
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import Any, NamedTuple

from . import state
from .errors import ERR_INTERNAL, ERR_PLUGIN_NOT_AVAILABLE, CNIError
from .tags import COMMENT_MAX, attachment_tag, network_tag

try:  # the binding only; libnftables.so.1 itself is loaded by Nft()
    import nftables
    _NFTABLES_MISSING = ""
except ImportError as _exc:  # answered by Nft() with code 50, not at import
    nftables = None
    _NFTABLES_MISSING = str(_exc)

__all__ = [
    "COMMENT_MAX",
    "CONTEXTS_MAX",
    "Element",
    "GetChain",
    "GetElement",
    "GetSet",
    "GetTable",
    "Nft",
    "NftError",
    "Table",
    "attachment_tag",
    "generation",
    "lookup",
    "network_tag",
    "nft_status",
    "release_contexts",
    "rule_comments",
    "table_state",
]

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


#: How many libnftables contexts a process keeps (see the module docstring).
CONTEXTS_MAX = 4
# (json?, st_dev, st_ino, thread id) -> libnftables context, least recent first
_contexts: OrderedDict[tuple[bool, int, int, int], Any] = OrderedDict()
_context_fds: dict[tuple[bool, int, int, int], frozenset[int]] = {}  # what each one opened
_contexts_pid = os.getpid()
_contexts_lock = threading.Lock()
_THREAD_NS = "/proc/thread-self/ns/net"
# (st_dev, st_ino, thread id) -> kept nfnetlink socket of `lookup`, least recent first
_sockets: OrderedDict[tuple[int, int, int], Any] = OrderedDict()


def _forget_parents_locked() -> None:
    # In a forked child the kept contexts and sockets are the parent's.
    global _contexts_pid
    if _contexts_pid != os.getpid():
        _contexts.clear()
        _context_fds.clear()
        _sockets.clear()
        _contexts_pid = os.getpid()


def _netns_identity() -> tuple[int, int]:
    """(st_dev, st_ino) of the calling thread's network namespace."""
    try:
        st = os.stat(_THREAD_NS)
    except FileNotFoundError:  # Linux < 3.17
        st = os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net")
    return st.st_dev, st.st_ino


def _context(json: bool, keep: bool = True) -> Any:
    """The calling thread's libnftables context for its current namespace
    (JSON output with handles, or plain text), made when there is none
    (``keep`` False: always a new one, not kept)."""
    key = (json, *_netns_identity(), threading.get_ident())
    with _contexts_lock:
        _forget_parents_locked()
        ctx = _contexts.get(key) if keep else None
        if ctx is not None:
            _contexts.move_to_end(key)
            return ctx
    if nftables is None:
        raise NftError(f"nftables Python binding not available: {_NFTABLES_MISSING}", None,
                       ERR_PLUGIN_NOT_AVAILABLE)
    before = state.open_fds() if keep else set()
    try:
        ctx = nftables.Nftables()
    except OSError as e:
        raise NftError(f"libnftables not available: {e}", None,
                       ERR_PLUGIN_NOT_AVAILABLE) from e
    if json:
        ctx.set_json_output(True)
        ctx.set_handle_output(True)
    if keep:
        with _contexts_lock:
            _contexts[key] = ctx
            _context_fds[key] = frozenset(state.open_fds() - before)
            while len(_contexts) > CONTEXTS_MAX:
                _context_fds.pop(_contexts.popitem(last=False)[0], None)
    return ctx


def kept_fds() -> set[int]:
    """The fds the kept contexts and `lookup` sockets hold (one netlink
    socket each): open between calls on purpose, so a long-lived process
    that checks for leaked fds (`cni_skel.warm.serving.ProcessBaseline`) does
    not count them."""
    with _contexts_lock:
        if _contexts_pid != os.getpid():
            return set()
        return set().union(*_context_fds.values(), (s.fileno() for s in _sockets.values()))


def _forked() -> None:
    # In a child of os.fork(): the kept contexts' sockets are the parent's,
    # and the lock may have been held by a thread that does not exist here.
    global _contexts_lock, _contexts_pid
    _contexts_lock = threading.Lock()
    _contexts.clear()
    _context_fds.clear()
    _sockets.clear()
    _contexts_pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def release_contexts(*, keep_netns: int | str | None = None) -> None:
    """Drop the libnftables contexts this process keeps (their sockets
    close once no `Nft` uses them), and close the kept `lookup` sockets:
    all of them, or with ``keep_netns`` (an open fd or a path of a network
    namespace) all but those made in that namespace. A kept socket keeps
    its namespace alive: a long-lived process keeps its own namespace's
    only (the cni-skel worker's serving processes do once idle for a
    second). The next `Nft` or `lookup` elsewhere makes a new one.

    Raises:
        OSError: ``keep_netns`` can not be read.
    """
    kept = None
    if keep_netns is not None:
        st = os.fstat(keep_netns) if isinstance(keep_netns, int) else os.stat(keep_netns)
        kept = (st.st_dev, st.st_ino)
    with _contexts_lock:
        _forget_parents_locked()
        for key in [k for k in _contexts if k[1:3] != kept]:
            del _contexts[key]
            _context_fds.pop(key, None)
        socks = [_sockets.pop(k) for k in [k for k in _sockets if k[0:2] != kept]]
    for sock in socks:
        sock.close()


class Nft:
    """A libnftables context with JSON output, acting in the network
    namespace the calling thread is in (a kept context when there is one
    for it, see the module docstring). ``keep=False``: contexts of its own,
    not kept, for a namespace that is about to go (a kept one would keep
    it alive).

    Raises:
        NftError: code 50 when libnftables can not be loaded (package
            libnftables1 missing, or the binding absent).
    """

    def __init__(self, *, keep: bool = True) -> None:
        self._keep = keep
        self._ctx = _context(json=True, keep=keep)
        self._text_ctx: Any = None

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

    def apply(self, commands: Iterable[dict[str, Any]], layouts: Iterable[list[dict]], *,
              what: str = "nftables") -> None:
        """Run ``commands`` (element adds, typically) as one transaction;
        when that fails because a table, chain or set is missing (ENOENT),
        run each of ``layouts`` in a transaction of its own (EEXIST: another
        caller made it first, fine) and ``commands`` again. So the common
        case costs one transaction, and concurrent first callers never
        create a layout twice (each layout holds a ``create`` that fails
        with EEXIST when it is there). Nothing to run: nothing done.

        Raises:
            NftError: 999 starting with ``what``; the failed transaction
                applied nothing.
        """
        cmds = list(commands)
        if not cmds:
            return
        try:
            self.run(cmds, what=what)
            return
        except NftError as e:
            if e.errno != errno.ENOENT:
                raise
        for layout in layouts:
            try:
                self.run(layout, what=what)
            except NftError as e:
                if e.errno != errno.EEXIST:
                    raise
        self.run(cmds, what=what)

    def text_cmd(self, command: str) -> tuple[int, str, str]:
        """Run one command written as ``nft`` text, in a plain-output
        context of its own: only for text a user gave (portmap's
        ``conditionsV4``), which libnftables' JSON input cannot carry.
        Returns libnftables' ``(rc, output, error text)``."""
        if self._text_ctx is None:
            self._text_ctx = _context(json=False, keep=self._keep)
        return self._text_ctx.cmd(command)

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


def table_state(family: str, name: str, what: str) -> str | None:
    """One line for a report of what stays on a node (``Plugin.node_state``):
    ``nftables table FAMILY NAME (WHAT)`` when the table exists in this
    network namespace, why it cannot be listed, or None when it is absent."""
    try:
        table = Nft().table(family, name)
    except (NftError, OSError) as exc:
        return f"cannot list nftables table {family} {name}: {exc}"
    return None if table is None else f"nftables table {family} {name} ({what})"


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


# --- point reads over netlink ---------------------------------------------------------


class GetElement(NamedTuple):
    """Query: the element of set or map ``set`` with key ``key``, given as
    libnftables JSON writes it (``"10.0.0.1"``, ``{"concat": ["tcp", 80]}``
    or a tuple/list of the parts). ``key_type``: the set's type as
    libnftables names it (``"ipv4_addr"``, ``["inet_proto", "inet_service"]``);
    ``data_type``: the map's data type, None for a set. Answer: `Element`, or
    None when there is no such element (or set, or table)."""

    set: str
    # typing.Any spelled out: a NamedTuple's generated __new__ resolves its
    # annotations without this module's globals (API reference tools).
    key: typing.Any
    key_type: str | tuple[str, ...] | list[str]
    data_type: str | None = None


class GetChain(NamedTuple):
    """Query: does chain ``name`` exist? Answer: bool."""

    name: str


class GetSet(NamedTuple):
    """Query: does set or map ``name`` exist? Answer: bool."""

    name: str


class GetTable(NamedTuple):
    """Query: does the table exist? Answer: bool."""


class Element(NamedTuple):
    """An element read back: map ``data`` (decoded as the query's
    ``data_type``; None for a set) and its ``comment`` (None without one)."""

    data: typing.Any
    comment: str | None


# The messages, attributes and their parsing are pyroute2's nf_tables support
# (pyroute2.netlink.nfnetlink.nftsocket), sent on a cni_skel.nlsock socket of
# the call (pyroute2's own nf_tables socket runs an asyncio loop). What is ours
# is nftables' data layout: how a key of a given nftables type is laid out in
# NFTA_DATA_VALUE, which pyroute2 does not know for concatenations.

_BATCH = 64  # requests per send: their answers must fit the socket's receive buffer
_TIMEOUT = 30.0  # seconds for each answer (a reply dropped by the kernel: an error)
_PROTO_NUM = {"icmp": 1, "igmp": 2, "tcp": 6, "udp": 17, "gre": 47, "esp": 50, "ah": 51,
              "icmpv6": 58, "sctp": 132, "udplite": 136}
_PROTO_NAME = {v: k for k, v in _PROTO_NUM.items()}


@functools.cache
def _netlink() -> SimpleNamespace:
    """pyroute2's nf_tables pieces and our socket, imported on the first
    `lookup` / `generation`: a one-shot portmap ADD makes no point read and
    must not pay pyroute2's import (~100 ms). (Modules and constants only:
    nothing of a request is kept.)"""
    from pyroute2.netlink import (  # noqa: PLC0415 (see above)
        NETLINK_NETFILTER,
        NLM_F_DUMP,
        NLM_F_REQUEST,
    )
    from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415
    from pyroute2.netlink.marshal import Marshal  # noqa: PLC0415
    from pyroute2.netlink.nfnetlink import NFNL_SUBSYS_NFTABLES, nftsocket  # noqa: PLC0415

    from .nlsock import NetlinkSocket  # noqa: PLC0415

    # message type -> class, as pyroute2's nf_tables socket registers them
    policy = {(NFNL_SUBSYS_NFTABLES << 8) | kind: cls
              for kind, cls in nftsocket.AsyncNFTSocket.policy.items()}
    return SimpleNamespace(NETLINK_NETFILTER=NETLINK_NETFILTER, NLM_F_REQUEST=NLM_F_REQUEST,
                           NLM_F_DUMP=NLM_F_DUMP,
                           NetlinkError=NetlinkError, NFNL_SUBSYS_NFTABLES=NFNL_SUBSYS_NFTABLES,
                           n=nftsocket, Marshal=Marshal, NetlinkSocket=NetlinkSocket,
                           policy=policy)


def _value_bytes(kind: str, value: Any) -> bytes:
    """One value of nftables type ``kind`` as the kernel compares it."""
    if kind == "ipv4_addr":
        return ipaddress.IPv4Address(value).packed
    if kind == "ipv6_addr":
        return ipaddress.IPv6Address(value).packed
    if kind == "inet_proto":
        return int(_PROTO_NUM.get(value, value) if isinstance(value, str) else value).to_bytes(1)
    if kind == "inet_service":
        return int(value).to_bytes(2, "big")
    raise ValueError(f"nftables type {kind} is not supported by lookup")


def _value(kind: str | None, raw: bytes | None) -> Any:
    """The inverse of `_value_bytes` (raw bytes for what it does not know)."""
    if kind is None or raw is None:
        return None
    if kind == "ipv4_addr" and len(raw) == 4:
        return str(ipaddress.IPv4Address(raw))
    if kind == "ipv6_addr" and len(raw) == 16:
        return str(ipaddress.IPv6Address(raw))
    if kind == "inet_service" and len(raw) >= 2:
        return int.from_bytes(raw[:2], "big")
    if kind == "inet_proto" and raw:
        return _PROTO_NAME.get(raw[0], raw[0])
    return raw


def _key_bytes(key_type: Any, key: Any) -> bytes:
    """The key as the kernel holds it: one field as is; a concatenation with
    each field padded to 32 bits (nftables evaluates a concatenation into
    consecutive 4-byte registers, and its set key is that register image)."""
    if isinstance(key_type, str):
        return _value_bytes(key_type, key)
    parts = key["concat"] if isinstance(key, dict) else list(key)
    if len(parts) != len(key_type):
        raise ValueError(f"key {key!r} does not match type {key_type!r}")
    out = b""
    for kind, part in zip(key_type, parts, strict=True):
        raw = _value_bytes(kind, part)
        out += raw + b"\0" * (-len(raw) % 4)
    return out


def _message(query: Any, table: str) -> tuple[int, Any]:
    """(NFT_MSG_GET* type, pyroute2 message) asking ``query`` about ``table``."""
    n = _netlink().n
    if isinstance(query, GetElement):
        key = {"attrs": [("NFTA_DATA_VALUE", _key_bytes(query.key_type, query.key))]}
        msg = n.nft_set_elem_list_msg()
        msg["attrs"] = [("NFTA_SET_ELEM_LIST_TABLE", table), ("NFTA_SET_ELEM_LIST_SET", query.set),
                        ("NFTA_SET_ELEM_LIST_ELEMENTS", [{"attrs": [("NFTA_SET_ELEM_KEY", key)]}])]
        return n.NFT_MSG_GETSETELEM, msg
    if isinstance(query, GetChain):
        msg = n.nft_chain_msg()
        msg["attrs"] = [("NFTA_CHAIN_TABLE", table), ("NFTA_CHAIN_NAME", query.name)]
        return n.NFT_MSG_GETCHAIN, msg
    if isinstance(query, GetSet):
        msg = n.nft_set_msg()
        msg["attrs"] = [("NFTA_SET_TABLE", table), ("NFTA_SET_NAME", query.name)]
        return n.NFT_MSG_GETSET, msg
    if isinstance(query, GetTable):
        msg = n.nft_table_msg()
        msg["attrs"] = [("NFTA_TABLE_NAME", table)]
        return n.NFT_MSG_GETTABLE, msg
    raise TypeError(f"not a lookup query: {query!r}")


def _element(query: GetElement, answer: Any) -> Element | None:
    """The `Element` in a NEWSETELEM answer (pyroute2's decoding)."""
    for elem in answer.get_attr("NFTA_SET_ELEM_LIST_ELEMENTS") or ():
        data = elem.get_attr("NFTA_SET_ELEM_DATA")
        udata = elem.get_attr("NFTA_SET_ELEM_USERDATA") or ()
        comment = next((v for k, v in udata if k == "NFTNL_UDATA_SET_ELEM_COMMENT"), None) \
            if isinstance(udata, list) else None
        return Element(_value(query.data_type, data and data.get_attr("NFTA_DATA_VALUE")),
                       None if comment is None else comment.decode(errors="replace"))
    return None


def _exchange(family: str, messages: list[tuple[int, Any]],
              flags: int = 0) -> list[tuple[list[Any], int]]:
    """Send the requests on one nfnetlink socket, ``_BATCH`` per send, and
    collect each one's answer: (its messages, 0) or ([], errno). The answers
    stop after the first error other than ENOENT: nfnetlink answers a send
    it refuses as a whole (EPERM without CAP_NET_ADMIN) once.

    Raises:
        NftError: the socket failed (no nfnetlink), or an answer was missing
            after ``_TIMEOUT`` seconds.
    """
    nl = _netlink()
    n = nl.n
    nfproto = {"inet": n.NFPROTO_INET, "ip": n.NFPROTO_IPV4, "ip6": n.NFPROTO_IPV6,
               "arp": n.NFPROTO_ARP, "bridge": n.NFPROTO_BRIDGE, "netdev": n.NFPROTO_NETDEV}[family]
    requests = []
    for kind, msg in messages:
        msg["nfgen_family"] = nfproto
        requests.append((msg, (nl.NFNL_SUBSYS_NFTABLES << 8) | kind, nl.NLM_F_REQUEST | flags))
    try:
        sock, key = _point_socket(nl)
        try:
            return sock.batch(requests, tolerate=(errno.ENOENT,), chunk=_BATCH)
        except BaseException:
            _drop_socket(key)  # answers may be left unread in it
            raise
    except nl.NetlinkError as e:
        if e.code == errno.ETIMEDOUT:
            raise NftError(f"nftables netlink: no answer in {_TIMEOUT:.0f} s", e.code) from e
        raise NftError(f"nftables netlink: {os.strerror(e.code)}", e.code) from e
    except OSError as e:
        raise NftError(f"nftables netlink: {e.strerror or e}", e.errno) from e


def _point_socket(nl: SimpleNamespace) -> tuple[Any, tuple[int, int, int]]:
    """The calling thread's kept nfnetlink socket for its current namespace
    (made when there is none), and its key."""
    key = (*_netns_identity(), threading.get_ident())
    with _contexts_lock:
        _forget_parents_locked()
        sock = _sockets.get(key)
        if sock is not None:
            _sockets.move_to_end(key)
            return sock, key
    marshal = nl.Marshal()
    marshal.msg_map.update(nl.policy)
    sock = nl.NetlinkSocket(nl.NETLINK_NETFILTER, marshal, timeout=_TIMEOUT)
    with _contexts_lock:
        _sockets[key] = sock
        evicted = [_sockets.popitem(last=False)[1] for _ in range(len(_sockets) - CONTEXTS_MAX)]
    for old in evicted:
        old.close()
    return sock, key


def _drop_socket(key: tuple[int, int, int]) -> None:
    with _contexts_lock:
        sock = _sockets.pop(key, None)
    if sock is not None:
        sock.close()


def lookup(family: str, table: str, queries: Iterable[Any]) -> list[Any]:
    """Answer each query (`GetElement`, `GetChain`, `GetSet`, `GetTable`) about
    table ``family name``, straight from the kernel: one netlink request per
    query, sent together (a point read: its cost does not depend on how many
    elements the sets hold), in the calling thread's network namespace. A
    missing table answers None/False to everything. Nothing is changed.

    Raises:
        NftError: the kernel refused a query for another reason than
            ENOENT (EPERM without CAP_NET_ADMIN, ...).
    """
    qs = list(queries)
    if not qs:
        return []
    done = _exchange(family, [_message(q, table) for q in qs])
    for _, err in done:
        if err not in (0, errno.ENOENT):
            raise NftError(f"nftables lookup in {family} {table}: {os.strerror(err)}", err)
    answers: list[Any] = []
    for q, (replies, err) in zip(qs, done, strict=True):
        if isinstance(q, GetElement):
            answers.append(next((_element(q, r) for r in replies), None) if err == 0 else None)
        else:
            answers.append(err == 0)
    return answers


def generation() -> int:
    """The nftables ruleset generation of the calling thread's network
    namespace: every committed transaction adds one (tests count
    transactions with it).

    Raises:
        NftError: the kernel refused (EPERM without CAP_NET_ADMIN).
    """
    n = _netlink().n
    [(replies, err)] = _exchange("inet", [(n.NFT_MSG_GETGEN, n.nft_gen_msg())])
    if err:
        raise NftError(f"nftables generation: {os.strerror(err)}", err)
    for reply in replies:
        gen = reply.get_attr("NFTA_GEN_ID")
        if gen is not None:
            return gen
    raise NftError("nftables generation: no NFTA_GEN_ID in the answer", None)


def _xt_comment(expr: Any) -> str | None:
    """The text of an xtables ``comment`` match (struct xt_comment_info: a
    NUL-terminated string in NFTA_MATCH_INFO), None for any other expression."""
    if expr.get_attr("NFTA_EXPR_NAME") != "match":
        return None
    data = expr.get_attr("NFTA_EXPR_DATA")
    if data is None or data.get_attr("NFTA_MATCH_NAME") != "comment":
        return None
    info = data.get_attr("NFTA_MATCH_INFO")
    if isinstance(info, str):  # pyroute2 decodes "hex" as "aa:bb:..."
        info = bytes.fromhex(info.replace(":", ""))
    if not info:
        return None
    return bytes(info).split(b"\0", 1)[0].decode(errors="replace")


def rule_comments(family: str, table: str) -> dict[int, str]:
    """handle -> comment of each rule of table ``family table`` that has
    one, read from the kernel (one netlink dump, ``NFT_MSG_GETRULE``), in the
    calling thread's network namespace; empty when the table does not exist.

    A rule's comment is its nftables comment (``NFTA_RULE_USERDATA``, what
    libnftables lists as ``"comment"``) or, for a rule iptables-nft wrote,
    the text of its ``-m comment`` match: libnftables 1.0.6 lists that
    match as ``{"xt": {"type": "match", "name": "comment"}}`` without the
    text, which is how the Go plugins' iptables rules name their container.
    Handles are the ones libnftables lists and deletes by.

    Raises:
        NftError: the kernel refused (EPERM without CAP_NET_ADMIN).
    """
    nl = _netlink()
    n = nl.n
    msg = n.nft_rule_msg()
    msg["attrs"] = [("NFTA_RULE_TABLE", table)]
    [(replies, err)] = _exchange(family, [(n.NFT_MSG_GETRULE, msg)], nl.NLM_F_DUMP)
    if err == errno.ENOENT:
        return {}
    if err:
        raise NftError(f"nftables rules of {family} {table}: {os.strerror(err)}", err)
    out: dict[int, str] = {}
    for rule in replies:
        handle = rule.get_attr("NFTA_RULE_HANDLE")
        if handle is None:
            continue
        udata = rule.get_attr("NFTA_RULE_USERDATA")
        comment = _udata_comment(udata)
        if comment is None:
            for expr in rule.get_attr("NFTA_RULE_EXPRESSIONS") or ():
                comment = _xt_comment(expr)
                if comment is not None:
                    break
        if comment is not None:
            out[handle] = comment
    return out


def _udata_comment(udata: Any) -> str | None:
    # NFTNL_UDATA_RULE_COMMENT (type 0): libnftnl's TLV, type and length bytes.
    if isinstance(udata, str):
        return udata or None
    raw = bytes(udata or b"")
    while len(raw) >= 2:
        kind, size = raw[0], raw[1]
        if kind == 0:
            return raw[2:2 + size].split(b"\0", 1)[0].decode(errors="replace")
        raw = raw[2 + size:]
    return None

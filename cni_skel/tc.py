"""Traffic control: token-bucket shaping with qdiscs, filters and ifb links.

What Go's plugins do with vishvananda/netlink's ``QdiscAdd`` / ``QdiscDel``
/ ``QdiscList`` / ``FilterAdd`` / ``FilterList`` and ``netlink.Ifb`` (the
bandwidth plugin), as typed helpers. Each takes a netlink socket (``ipr``)
first and acts in the namespace it is bound to: a `cni_skel.rtnl.Rtnl` or a
pyroute2 ``IPRoute``, as the `cni_skel.netlink` helpers. Links are given as
there (a name, an ifindex, a `cni_skel.netlink.Link`); a tc message needs
the index, so a name costs one look-up.

Units are Go's. A helper taking a configuration takes what the bandwidth
plugin's config holds: rates in bits per second, bursts in bits
(`tbf_parameters`, `add_tbf`, as Go's ``createTBF(rateInBits,
burstInBits)``). What goes to and comes back from the kernel is in the
kernel's units, those of Go's ``netlink.Tbf``: rate in bytes per second,
the bucket (``buffer``) as the time it takes to send at that rate in psched
ticks (64 ns, 15.625 per µs on every Linux since 2.6.32; read from
/proc/net/psched as Go reads it), the queue ``limit`` in bytes
(`TbfParameters`).

Handles are 32-bit ``major:minor`` numbers (`make_handle`; `format_handle`
writes them as tc does): the root of a link is `HANDLE_ROOT`, its ingress
hook `HANDLE_INGRESS`.

Messages are pyroute2's ``tcmsg`` with its option classes (``sched_tbf``,
``cls_u32``, ``act_mirred``) encoding them: what Go sends, and the kernel
keeps the same (pyroute2 also fills a rate's cell log and alignment, for a
rate table the kernel is not sent and which it ignores). Not pyroute2's tc
request filters: their TBF parameters compute the bucket
with floats in another order than Go (a tick apart for some rates) and add
a rate table Go never sends. pyroute2 0.9's TBF options lack the 64-bit
rate (rates of 2^32 bytes/s and more, 34 Gbit/s): the class is extended
once, at import.

Errors are `cni_skel.errors.CNIError`: code 7 for bad values (a rate or
burst that rounds to zero bytes, a burst of 4 GB or more, a bad name);
999 ``"<operation> <link>: <strerror>"`` for what the kernel refuses;
`cni_skel.netlink.LinkNotFound` / `cni_skel.netlink.LinkExists` (999) for a
missing or taken link.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyroute2.netlink import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
)
from pyroute2.netlink.exceptions import NetlinkDumpInterrupted, NetlinkError
from pyroute2.netlink.rtnl import (
    RTM_DELQDISC,
    RTM_GETQDISC,
    RTM_GETTFILTER,
    RTM_NEWQDISC,
    RTM_NEWTFILTER,
)
from pyroute2.netlink.rtnl.tcmsg import cls_u32, sched_tbf, tcmsg

from cni_skel import netlink
from cni_skel.env import ifname_problem
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, CNIError
from cni_skel.rtnl import Rtnl

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyroute2 import IPRoute

    Socket = IPRoute | Rtnl

__all__ = [
    "ETH_P_ALL",
    "HANDLE_INGRESS",
    "HANDLE_ROOT",
    "INGRESS_QDISC",
    "LATENCY_MS",
    "Filter",
    "Qdisc",
    "TbfParameters",
    "add_ingress_qdisc",
    "add_redirect_filter",
    "add_tbf",
    "create_ifb",
    "del_qdisc",
    "filters",
    "format_handle",
    "make_handle",
    "qdiscs",
    "tbf_parameters",
]

#: The parent of a link's root qdisc (TC_H_ROOT).
HANDLE_ROOT = 0xFFFFFFFF
#: The parent of a link's ingress qdisc (TC_H_INGRESS).
HANDLE_INGRESS = 0xFFFFFFF1
#: The handle of a link's ingress qdisc, ``ffff:`` (``make_handle(0xFFFF,
#: 0)``): the parent of the filters on what the link receives.
INGRESS_QDISC = 0xFFFF0000
#: A filter protocol matching every packet (linux/if_ether.h).
ETH_P_ALL = 0x0003
#: Go's ``latencyInMillis``: how long a packet may wait in a TBF's queue,
#: which sizes the queue (`tbf_parameters`).
LATENCY_MS = 25

_TIME_UNITS_PER_SEC = 1_000_000  # Go's netlink.TIME_UNITS_PER_SEC (µs)
# The kernel's psched clock since 2.6.32: 1000 ns per µs, 64 ns per tick.
_TICK_IN_USEC = 1000 / 64
_U32 = 0xFFFFFFFF
_IFF_UP = 0x1
_REQ = NLM_F_REQUEST | NLM_F_ACK
_DUMP = NLM_F_REQUEST | NLM_F_DUMP
_TCA_EGRESS_REDIR = 1  # linux/tc_act/tc_mirred.h

# pyroute2 0.9's TBF option table stops at TCA_TBF_PTAB (4); the kernel
# reports a rate of 2^32 bytes/s or more in TCA_TBF_RATE64 (5), and Go sends
# it. Extended once, before any TBF message is compiled.
if not any(entry[0] == "TCA_TBF_RATE64" for entry in sched_tbf.options.nla_map):
    sched_tbf.options.nla_map = (*sched_tbf.options.nla_map, ("TCA_TBF_RATE64", "uint64"),
                                 ("TCA_TBF_PRATE64", "uint64"), ("TCA_TBF_BURST", "uint32"),
                                 ("TCA_TBF_PBURST", "uint32"), ("TCA_TBF_PAD", "hex"))


# --------------------------------------------------------------------------
# handles


def make_handle(major: int, minor: int) -> int:
    """The 32-bit handle ``major:minor`` (each 0..0xFFFF; Go's
    ``netlink.MakeHandle``): ``make_handle(1, 0)`` is ``1:``, 0x10000.

    Raises:
        CNIError: code 7 for a part out of range.
    """
    if not (0 <= major <= 0xFFFF and 0 <= minor <= 0xFFFF):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid tc handle {major:x}:{minor:x}")
    return (major << 16) | minor


def format_handle(handle: int) -> str:
    """``handle`` as tc writes it: ``"1:"``, ``"ffff:fff1"``, ``"root"`` for
    `HANDLE_ROOT`, ``"none"`` for 0."""
    if handle == HANDLE_ROOT:
        return "root"
    if handle == 0:
        return "none"
    major, minor = handle >> 16, handle & 0xFFFF
    return f"{major:x}:{minor:x}" if minor else f"{major:x}:"


# --------------------------------------------------------------------------
# TBF arithmetic


@dataclasses.dataclass(frozen=True)
class TbfParameters:
    """A token bucket filter's settings in the kernel's units (Go's
    ``netlink.Tbf``: ``Rate``, ``Buffer``, ``Limit``).

    Attributes:
        rate: bytes per second.
        buffer: the bucket, as the time it takes to send at ``rate``, in
            psched ticks (15.625 per µs).
        limit: bytes that may wait in the queue.
    """

    rate: int
    buffer: int
    limit: int

    @property
    def burst(self) -> int:
        """The bucket in bytes: what ``rate`` sends in ``buffer`` (rounded
        down; the kernel's own reckoning of it)."""
        return int(self.rate * (self.buffer / _tick_in_usec()) / _TIME_UNITS_PER_SEC)


@functools.cache
def _tick_in_usec() -> float:
    """psched ticks per µs, as Go's netlink computes it from /proc/net/psched
    (its ``TickInUsec``); the kernel's 15.625 when the file can't be read."""
    try:
        with open("/proc/net/psched", encoding="ascii") as fp:
            vals = [int(v, 16) for v in fp.read().split()[:4]]
        if len(vals) < 3 or not vals[1]:
            raise ValueError("short")
    except (OSError, ValueError):
        return _TICK_IN_USEC
    if vals[2] == 1_000_000_000:  # Go's compatibility rule for old kernels
        vals[0] = vals[1]
    return vals[0] / vals[1] * (vals[2] / _TIME_UNITS_PER_SEC)


def _u32(value: float) -> int:
    """A float as Go's ``uint32(...)``, truncated; saturated at 2^32-1 where
    Go's conversion is undefined (and wraps on amd64)."""
    return min(int(value), _U32)


def tbf_parameters(rate: int, burst: int, *, latency_ms: float = LATENCY_MS) -> TbfParameters:
    """What Go's bandwidth plugin asks of the kernel for ``rate`` (bits per
    second) and ``burst`` (bits): its ``createTBF`` arithmetic, float for
    float. The rate in bytes (``rate // 8``); the bucket, ``burst // 8``
    bytes, as the µs to send them at that rate, in ticks; the queue limit
    what the rate sends in ``latency_ms`` (Go's 25 ms) plus the bucket's
    bytes. A bucket or limit past 2^32-1 saturates there (Go's uint32
    conversion wraps around on amd64: a bucket of more than 274 s at the
    rate becomes any size, possibly less than one packet).

    Raises:
        CNIError: code 7 when ``rate`` or ``burst`` is not a whole number,
            is below 8 (no byte: the kernel refuses a TBF without rate or
            bucket), or the burst is 4 GB (2^32-1 bytes) or more (Go's
            limit), or ``latency_ms`` is negative.
    """
    for what, value in (("rate", rate), ("burst", burst)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid {what} {value!r}: "
                                                       "a whole number of bits")
        if value < 8:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f"invalid {what} {value}: less than one byte (8 bits)")
    if burst // 8 >= _U32:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "burst cannot be more than 4GB")
    if latency_ms < 0:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid latency {latency_ms} ms")
    rate_bytes, burst_bytes = rate // 8, burst // 8
    usec = _u32(float(burst_bytes) * float(_TIME_UNITS_PER_SEC) / float(rate_bytes))
    buffer = _u32(float(usec) * _tick_in_usec())
    latency = float(_TIME_UNITS_PER_SEC) * (latency_ms / 1000.0)
    limit = min(_u32(float(rate_bytes) * latency / float(_TIME_UNITS_PER_SEC)) + burst_bytes,
                _U32)
    return TbfParameters(rate=rate_bytes, buffer=buffer, limit=limit)


# --------------------------------------------------------------------------
# requests


def _strerror(exc: NetlinkError) -> str:
    msg = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], str) else ""
    msg = msg or (os.strerror(exc.code) if exc.code else str(exc))
    return msg[:1].lower() + msg[1:]


def _send(ipr: Socket, msg: Any, msg_type: int, flags: int) -> list[Any]:
    """One request on either kind of socket: its answer messages."""
    if isinstance(ipr, Rtnl):
        return ipr.request(msg, msg_type, flags)
    # pyroute2 0.9.7's IPRoute.nlm_request fails on a missing status key;
    # nlm_request_batch is the same request (as cni_skel.netlink sends it).
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = flags
    return list(ipr.nlm_request_batch([msg]))


def _call(op: str, target: object, fn: Callable[[], list[Any]],
          ignore: tuple[int, ...] = ()) -> list[Any] | None:
    """Run one request: its answer; None for an ``ignore``d errno. A kernel
    refusal is 999 ``"<op> <target>: <strerror>"``, a value pyroute2 could
    not encode 7; an interrupted dump is tried again (a few times)."""
    for attempt in range(5):
        try:
            return fn()
        except NetlinkDumpInterrupted as e:
            if attempt == 4:
                raise CNIError(ERR_INTERNAL, f"{op} {target}: dump interrupted") from e
        except NetlinkError as e:
            if e.code in ignore:
                return None
            raise CNIError(ERR_INTERNAL, f"{op} {target}: {_strerror(e)}") from e
        except (ValueError, TypeError, OverflowError) as e:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"{op} {target}: {e}") from e
    return None  # pragma: no cover - the loop returns or raises


def _target(link: netlink.Link | str | int) -> str:
    """What an error message names: the link's name when known."""
    return f'"{link.name}"' if isinstance(link, netlink.Link) else \
        f'"{link}"' if isinstance(link, str) else f"index {link}"


def _tc_msg(index: int, parent: int, handle: int = 0, info: int = 0) -> Any:
    msg = tcmsg()
    msg["family"] = socket.AF_UNSPEC
    msg["index"] = index
    msg["parent"] = parent
    msg["handle"] = handle
    msg["info"] = info
    return msg


def _change(op: str, ipr: Socket, link: netlink.Link | str | int, msg_type: int, flags: int,
            build_msg: Callable[[int], Any], ignore: tuple[int, ...] = ()) -> list[Any] | None:
    """Send the message ``build_msg(ifindex)`` for ``link``; a link gone
    meanwhile (ENODEV) is `cni_skel.netlink.LinkNotFound`."""
    index = netlink.link_index(ipr, link)
    target = _target(link)
    try:
        return _call(op, f"on {target}", lambda: _send(ipr, build_msg(index), msg_type, flags),
                     ignore=ignore)
    except CNIError as e:
        if isinstance(e.__cause__, NetlinkError) and e.__cause__.code == errno.ENODEV:
            raise netlink.LinkNotFound(link) from e.__cause__
        raise


# --------------------------------------------------------------------------
# ifb


def create_ifb(ipr: Socket, name: str, *, mtu: int | None = None, up: bool = True) -> netlink.Link:
    """Create ifb link ``name`` (an intermediate functional block: what a
    mirred action redirects to, so that a qdisc on it shapes the traffic of
    another link), up unless ``up`` is False, with ``mtu`` (bytes; the
    kernel's 1500 when None). Its txqlen is the kernel's (32). The kernel
    needs CONFIG_IFB.

    Here rather than in `cni_skel.netlink`: an ifb exists for tc (it passes
    nothing but what a filter redirects to it), and is made in the node's
    namespace, never straight into a pod.

    Returns:
        the new `cni_skel.netlink.Link`.

    Raises:
        LinkExists: (999) the name is taken.
        CNIError: 7 for a bad name or MTU; 999 for other kernel errors.

    Source: Go ``netlink.LinkAdd(&netlink.Ifb{...})`` as the bandwidth
    plugin's ``CreateIfb`` makes it (``Flags: net.FlagUp``, the host
    veth's MTU).
    """
    if not isinstance(name, str) or ifname_problem(name) is not None:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'invalid interface name "{name}"')
    if mtu is not None and (isinstance(mtu, bool) or not isinstance(mtu, int) or mtu <= 0):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid MTU {mtu!r}")
    # IFF_UP in the creation, as Go's LinkAdd does it; the kernel echoes the
    # new link (NLM_F_ECHO): one request in all.
    data = {"flags": _IFF_UP, "change": _IFF_UP} if up else {}
    return netlink._create_link("create ifb", ipr, name, "ifb", netns=None, netns_ipr=None,
                                mtu=mtu, mac=None, parent=None, data=data)


# --------------------------------------------------------------------------
# qdiscs


@dataclasses.dataclass(frozen=True)
class Qdisc:
    """One queueing discipline as the kernel reported it (RTM_NEWQDISC),
    the typed answer of `qdiscs` (Go: ``netlink.Qdisc``'s ``Attrs()``).

    Attributes:
        index: the ifindex of its link.
        kind: ``"tbf"``, ``"ingress"``, ``"noqueue"``, ``"pfifo_fast"``...
        handle: its own handle (``1:`` is 0x10000; 0 for a link's default).
        parent: `HANDLE_ROOT`, `HANDLE_INGRESS`, or the class it hangs on.
        tbf: for a TBF, its rate, bucket and limit (`TbfParameters`, the
            kernel's units); None for other kinds.
    """

    index: int
    kind: str
    handle: int
    parent: int
    tbf: TbfParameters | None = None


def _qdisc_of(msg: Any) -> Qdisc:
    kind = msg.get_attr("TCA_KIND") or ""
    tbf = None
    if kind == "tbf":
        options = msg.get_attr("TCA_OPTIONS")
        parms = None if options is None else options.get_attr("TCA_TBF_PARMS")
        if parms is not None:
            rate = options.get_attr("TCA_TBF_RATE64") or parms["rate"]
            tbf = TbfParameters(rate=rate, buffer=parms["buffer"], limit=parms["limit"])
    return Qdisc(index=msg["index"], kind=kind, handle=msg["handle"], parent=msg["parent"],
                 tbf=tbf)


def qdiscs(ipr: Socket, link: netlink.Link | str | int | None = None) -> list[Qdisc]:
    """The qdiscs of ``link`` (every link's when None), in the kernel's
    order (a link's root before its ingress). One dump (and a look-up for a
    name). A link that is down may have none listed.

    Raises:
        LinkNotFound: (999) no such link.
        CNIError: 999 for kernel errors.
    """
    index = None if link is None else netlink.link_index(ipr, link)
    target = "(all links)" if link is None else f"of {_target(link)}"
    msg = _tc_msg(index or 0, 0)
    answer = _call("list qdiscs", target, lambda: _send(ipr, msg, RTM_GETQDISC, _DUMP)) or []
    return [_qdisc_of(m) for m in answer
            if m["header"]["type"] == RTM_NEWQDISC and (index is None or m["index"] == index)]


def add_tbf(ipr: Socket, link: netlink.Link | str | int, rate: int, burst: int, *,
            latency_ms: float = LATENCY_MS, replace: bool = False,
            handle: int = 0x10000, parent: int = HANDLE_ROOT) -> TbfParameters:
    """Shape what ``link`` sends with a token bucket filter: ``rate`` bits
    per second, a bucket of ``burst`` bits (`tbf_parameters`, Go's
    arithmetic), as qdisc ``handle`` (``1:``) at ``parent`` (the root:
    ``tc qdisc add dev LINK root handle 1: tbf ...``). A link's default
    root qdisc is replaced; another qdisc there is EEXIST unless
    ``replace`` (NLM_F_REPLACE: ``tc qdisc replace``).

    Returns:
        the `TbfParameters` sent (what `qdiscs` reads back).

    Raises:
        LinkNotFound: (999) no such link.
        CNIError: 7 for bad values (`tbf_parameters`); 999 for kernel
            errors (EEXIST: a qdisc is there already).

    Source: Go bandwidth's ``createTBF`` (``netlink.QdiscAdd`` of a
    ``netlink.Tbf``: only TCA_TBF_PARMS, and TCA_TBF_RATE64 for rates of
    2^32 bytes/s and more).
    """
    params = tbf_parameters(rate, burst, latency_ms=latency_ms)
    options: list[Any] = [["TCA_TBF_PARMS", {"rate": min(params.rate, _U32),
                                             "limit": params.limit, "buffer": params.buffer}]]
    if params.rate > _U32:
        options.append(["TCA_TBF_RATE64", params.rate])

    def message(index: int) -> Any:
        msg = _tc_msg(index, parent, handle)
        msg["attrs"] = [["TCA_KIND", "tbf"], ["TCA_OPTIONS", {"attrs": options}]]
        return msg

    flags = _REQ | NLM_F_CREATE | (NLM_F_REPLACE if replace else NLM_F_EXCL)
    _change("replace tbf qdisc" if replace else "add tbf qdisc", ipr, link, RTM_NEWQDISC, flags,
            message)
    return params


def add_ingress_qdisc(ipr: Socket, link: netlink.Link | str | int) -> None:
    """Give ``link`` its ingress qdisc (handle ``ffff:`` at
    `HANDLE_INGRESS`: ``tc qdisc add dev LINK ingress``), where filters on
    what the link receives hang.

    Raises:
        LinkNotFound: (999) no such link.
        CNIError: 999 for kernel errors (EEXIST: it has one).

    Source: Go bandwidth's ``CreateEgressQdisc`` (``netlink.Ingress``).
    """

    def message(index: int) -> Any:
        msg = _tc_msg(index, HANDLE_INGRESS, INGRESS_QDISC)
        msg["attrs"] = [["TCA_KIND", "ingress"]]
        return msg

    _change("add ingress qdisc", ipr, link, RTM_NEWQDISC, _REQ | NLM_F_CREATE | NLM_F_EXCL,
            message)


def del_qdisc(ipr: Socket, link: netlink.Link | str | int, parent: int = HANDLE_ROOT, *,
              missing_ok: bool = True) -> bool:
    """Delete the qdisc of ``link`` at ``parent`` (`HANDLE_ROOT`: ``tc qdisc
    del dev LINK root``, the link gets its default back; `HANDLE_INGRESS`:
    its ingress qdisc and the filters on it). True when deleted.

    With ``missing_ok`` (default), nothing to delete (ENOENT: only the
    default is there) and a missing link answer False.

    Raises:
        LinkNotFound: (999) no such link, without ``missing_ok``.
        CNIError: 999 for kernel errors (ENOENT without ``missing_ok``).
    """
    handle = INGRESS_QDISC if parent == HANDLE_INGRESS else 0
    ignore = (errno.ENOENT,) if missing_ok else ()
    try:
        done = _change("delete qdisc", ipr, link, RTM_DELQDISC, _REQ,
                       lambda index: _tc_msg(index, parent, handle), ignore=ignore)
    except netlink.LinkNotFound:
        if missing_ok:
            return False
        raise
    return done is not None


# --------------------------------------------------------------------------
# filters


@dataclasses.dataclass(frozen=True)
class Filter:
    """One classifier as the kernel reported it (RTM_NEWTFILTER), the typed
    answer of `filters` (Go: ``netlink.U32`` and its ``Actions``). Only
    entries that match packets are listed (for u32: those with a selector,
    not its hash tables).

    Attributes:
        index: the ifindex of its link.
        kind: ``"u32"``, ``"matchall"``, ...
        parent: the qdisc it hangs on (``ffff:`` for the ingress qdisc).
        priority: its preference (lower first).
        protocol: the ETH_P_* it matches (`ETH_P_ALL`: every packet).
        handle: the kernel's handle of the entry (u32: ``800::800``...).
        classid: the class it sends matches to (u32's TCA_U32_CLASSID), or None.
        match_all: u32 only: its selector matches every packet (its keys
            all have mask 0).
        redirect: the ifindex of its first mirred action's egress
            redirect (``action mirred egress redirect dev X``), or None.
        actions: the kinds of its actions, in order (``("mirred",)``).
    """

    index: int
    kind: str
    parent: int
    priority: int
    protocol: int
    handle: int
    classid: int | None = None
    match_all: bool = False
    redirect: int | None = None
    actions: tuple[str, ...] = ()


def _filter_of(msg: Any) -> Filter | None:
    options = msg.get_attr("TCA_OPTIONS")
    kind = msg.get_attr("TCA_KIND") or ""
    if options is None or (kind == "u32" and options.get_attr("TCA_U32_SEL") is None):
        return None  # a chain's head or a u32 hash table: matches nothing itself
    sel = options.get_attr("TCA_U32_SEL") if kind == "u32" else None
    acts = options.get_attr("TCA_U32_ACT") or options.get_attr("TCA_MATCHALL_ACT") \
        if kind in ("u32", "matchall") else None
    kinds: list[str] = []
    redirect = None
    for _name, act in (acts["attrs"] if acts is not None else ()):
        if not hasattr(act, "get_attr"):
            continue
        kinds.append(act.get_attr("TCA_ACT_KIND") or "")
        act_options = act.get_attr("TCA_ACT_OPTIONS")
        parms = None if kinds[-1] != "mirred" or act_options is None \
            else act_options.get_attr("TCA_MIRRED_PARMS")
        if parms is not None and redirect is None and parms["eaction"] == _TCA_EGRESS_REDIR:
            redirect = parms["ifindex"]
    info = msg["info"]
    return Filter(index=msg["index"], kind=kind, parent=msg["parent"], priority=info >> 16,
                  protocol=socket.ntohs(info & 0xFFFF), handle=msg["handle"],
                  classid=options.get_attr("TCA_U32_CLASSID") if kind == "u32" else None,
                  match_all=sel is not None and all(k["key_mask"] == 0 for k in sel["keys"]),
                  redirect=redirect, actions=tuple(kinds))


def filters(ipr: Socket, link: netlink.Link | str | int,
            parent: int = INGRESS_QDISC) -> list[Filter]:
    """The filters on ``link``'s qdisc ``parent`` (default its ingress
    qdisc, ``ffff:``; ``tc filter show dev LINK ingress``), in the kernel's
    order. One dump (and a look-up for a name). No such qdisc: none.

    Raises:
        LinkNotFound: (999) no such link.
        CNIError: 999 for kernel errors.
    """
    answer = _change("list filters", ipr, link, RTM_GETTFILTER, _DUMP,
                     lambda index: _tc_msg(index, parent)) or []
    found = (_filter_of(m) for m in answer if m["header"]["type"] == RTM_NEWTFILTER)
    return [f for f in found if f is not None]


def add_redirect_filter(ipr: Socket, link: netlink.Link | str | int,
                        target: netlink.Link | str | int, *, parent: int = INGRESS_QDISC,
                        priority: int = 1, classid: int = 0x10001) -> None:
    """Send every packet ``link`` receives to ``target``'s egress: a u32
    filter matching all (protocol all, one key of mask 0) on ``link``'s
    qdisc ``parent`` (its ingress qdisc, `add_ingress_qdisc`), with one
    mirred action redirecting to ``target`` (``tc filter add dev LINK parent
    ffff: protocol all prio 1 u32 match u32 0 0 flowid 1:1 action mirred
    egress redirect dev TARGET``). The packet is taken (TC_ACT_STOLEN): it
    leaves ``target`` and is not received by ``link`` on the way.

    Raises:
        LinkNotFound: (999) no such ``link`` or ``target``.
        CNIError: 7 for a priority out of range; 999 for kernel errors
            (EINVAL when ``link`` has no qdisc ``parent``).

    Source: Go bandwidth's ``CreateEgressQdisc`` (``netlink.FilterAdd`` of a
    ``netlink.U32`` with ``ClassId: MakeHandle(1, 1)``, ``Priority: 1``,
    ``Protocol: ETH_P_ALL`` and a ``MirredAction`` to the ifb). Go sends the
    redirect twice (its ``RedirIndex`` and its ``Actions``); the second is
    never reached, the first having taken the packet.
    """
    if not 0 < priority <= 0xFFFF:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"invalid filter priority {priority}")
    redirect_to = netlink.link_index(ipr, target)
    options = cls_u32.get_parameters({
        "target": classid, "keys": ["0x0/0x0+0"],
        "action": {"kind": "mirred", "direction": "egress", "action": "redirect",
                   "ifindex": redirect_to}})

    def message(index: int) -> Any:
        msg = _tc_msg(index, parent, info=(priority << 16) | socket.htons(ETH_P_ALL))
        msg["attrs"] = [["TCA_KIND", "u32"], ["TCA_OPTIONS", options]]
        return msg

    _change("add filter", ipr, link, RTM_NEWTFILTER, _REQ | NLM_F_CREATE | NLM_F_EXCL, message)

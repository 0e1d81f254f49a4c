"""Connection tracking entries: find and delete them (ctnetlink).

The Go plugins' ``pkg/utils/conntrack.go`` equivalent. Acts in the network
namespace of the calling thread (call it inside `cni_skel.netns.NetNS.enter`
to act elsewhere).

The messages are pyroute2's (``nfct_msg``, ``NFCTAttrTuple``), sent on a
`cni_skel.nlsock.NetlinkSocket` of this call (pyroute2's ``Conntrack``
starts an asyncio loop per socket): the namespace's entry count, then (when
it has entries) one dump, then every delete in one send. Nothing is kept
between calls.

A conntrack dump walks the kernel's whole hash table (shared by all
namespaces, one lock per bucket: milliseconds of kernel CPU with the
default 262144 buckets) however few entries match, so a namespace that
tracks nothing is not dumped.
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from pyroute2.netlink import NETLINK_NETFILTER, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.marshal import Marshal
from pyroute2.netlink.nfnetlink import NFNL_SUBSYS_CTNETLINK
from pyroute2.netlink.nfnetlink.nfctsocket import (
    IPCTNL_MSG_CT_DELETE,
    IPCTNL_MSG_CT_GET,
    IPCTNL_MSG_CT_GET_STATS,
    AsyncNFCTSocket,
    NFCTAttrTuple,
    nfct_msg,
)

from .errors import ERR_INTERNAL, CNIError
from .nlsock import NetlinkSocket

__all__ = ["delete_entries"]

_FAMILY = {4: socket.AF_INET, 6: socket.AF_INET6}
_GET = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET
_DELETE = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE
_STATS = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET_STATS


def _same_ip(a: object, b: object) -> bool:
    try:
        return ipaddress.ip_address(str(a)) == ipaddress.ip_address(str(b))
    except ValueError:
        return False


def _socket() -> NetlinkSocket:
    """A ctnetlink socket whose answers pyroute2's nfct messages parse."""
    marshal = Marshal()
    marshal.msg_map.update(AsyncNFCTSocket.policy)
    return NetlinkSocket(NETLINK_NETFILTER, marshal)


def _tracked(sock: NetlinkSocket, family: int) -> int | None:
    """How many entries the calling namespace's table holds (every family;
    CTA_STATS_GLOBAL_ENTRIES), None when the kernel does not say."""
    msg = nfct_msg()
    msg["nfgen_family"] = family
    # The answer is one message marked NLM_F_MULTI with no NLMSG_DONE after
    # it: the ACK asked for ends it.
    for answer in sock.request(msg, _STATS, NLM_F_REQUEST | NLM_F_ACK):
        count = answer.get_attr("CTA_STATS_GLOBAL_ENTRIES")
        if count is not None:
            return count
    return None


def delete_entries(version: int, proto: int, *, dport: int | None = None,
                   daddr: str | None = None) -> int:
    """Delete the conntrack entries of IP ``version`` (4 or 6) and IP protocol
    number ``proto`` (6 TCP, 17 UDP, 132 SCTP) whose *original* direction
    goes to destination port ``dport`` and/or address ``daddr`` (None: any).
    Go: ``DeleteConntrackEntriesForDstPort`` / ``...ForDstIP``.

    Returns:
        how many entries were deleted (an entry that vanished meanwhile is
        not an error and not counted).

    Raises:
        CNIError: 999 when ctnetlink can not be used (no nf_conntrack, no
            CAP_NET_ADMIN).
    """
    family = _FAMILY[version]
    wanted = NFCTAttrTuple(family=family, proto=proto, dport=dport, daddr=daddr)
    wanted.attrs()  # computes wanted.flags, the CTA_FILTER of the dump
    dump = nfct_msg.create_from(tuple_orig=wanted,
                                cta_filter={"attrs": [["CTA_FILTER_ORIG_FLAGS", wanted.flags]]})
    dump["nfgen_family"] = family
    try:
        with _socket() as sock:
            if _tracked(sock, family) == 0:
                return 0
            doomed = []
            for entry in sock.request(dump, _GET, NLM_F_REQUEST | NLM_F_DUMP):
                orig = NFCTAttrTuple.from_netlink(family, entry.get_attr("CTA_TUPLE_ORIG"))
                # The kernel filters dumps (CTA_FILTER, Linux 5.8+); check again
                # for older kernels that ignore the filter.
                if orig.proto != proto or (dport is not None and orig.dport not in (None, dport)) \
                        or (daddr is not None and not _same_ip(orig.daddr, daddr)):
                    continue
                msg = nfct_msg.create_from(tuple_orig=orig)
                msg["nfgen_family"] = family
                doomed.append((msg, _DELETE, NLM_F_REQUEST | NLM_F_ACK))
            answers = sock.batch(doomed)
    except (OSError, NetlinkError) as e:
        raise CNIError(ERR_INTERNAL, f"conntrack: deleting entries to port {dport}: {e}") from e
    failed = [err for _, err in answers if err not in (0, errno.ENOENT)]
    if failed:
        e = NetlinkError(failed[0])
        raise CNIError(ERR_INTERNAL, f"conntrack: deleting entries to port {dport}: {e}") from e
    return sum(1 for _, err in answers if err == 0)

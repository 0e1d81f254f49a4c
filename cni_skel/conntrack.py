"""Connection tracking entries: find and delete them (pyroute2's
``Conntrack``, ctnetlink).

The Go plugins' ``pkg/utils/conntrack.go`` equivalent. Acts in the network
namespace of the calling thread (call it inside `cni_skel.netns.NetNS.enter`
to act elsewhere).
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from pyroute2 import Conntrack
from pyroute2.conntrack import NFCTAttrTuple
from pyroute2.netlink.exceptions import NetlinkError

from .errors import ERR_INTERNAL, CNIError

__all__ = ["delete_entries"]

_FAMILY = {4: socket.AF_INET, 6: socket.AF_INET6}


def _same_ip(a: object, b: object) -> bool:
    try:
        return ipaddress.ip_address(str(a)) == ipaddress.ip_address(str(b))
    except ValueError:
        return False


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
    wanted = NFCTAttrTuple(family=_FAMILY[version], proto=proto, dport=dport, daddr=daddr)
    deleted = 0
    try:
        with Conntrack() as ct:
            for entry in list(ct.dump_entries(tuple_orig=wanted)):
                # The kernel filters dumps (CTA_FILTER, Linux 5.8+); check again
                # for older kernels that ignore the filter.
                orig = entry.tuple_orig
                if orig.proto != proto or (dport is not None and orig.dport not in (None, dport)) \
                        or (daddr is not None and not _same_ip(orig.daddr, daddr)):
                    continue
                try:
                    ct.delete(entry)
                    deleted += 1
                except NetlinkError as e:
                    if e.code != errno.ENOENT:
                        raise
    except (OSError, NetlinkError) as e:
        raise CNIError(ERR_INTERNAL, f"conntrack: deleting entries to port {dport}: {e}") from e
    return deleted

"""A pod's veth pair in one call (Go ``ip.SetupVeth``).

What every veth-based plugin does first (bridge, ptp, ...): a host end with a
fresh random name, a container end ``CNI_IFNAME`` inside the pod, both up,
the host end taking no IPv6 router advertisements (the plugin owns its
routes). Built on `cni_skel.netlink.create_veth_pair`: one request from the
node's namespace creates the container end directly in the pod's (Go sends
it from inside the pod's namespace, placing the host end in the node's: the
same final state, with no thread entering the pod).

Source: Go ``pkg/ip/link_linux.go`` ``SetupVeth`` / ``SetupVethWithName`` /
``RandomVethName`` (containernetworking/plugins 1.1.1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import TYPE_CHECKING

from . import linkbatch, netlink
from .errors import ERR_INTERNAL, CNIError
from .sysctl import write_sysctl

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .netlink import Link, Socket
    from .netns import NetNS

__all__ = ["VETH_TRIES", "delete_veth", "random_veth_name", "setup_veth"]

VETH_TRIES = 10  # fresh random host-side names before giving up (Go: 10)


def random_veth_name() -> str:
    """``"veth"`` + 8 random hex digits (Go ``ip.RandomVethName``; the
    prefix makes NetworkManager leave the link alone)."""
    return "veth" + os.urandom(4).hex()


def setup_veth(ipr: Socket, netns: NetNS, ifname: str, *, mtu: int | None = None,
               mac: str | None = None, host_name: str | None = None,
               master: Link | int | None = None, up: bool = True,
               peer_ipr: Socket | None = None) -> tuple[Link, Link]:
    """Create a veth pair: the host end in ``ipr``'s namespace (call this
    with the thread there too: the host end's sysctl is written in the
    thread's namespace), the container end ``ifname`` in ``netns``.

    ``mtu``: bytes, both ends (None: the kernel's 1500). ``mac``: the
    container end's MAC (kernel random when None). ``host_name``: the host
    end's name; None picks `random_veth_name` names until one is free
    (at most `VETH_TRIES`). ``master``: make the host end a port of that
    bridge in the creation request. ``up``: bring both ends up (False
    leaves them down, for a caller that sets port flags and IFF_UP in one
    request). ``peer_ipr``: a socket bound to ``netns`` (one is opened when
    needed and not given). The host end's ``accept_ra`` is set to 0, best
    effort (no IPv6: nothing to do), as Go.

    Returns:
        ``(host, container)`` `cni_skel.netlink.Link` objects as the kernel
        created them (``up`` set when brought up here); the container's
        ifindex belongs to ``netns``.

    Raises:
        CNIError: 999 ``container interface "<ifname>" already exists in
            <netns>``; 999 when ``host_name`` is taken or no free random
            name was found; 7 for bad names, MAC or MTU; 999 for kernel
            errors. Nothing is left behind on an error.
    """
    names = [host_name] if host_name else [random_veth_name() for _ in range(VETH_TRIES)]
    for name in names:
        try:
            host, cont = netlink.create_veth_pair(ipr, name, ifname, peer_netns=netns, mtu=mtu,
                                                  peer_mac=mac, master=master,
                                                  peer_ipr=peer_ipr)
            break
        except netlink.LinkExists as e:
            if e.name != name:
                raise CNIError(ERR_INTERNAL, f'container interface "{ifname}" already '
                                             f"exists in {netns.path}") from e
            if host_name:
                raise
    else:
        raise CNIError(ERR_INTERNAL, "failed to find a unique veth name")
    try:
        with contextlib.suppress(CNIError):
            write_sysctl(f"net/ipv6/conf/{host.name}/accept_ra", "0")
        if up:
            netlink.link_up(ipr, host)
            with contextlib.ExitStack() as stack:
                if peer_ipr is None:
                    peer_ipr = stack.enter_context(netns.rtnl())
                netlink.link_up(peer_ipr, cont)
            host = dataclasses.replace(host, up=True, flags=host.flags | netlink.IFF_UP)
            cont = dataclasses.replace(cont, up=True, flags=cont.flags | netlink.IFF_UP)
    except BaseException:
        netlink.delete_link(ipr, host)  # takes the container end with it
        raise
    return host, cont


def delete_veth(ipr: Socket, peer_ipr: Socket, ifname: str) -> bool:
    """Delete the pod's veth ``ifname`` (in ``peer_ipr``'s namespace); the
    pair goes as one. With no other deletion under way in ``ipr``'s
    namespace (the node's) it deletes ``ifname`` in the pod, as Go's DEL
    does (``ip.DelLinkByName``), keeping the node's deletions that arrive
    meanwhile waiting behind it; else it deletes the pair by its host end
    in the node, where concurrent DELs share one kernel request for their
    host ends (`cni_skel.netlink.delete_link` batches the deletions of its
    process's own namespace). The host end is the container end's peer
    only when the pod's namespace names ``ipr``'s as the peer's
    (`cni_skel.netlink.netnsid`): else, and for a link that is no veth,
    ``ifname`` itself is deleted in the pod. Call it from the node's
    namespace.

    Returns:
        True when a link was deleted; False when the pod had no ``ifname``.

    Raises:
        CNIError: 999 for kernel errors.
    """
    with linkbatch.alone(ipr) as alone:
        if alone:  # no batch to join: the pod's end, one request
            return netlink.delete_link(peer_ipr, ifname)
    cont = netlink.find_link(peer_ipr, ifname)
    if cont is None:
        return False
    if (cont.kind == "veth" and cont.peer_index and cont.link_netnsid is not None
            and netlink.netnsid(peer_ipr, ipr) == cont.link_netnsid
            and netlink.delete_link(ipr, netlink.Link(index=cont.peer_index,
                                                      name=f"{ifname}'s peer", kind="veth"))):
        return True
    return netlink.delete_link(peer_ipr, cont)

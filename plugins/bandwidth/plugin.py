"""CNI meta plugin ``bandwidth``: rate limits on a pod's veth, with token
bucket filters on the node's end of it (Go 1.1.1's bandwidth).

Traffic into the pod (``ingressRate``) leaves the node's veth end toward
the pod: a TBF as that end's root qdisc shapes it. Traffic out of the pod
(``egressRate``) arrives on that end, where a qdisc cannot hold it back:
its ingress qdisc's filter redirects every packet to an ifb link of the
attachment (``bwp`` + 12 hex digits of SHA-512 of the network name and the
container ID, Go's name), whose root TBF shapes it before the packet goes
on as if received on the veth. DEL removes the veth's qdiscs while the
veth is there (Go leaves them to the veth's deletion) and the ifb (GC the
ifbs of attachments gone).

Rates are bits per second, bursts bits (Go's keys and units); a limit of 0
is none.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any

from pydantic import Field, StrictInt

from cni_skel import CmdArgs, CNIError, NetConf, Plugin, Result, netlink, tc
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG
from cni_skel.model import CNIModel
from cni_skel.netns import NetNS, open_netns
from cni_skel.rollback import rollback
from cni_skel.rtnl import Rtnl
from cni_skel.tags import network_tag
from cni_skel.types import Interface, check_expressible

__all__ = ["IFB_PREFIX", "Bandwidth", "BandwidthConf", "BandwidthEntry", "ifb_name"]

#: The first letters of every ifb this plugin makes (Go's ``ifbDevicePrefix``).
IFB_PREFIX = "bwp"
_IFB_LEN = 15  # Go's maxIfbDeviceLength: IFNAMSIZ - 1
_IFB_RE = re.compile(rf"{IFB_PREFIX}[0-9a-f]{{{_IFB_LEN - len(IFB_PREFIX)}}}")
_U64 = 2**64 - 1
_ALIAS = "cni-skel bandwidth "

#: Bits (per second), Go's uint64: a negative number, a fraction or a string is code 7.
Bits = Annotated[StrictInt, Field(ge=0, le=_U64)]
_KEYS = ("ingress_rate", "ingress_burst", "egress_rate", "egress_burst")


class BandwidthEntry(CNIModel):
    """The four limits (Go's ``BandwidthEntry``): rates in bits per second,
    bursts in bits; 0 is no limit. A rate needs its burst and a burst its
    rate (`check`)."""

    ingress_rate: Bits = Field(0, alias="ingressRate")
    ingress_burst: Bits = Field(0, alias="ingressBurst")
    egress_rate: Bits = Field(0, alias="egressRate")
    egress_burst: Bits = Field(0, alias="egressBurst")

    def is_zero(self) -> bool:
        """Nothing to shape (Go's ``isZero``)."""
        return not any(getattr(self, key) for key in _KEYS)

    def check(self) -> None:
        """Go's ``validateRateAndBurst`` of each direction.

        Raises:
            CNIError: code 7 with Go's message: a rate without a burst, a
                burst without a rate, a burst of 4 GB (2^32-1 bytes) or more.
        """
        for rate, burst in ((self.ingress_rate, self.ingress_burst),
                            (self.egress_rate, self.egress_burst)):
            if burst == 0 and rate != 0:
                raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                               "if rate is set, burst must also be set")
            if rate == 0 and burst != 0:
                raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                               "if burst is set, rate must also be set")
            if burst // 8 >= 2**32 - 1:
                raise CNIError(ERR_INVALID_NETWORK_CONFIG, "burst cannot be more than 4GB")


class BandwidthRuntimeConfig(CNIModel):
    """``runtimeConfig``: the ``bandwidth`` capability (what kubelet fills
    from a pod's bandwidth annotations)."""

    bandwidth: BandwidthEntry | None = None


class BandwidthConf(NetConf):
    """NetConf (cniVersion, name, prevResult, ...) plus the four limits at the
    top level (``ingressRate``, ``ingressBurst``, ``egressRate``,
    ``egressBurst``) and ``runtimeConfig.bandwidth`` with the same keys.
    A value that is not a whole number of 0..2^64-1 is code 7 naming it."""

    ingress_rate: Bits | None = Field(None, alias="ingressRate")
    ingress_burst: Bits | None = Field(None, alias="ingressBurst")
    egress_rate: Bits | None = Field(None, alias="egressRate")
    egress_burst: Bits | None = Field(None, alias="egressBurst")
    runtime_config: BandwidthRuntimeConfig = Field(default_factory=BandwidthRuntimeConfig,
                                                   alias="runtimeConfig")

    def limits(self) -> BandwidthEntry | None:
        """The limits in force (Go's ``getBandwidth``), checked
        (`BandwidthEntry.check`): the top-level keys when the config has any
        of the four (even as 0 or null: Go's embedded entry then exists),
        else ``runtimeConfig.bandwidth``; None when neither is there.

        Raises:
            CNIError: code 7, as `BandwidthEntry.check`.
        """
        if any(key in self.model_fields_set for key in _KEYS):
            entry = BandwidthEntry(**{key: getattr(self, key) or 0 for key in _KEYS})
        else:
            entry = self.runtime_config.bandwidth
        if entry is not None:
            entry.check()
        return entry


def ifb_name(network: str, container_id: str) -> str:
    """The ifb of an attachment, as Go names it: ``bwp`` and the first 12
    hex digits of SHA-512 of the network name followed by the container ID
    (15 characters)."""
    digest = hashlib.sha512((network + container_id).encode("utf-8", "surrogatepass"))
    return (IFB_PREFIX + digest.hexdigest())[:_IFB_LEN]


def _alias(network: str) -> str:
    """The IFLA_IFALIAS marking an ifb this plugin made for ``network``: what
    GC goes by (an ifb's name hashes the network with the container ID, so
    it does not tell which network an ifb is of)."""
    return _ALIAS + network_tag(network)


def _host_veth(ipr: Any, pod: NetNS, prev: Result, ifname: str) -> netlink.Link:
    """The node's end of the pod's veth: the peer of ``ifname`` in the pod,
    which prevResult must list as an interface without a sandbox (Go's
    ``getHostInterface``).

    Raises:
        CNIError: 7 when prevResult lists no interface; 999 when ``ifname``
            is no veth, its peer is not in this namespace, or prevResult does
            not name it.
    """
    if not prev.interfaces:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "no interfaces provided")
    with pod.rtnl() as pipr:
        cont = netlink.find_link(pipr, ifname)
    if cont is None or cont.kind != "veth" or not cont.peer_index:
        why = "link not found" if cont is None else f"it is {cont.kind or 'no veth'}"
        raise CNIError(ERR_INTERNAL, f"container interface {ifname} has no veth peer: {why}")
    host = netlink.find_link(ipr, cont.peer_index)
    # The index is the peer's in its own namespace: a link here with that
    # index must be a veth pointing back at the pod's end to be the peer.
    if host is None or host.kind != "veth" or host.peer_index != cont.index:
        raise CNIError(ERR_INTERNAL, f"veth peer with index {cont.peer_index} is not in host ns")
    if not any(not iface.sandbox and iface.name == host.name for iface in prev.interfaces):
        raise CNIError(ERR_INTERNAL, "no veth peer of container interface found in host ns",
                       f'prevResult lists no interface "{host.name}" without a sandbox')
    return host


def _veth_peer(ipr: Any, netns: str, ifname: str) -> netlink.Link | None:
    """The node's end of the pod's veth ``ifname``, or None when the pod,
    the link or its peer here is gone (or it is no veth)."""
    pod = open_netns(netns, missing_ok=True) if netns else None
    if pod is None:
        return None
    with pod, pod.rtnl() as pipr:
        cont = netlink.find_link(pipr, ifname)
    if cont is None or cont.kind != "veth" or not cont.peer_index:
        return None
    host = netlink.find_link(ipr, cont.peer_index)
    if host is None or host.kind != "veth" or host.peer_index != cont.index:
        return None
    return host


def _tbf_problem(ipr: Any, link: netlink.Link, want: tc.TbfParameters, what: str) -> str | None:
    """What differs between ``link``'s root qdisc and the TBF ``want``
    (None: nothing); ``what`` names the limit in the message."""
    root = next((q for q in tc.qdiscs(ipr, link) if q.parent == tc.HANDLE_ROOT), None)
    if root is None or root.tbf is None:
        kind = "none" if root is None else root.kind
        return f'no TBF qdisc on "{link.name}" for {what} (its root qdisc is {kind})'
    have = root.tbf
    for field, unit in (("rate", "bytes/s"), ("limit", "bytes"), ("buffer", "ticks")):
        if getattr(have, field) != getattr(want, field):
            return (f"{field.capitalize()} doesn't match: {what} TBF on \"{link.name}\" has "
                    f"{field} {getattr(have, field)} {unit}, want {getattr(want, field)}")
    return None


class Bandwidth(Plugin):
    """bandwidth: ADD, CHECK and DEL as Go's (CHECK looks at everything ADD
    made); GC deletes the ifbs of this network's attachments not in
    ``cni.dev/valid-attachments``; STATUS succeeds (Go's has neither)."""

    name = "bandwidth"
    config_model = BandwidthConf

    def validate_config(self, args: CmdArgs, conf: BandwidthConf) -> None:
        """The limits' rules (`BandwidthConf.limits`); code 7."""
        conf.limits()

    def add(self, args: CmdArgs, conf: BandwidthConf) -> Result:
        """Shape the pod's traffic on the node's end of its veth, found from
        prevResult (see the module). Any failure undoes what this ADD did.

        Returns:
            prevResult, and the ifb (name, MAC) as one more interface when
            egress is shaped (as Go); prevResult alone with no limits.

        Raises:
            CNIError: 7 for bad limits, without prevResult, or with no
                interface in it; 999 when the veth or its peer is not found,
                or the kernel refuses (an ifb of that name exists, the veth
                has a root or ingress qdisc of its own already).
        """
        limits = conf.limits()
        prev = conf.prev_result
        if prev is None:  # Go: 999, or a crash without limits
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "must be called as chained plugin")
        check_expressible(conf.cni_version, prev)
        if limits is None or limits.is_zero():
            return prev
        for rate, burst in ((limits.ingress_rate, limits.ingress_burst),
                            (limits.egress_rate, limits.egress_burst)):
            if rate:
                tc.tbf_parameters(rate, burst)  # code 7 before the first change
        result = prev.model_copy(deep=True)
        with NetNS.open(args.netns) as pod, Rtnl() as ipr, rollback(self.name) as undo:
            host = _host_veth(ipr, pod, prev, args.ifname)
            if limits.ingress_rate:
                tc.add_tbf(ipr, host, limits.ingress_rate, limits.ingress_burst)
                undo.callback(f'deleting the TBF on "{host.name}"', tc.del_qdisc, ipr, host)
            if limits.egress_rate:
                name = ifb_name(conf.name, args.container_id)
                ifb = tc.create_ifb(ipr, name, mtu=host.mtu)
                undo.callback(f'deleting ifb "{name}"', netlink.delete_link, ipr, ifb)
                netlink.link_set(ipr, ifb, ifalias=_alias(conf.name))
                result.interfaces.append(Interface(name=name, mac=ifb.mac))
                tc.add_ingress_qdisc(ipr, host)
                undo.callback(f'deleting the ingress qdisc of "{host.name}"', tc.del_qdisc,
                              ipr, host, tc.HANDLE_INGRESS)
                tc.add_redirect_filter(ipr, host, ifb)
                tc.add_tbf(ipr, ifb, limits.egress_rate, limits.egress_burst)
        return result

    def check(self, args: CmdArgs, conf: BandwidthConf) -> None:
        """The qdiscs ADD made are there with the configured rates: the
        veth's root TBF for ``ingressRate``; for ``egressRate`` the ifb, its
        root TBF, the veth's ingress qdisc and its filter redirecting to the
        ifb. Go's CHECK compares each TBF's rate, limit and buffer but stops
        at the first qdisc that is no TBF (a veth without its TBF passes)
        and does not look at the redirect.

        Raises:
            CNIError: 7 for bad limits or without prevResult; 999 naming the
                first thing that differs (Go's "Rate doesn't match", ...).
        """
        limits = conf.limits()
        prev = conf.prev_result
        if prev is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "must be called as a chained plugin")
        with NetNS.open(args.netns) as pod, Rtnl() as ipr:
            host = _host_veth(ipr, pod, prev, args.ifname)
            if limits is None or limits.is_zero():
                return
            problem = None
            if limits.ingress_rate:
                want = tc.tbf_parameters(limits.ingress_rate, limits.ingress_burst)
                problem = _tbf_problem(ipr, host, want, "ingress")
            if problem is None and limits.egress_rate:
                problem = self._egress_problem(ipr, host, conf.name, args.container_id, limits)
        if problem is not None:
            raise CNIError(ERR_INTERNAL, f"bandwidth: {problem}")

    @staticmethod
    def _egress_problem(ipr: Any, host: netlink.Link, network: str, container_id: str,
                        limits: BandwidthEntry) -> str | None:
        name = ifb_name(network, container_id)
        ifb = netlink.find_link(ipr, name)
        if ifb is None:
            return f'get ifb device: link "{name}" not found'
        want = tc.tbf_parameters(limits.egress_rate, limits.egress_burst)
        problem = _tbf_problem(ipr, ifb, want, "egress")
        if problem is not None:
            return problem
        if not any(q.kind == "ingress" for q in tc.qdiscs(ipr, host)):
            return f'no ingress qdisc on "{host.name}"'
        if not any(f.match_all and f.redirect == ifb.index for f in tc.filters(ipr, host)):
            return f'no filter on "{host.name}" redirecting its traffic to "{name}"'
        return None

    def delete(self, args: CmdArgs, conf: BandwidthConf) -> None:
        """Remove what ADD made: the root TBF and the ingress qdisc (when
        its filter redirects to this attachment's ifb, or to an ifb already
        gone) of the node's end of
        the pod's veth, while the pod and its veth are there (Go leaves them
        for the veth's own deletion), then the attachment's ifb. Succeeds
        when things are gone; needs no namespace. A link of the ifb's name
        that is no ifb is not this plugin's and stays (Go's deletes it).
        The limits are not checked again (Go's DEL fails for a config its
        ADD refused, and so for good).

        Raises:
            CNIError: 999 when the kernel refuses.
        """
        with Rtnl() as ipr:
            ifb = netlink.find_link(ipr, ifb_name(conf.name, args.container_id))
            if ifb is not None and ifb.kind != "ifb":
                ifb = None
            host = _veth_peer(ipr, args.netns, args.ifname)
            if host is not None:
                if any(q.parent == tc.HANDLE_ROOT and q.kind == "tbf"
                       for q in tc.qdiscs(ipr, host)):
                    tc.del_qdisc(ipr, host)
                # ours, or one whose ifb is gone already (an earlier DEL
                # without the pod, GC: the kernel reports no target then)
                if any("mirred" in f.actions and (
                        not f.redirect or (ifb is not None and f.redirect == ifb.index)
                        or netlink.find_link(ipr, f.redirect) is None)
                       for f in tc.filters(ipr, host)):
                    tc.del_qdisc(ipr, host, tc.HANDLE_INGRESS)
            if ifb is not None:
                netlink.delete_link(ipr, ifb)

    def gc(self, args: CmdArgs, conf: BandwidthConf) -> None:
        """Delete the ifbs this plugin made for this network (its alias on
        them) whose attachment's container is not in
        ``cni.dev/valid-attachments``, and the ingress qdisc of a node veth
        still redirecting to one. Ifbs of other networks, those Go's
        plugin made (no alias) and any other link stay. Best effort: a
        failure does not stop the others.

        Raises:
            CNIError: 7 without the list of valid attachments (nothing is
                deleted); 999 naming the last ifb the kernel would not delete.
        """
        keep = {ifb_name(conf.name, a.container_id) for a in conf.gc_keep()}
        mark = _alias(conf.name)
        failed: CNIError | None = None
        with Rtnl() as ipr:
            stale = [link for link in netlink.links(ipr, "ifb") if link.alias == mark
                     and link.name not in keep and _IFB_RE.fullmatch(link.name)]
            gone = {link.index for link in stale}
            veths = netlink.links(ipr, "veth") if stale else []
            for veth in veths:  # a veth still here redirecting to one: its ingress qdisc
                try:
                    if any(f.redirect in gone for f in tc.filters(ipr, veth)):
                        tc.del_qdisc(ipr, veth, tc.HANDLE_INGRESS)
                except CNIError as exc:
                    failed = exc
            for link in stale:
                try:
                    netlink.delete_link(ipr, link)
                except CNIError as exc:
                    failed = exc
        if failed is not None:
            raise failed

    @classmethod
    def node_state(cls) -> list[str]:
        """The ifbs it made in this network namespace, of any network
        (`cni_skel.skel.Plugin.node_state`). Go's DEL finds them by the same
        name, so a hand-over to Go needs nothing."""
        with Rtnl() as ipr:
            n = sum(1 for link in netlink.links(ipr, "ifb")
                    if (link.alias or "").startswith(_ALIAS) and _IFB_RE.fullmatch(link.name))
        return [f"{n} ifb link(s) shaping pods' egress, deleted by their DEL or GC"] if n else []

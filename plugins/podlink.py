"""The flow shared by the plugins that make one link in the pod: ``macvlan``,
``ipvlan``, ``vlan`` (on a node-side *master*) and ``dummy`` (none).

Written once here, configured by each plugin (`PodLinkPlugin` class
attributes and three hooks: `PodLinkPlugin.find_master`,
`PodLinkPlugin.create_link`, `PodLinkPlugin.link_problem`):

* **ADD** (Go's cmdAdd of the four, in its order): resolve the master (the
  ``master`` key, else the node's default-route interface; inside the pod
  with ``linkInContainer``), create the link directly in the pod under
  CNI_IFNAME (Go always creates it under a temporary name and renames it;
  the SDK does so only on kernels that also refuse a name taken on the node,
  such as Debian 12's 6.1; a name taken in the pod is 999 as Go's), IPAM
  ADD (optional for macvlan: no ``ipam.type`` means an L2-only link, brought
  up, a result with the interface only), for macvlan and ipvlan the
  ``arp_notify``/``ndisc_notify`` sysctls (`cni_skel.announce.notify_sysctls`),
  then addresses, up and routes (`cni_skel.ipam.configure_iface`): going up
  with its addresses, the link announces each one (the kernel sends a
  gratuitous ARP, and an unsolicited NA once DAD is done). Any failure deletes the
  link and runs IPAM DEL (Go 1.1.1 leaves the link when IPAM fails).
* **DEL**: IPAM DEL, then CNI_IFNAME in the pod when it is a link of this
  plugin's kind (Go deletes whatever has the name). A missing netns or link
  is success; the master is not needed (Go 1.1.1's macvlan and vlan DEL fail
  when it is gone).
* **CHECK**: prevResult required (code 7), IPAM CHECK, then the link in the
  pod: kind, the master it sits on, the plugin's own settings (mode, VLAN
  ID...), prevResult's MAC, up, prevResult's addresses and routes; each
  mismatch is 999 naming it.
* **GC**, **STATUS**: passed to IPAM (the `cni_skel.skel.Plugin` defaults).

Config errors are code 7 naming the key (Go: 999 for all of them); runtime
errors keep Go's code (999) and, where Go has one, its text.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from cni_skel import netlink
from cni_skel.announce import notify_sysctls
from cni_skel.config import IfName, NetConf
from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, CNIError
from cni_skel.invoke import delegate_check, delegate_del, ipam_add
from cni_skel.ipam import check_interface_ips, check_routes, configure_iface
from cni_skel.netns import NetNS, open_netns
from cni_skel.rollback import Rollback, rollback
from cni_skel.rtnl import Rtnl
from cni_skel.skel import Plugin
from cni_skel.types import DNS, Interface, Result, check_expressible

__all__ = ["MasterLinkConf", "MasterLinkPlugin", "PodLinkPlugin", "ipam_type", "link_mode"]


def ipam_type(conf: NetConf) -> str:
    """The config's ``ipam.type``, ``""`` when it has none (Go's
    ``n.IPAM.Type``: an L2-only attachment for macvlan)."""
    return conf.ipam.type if conf.ipam is not None else ""


def link_mode(kind: str, value: Any, modes: tuple[str, ...]) -> Any:
    """A ``mode`` key's value: absent or ``""`` is ``modes[0]`` (Go's
    default); one not in ``modes`` raises ValueError with Go's text
    (``unknown <kind> mode: "x"``), which the config model answers with
    code 7 naming the key."""
    if value in (None, ""):
        return modes[0]
    if value not in modes:
        raise ValueError(f'unknown {kind} mode: "{value}"')
    return value


class MasterLinkConf(NetConf):
    """Keys of the plugins whose link sits on a master (macvlan, ipvlan,
    vlan): ``master`` (an interface name; absent or ``""``: the plugin's
    default), ``mtu`` (bytes, >= 0, 0: the kernel's, which is the master's;
    above the master's MTU is code 7 with Go's text at ADD/CHECK),
    ``linkInContainer`` (newer Go: the master is a link of the pod's netns,
    and the new link is made there)."""

    master: IfName | None = None
    mtu: int = Field(0, ge=0)
    link_in_container: bool = Field(False, alias="linkInContainer")

    @field_validator("master", mode="before")
    @classmethod
    def _unset_master(cls, value: Any) -> Any:
        return None if value == "" else value  # Go: "" is "not given"


def _default_route_link(ipr: Rtnl) -> netlink.Link:
    # Go lists routes of every family (IPv4 first) and takes the first default.
    for family in (4, 6):
        link = netlink.default_route_interface(ipr, family)
        if link is not None:
            return link
    raise CNIError(ERR_INTERNAL, "no default route interface found")


class PodLinkPlugin(Plugin):
    """ADD / DEL / CHECK of one link in the pod (module docstring); a plugin
    sets the class attributes and implements `create_link` (and, with a
    master, `find_master`; for its own settings, `link_problem`).

    Class attributes:
        kind: the link kind (IFLA_INFO_KIND) the plugin makes and DEL/CHECK
            look for.
        ip_source_required: None when an attachment without addresses is
            fine (macvlan), else the code-7 message for a config with no
            IPAM (Go's dummy text for dummy).
        announce: set Go's ``arp_notify``/``ndisc_notify`` on the link
            before its addresses and its up, so the kernel announces each
            address (macvlan, ipvlan).
        dns_from_config: the result's ``dns`` is the config's (Go's
            ``result.DNS = n.DNS``, ``{}`` when the config has none); False:
            the IPAM result's (dummy).
    """

    kind: ClassVar[str] = ""
    ip_source_required: ClassVar[str | None] = None
    announce: ClassVar[bool] = False
    dns_from_config: ClassVar[bool] = True

    # -- hooks -----------------------------------------------------------------

    def link_in_pod(self, conf: Any) -> bool:
        """Whether the master is looked up, and the link created, in the pod
        (``linkInContainer``); else in the node's namespace."""
        return bool(getattr(conf, "link_in_container", False))

    def find_master(self, args: CmdArgs, conf: Any, ipr: Rtnl, *,
                    checking: bool = False) -> netlink.Link | None:
        """The link the new one sits on, read through ``ipr`` (the node's
        socket, or the pod's with `link_in_pod`); None: no master (dummy,
        or nothing to compare at CHECK). Default: None."""
        return None

    def create_link(self, ipr: Rtnl, name: str, args: CmdArgs, conf: Any,
                    master: netlink.Link | None, target: dict[str, Any]) -> netlink.Link:
        """Create the link ``name`` (CNI_IFNAME) on ``master`` through
        ``ipr``; ``target``: the
        ``netns``/``netns_ipr`` keywords of the `cni_skel.netlink`
        ``create_*`` helpers (put it in the pod). Returns it as read in the
        pod."""
        raise NotImplementedError

    def link_problem(self, link: netlink.Link, conf: Any) -> str | None:
        """CHECK of the plugin's own settings on the pod's link (mode, VLAN
        ID...): the mismatch as a message, None when it matches."""
        return None

    def ip_source(self, conf: Any) -> bool:
        """Whether ADD gets addresses: an ``ipam.type`` (ipvlan also takes
        them from a chained prevResult)."""
        return bool(ipam_type(conf))

    def addresses(self, undo: Rollback, args: CmdArgs, conf: Any) -> Result:
        """The IPs, routes and DNS for the link: IPAM ADD (its DEL on
        ``undo``) when configured, else none (an L2-only link).

        Raises:
            CNIError: IPAM's error; 999 ``IPAM plugin returned missing IP
                config`` (Go's) when it gave no IP.
        """
        kind = ipam_type(conf)
        if not kind:
            return Result()
        got = ipam_add(undo, kind, args.stdin_data, args)
        if not got.ips:
            raise CNIError(ERR_INTERNAL, "IPAM plugin returned missing IP config")
        return Result(ips=got.ips, routes=got.routes, dns=got.dns)

    # -- verbs -----------------------------------------------------------------

    def validate_config(self, args: CmdArgs, conf: Any) -> None:
        """ADD's checks before any side effect: an IP source when the plugin
        needs one, and a result the config's cniVersion can carry.

        Raises:
            CNIError: 7 (`ip_source_required`); 1 for an L2-only result at
                0.1.0/0.2.0 (Go creates the link, answers 999 and leaves it).
        """
        has_ip = self.ip_source(conf)
        if self.ip_source_required is not None and not has_ip:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, self.ip_source_required, "ipam")
        check_expressible(conf.cni_version, has_ip=has_ip)

    def add(self, args: CmdArgs, conf: Any) -> Result:
        """Create the link in the pod, configure it, answer the result (one
        interface: the link's name, MAC and sandbox; every IP on it).

        Raises:
            CNIError: as `validate_config`; 7 for an MTU above the
                master's; 999 for a missing master or default route, a name
                taken in the pod, IPAM and kernel errors. Nothing is left
                behind.
        """
        self.validate_config(args, conf)
        in_pod = self.link_in_pod(conf)
        with NetNS.open(args.netns) as pod, Rtnl() as ipr, pod.rtnl() as cipr, \
                rollback(self.name) as undo:
            home = cipr if in_pod else ipr
            master = self.find_master(args, conf, home)
            target: dict[str, Any] = {"netns": None if in_pod else pod, "netns_ipr": cipr}
            link = self._create(home, cipr, args, conf, master, target)
            undo.callback(f"deleting {args.ifname}", netlink.delete_link, cipr, link)
            result = self.addresses(undo, args, conf)
            result.cni_version = conf.cni_version
            result.interfaces = [Interface(name=args.ifname, mac=link.mac, sandbox=args.netns)]
            for ipc in result.ips:
                ipc.interface = 0  # every address is the pod link's
            if result.ips:
                if self.announce:
                    # before the addresses and the link's up: the kernel then
                    # announces each address itself (as with Go)
                    pod.run(notify_sysctls, args.ifname)
                configure_iface(pod, link, result, ipr=cipr)
            else:
                netlink.link_up(cipr, link)
        if self.dns_from_config:
            result.dns = conf.dns.model_copy(deep=True) if conf.dns is not None else DNS()
        return result

    def _create(self, ipr: Rtnl, cipr: Rtnl, args: CmdArgs, conf: Any,
                master: netlink.Link | None, target: dict[str, Any]) -> netlink.Link:
        """`create_link` under CNI_IFNAME, in the pod (on older kernels the
        SDK makes it under a temporary name and renames it there, as Go
        always does); errors with Go's texts."""
        try:
            return self.create_link(ipr, args.ifname, args, conf, master, target)
        except netlink.LinkExists as e:
            raise CNIError(ERR_INTERNAL, f'failed to create {self.kind} "{args.ifname}" '
                                         "in the container: file exists") from e
        except CNIError as e:
            raise CNIError(e.code, f"failed to create {self.kind}: {e.msg}", e.details) from e

    def delete(self, args: CmdArgs, conf: Any) -> None:
        """IPAM DEL (when configured), then CNI_IFNAME in the pod if it is a
        link of `kind`. Repeatable; an empty or gone netns is success.

        Raises:
            CNIError: IPAM's error; 999 for kernel errors.
        """
        kind = ipam_type(conf)
        if kind:
            delegate_del(kind, args.stdin_data, args)
        pod = open_netns(args.netns, missing_ok=True)
        if pod is None:
            return
        with pod, pod.rtnl() as cipr:
            link = netlink.find_link(cipr, args.ifname)
            if link is not None and link.kind == self.kind:
                netlink.delete_link(cipr, link)

    def check(self, args: CmdArgs, conf: Any) -> None:
        """IPAM CHECK, then prevResult's interface against the pod (module
        docstring).

        Raises:
            CNIError: 7 without prevResult (or an IP source the plugin
                needs); IPAM's error; 999 naming the first mismatch.
        """
        if self.ip_source_required is not None and not self.ip_source(conf):
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, self.ip_source_required, "ipam")
        kind = ipam_type(conf)
        if kind:
            delegate_check(kind, args.stdin_data, args)
        prev = conf.prev_result
        if prev is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "Required prevResult missing")
        want = next((i for i in prev.interfaces
                     if i.name == args.ifname and i.sandbox == args.netns), None)
        if want is None:
            raise CNIError(ERR_INTERNAL, "Sandbox in prevResult doesn't match configured "
                                         f"netns: {args.netns}")
        in_pod = self.link_in_pod(conf)
        with NetNS.open(args.netns) as pod, Rtnl() as ipr, pod.rtnl() as cipr:
            master = self.find_master(args, conf, cipr if in_pod else ipr, checking=True)
            link = netlink.find_link(cipr, args.ifname)
            problem = self._link_mismatch(link, want, master, in_pod, conf)
            if problem is not None:
                raise CNIError(ERR_INTERNAL, problem)
            assert link is not None
            index = prev.interfaces.index(want)
            check_interface_ips(cipr, link, [ipc for ipc in prev.ips
                                             if ipc.interface in (None, index)])
            check_routes(cipr, prev.routes)

    def _link_mismatch(self, link: netlink.Link | None, want: Interface,
                       master: netlink.Link | None, in_pod: bool, conf: Any) -> str | None:
        """Go's validateCniContainerInterface (texts included) plus the
        master and the link being up."""
        name = want.name
        if link is None:
            return f"Container Interface name in prevResult: {name} not found"
        if link.kind != self.kind:
            return f"Error: Container interface {name} not of type {self.kind}"
        if master is not None and (link.parent != master.index
                                   or (link.link_netnsid is None) != in_pod):
            where = "the container" if in_pod else "the host"
            return f'Container {self.kind} {name} is not on master "{master.name}" in {where}'
        problem = self.link_problem(link, conf)
        if problem is not None:
            return problem
        if want.mac and want.mac != link.mac:
            return f"Interface {name} Mac {want.mac} doesn't match container Mac: {link.mac}"
        if not link.up:
            return f"Interface {name} is down"
        return None


class MasterLinkPlugin(PodLinkPlugin):
    """A `PodLinkPlugin` whose link sits on a master (`MasterLinkConf`):
    `find_master` resolves it as Go's loadConf and createX do.

    Class attribute ``mode_label``: how CHECK's mode mismatch names the
    kind (Go's texts: ``macvlan``, ``IPVlan``); set for a config with a
    ``mode``.
    """

    mode_label: ClassVar[str] = ""

    def link_problem(self, link: netlink.Link, conf: Any) -> str | None:
        """The ``mode``, when the config has one (Go's text)."""
        want = getattr(conf, "mode", None)
        if want is not None and link.mode != want:
            return (f"Container {self.mode_label} mode {link.mode} does not match expected "
                    f"value: {want}")
        return None

    def master_name(self, args: CmdArgs, conf: Any, ipr: Rtnl, *, checking: bool) -> str | None:
        """The master's name: ``master``, else the default-route interface of
        ``ipr``'s namespace (Go's getDefaultRouteInterfaceName: the first
        default route, IPv4 before IPv6). None: nothing to look up.

        Raises:
            CNIError: 999 ``no default route interface found`` (Go's).
        """
        return conf.master or _default_route_link(ipr).name

    def find_master(self, args: CmdArgs, conf: Any, ipr: Rtnl, *,
                    checking: bool = False) -> netlink.Link | None:
        """The master `Link` (see `PodLinkPlugin.find_master`), its MTU
        checked against ``mtu``.

        Raises:
            CNIError: 999 ``failed to lookup master "X": Link not found``
                (Go's createX text); 7 ``invalid MTU N, must be [0, master
                MTU(M)]`` (Go's text; Go: 999).
        """
        name = self.master_name(args, conf, ipr, checking=checking)
        if name is None:
            return None
        master = netlink.find_link(ipr, name)
        if master is None:
            raise CNIError(ERR_INTERNAL, f'failed to lookup master "{name}": Link not found')
        if master.mtu is not None and conf.mtu > master.mtu:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f"invalid MTU {conf.mtu}, must be [0, master MTU({master.mtu})]",
                           "mtu")
        return master

"""The ``tap`` plugin: a tap device in the pod, for a VM or a userspace
network stack running there (it opens /dev/net/tun and attaches to the
device by name), optionally a port of a bridge of the pod, with IPAM's
addresses (optional: without ``ipam`` the device is L2 only, up with no
address).

Go's plugins/main/tap appeared after 1.1.1 (Debian's release has none):
this follows v1.9.1, its newest: same keys, defaults, result, kernel state
(tun flags, owner, group, multi-queue) and error texts where Go has one.
The flow is the one of `cni_skel_plugins.podlink` (DEL, CHECK, GC and
STATUS are its own; ADD is written here for Go's order and texts). Needs
a kernel with CONFIG_TUN and /dev/net/tun.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Any

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator

from cni_skel import netlink
from cni_skel.args import MacAddress
from cni_skel.config import IfName, NetConf
from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_INTERNAL, CNIError
from cni_skel.ipam import configure_iface
from cni_skel.model import validate_nested
from cni_skel.netns import NetNS, open_netns
from cni_skel.rollback import rollback
from cni_skel.rtnl import Rtnl
from cni_skel.sysctl import write_sysctl
from cni_skel.types import DNS, Interface, Result

from ..bridge.config import BridgeArgs, BridgeRuntimeConfig
from ..podlink import PodLinkPlugin

__all__ = ["Tap", "TapArgs", "TapConf"]

#: Where Go's go-selinux writes the exec label (per thread).
EXEC_LABEL = "/proc/thread-self/attr/exec"
#: The kernel's bounds of a tap's MTU (ETH_MIN_MTU; 65535 less the
#: Ethernet header).
TAP_MIN_MTU, TAP_MAX_MTU = 68, 65521
#: Go's uint32 for ``owner`` / ``group``, less the kernel's "none" (2**32-1).
ID_MAX = 2**32 - 2


class TapArgs(BridgeArgs):
    """CNI_ARGS of tap: ``MAC`` for the device (a bad one is code 4); an
    unknown key without ``IgnoreUnknown`` is refused, as Go's LoadArgs."""


class TapConf(NetConf):
    """Network config of ``tap`` (Go v1.9.1's ``NetConf``). ``mac``, ``mtu``,
    ``multiQueue``, ``owner``, ``group`` and ``selinuxContext`` came with
    the plugin (upstream PR #784, merged early 2023: Go v1.3.0);
    ``bridge`` later (commit edab9ef, mid-2023: Go v1.4.0).

    Keys:
        mac: the device's MAC (kernel random otherwise).
        mtu: bytes, 0 (default): the kernel's (1500), else 68..65521 (the
            kernel's bounds for a tap; Go: 999 from ``ip``).
        multiQueue: IFF_MULTI_QUEUE (one fd per queue).
        owner, group: uid / gid allowed to attach without CAP_NET_ADMIN
            (0..4294967294); absent: none.
        selinuxContext: the SELinux label the device is created under (Go
            sets it as the exec label of the ``ip`` it runs); with SELinux
            off the kernel refuses it and ADD fails with Go's text.
        bridge: a bridge *in the pod* the device becomes a port of.
        ipam, dns: as every plugin; the result's ``dns`` is this config's.
        runtimeConfig.mac: the ``mac`` capability.

    The device's MAC in Go's precedence (`mac_for`): ``mac`` < CNI_ARGS
    ``MAC`` < ``runtimeConfig.mac``. ``args.cni.mac`` is not read (Go's
    ``Args`` is an empty struct).

    Errors: code 7 naming the key (a wrong JSON type, a negative MTU, a
    bad MAC; Go: 999 ``failed to load netconf: ...``).
    """

    mac: MacAddress | None = None
    mtu: StrictInt = Field(0, ge=0, le=TAP_MAX_MTU)
    multi_queue: StrictBool = Field(False, alias="multiQueue")
    owner: StrictInt | None = Field(None, ge=0, le=ID_MAX)
    group: StrictInt | None = Field(None, ge=0, le=ID_MAX)
    selinux_context: StrictStr = Field("", alias="selinuxContext")
    bridge: IfName | None = None

    @field_validator("bridge", "mac", mode="before")
    @classmethod
    def _unset(cls, value: Any) -> Any:
        return None if value == "" else value  # Go: "" is "not given"

    @field_validator("mtu")
    @classmethod
    def _mtu(cls, value: int) -> int:
        if 0 < value < TAP_MIN_MTU:
            raise ValueError(f"invalid MTU {value}, must be 0 or [{TAP_MIN_MTU}, {TAP_MAX_MTU}]")
        return value

    @field_validator("runtime_config")
    @classmethod
    def _runtime_mac(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Checked here so that an error names runtimeConfig.mac.
        validate_nested(BridgeRuntimeConfig, value)
        return value

    def mac_for(self, args: CmdArgs) -> str | None:
        """The device's MAC in Go's precedence (class docstring); None: the
        kernel's random one."""
        runtime = BridgeRuntimeConfig.model_validate(self.runtime_config or {}).mac
        return runtime or getattr(args.typed_args, "mac", None) or self.mac

    def netlink_flags(self) -> dict[str, bool]:
        """The tun flags Go 1.9.1 leaves on the device: with both ``owner``
        and ``group`` (and no ``selinuxContext``) it creates it through
        vishvananda/netlink (IFF_VNET_HDR; IFF_NO_PI only with
        ``multiQueue``), else through ``ip tuntap add`` (IFF_NO_PI)."""
        if self.owner is not None and self.group is not None and not self.selinux_context:
            return {"vnet_hdr": True, "pi": not self.multi_queue}
        return {"vnet_hdr": False, "pi": False}


def _strerror(e: OSError) -> str:
    msg = e.strerror or os.strerror(e.errno or 0)
    return msg[:1].lower() + msg[1:]


def _write_exec_label(label: str) -> None:
    """go-selinux's SetExecLabel: the label of the next exec of this thread.

    Raises:
        CNIError: 999 ``failed set socket label: write ...: <strerror>``
            (Go's text; EINVAL when no SELinux takes it).
    """
    try:
        fd = os.open(EXEC_LABEL, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, label.encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise CNIError(ERR_INTERNAL, f"failed set socket label: write {EXEC_LABEL}: "
                                     f"{_strerror(e)}") from e


def _ip_tuntap_add(temp: str, conf: TapConf) -> None:
    """Go's createTapWithIptool, run in the pod's namespace (the calling
    thread's) under the exec label just set: the device is created by an
    ``ip`` running with that label, so the kernel labels it so."""
    argv = ["ip", "tuntap", "add", "mode", "tap", "name", temp]
    if conf.multi_queue:
        argv.append("multi_queue")
    if conf.owner is not None:
        argv += ["user", str(conf.owner)]
    if conf.group is not None:
        argv += ["group", str(conf.group)]
    try:
        run = subprocess.run(argv, capture_output=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CNIError(ERR_INTERNAL, f"failed to run command ip: {e}") from e
    if run.returncode != 0:
        output = (run.stdout + run.stderr).decode(errors="replace")
        raise CNIError(ERR_INTERNAL, f"failed to run command {output}: exit status "
                                     f"{run.returncode}")


class Tap(PodLinkPlugin):
    """tap: ADD as Go's v1.9.1 cmdAdd; DEL, CHECK, GC and STATUS as the
    other pod-link plugins (`cni_skel_plugins.podlink`): DEL deletes
    CNI_IFNAME only when it is a tun/tap device, CHECK also compares the
    device's tap mode, owner, group, multi-queue and bridge with the
    config."""

    name = "tap"
    config_model = TapConf
    args_model = TapArgs
    kind = "tun"  # IFLA_INFO_KIND of tun and tap devices

    def link_in_pod(self, conf: Any) -> bool:
        """Always: a tap has no master, it is made in the pod."""
        return True

    def add(self, args: CmdArgs, conf: TapConf) -> Result:
        """The tap in the pod (its MTU and MAC), the bridge port, up; then
        IPAM, ``arp_notify``, addresses and routes (Go's order).

        Returns:
            one interface (CNI_IFNAME, its MAC, the sandbox), IPAM's IPs
            (on interface 0) and routes, the config's ``dns``.

        Raises:
            CNIError: 1 for an L2-only result at 0.1.0/0.2.0; 999 with Go's
                texts: ``failed set socket label: ...``, ``failed to rename
                tap to "eth0": file exists`` (a name taken in the pod),
                ``failed to get bridge X: Link not found``, ``failed to set
                tap eth0 as a port of bridge X: ...``, ``IPAM plugin
                returned missing IP config``; IPAM's and kernel errors.
                Nothing is left behind (Go leaves the device).
        """
        self.validate_config(args, conf)
        with NetNS.open(args.netns) as pod, pod.rtnl() as cipr, rollback(self.name) as undo:
            link = self._create_tap(pod, cipr, args, conf)
            undo.callback(f"deleting {args.ifname}", netlink.delete_link, cipr, link)
            if conf.bridge is not None:
                self._join_bridge(cipr, link, args.ifname, conf.bridge)
            netlink.link_up(cipr, link)
            result = self.addresses(undo, args, conf)
            result.cni_version = conf.cni_version
            result.interfaces = [Interface(name=args.ifname, mac=link.mac, sandbox=args.netns)]
            for ipc in result.ips:
                ipc.interface = 0  # every address is the tap's
            if result.ips:
                with contextlib.suppress(CNIError):  # Go ignores its error
                    pod.run(write_sysctl, f"net/ipv4/conf/{args.ifname}/arp_notify", "1")
                # no carrier until a VM attaches: DAD can not run yet (Go
                # waits 5 s for it, then goes on)
                configure_iface(pod, link, result, ipr=cipr, wait_dad=False)
        result.dns = conf.dns.model_copy(deep=True) if conf.dns is not None else DNS()
        return result

    def _create_tap(self, pod: NetNS, cipr: Rtnl, args: CmdArgs,
                    conf: TapConf) -> netlink.Link:
        """`cni_skel.netlink.create_tap` with Go's flags, or, with
        ``selinuxContext``, Go's labelled ``ip tuntap add`` and the rename."""
        mac = conf.mac_for(args)
        mtu = conf.mtu or None
        if conf.selinux_context:
            return self._create_labelled(pod, cipr, args.ifname, conf, mtu, mac)
        try:
            return netlink.create_tap(cipr, args.ifname, mtu=mtu, mac=mac, owner=conf.owner,
                                      group=conf.group, multi_queue=conf.multi_queue,
                                      **conf.netlink_flags())
        except netlink.LinkExists as e:
            raise CNIError(ERR_INTERNAL, f'failed to rename tap to "{args.ifname}": '
                                         "file exists") from e
        except CNIError as e:
            reason = e.msg.removeprefix(f"create tap {args.ifname}: ")
            raise CNIError(e.code, f"failed to create tap: {reason}", e.details) from e

    def _create_labelled(self, pod: NetNS, cipr: Rtnl, ifname: str, conf: TapConf,
                         mtu: int | None, mac: str | None) -> netlink.Link:
        """Go's SELinux path: the exec label set on this thread, ``ip tuntap
        add`` run in the pod under it (a temporary name), the label cleared;
        then the rename, MTU and MAC through netlink."""
        temp = "veth" + os.urandom(4).hex()  # Go's ip.RandomVethName
        with pod.enter():
            _write_exec_label(conf.selinux_context)
            try:
                _ip_tuntap_add(temp, conf)
            finally:
                with contextlib.suppress(CNIError):
                    _write_exec_label("")
        link = netlink.find_link(cipr, temp)
        if link is None:
            raise CNIError(ERR_INTERNAL, f'failed to refetch tap "{temp}": Link not found')
        try:
            netlink.link_set(cipr, link, ifname=ifname, mtu=mtu, address=mac)
        except CNIError as e:
            netlink.delete_link(cipr, link)
            if isinstance(e, netlink.LinkExists):
                raise CNIError(ERR_INTERNAL, f'failed to rename tap to "{ifname}": '
                                             "file exists") from e
            raise
        renamed = netlink.find_link(cipr, link.index)
        if renamed is None:
            raise CNIError(ERR_INTERNAL, f'failed to refetch tap "{ifname}": Link not found')
        return renamed

    @staticmethod
    def _join_bridge(cipr: Rtnl, link: netlink.Link, ifname: str, bridge: str) -> None:
        """The tap as a port of the pod's ``bridge`` (Go's texts)."""
        master = netlink.find_link(cipr, bridge)
        if master is None:
            raise CNIError(ERR_INTERNAL, f"failed to get bridge {bridge}: Link not found")
        try:
            netlink.link_set(cipr, link, master=master.index)
        except CNIError as e:
            reason = e.msg.rsplit(": ", 1)[-1]
            raise CNIError(ERR_INTERNAL, f"failed to set tap {ifname} as a port of bridge "
                                         f"{bridge}: {reason}") from e

    def check(self, args: CmdArgs, conf: TapConf) -> None:
        """`PodLinkPlugin.check` (prevResult, IPAM CHECK, kind, MAC, up,
        addresses, routes), then the device against the config: tap mode,
        ``owner``, ``group``, ``multiQueue``, the ``bridge`` it is a port of
        (Go's CHECK compares addresses and routes only).

        Raises:
            CNIError: 7 without prevResult; IPAM's error; 999 naming the
                first mismatch.
        """
        super().check(args, conf)
        pod = open_netns(args.netns)
        assert pod is not None
        with pod, pod.rtnl() as cipr:
            link = netlink.find_link(cipr, args.ifname)
            assert link is not None  # super().check found it
            problem = _tap_mismatch(cipr, link, conf)
        if problem is not None:
            raise CNIError(ERR_INTERNAL, problem)


def _tun_data(cipr: Rtnl, link: netlink.Link) -> dict[str, Any]:
    """IFLA_TUN_* of the device (IFLA_INFO_DATA of kind ``tun``), by name
    without the prefix, lower-case: ``type`` (1 tun, 2 tap), ``owner``,
    ``group`` (absent: none), ``pi``, ``vnet_hdr``, ``persist``,
    ``multi_queue``..."""
    for msg in cipr.link("get", index=link.index):
        info = msg.get_attr("IFLA_LINKINFO")
        data = info.get_attr("IFLA_INFO_DATA") if info is not None else None
        if data is None:
            return {}
        return {name.removeprefix("IFLA_TUN_").lower(): value
                for name, value in data["attrs"]}
    return {}


def _tap_mismatch(cipr: Rtnl, link: netlink.Link, conf: TapConf) -> str | None:
    """What of the config the device does not hold, as a message; None."""
    name = link.name
    data = _tun_data(cipr, link)
    if data.get("type") != 2:
        return f"Error: Container interface {name} is a tun device, not a tap"
    for key, want in (("owner", conf.owner), ("group", conf.group)):
        if data.get(key) != want:
            shown = "none" if data.get(key) is None else data.get(key)
            return f"Interface {name} {key} {shown} doesn't match config: {want}"
    if bool(data.get("multi_queue")) != conf.multi_queue:
        return f"Interface {name} multiQueue {not conf.multi_queue} doesn't match config"
    if conf.bridge is not None:
        bridge = netlink.find_link(cipr, conf.bridge)
        if bridge is None or link.master != bridge.index:
            return f"Interface {name} is not a port of bridge {conf.bridge}"
    if conf.mtu and link.mtu != conf.mtu:
        return f"Interface {name} MTU {link.mtu} doesn't match config: {conf.mtu}"
    return None

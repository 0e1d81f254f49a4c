"""The host-device plugin: `HostDevice`, and the moves of a device between
the node and the pod."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, ClassVar

from cni_skel import gorules, netlink
from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, ERR_IO_FAILURE, CNIError
from cni_skel.invoke import delegate_check, delegate_del, ipam_add
from cni_skel.ipam import check_interface_ips, check_routes, configure_iface
from cni_skel.netns import NetNS, current_netns, open_netns
from cni_skel.rollback import Rollback, rollback
from cni_skel.rtnl import Rtnl
from cni_skel.skel import Plugin
from cni_skel.types import DNS, Interface, Result, check_expressible

from . import saved as saved_mod
from .config import DEFAULT_DATA_DIR, HostDeviceConf
from .saved import Saved, Store
from .sysfs import SYS, device_id_kind, find_device, has_dpdk_driver, parse_mac

__all__ = ["HostDevice"]


def _warn(msg: str) -> None:
    print(f"host-device: {msg}", file=sys.stderr)


def _settle(ipr: Rtnl, index: int, saved: Saved | None) -> None:
    """The device is back on the node under its name: its MTU and up state
    as ADD found them, then its alias as it was (our mark goes last, so a
    DEL that fails before still finds the device by it). Without a saved
    state (Go's ADD moved it) the alias is cleared and the device stays
    down, as Go 1.9's DEL leaves it."""
    if saved is None:
        netlink.link_set(ipr, index, ifalias="")
        return
    now = netlink.find_link(ipr, index)
    mtu = saved.mtu if saved.mtu and now is not None and now.mtu != saved.mtu else None
    netlink.link_set(ipr, index, mtu=mtu, up=True if saved.up else None)
    netlink.link_set(ipr, index, ifalias=saved.alias)


def _move_out(ipr: Rtnl, node: NetNS, cipr: Rtnl, ifname: str, saved: Saved | None) -> bool:
    """Move the pod's CNI_IFNAME back to the node under its original name
    (its alias, else the saved name), Go 1.1.1's way: down, renamed in the
    pod, moved; then `_settle`. False when the pod has no such device, or
    one that no ADD moved there (no alias and nothing saved: say, the pod's
    own interface of that name, which made an ADD fail; Go's DEL fails then,
    "failed to find original ifname", and the runtime retries it for ever).

    Raises:
        CNIError: 999 with Go's texts: the rename or the move refused (then
            the device is named CNI_IFNAME again and up if it was, so that
            DEL can be retried).
    """
    link = netlink.find_link(cipr, ifname)
    if link is None and saved is not None:
        # an ADD whose rename failed left it under its node name
        other = netlink.find_link(cipr, saved.name)
        if other is not None and other.mac == saved.mac:
            link = other
    if link is None:
        return False
    if not link.alias and saved is None:
        return False  # no alias, nothing saved: not a device an ADD moved (one refused)
    name = link.alias or (saved.name if saved is not None else "")
    netlink.link_down(cipr, link)  # a device is renamed only when down
    try:
        if link.name != name:
            try:
                netlink.link_set(cipr, link, ifname=name)
            except CNIError as exc:
                raise CNIError(ERR_INTERNAL, f'failed to restore "{link.name}" to original '
                                             f'name "{name}": {exc.msg}') from exc
        try:
            netlink.move_link(cipr, link.index, node)
        except CNIError as exc:
            raise CNIError(ERR_INTERNAL, f'failed to move "{name}" to host netns: '
                                         f"{exc.msg}") from exc
    except CNIError:
        with contextlib.suppress(CNIError):
            if link.name != name:
                netlink.link_set(cipr, link.index, ifname=link.name)
            if link.up:
                netlink.link_up(cipr, link.index)
        raise
    back = netlink.find_link(ipr, name)
    if back is not None:
        _settle(ipr, back.index, saved)
    return True


def _recover(ipr: Rtnl, saved: Saved) -> bool:
    """The device is not in the pod: look for it on the node by our alias
    (and its MAC). A physical device whose netns died is there (when the
    node namespace is the initial one), down, under its pod name or
    ``dev<N>``, alias kept; a virtual one was destroyed with the netns. A
    found device gets its name back (when free), MTU and state. False when
    it is not there."""
    for link in netlink.links(ipr):
        if link.alias != saved.name or (saved.mac is not None and link.mac != saved.mac):
            continue
        if link.name != saved.name:
            netlink.link_down(ipr, link)
            try:
                netlink.link_set(ipr, link.index, ifname=saved.name)
            except CNIError as exc:
                _warn(f'{link.name}: cannot take back its name "{saved.name}": {exc.msg}')
        _settle(ipr, link.index, saved)
        return True
    return False


class HostDevice(Plugin):
    """host-device: moves a device of the node into the pod as CNI_IFNAME
    (Go's plugins/main/host-device 1.1.1), addresses from IPAM when the
    config names one, else L2 only; DEL moves it back under its original
    name and, beyond Go, with its original MTU and up/down state (`.saved`).
    A PCI device bound to a userspace driver (DPDK) is not moved: only IPAM
    runs, as Go.

    ``sys_root``: where /sys is read (a copy of the tree, for tests).
    """

    name = "host-device"
    config_model = HostDeviceConf
    sys_root: ClassVar[str] = SYS

    # --- config ------------------------------------------------------------------

    def _names(self, conf: HostDeviceConf) -> tuple[str, str]:
        """``(PCI address, auxiliary-bus device)`` in use, one of them "":
        ``runtimeConfig.deviceID`` names either (Go >= 1.5, `device_id_kind`;
        an auxiliary device overrides ``pciBusID`` too), else ``pciBusID``."""
        dev = conf.runtime_config.device_id
        if dev and device_id_kind(dev, self.sys_root) == "aux":
            return "", dev
        return conf.pci_addr, ""

    def _dpdk(self, conf: HostDeviceConf) -> bool:
        """Go's loadConf: the device named at all (7), and whether the PCI
        device is bound to a userspace driver (999 when /sys lacks it)."""
        conf.require_device()
        pci = self._names(conf)[0]
        return bool(pci) and has_dpdk_driver(pci, self.sys_root)

    @staticmethod
    def _check_keys(conf: HostDeviceConf) -> None:
        """The naming key in use has a valid form (7, Go's texts)."""
        if conf.device:
            return
        if conf.hwaddr:
            parse_mac(conf.hwaddr)
        elif conf.kernelpath and not conf.kernelpath.startswith("/sys/devices/"):
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f'kernel device path "{conf.kernelpath}" must be absolute and '
                           "begin with /sys/devices/")

    def validate_config(self, args: CmdArgs, conf: HostDeviceConf) -> None:
        """The device named one way or another and the naming key's form.

        Raises:
            CNIError: 7 (Go's texts)."""
        conf.require_device()
        self._check_keys(conf)

    def _find(self, ipr: Rtnl, conf: HostDeviceConf) -> netlink.Link:
        try:
            pci, aux = self._names(conf)
            return find_device(ipr, device=conf.device, hwaddr=conf.hwaddr,
                               kernelpath=conf.kernelpath, pci_addr=pci, aux_dev=aux,
                               sys_root=self.sys_root)
        except CNIError as exc:
            raise CNIError(exc.code, f"failed to find host device: {exc.msg}",
                           exc.details) from None

    # --- ADD ---------------------------------------------------------------------

    def add(self, args: CmdArgs, conf: HostDeviceConf) -> Result:
        """Find the device (`find_device`), save its state, move it into the
        pod under CNI_IFNAME with its node name as alias, bring it up; then,
        with IPAM, IPAM ADD and its addresses and routes on it.

        Returns Go's result: ``interfaces`` [the device in the pod: name,
        MAC, sandbox]; with IPAM its ``ips`` (interface 0) and ``routes``
        and the config's ``dns``. DPDK: nothing moves, the interface is
        ``{name: CNI_IFNAME, sandbox}`` (Go >= 1.7; 1.1.1 names none).

        Any failure puts the device back on the node as it was and releases
        the IPAM address (Go 1.1.1 leaves the device in the pod).

        Raises:
            CNIError: 7 for the config (no device named, a bad ``hwaddr`` or
                ``kernelpath``); 1 at cniVersion 0.1.0/0.2.0 without IPAM
                (no IP to write; Go moves the device, then fails 999);
                999 ``failed to find host device: ...`` (Go's texts, e.g.
                ``Link not found``), ``failed to move link ...``, ``IPAM
                plugin returned missing IP config``; IPAM's errors.
        """
        dpdk = self._dpdk(conf)
        check_expressible(conf.cni_version, has_ip=bool(conf.ipam_type))
        if not dpdk:
            self._check_keys(conf)
        with contextlib.ExitStack() as stack:
            pod = stack.enter_context(NetNS.open(args.netns))
            iface: Interface | None = None
            cont: netlink.Link | None = None
            cipr: Rtnl | None = None
            if dpdk:
                undo = stack.enter_context(rollback(self.name))
                # Go >= 1.7: the attachment is named even though nothing moves
                iface = Interface(name=args.ifname, sandbox=args.netns)
            else:
                ipr = stack.enter_context(Rtnl())
                cipr = stack.enter_context(pod.rtnl())
                store = stack.enter_context(
                    Store.open(conf.data_dir or DEFAULT_DATA_DIR, create=True))
                undo = stack.enter_context(rollback(self.name))
                cont = self._move_in(ipr, pod, cipr, store, undo, args, conf)
                iface = Interface(name=cont.name, mac=cont.mac, sandbox=args.netns)
            if not conf.ipam_type:
                return Result(cni_version=conf.cni_version,
                              interfaces=[iface] if iface is not None else [])
            result = ipam_add(undo, conf.ipam_type, args.stdin_data, args)
            if not result.ips:
                raise CNIError(ERR_INTERNAL, "IPAM plugin returned missing IP config")
            for ipc in result.ips:
                ipc.interface = 0  # the moved device, the only interface
            result.interfaces = [iface] if iface is not None else []
            if cont is not None:
                configure_iface(pod, cont, result, ipr=cipr)
            result.dns = conf.dns if conf.dns is not None else DNS()
            return result

    def _move_in(self, ipr: Rtnl, pod: NetNS, cipr: Rtnl, store: Store, undo: Rollback,
                 args: CmdArgs, conf: HostDeviceConf) -> netlink.Link:
        """The device from the node into the pod, renamed CNI_IFNAME, alias
        its node name (Go's), up; its state saved first. Undo steps on
        ``undo``: the device back, the saved file as it was."""
        dev = self._find(ipr, conf)
        if netlink.find_link(cipr, args.ifname) is not None:
            # Go moves first and fails renaming; checked before, nothing moves
            raise CNIError(ERR_INTERNAL, f'failed to move link failed to rename device '
                                         f'"{dev.name}" to "{args.ifname}": file exists')
        state = Saved.of(dev, dev.alias, network=conf.name,
                         container_id=args.container_id, ifname=args.ifname)
        before = store.read_raw(args.container_id, args.ifname)
        store.write_raw(args.container_id, args.ifname, state.to_json())
        undo.callback("putting back the saved state", store.write_raw, args.container_id,
                      args.ifname, before)
        undo.callback(f"moving {dev.name} back to the node", self._put_back, ipr, cipr,
                      args.ifname, state)
        try:
            cont = netlink.move_link(ipr, dev, pod, new_name=args.ifname, netns_ipr=cipr)
        except CNIError as exc:
            raise CNIError(ERR_INTERNAL, f"failed to move link {exc.msg}") from exc
        assert cont is not None  # new_name given
        netlink.link_set(cipr, cont, ifalias=dev.name, up=True)
        return netlink.find_link(cipr, cont.index) or cont

    @staticmethod
    def _put_back(ipr: Rtnl, cipr: Rtnl, ifname: str, state: Saved) -> None:
        """A failed ADD's undo: the device back on the node as it was,
        wherever the ADD stopped."""
        with current_netns() as node:
            if not _move_out(ipr, node, cipr, ifname, state):
                _recover(ipr, state)

    # --- DEL ---------------------------------------------------------------------

    def delete(self, args: CmdArgs, conf: HostDeviceConf) -> None:
        """IPAM DEL, then the device from the pod back to the node under its
        original name (its alias, Go's), with the MTU and up state ADD
        saved; the saved file goes.

        Idempotent: a device no longer in the pod is fine. With the netns
        gone (or CNI_NETNS empty), the kernel has destroyed a virtual device
        (veth, macvlan...) with it and sent a physical one back to the
        initial namespace, down, under its pod name (or ``dev<N>``): DEL
        finds it there by its alias and restores it, when the plugin runs in
        that namespace (the normal case). Unlike Go 1.1.1 (DEL fails when
        the link or netns is gone; IPAM DEL is skipped for an empty
        CNI_NETNS), every case succeeds and the address is released. A
        config that names no device is accepted (nothing needs it), and a
        PCI device gone from /sys counts as not DPDK.

        Raises:
            CNIError: IPAM's error; 999 when the device in the pod can not
                be renamed or moved (Go's texts), or has no original name
                (no alias, nothing saved: not a device this plugin moved);
                5 when the saved file can not be read or removed.
        """
        dpdk = False
        pci = self._names(conf)[0]
        if pci:
            try:
                dpdk = has_dpdk_driver(pci, self.sys_root)
            except CNIError as exc:
                _warn(f"DEL goes on: {exc.msg}")
        pod = open_netns(args.netns, missing_ok=True)
        with contextlib.ExitStack() as stack:
            if pod is not None:
                stack.enter_context(pod)
            if conf.ipam_type:
                delegate_del(conf.ipam_type, args.stdin_data, args)
            if dpdk:
                return
            store = stack.enter_context(
                Store.open(conf.data_dir or DEFAULT_DATA_DIR, create=False))
            ipr = stack.enter_context(Rtnl())
            state = store.read(args.container_id, args.ifname)
            moved = False
            if pod is not None:
                node = stack.enter_context(current_netns())
                cipr = stack.enter_context(pod.rtnl())
                moved = _move_out(ipr, node, cipr, args.ifname, state)
            if not moved and state is not None:
                _recover(ipr, state)
            store.write_raw(args.container_id, args.ifname, None)

    # --- CHECK -------------------------------------------------------------------

    def check(self, args: CmdArgs, conf: HostDeviceConf) -> None:
        """Go's cmdCheck: IPAM CHECK; prevResult's interface named CNI_IFNAME
        with sandbox CNI_NETNS, present in the pod with its MAC; its
        addresses and routes (not for a DPDK device).

        Raises:
            CNIError: 7 without prevResult, or naming no device; 3 for a
                missing netns; 999 naming what differs (Go's texts).
        """
        dpdk = self._dpdk(conf)
        with NetNS.open(args.netns) as pod:
            if conf.ipam_type:
                delegate_check(conf.ipam_type, args.stdin_data, args)
            prev = conf.prev_result
            if prev is None:
                raise CNIError(ERR_INVALID_NETWORK_CONFIG, "Required prevResult missing")
            if dpdk:
                return
            want = next((i for i in prev.interfaces
                         if i.name == args.ifname and i.sandbox == args.netns), None)
            if want is None:
                raise CNIError(ERR_INTERNAL, "Sandbox in prevResult  doesn't match configured "
                                             f"netns: {args.netns}")
            with pod.rtnl() as cipr:
                link = netlink.find_link(cipr, want.name)
                if link is None:
                    raise CNIError(ERR_INTERNAL, f"Container Interface name in prevResult: "
                                                 f"{want.name} not found")
                if want.mac and want.mac != (link.mac or ""):
                    raise CNIError(ERR_INTERNAL, f"Interface {want.name} Mac {want.mac} doesn't "
                                                 f"match container Mac: {link.mac or ''}")
                check_interface_ips(cipr, link, prev.ips)
                check_routes(cipr, prev.routes)

    # --- GC, node state -----------------------------------------------------------

    def gc(self, args: CmdArgs, conf: HostDeviceConf) -> None:
        """IPAM GC (the default), then this network's saved files whose
        attachment is not in ``cni.dev/valid-attachments`` and whose device
        is back on the node (its pod gone): the device gets its name, MTU
        and state back, as a DEL would give them, and the file goes. A
        device still in a pod keeps its file, for the DEL that moves it
        back. (Go's host-device has no GC.)

        Raises:
            CNIError: IPAM's; 7 without the list of valid attachments; 5
                naming the files that could not be handled.
        """
        super().gc(args, conf)
        keep = {(a.container_id, a.ifname) for a in conf.gc_keep()}
        with Store.open(conf.data_dir or DEFAULT_DATA_DIR, create=False) as store, \
                Rtnl() as ipr:
            problems = store.collect(conf.name, keep, lambda saved: _recover(ipr, saved))
        if problems:
            raise CNIError(ERR_IO_FAILURE, f"host-device: GC left {len(problems)} file(s) it "
                                           "could not handle", "; ".join(problems))

    @classmethod
    def node_state(cls) -> list[str]:
        """Saved device states in the default data dir
        (`cni_skel.skel.Plugin.node_state`)."""
        n = len(saved_mod.listing(DEFAULT_DATA_DIR))
        return [f"{n} saved device state file(s) in {DEFAULT_DATA_DIR}"] if n else []

    @classmethod
    def hand_over_to_go(cls, conf: Any, handover: gorules.GoHandOver, *,
                        dry_run: bool = False) -> list[str]:
        """Go's DEL needs nothing more (the alias holds the device's name);
        our saved state of the attachment is removed, and said to be lost:
        Go's DEL leaves the device down with the pod's MTU."""
        data_dir = getattr(conf, "data_dir", "") or DEFAULT_DATA_DIR
        with Store.open(data_dir, create=False) as store:
            if store.read_raw(handover.container_id, handover.ifname) is None:
                return []
            if not dry_run:
                store.write_raw(handover.container_id, handover.ifname, None)
        verb = "would remove" if dry_run else "removed"
        return [f"{verb} the saved state of {handover.container_id}/{handover.ifname}: Go's "
                "DEL moves the device back under its name but leaves it down, with the MTU "
                "it has in the pod"]

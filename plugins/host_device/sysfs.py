"""Finding the node's device from the config, through /sys and netlink.

Go's ``getLink`` and ``hasDpdkDriver`` (plugins/main/host-device, 1.1.1): the
same order, the same answers, the same error texts (the ones that name a
path name the path read). Every /sys path is taken under ``sys_root``
(``"/sys"`` on a node), so the real code can be run on a copy of the tree:
the paths a config holds (``kernelpath``) and Go's messages are written as
under ``/sys``, and read under ``sys_root``.

What /sys shows is the network namespace of the process that mounted it:
a plugin started by ``ip netns exec`` (or by the cni-skel worker, which
enters the caller's mount namespace) sees its own namespace's links under
``/sys/devices/virtual/net`` and a PCI device's ``net/`` directory empty
unless the device is in that namespace, as Go's binary does.
"""

from __future__ import annotations

import os
import re
import stat

from cni_skel import netlink
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, CNIError

__all__ = ["SYS", "USERSPACE_DRIVERS", "find_device", "has_dpdk_driver", "parse_mac"]

SYS = "/sys"
#: Drivers that hand a PCI NIC to userspace (DPDK): no netdev to move (Go's list).
USERSPACE_DRIVERS = ("vfio-pci", "uio_pci_generic", "igb_uio")
_PCI_DEVICES = "bus/pci/devices"
_AUX_DEVICES = "bus/auxiliary/devices"
_KERNELPATH_PREFIX = "/sys/devices/"
_MAX_LINKS = 255  # Go's EvalSymlinks gives up after as many


def _strerror(exc: OSError) -> str:
    msg = exc.strerror or os.strerror(exc.errno or 0)
    return msg[:1].lower() + msg[1:]


def _quote(text: str) -> str:
    """Go's ``%q`` of a plain string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _shown(path: str, sys_root: str) -> str:
    """``path`` (under ``sys_root``) as Go names it: under /sys."""
    if sys_root != SYS and (path == sys_root or path.startswith(sys_root + "/")):
        return SYS + path[len(sys_root):]
    return path


def _real(path: str, sys_root: str) -> str:
    """A /sys path of the config, read under ``sys_root``."""
    if sys_root != SYS and (path == SYS or path.startswith(SYS + "/")):
        return sys_root + path[len(SYS):]
    return path


class _GoError(Exception):
    """An OS error as Go's os package words it (``lstat <path>: <strerror>``)."""


def _eval_symlinks(path: str, sys_root: str) -> str:
    """Go's ``filepath.EvalSymlinks`` of an absolute path: each component
    lstat'ed in turn, symlinks followed (relative ones from their
    directory). Raises `_GoError`."""
    todo = path.split("/")
    todo.reverse()
    cur = "/"
    links = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, part)
        try:
            st = os.lstat(nxt)
        except OSError as exc:
            raise _GoError(f"lstat {_shown(nxt, sys_root)}: {_strerror(exc)}") from None
        if not stat.S_ISLNK(st.st_mode):
            cur = nxt
            continue
        links += 1
        if links > _MAX_LINKS:
            raise _GoError("EvalSymlinks: too many links")
        target = os.readlink(nxt)
        if target.startswith("/"):
            cur = "/"
        todo.extend(reversed(target.split("/")))
    return cur


def has_dpdk_driver(pci_addr: str, sys_root: str = SYS) -> bool:
    """Is PCI device ``pci_addr`` bound to a userspace driver
    (`USERSPACE_DRIVERS`)? Reads ``<sys_root>/bus/pci/devices/<addr>/driver``
    (a symlink to the driver's directory).

    Raises:
        CNIError: 999 ``error with host device: lstat <path>: no such file
            or directory`` (Go's text) when the device or its driver link is
            missing: no driver bound is an error, as in Go.

    Source: Go ``hasDpdkDriver`` (+ ``loadConf``'s wrapping).
    """
    link = os.path.join(sys_root, _PCI_DEVICES, pci_addr, "driver")
    try:
        driver = _eval_symlinks(link, sys_root)
        try:
            os.stat(driver)
        except OSError as exc:
            raise _GoError(f"stat {_shown(driver, sys_root)}: {_strerror(exc)}") from None
    except _GoError as exc:
        raise CNIError(ERR_INTERNAL, f"error with host device: {exc}") from None
    return os.path.basename(driver) in USERSPACE_DRIVERS


_MAC_COLON = re.compile(r"[0-9A-Fa-f]{2}(?:([:-])[0-9A-Fa-f]{2})(?:\1[0-9A-Fa-f]{2})*")
_MAC_DOT = re.compile(r"[0-9A-Fa-f]{4}(?:\.[0-9A-Fa-f]{4})*")


def parse_mac(text: str) -> str:
    """Go's ``net.ParseMAC``: an EUI-48, EUI-64 or 20-byte InfiniBand
    address written ``aa:bb:..``, ``aa-bb-..`` or ``aabb.ccdd.eeff``, as
    lower-case ``aa:bb:..`` (how a `cni_skel.netlink.Link` holds its MAC).

    Raises:
        CNIError: 7 ``failed to parse MAC address "<text>": address <text>:
            invalid MAC address`` (Go's text; Go answers 999).
    """
    octets: list[str] = []
    if _MAC_COLON.fullmatch(text):
        octets = re.split(r"[:-]", text)
    elif _MAC_DOT.fullmatch(text):
        octets = [g[i:i + 2] for g in text.split(".") for i in (0, 2)]
    if len(octets) not in (6, 8, 20):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       f"failed to parse MAC address {_quote(text)}: address {text}: "
                       "invalid MAC address")
    return ":".join(o.lower() for o in octets)


def _not_found() -> CNIError:
    # vishvananda/netlink's LinkNotFoundError text
    return CNIError(ERR_INTERNAL, "Link not found")


def _by_name(ipr: netlink.Socket, name: str) -> netlink.Link:
    link = netlink.find_link(ipr, name)
    if link is None:
        raise _not_found()
    return link


def _read_dir(path: str) -> list[str]:
    """Go's ``ioutil.ReadDir`` names: sorted. Raises OSError."""
    return sorted(os.listdir(path))


def _by_kernelpath(ipr: netlink.Socket, kernelpath: str, sys_root: str) -> netlink.Link:
    if not kernelpath.startswith("/") or not kernelpath.startswith(_KERNELPATH_PREFIX):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       f"kernel device path {_quote(kernelpath)} must be absolute and begin "
                       f"with {_KERNELPATH_PREFIX}")
    net_dir = os.path.normpath(os.path.join(kernelpath, "net"))  # Go's Join cleans
    try:
        names = _read_dir(_real(net_dir, sys_root))
    except OSError:
        raise CNIError(ERR_INTERNAL,
                       f"failed to find network devices at {_quote(net_dir)}") from None
    by_name = {link.name: link for link in netlink.links(ipr)}
    # the first entry that is a link of this namespace
    for name in names:
        if name in by_name:
            return by_name[name]
    raise CNIError(ERR_INTERNAL, "failed to find physical interface")


def _by_pci(ipr: netlink.Socket, pci_addr: str, sys_root: str) -> netlink.Link:
    device = os.path.join(sys_root, _PCI_DEVICES, pci_addr)
    net_dir = os.path.join(device, "net")
    if not os.path.lexists(net_dir):
        # a virtio NIC keeps its netdev one level down (virtioN/net)
        try:
            matches = sorted(e for e in os.listdir(device) if e.startswith("virtio")
                             and os.path.lexists(os.path.join(device, e, "net")))
        except OSError:
            matches = []
        if not matches:
            raise CNIError(ERR_INTERNAL, f"no net directory under pci device {pci_addr}")
        net_dir = os.path.join(device, matches[0], "net")
    try:
        names = _read_dir(net_dir)
    except OSError as exc:
        shown = _shown(net_dir, sys_root)
        raise CNIError(ERR_INTERNAL, f"failed to read net directory {shown}: "
                       f"{_quote(f'open {shown}: {_strerror(exc)}')}") from None
    if names:
        return _by_name(ipr, names[0])
    raise CNIError(ERR_INTERNAL, f"failed to find device name for pci address {pci_addr}")


def device_id_kind(device_id: str, sys_root: str = SYS) -> str:
    """What ``runtimeConfig.deviceID`` names (Go >= 1.5 ``handleDeviceID``):
    ``"pci"`` when ``/sys/bus/pci/devices/<id>`` exists, else ``"aux"`` when
    ``/sys/bus/auxiliary/devices/<id>`` does (an auxiliary-bus device, e.g.
    a Mellanox SF), else ``"pci"`` (the PCI look-up then fails with Go
    1.1.1's text)."""
    if os.path.lexists(os.path.join(sys_root, _PCI_DEVICES, device_id)):
        return "pci"
    if os.path.lexists(os.path.join(sys_root, _AUX_DEVICES, device_id)):
        return "aux"
    return "pci"


def _by_aux(ipr: netlink.Socket, aux_dev: str, sys_root: str) -> netlink.Link:
    # Go's linkFromPath on /sys/bus/auxiliary/devices/<dev>/net
    net_dir = os.path.join(sys_root, _AUX_DEVICES, aux_dev, "net")
    shown = _shown(net_dir, sys_root)
    try:
        names = _read_dir(net_dir)
    except OSError as exc:
        raise CNIError(ERR_INTERNAL, f"failed to read directory {shown}: "
                       f"{_quote(f'open {shown}: {_strerror(exc)}')}") from None
    if names:
        return _by_name(ipr, names[0])
    raise CNIError(ERR_INTERNAL, f"failed to find network device in path {shown}")


def find_device(ipr: netlink.Socket, *, device: str = "", hwaddr: str = "",
                kernelpath: str = "", pci_addr: str = "", aux_dev: str = "",
                sys_root: str = SYS) -> netlink.Link:
    """The node's link the config names, looked up in ``ipr``'s namespace.
    The first key given wins, in Go's order: ``device`` (a link name),
    ``hwaddr`` (the first link with that MAC, in ifindex order),
    ``kernelpath`` (``/sys/devices/...``: the first entry of its ``net/``
    directory, in name order, that is a link here), ``pci_addr`` (the first
    entry of ``/sys/bus/pci/devices/<addr>/net/``, or of its
    ``virtio*/net/``), ``aux_dev`` (the first entry of
    ``/sys/bus/auxiliary/devices/<dev>/net/``, Go >= 1.5).

    Raises:
        CNIError: 7 for a ``hwaddr`` that is no MAC or a ``kernelpath``
            outside /sys/devices/ (Go's texts; Go answers 999); 999 with
            Go's text when nothing is found (``Link not found``, ``failed to
            find physical interface``, ``failed to find network devices at
            "<dir>"``, ``no net directory under pci device <addr>``,
            ``failed to find device name for pci address <addr>``...). The
            caller prefixes ``failed to find host device: ``.

    Source: Go ``getLink``.
    """
    if device:
        return _by_name(ipr, device)
    if hwaddr:
        mac = parse_mac(hwaddr)
        for link in netlink.links(ipr):
            if link.mac == mac:
                return link
    elif kernelpath:
        return _by_kernelpath(ipr, kernelpath, sys_root)
    elif pci_addr:
        return _by_pci(ipr, pci_addr, sys_root)
    elif aux_dev:
        return _by_aux(ipr, aux_dev, sys_root)
    raise CNIError(ERR_INTERNAL, "failed to find physical interface")

"""Hypothesis strategies for the contract fuzz suite: one `Case` is the
environment and stdin of one plugin call, plus whether a valid ADD runs
first (so DEL, CHECK and GC meet a real attachment) and, for firewall, how
the node filters forwarded traffic (`NODE_FILTERS`, so both of its paths run).

Configs start from a known-good config per plugin (`base_config`), get
optional keys derived from the plugin's own pydantic config model
(`from_model`: every field of the model, values by type and by key name
from `HINTS`), and are then, in most examples, mutated: a value of the
wrong type at a random path, a deleted key, a huge string, any cniVersion of
`cni_skel.version` (and malformed ones), padding up to 1 MB, or stdin that is
not a JSON object at all. prevResults are built from the result model
(`cni_skel.types.Result`) and written in the config's version.
Environment variables are valid mostly, else missing, empty, long (up to
100 kB), invalid UTF-8 (bytes) or with control characters.

Paths and names never reach outside the test: every value that names a
namespace, a directory or a container is a placeholder (`token`) the test
resolves to what it made; a mutated CNI_NETNS or CNI_PATH always lies under
a directory that does not exist; the ``dataDir`` keys are never deleted nor
set to another string (an empty or relative one would mean the machine's
/var/lib/cni or the working directory), only to values of a wrong type;
tuning only gets sysctls from `SAFE_SYSCTLS` (per network namespace, so
they only ever reach the pod); firewall never gets backend ``firewalld``
(no firewalld runs in the fuzz; the test points D-Bus at a socket that does
not exist, so the machine's bus is never asked and no backend means
iptables + nftables).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from cni_skel_plugins.bandwidth import BandwidthConf
from cni_skel_plugins.bridge.config import BridgeConf
from cni_skel_plugins.firewall import Firewall, FirewallConf
from cni_skel_plugins.flannel import FlannelConf
from cni_skel_plugins.host_device.config import HostDeviceConf
from cni_skel_plugins.host_local.config import HostLocalConf, IPAMSettings
from cni_skel_plugins.ipvlan import IPVlanConf
from cni_skel_plugins.macvlan import MacvlanConf
from cni_skel_plugins.portmap.config import PortMapConf
from cni_skel_plugins.ptp import PtpConf
from cni_skel_plugins.sbr import SbrConf
from cni_skel_plugins.static.config import StaticConf
from cni_skel_plugins.tap import TapConf
from cni_skel_plugins.tuning.config import TuningConf
from cni_skel_plugins.vlan import VlanConf
from cni_skel_plugins.vrf import VrfConf
from hypothesis import strategies as st
from pydantic import BaseModel

from cni_skel.config import NetConf
from cni_skel.errors import CNIError
from cni_skel.types import Result
from cni_skel.version import ALL_VERSIONS, CURRENT_VERSION

__all__ = [
    "BRIDGE",
    "CNI_VARS",
    "KERNEL_PLUGINS",
    "MISSING",
    "NET",
    "NODE_FILTERS",
    "PLUGINS",
    "SAFE_SYSCTLS",
    "TOKENS",
    "VERBS",
    "Case",
    "base_config",
    "cases",
    "from_model",
    "prev_result",
    "token",
]

PLUGINS = ("bandwidth", "bridge", "firewall", "flannel", "host-device", "host-local", "loopback",
           "macvlan", "portmap", "ptp", "sbr", "static", "tap", "tuning")
#: Plugins whose link kind some kernels lack, with the feature they need
#: (tests/kernelvm.py): where the host has none, they are fuzzed in its VM.
KERNEL_PLUGINS = {"ipvlan": "ipvlan", "vlan": "8021q", "dummy": "dummy", "vrf": "vrf"}
VERBS = ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")
CNI_VARS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")


def token(name: str) -> str:
    """A placeholder the test replaces (in env values and in the JSON text)."""
    return f"@@fz:{name}@@"


#: Placeholders: POD (the pod's netns path), NOTNS (a regular file), BIN (the
#: bin dir), DATA (host-local dataDir), TUNING (tuning dataDir), HOSTDEV
#: (host-device's dataDir), RESOLV (a resolv.conf), CID (this example's
#: container ID), PREV (the setup ADD's result, a JSON value), SUBNET
#: (flannel's subnet file), FLANNEL (flannel's dataDir), FIREWALL (firewall's
#: dataDir: its records).
TOKENS = {name: token(name) for name in
          ("POD", "NOTNS", "BIN", "DATA", "TUNING", "HOSTDEV", "RESOLV", "CID", "PREV",
           "SUBNET", "FLANNEL", "FIREWALL")}
(POD, NOTNS, BIN, DATA, TUNING, HOSTDEV, RESOLV, CID, PREV, SUBNET, FLANNEL,
 FIREWALL) = TOKENS.values()
#: A missing environment variable.
MISSING = None

NET = "fznet"
BRIDGE = "cnskfz0"
PM_LINK = "cnskfzpm0"  # the node link portmap's prevResult names
UPLINK = "cnskfzup0"  # macvlan's, ipvlan's and vlan's master on the node
DEVICE = "cnskfzhd0"  # the node link host-device moves into the pod
BW_HOST = "cnskfzbw0"  # the node end of the pod's veth bandwidth shapes
PM_NODE = ("10.99.0.1/24", "fd00:99::1/64")
POD_IPS = ("10.99.0.5/24", "fd00:99::5/64")
RANGES = [[{"subnet": "10.66.0.0/24"}], [{"subnet": "fd00:66::/64"}]]
ABSENT = "/run/netns/cnsk-fz-absent-"  # a path under it never exists
#: How the node filters forwarded traffic before a firewall case (the test
#: sets it up in the node namespace): ``iptables-drop``, the iptables (and
#: ip6tables) FORWARD policy DROP; ``nft-drop``, a native table ``inet
#: nodefw`` whose forward chain drops by policy. Neither: nothing drops.
NODE_FILTERS = ("iptables-drop", "nft-drop")

#: Sysctls tuning may set in the fuzz: all per network namespace, so a write
#: only ever reaches the pod. Values are valid ones.
SAFE_SYSCTLS = {
    "net.core.somaxconn": ("1024", "512"),
    "net.ipv4.ip_unprivileged_port_start": ("0", "1000"),
    "net.ipv4.ping_group_range": ("0 2147483647", "1 0"),
    "net.ipv4.conf.IFNAME.rp_filter": ("0", "2"),
    "net/ipv4/conf/IFNAME/accept_redirects": ("0", "1"),
    "net.ipv4.conf.eth0.arp_ignore": ("1", "2"),
    "net.ipv4.tcp_syncookies": ("0", "2"),
}


def sysctl_paths(ifnames: tuple[str, ...] = ("eth0", "lo")) -> list[str]:
    """/proc/sys-relative paths of `SAFE_SYSCTLS` (IFNAME for each name)."""
    out = []
    for key in SAFE_SYSCTLS:
        parts = key.split("/") if "/" in key else key.split(".")
        for ifname in ifnames if "IFNAME" in parts else ifnames[:1]:
            path = "/".join(ifname if p == "IFNAME" else p for p in parts)
            if path not in out:
                out.append(path)
    return out


# --- known-good configs ------------------------------------------------------------


def prev_result(plugin: str, version: str = CURRENT_VERSION) -> Any:
    """A prevResult for a chained plugin (portmap: node link + pod interface
    with the pod's addresses; tuning: the pod interface; sbr: the pod
    interface with its addresses and gateway), built with the result model
    and written in ``version``'s shape."""
    if plugin == "bandwidth":
        doc = {"interfaces": [{"name": BW_HOST}, {"name": "eth0", "sandbox": POD}],
               "ips": [{"address": POD_IPS[0], "interface": 1}]}
    elif plugin in ("sbr", "vrf"):
        doc = {"interfaces": [{"name": "eth0", "sandbox": POD}],
               "ips": [{"address": POD_IPS[0], "gateway": "10.99.0.1", "interface": 0},
                       {"address": POD_IPS[1], "gateway": "fd00:99::1", "interface": 0}]}
    elif plugin == "firewall":  # after bridge: the bridge first (its ingressPolicy's)
        doc = {"interfaces": [{"name": BRIDGE}, {"name": "eth0", "sandbox": POD}],
               "ips": [{"address": POD_IPS[0], "gateway": "10.99.0.1", "interface": 1},
                       {"address": POD_IPS[1], "interface": 1}]}
    elif plugin == "portmap":
        doc = {"interfaces": [{"name": PM_LINK}, {"name": "eth0", "sandbox": POD}],
               "ips": [{"address": POD_IPS[0], "gateway": "10.99.0.1", "interface": 1},
                       {"address": POD_IPS[1], "interface": 1}]}
    else:
        doc = {"interfaces": [{"name": "eth0", "sandbox": POD}],
               "ips": [{"address": POD_IPS[0], "interface": 0}]}
    return Result.model_validate(doc).to_version(version)


def base_config(plugin: str, version: str = CURRENT_VERSION) -> dict:
    """The known-good config of ``plugin`` (used as is by the setup ADD)."""
    conf: dict[str, Any] = {"cniVersion": version, "name": NET, "type": plugin}
    ipam = {"type": "host-local", "dataDir": DATA, "ranges": json.loads(json.dumps(RANGES))}
    if plugin == "bridge":
        conf.update(bridge=BRIDGE, isGateway=True, ipMasq=True, macspoofchk=True, ipam=ipam)
    elif plugin == "host-local":
        conf["ipam"] = ipam
    elif plugin == "static":
        conf["ipam"] = {"type": "static",
                        "addresses": [{"address": "10.66.0.9/24", "gateway": "10.66.0.1"},
                                      {"address": "fd00:66::9/64"}],
                        "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.0.0.53"]}}
    elif plugin == "flannel":
        conf.update(subnetFile=SUBNET, dataDir=FLANNEL, delegate={"bridge": BRIDGE},
                    ipam={"dataDir": DATA})
    elif plugin == "portmap":
        conf.update(capabilities={"portMappings": True},
                    runtimeConfig={"portMappings": [
                        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]},
                    prevResult=prev_result(plugin, version))
    elif plugin == "sbr":
        conf["prevResult"] = prev_result(plugin, version)
    elif plugin == "firewall":
        conf.update(dataDir=FIREWALL, prevResult=prev_result(plugin, version))
    elif plugin == "vrf":
        conf.update(vrfname="cnskfzvrf", prevResult=prev_result(plugin, version))
    elif plugin == "bandwidth":
        conf.update(ingressRate=8_000_000, ingressBurst=800_000, egressRate=8_000_000,
                    egressBurst=800_000, prevResult=prev_result(plugin, version))
    elif plugin == "tuning":
        conf.update(dataDir=TUNING, sysctl={"net.core.somaxconn": "1024"}, mtu=1400,
                    promisc=True, prevResult=prev_result(plugin, version))
    elif plugin == "macvlan":
        conf.update(master=UPLINK, mode="bridge", ipam=ipam)
    elif plugin == "ipvlan":
        conf.update(master=UPLINK, mode="l2", ipam=ipam)
    elif plugin == "vlan":
        conf.update(master=UPLINK, vlanId=100, ipam=ipam)
    elif plugin == "dummy":
        conf["ipam"] = ipam
    elif plugin == "ptp":
        conf.update(ipMasq=True, ipam=ipam)
    elif plugin == "host-device":
        conf.update(device=DEVICE, dataDir=HOSTDEV, ipam=ipam)
    elif plugin == "tap":
        conf.update(mtu=1400, multiQueue=True, owner=1000, group=1000, ipam=ipam)
    return conf


# --- configs derived from the models -------------------------------------------------

_ADDRS = ["10.66.0.1", "10.66.0.10", "10.66.0.50", "10.66.0.77", "10.99.0.1",
          "fd00:66::1", "fd00:66::10", "fd00:66::77"]
_MACS = ["0a:58:0a:42:00:09", "02:42:ac:11:00:02", "0A-58-0A-42-00-0A"]

#: Values by key name ("Model.key" first, then "key"): valid ones mostly, for
#: the keys whose type alone says too little.
HINTS: dict[str, st.SearchStrategy[Any]] = {
    "subnet": st.sampled_from(["10.66.0.0/24", "fd00:66::/64", "10.66.0.0/28", "10.68.0.0/24"]),
    "rangeStart": st.sampled_from(_ADDRS),
    "rangeEnd": st.sampled_from(_ADDRS),
    "gateway": st.sampled_from(_ADDRS),
    "gw": st.sampled_from(_ADDRS),
    "address": st.sampled_from([*POD_IPS, "10.66.0.9/24"]),
    "dst": st.sampled_from(["0.0.0.0/0", "::/0", "10.200.0.0/16"]),
    "mac": st.sampled_from(_MACS),
    "mtu": st.sampled_from([0, 1280, 1400, 1500, 9000]),
    "txQLen": st.sampled_from([0, 500, 1000, 10000]),
    "vlan": st.sampled_from([0, 0, 0, 0, 0, 10]),
    "vlanTrunk": st.sampled_from([None, None, [], [{"id": 20}], [{"minID": 30, "maxID": 32}],
                                  [{"minID": 30}]]),
    "disableContainerInterface": st.sampled_from([False, False, False, True]),
    "IPAMSettings.subnet": st.sampled_from(["10.68.0.0/24", "10.66.0.0/28"]),
    "IPAMSettings.rangeStart": st.sampled_from(["10.68.0.10", "10.66.0.10"]),
    "IPAMSettings.rangeEnd": st.sampled_from(["10.68.0.50", "10.66.0.50"]),
    "IPAMSettings.gateway": st.sampled_from(["10.68.0.1", "fd00:66::1"]),
    "hostPort": st.integers(8080, 8089),
    "containerPort": st.sampled_from([80, 8080]),
    "protocol": st.sampled_from(["tcp", "udp", "sctp", "TCP", ""]),
    "hostIP": st.sampled_from(["", "10.99.0.1", "fd00:99::1", "::ffff:10.99.0.1"]),
    "backend": st.sampled_from([None, "nftables", "iptables"]),
    "ipMasqBackend": st.sampled_from([None, "nftables", "iptables"]),
    # nft or iptables syntax (with no backend, the latter means iptables)
    "conditionsV4": st.sampled_from([None, [], ["ip saddr 10.0.0.0/8"], ["-s", "10.0.0.0/8"]]),
    "conditionsV6": st.sampled_from([None, [], ["ip6 saddr fd00::/8"]]),
    "markMasqBit": st.sampled_from([None, None, None, 5, 32]),
    # a chain that does not exist: ADD fails, nothing may be left
    "externalSetMarkChain": st.sampled_from([None, None, None, "FZ-MARK"]),
    "sysctl": st.lists(st.sampled_from(sorted(SAFE_SYSCTLS)), max_size=3, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: st.sampled_from(SAFE_SYSCTLS[k]) for k in keys})),
    "dataDir": st.just(DATA),
    "TuningConf.dataDir": st.just(TUNING),
    "resolvConf": st.sampled_from([RESOLV, "", "/nonexistent/resolv.conf"]),
    "ips": st.lists(st.sampled_from(["10.66.0.77", "fd00:66::77", "10.66.0.78/24"]),
                    max_size=2, unique=True),
    "ipRanges": st.sampled_from([[], [[{"subnet": "10.67.0.0/24"}]]]),
    "nameservers": st.lists(st.sampled_from(["10.0.0.53", "fd00::53"]), max_size=2),
    "domain": st.sampled_from(["fz.local", ""]),
    "search": st.lists(st.sampled_from(["fz.local", "svc.fz.local"]), max_size=2),
    "options": st.lists(st.sampled_from(["ndots:5", "edns0"]), max_size=2),
    "capabilities": st.sampled_from([{}, {"portMappings": True}, {"mac": True, "ips": True}]),
    "runtimeConfig": st.sampled_from([{}, {"mac": _MACS[0]}]),
    "args": st.sampled_from([{}, {"cni": {"mac": _MACS[1]}}]),
    "containerID": st.sampled_from([CID, "fzother"]),
    "ifname": st.sampled_from(["eth0", "eth1"]),
    "Interface.name": st.sampled_from(["eth0", BRIDGE, PM_LINK, "lo"]),
    "sandbox": st.sampled_from([POD, ""]),
    "interface": st.sampled_from([0, 1, 2]),
    "mode": st.sampled_from(["bridge", "private", "vepa", "passthru", "source", "l2", "l3",
                             "l3s", ""]),
    "vlanId": st.sampled_from([100, 100, 0, 4094, 4095]),
    "linkInContainer": st.sampled_from([False, False, True]),
    "bcqueuelen": st.sampled_from([0, 0, 100]),
    # host-device finds devices in the node namespace only (its netlink,
    # its /sys); a PCI address of this machine is never named
    "hwaddr": st.sampled_from(["", *_MACS]),
    "kernelpath": st.sampled_from(["", f"/sys/devices/virtual/net/{DEVICE}", "/nonexistent"]),
    "pciBusID": st.sampled_from(["", "0000:99:1f.7"]),
    "deviceID": st.sampled_from(["", "0000:99:1f.7"]),
    "socketPath": st.none(),
    "pciID": st.none(),
    "advmss": st.sampled_from([None, 0, 1400]),
    "priority": st.sampled_from([None, 0, 100]),
    "table": st.sampled_from([None, 0, 100]),
    "scope": st.sampled_from([None, 0, 253]),
    # firewall: never "firewalld" (module docstring); junk (code 7) about a
    # time in ten per key, so that most configs get past validation.
    # sampled_from leans to its first items: the lists interleave what
    # should be even.
    # tap: ids the kernel takes, and ones the model refuses; a label no
    # kernel here can apply (no SELinux: EINVAL, nothing made); a bridge in
    # the pod that is not there, or no interface name at all
    "TapConf.owner": st.sampled_from([None, 0, 1000, 4294967294, 4294967295, -1]),
    "TapConf.group": st.sampled_from([None, 0, 1000, 4294967294, 4294967295, -1]),
    "TapConf.selinuxContext": st.sampled_from(["", "", "", "system_u:system_r:container_t:s0"]),
    "TapConf.bridge": st.sampled_from([None, None, "", "fzpodbr0", "bad name!"]),
    "FirewallConf.backend": st.sampled_from(["iptables", "nftables", ""] * 6
                                            + ["IPTABLES", "iptables ", None]),
    "FirewallConf.ingressPolicy": st.sampled_from(["open", "same-bridge", "isolated"] * 5
                                                  + ["", "Same-Bridge", 1]),
    # valid (28 characters the most), names iptables refuses or that make a
    # loop (a target, a built-in or our own chain), and ones the model refuses
    "FirewallConf.iptablesAdminChainName": st.sampled_from(
        ["FZ-ADMIN", "FORWARD", "", "CNI-FORWARD", "A" * 28, "ACCEPT", "fz_admin.1",
         "CNI-ISOLATION-STAGE-2", "CNI-ADMIN"] + ["FZ-ADMIN", "", "CNI-ADMIN"] * 2
        + ["-X", "!fz", "fz admin", "B" * 29, "fz\n", 5]),
    "FirewallConf.firewalldZone": st.sampled_from(["", "trusted", "public", "fz zone"] * 2
                                                  + [3]),
}

_IP_TYPES = (ipaddress.IPv4Address, ipaddress.IPv6Address)
_NET_TYPES = (ipaddress.IPv4Interface, ipaddress.IPv6Interface, ipaddress.IPv4Network,
              ipaddress.IPv6Network)


def _derive(tp: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """A strategy for a value of annotation ``tp`` (validators ignored)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Annotated:
        return _derive(args[0], depth)
    if isinstance(tp, typing.ForwardRef | str):
        return st.none()
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        return st.one_of([_derive(m, depth) for m in members]) if members else st.none()
    if origin is Literal:
        return st.sampled_from(args)
    if origin is list:
        return st.lists(_derive(args[0], depth + 1), max_size=2 if depth < 3 else 0)
    if origin is dict:
        return st.dictionaries(st.sampled_from(["k1", "k2"]), _derive(args[1], depth + 1),
                               max_size=2)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return from_model(tp) if depth < 3 else st.just({})
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(0, 100)
    if tp is float:
        return st.floats(0, 100)
    if tp is str:
        return st.sampled_from(["", "fz"])
    if isinstance(tp, type) and issubclass(tp, _IP_TYPES):
        return st.sampled_from(_ADDRS)
    if isinstance(tp, type) and issubclass(tp, _NET_TYPES):
        return st.sampled_from(["10.66.0.0/24", "fd00:66::/64"])
    return st.none() | st.booleans() | st.integers(0, 10) | st.just("fz")


@functools.cache
def from_model(model: type[BaseModel], *, skip: frozenset[str] = frozenset(),
               optional: float = 1 / 3) -> st.SearchStrategy[dict]:
    """JSON objects for ``model``: its required fields always, each optional
    one with probability ``optional``; keys are the fields' aliases (the wire
    names), values from `HINTS`, a nested model's own fields, or the type."""
    fields = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        if info.exclude or key in skip:
            continue
        hint = HINTS.get(f"{model.__name__}.{key}")
        if hint is None and not _is_model(info.annotation):
            hint = HINTS.get(key)
        fields.append((key, hint if hint is not None else _derive(info.annotation),
                       info.is_required()))

    @st.composite
    def build(draw: st.DrawFn) -> dict:
        out = {}
        for key, strategy, required in fields:
            if required or draw(st.floats(0, 1)) < optional:
                out[key] = draw(strategy)
        return out

    return build()


def _is_model(tp: Any) -> bool:
    for arg in (tp, *typing.get_args(tp)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return True
    return False


def in_shape(doc: dict, version: str) -> Any:
    """A drawn prevResult ``doc`` in ``version``'s shape when it can be
    written so, else as drawn."""
    try:
        return Result.model_validate(doc).to_version(version)
    except (ValueError, CNIError):
        return doc


@functools.cache
def derived_prev_result(version: str) -> st.SearchStrategy[Any]:
    """A prevResult from the result model's fields, in ``version``'s shape
    when it can be written so (else as drawn)."""
    return from_model(Result, skip=frozenset({"cniVersion"}), optional=0.7).map(
        lambda doc: in_shape(doc, version))


_CONF_MODEL = {"bridge": BridgeConf, "host-local": HostLocalConf, "loopback": NetConf,
               "portmap": PortMapConf, "tuning": TuningConf, "macvlan": MacvlanConf,
               "ptp": PtpConf, "host-device": HostDeviceConf, "ipvlan": IPVlanConf,
               "vlan": VlanConf, "dummy": NetConf, "sbr": SbrConf, "static": StaticConf,
               "flannel": FlannelConf, "bandwidth": BandwidthConf, "vrf": VrfConf,
               "firewall": FirewallConf, "tap": TapConf}
# Keys the base config sets (or the case adds) rather than the derivation.
_BASE_KEYS = frozenset({"cniVersion", "name", "type", "bridge", "ipam", "prevResult", "dataDir",
                        "cni.dev/valid-attachments", "cni.dev/attachments", "master",
                        "device", "subnetFile", "delegate"})


#: The firewall's own keys, each drawn on its own (present 3 times in 4)
#: rather than with the model's other optional keys (once in 4).
_FIREWALL_KEYS = ("backend", "ingressPolicy", "iptablesAdminChainName", "firewalldZone")
# the first is the bridge ingressPolicy isolates; one name is over IFNAMSIZ
# (iptables refuses it half-way through an ADD)
_FW_IFACES = [{"name": BRIDGE}, {"name": "eth0", "sandbox": POD}, {"name": "cnskfz1"},
              {"name": "eth1", "sandbox": POD}, {"name": ""}, {"name": "cnskfzlongname16"}]
# Pod addresses: the usual (twice as likely), another pod's, a host prefix,
# an IPv4-mapped IPv6 one, and ones a set may refuse (zero, broadcast).
_FW_ADDRS = [*POD_IPS, *POD_IPS, "10.99.0.6/24", "fd00:99::6/64", "10.99.0.5/32",
             "192.168.7.9/16", "::ffff:10.99.0.7/128", "0.0.0.0/0", "255.255.255.255/32",
             "::/0"]


@st.composite
def firewall_prev_result(draw: st.DrawFn, version: str) -> Any:
    """A prevResult of 0-3 interfaces and 0-4 addresses (v4 and v6; now and
    then one naming an interface that is not there), in ``version``'s
    shape when it can be written so (else as drawn)."""
    # counts drawn from lists: st.lists leans to empty ones
    ifaces = [draw(st.sampled_from(_FW_IFACES))
              for _ in range(draw(st.sampled_from([0, 1, 2, 2, 3])))]
    ips = []
    for _ in range(draw(st.sampled_from([0, 1, 2, 2, 3, 4]))):
        ip: dict[str, Any] = {"address": draw(st.sampled_from(_FW_ADDRS))}
        index = draw(st.sampled_from([None, 0, 1, 1, 2, 7]))
        if index is not None:
            ip["interface"] = index
        ips.append(ip)
    return in_shape({"interfaces": ifaces, "ips": ips}, version)


# sbr: the pod's own addresses (twice as likely), addresses eth0 does not
# hold (in and out of its subnets), on-link gateways or none.
_SBR_ADDRS = [*POD_IPS, *POD_IPS, "10.66.16.50/24", "10.99.0.6/24", "fd00:99::6/64",
              "fd00:77::5/64"]
_SBR_GATEWAYS = {4: [None, "10.99.0.1", "10.99.0.1", "10.99.0.77"],
                 6: [None, "fd00:99::1", "fd00:99::1"]}
_SBR_IFACES = [{"name": "eth0", "sandbox": POD}, {"name": "net1", "sandbox": POD}]


@st.composite
def sbr_prev_result(draw: st.DrawFn, version: str) -> Any:
    """A prevResult for sbr: a third of the time in the 0.2.0 shape (``ip4``
    / ``ip6``, no interfaces) whatever the config's version; else 0-3
    addresses of `_SBR_ADDRS`, each with an interface index or none, the
    interfaces eth0 or another name, in ``version``'s shape when it can be
    written so."""
    def gateway(addr: str) -> Any:
        return draw(st.sampled_from(_SBR_GATEWAYS[ipaddress.ip_interface(addr).version]))

    if draw(st.sampled_from([True, False, False])):
        doc: dict[str, Any] = {"cniVersion": "0.2.0"}
        for key, family in (("ip4", 4), ("ip6", 6)):
            addrs = [a for a in _SBR_ADDRS if ipaddress.ip_interface(a).version == family]
            if draw(st.booleans()):
                ip = {"ip": draw(st.sampled_from(addrs))}
                if (gw := gateway(ip["ip"])) is not None:
                    ip["gateway"] = gw
                doc[key] = ip
        return doc
    ifaces = [draw(st.sampled_from(_SBR_IFACES))
              for _ in range(draw(st.sampled_from([0, 1, 1, 2])))]
    ips = []
    for _ in range(draw(st.sampled_from([0, 1, 2, 2, 3]))):
        ip = {"address": draw(st.sampled_from(_SBR_ADDRS))}
        if (gw := gateway(ip["address"])) is not None:
            ip["gateway"] = gw
        index = draw(st.sampled_from([None, 0, 0, 1]))
        if index is not None:
            ip["interface"] = index
        ips.append(ip)
    return in_shape({"interfaces": ifaces, "ips": ips}, version)


#: Chained plugins that walk a prevResult, and the sizes of the huge ones
#: they get now and then (the SDK refuses more than a prevResult may carry,
#: docs/limits.md; below that the work must stay bounded).
HUGE_PREV_PLUGINS = ("bandwidth", "firewall", "portmap", "sbr", "tuning", "vrf")
HUGE_PREV_SIZES = (1_000, 5_000, 20_000)
#: The longest one call with a huge prevResult may take (a hang guard, not a
#: speed target: Go refuses 20,000 addresses in 0.3 s).
HUGE_PREV_SECONDS = 20.0


def huge_prev_result(plugin: str, key: str, size: int, version: str) -> dict:
    """``plugin``'s valid prevResult with ``size`` entries in ``key`` (``ips``:
    addresses of 10.98.0.0/16 on the pod's interface; ``routes``; ``dns``:
    nameservers), in the current shape (its own cniVersion says so)."""
    doc = Result.model_validate(prev_result(plugin)).to_version(CURRENT_VERSION)
    pod = next((n for n, i in enumerate(doc["interfaces"]) if i.get("sandbox")), 0)
    hosts = [f"10.98.{n // 250}.{n % 250 + 1}" for n in range(size)]
    if key == "ips":
        doc["ips"] = [*doc["ips"], *({"address": f"{h}/16", "interface": pod} for h in hosts)]
    elif key == "routes":
        doc["routes"] = [{"dst": f"{h}/32", "gw": "10.99.0.1"} for h in hosts]
    else:
        doc["dns"] = {"nameservers": hosts}
    return doc


@st.composite
def configs(draw: st.DrawFn, plugin: str, verb: str, version: str) -> dict:
    """A valid-ish config: `base_config` plus optional keys from the plugin's
    model; for host-local and bridge also the ``ipam`` keys of
    `IPAMSettings`; a derived prevResult now and then."""
    conf = base_config(plugin, version)
    if plugin == "firewall":
        conf.update(draw(from_model(FirewallConf, skip=_BASE_KEYS | frozenset(_FIREWALL_KEYS),
                                    optional=0.25)))
        # weights as lists: st.integers and st.booleans lean to 0 / False
        for key in _FIREWALL_KEYS:
            if draw(st.sampled_from([True, True, True, False])):
                conf[key] = draw(HINTS[f"FirewallConf.{key}"])
        prev = draw(st.sampled_from(["drawn"] * 5 + ["base"] * 4 + ["none"]))
        if prev == "drawn":
            conf["prevResult"] = draw(firewall_prev_result(version))
        elif prev == "none":
            del conf["prevResult"]
    else:
        conf.update(draw(from_model(_CONF_MODEL[plugin], skip=_BASE_KEYS, optional=0.25)))
    if plugin == "sbr":
        prev = draw(st.sampled_from(["drawn"] * 4 + ["base"] * 5 + ["none"]))
        if prev == "drawn":
            conf["prevResult"] = draw(sbr_prev_result(version))
        elif prev == "none":
            del conf["prevResult"]
    if "ipam" in conf:
        extra = draw(from_model(IPAMSettings, skip=frozenset({"type", "dataDir", "ranges"}),
                                optional=0.1))
        conf["ipam"].update(extra)
        if draw(st.integers(0, 4)) == 0:
            conf["ipam"]["ranges"] = draw(from_model(IPAMSettings, optional=1.0).map(
                lambda d: d.get("ranges", [])))
    chained = ("portmap", "tuning", "loopback", "sbr", "bandwidth", "vrf", "firewall")
    if plugin in chained and draw(st.integers(0, 5)) == 0:
        conf["prevResult"] = draw(derived_prev_result(version))
    if verb == "GC" or draw(st.integers(0, 9)) == 0:
        conf["cni.dev/valid-attachments"] = draw(st.lists(
            st.fixed_dictionaries({"containerID": HINTS["containerID"],
                                   "ifname": HINTS["ifname"]}), max_size=2))
    return conf


# --- mutations ---------------------------------------------------------------------------

_WRONG = [None, True, False, 0, -1, 7, 2**64, 1.5, "", "fz", "\u00e9\u2603", [], [1, "a"], {},
          {"fz": 1}]
_BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]
_CONTROL = ["\n", "\t", "\r", "\x1b[31m", "\x7f", "\x01", "\x1f"]
_LONG = [64, 250, 256, 4096, 100_000]
_HUGE = [100_000, 300_000, 1_000_000]
MAX_STDIN = 1_000_000


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING_KEY = _Missing()


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((*prefix, k))
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append((*prefix, i))
            out.extend(_paths(v, (*prefix, i)))
    return out


def _get(obj: Any, path: tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _is_data_dir(path: tuple) -> bool:
    return bool(path) and isinstance(path[-1], str) and path[-1].lower() == "datadir"


def _holds_data_dir(obj: Any) -> bool:
    return isinstance(obj, dict) and any(isinstance(k, str) and k.lower() == "datadir"
                                         for k in obj)


@st.composite
def mutated(draw: st.DrawFn, conf: dict, notes: list[str]) -> dict:
    """``conf`` with 1-3 mutations (notes say which); at most `MAX_STDIN` bytes."""
    conf = json.loads(json.dumps(conf))
    for _ in range(draw(st.integers(1, 3))):
        room = MAX_STDIN - len(json.dumps(conf))
        op = draw(st.sampled_from(["wrong-type", "wrong-type", "delete", "huge", "version",
                                   "pad"]))
        paths = _paths(conf)
        if op == "version":
            v = draw(st.sampled_from([*ALL_VERSIONS, "", "9.9.9", "1.1", "01.1.0", None, 110,
                                      "1.1.0\n", MISSING_KEY]))
            if v is MISSING_KEY:
                conf.pop("cniVersion", None)
            else:
                conf["cniVersion"] = v
            notes.append(f"cniVersion {v!r}")
            continue
        if op == "pad":
            size = min(room - 20, draw(st.sampled_from([10_000, 100_000, 900_000])))
            if size <= 0:
                continue
            conf["fzPad"] = "p" * size
            notes.append(f"padded with {size} bytes")
            continue
        if not paths:
            continue
        path = draw(st.sampled_from(paths))
        parent, key = _get(conf, path[:-1]), path[-1]
        old = parent[key]
        if op == "delete":
            if _is_data_dir(path) or _holds_data_dir(old):
                continue
            del parent[key]
            notes.append(f"deleted {_dotted(path)}")
        elif op == "huge":
            if _is_data_dir(path):
                continue
            size = min(room, draw(st.sampled_from(_HUGE)))
            if size <= 0:
                continue
            parent[key] = draw(st.sampled_from("aZ9.-/")) * size
            notes.append(f"{_dotted(path)} = {size}-byte string")
        else:
            choices = [w for w in _WRONG if type(w) is not type(old)
                       and not (_is_data_dir(path) and isinstance(w, str))
                       and not (_holds_data_dir(old) and isinstance(w, dict))]
            new = draw(st.sampled_from(choices))
            parent[key] = new
            notes.append(f"{_dotted(path)} = {new!r} (was {type(old).__name__})")
    return conf


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


@st.composite
def raw_stdin(draw: st.DrawFn, conf: dict, notes: list[str]) -> bytes:
    """stdin that is not one JSON object (or is one, wrapped oddly)."""
    text = json.dumps(conf).encode()
    kind = draw(st.sampled_from(["empty", "truncated", "binary", "scalar", "bad-utf8", "bom",
                                 "trailing", "two-docs", "deep"]))
    notes.append(f"stdin: {kind}")
    if kind == "empty":
        return b""
    if kind == "truncated":
        return text[:draw(st.integers(0, max(0, len(text) - 2)))]
    if kind == "binary":
        return draw(st.binary(max_size=64))
    if kind == "scalar":
        return draw(st.sampled_from([b"[]", b"null", b"42", b'"fznet"', b"[{}]", b"{}"]))
    if kind == "bad-utf8":
        return text.replace(NET.encode(), b"fz" + draw(st.sampled_from(_BAD_UTF8)) + b"net", 1)
    if kind == "bom":
        return b"\xef\xbb\xbf" + text
    if kind == "trailing":
        return text + draw(st.sampled_from([b" x", b"}", b"\x00", b"\n\n{}"]))
    if kind == "two-docs":
        return text + b"\n" + text
    depth = draw(st.sampled_from([1000, 100_000]))
    return b'{"a":' * depth + b"1" + b"}" * depth


# --- environments ----------------------------------------------------------------------


def _cni_args(plugin: str) -> st.SearchStrategy[str]:
    common = ["", "", "IgnoreUnknown=1;K8S_POD_NAMESPACE=fz;K8S_POD_NAME=pod-0"]
    extra = {"host-local": ["IP=10.66.0.77", "IgnoreUnknown=1;IP=fd00:66::77"],
             "bridge": ["MAC=0a:58:0a:42:00:0b", "IgnoreUnknown=1;MAC=02:42:ac:11:00:09"],
             "tuning": ["MAC=0a:58:0a:42:00:0c"],
             "macvlan": ["MAC=0a:58:0a:42:00:0d", "IgnoreUnknown=1;MAC=0A-58-0A-42-00-0E"],
             "static": ["IP=10.66.0.77/24;GATEWAY=10.66.0.1", "IgnoreUnknown=1;IP=fd00:66::77/64"]
             }.get(plugin, [])
    return st.sampled_from(common + extra)


def _long(var: str, size: int) -> str:
    if var == "CNI_NETNS":
        return ABSENT + "n" * size
    if var == "CNI_PATH":
        return "/nonexistent-" + "p" * size
    if var == "CNI_ARGS":
        return "IgnoreUnknown=1;FZ=" + "v" * size
    return {"CNI_COMMAND": "A", "CNI_CONTAINERID": "a", "CNI_IFNAME": "e"}[var] * size


_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=24)


@st.composite
def env_mutation(draw: st.DrawFn, var: str, valid: str, notes: list[str]) -> str | bytes | None:
    """A broken value for ``var`` (None: unset)."""
    kinds = ["missing", "empty", "long", "bad-utf8", "control", "text"]
    if var == "CNI_NETNS":
        kinds += ["notns", "self", "absent"]
    if var == "CNI_COMMAND":
        kinds += ["lower", "unknown"]
    kind = draw(st.sampled_from(kinds))
    value: str | bytes | None
    if kind == "missing":
        value = MISSING
    elif kind == "empty":
        value = ""
    elif kind == "long":
        size = draw(st.sampled_from(_LONG))
        value = _long(var, size)
        kind = f"long ({size})"
    elif kind == "bad-utf8":
        base = ABSENT.encode() if var == "CNI_NETNS" else valid.encode()
        value = base + draw(st.sampled_from(_BAD_UTF8))
    elif kind == "control":
        ctl = draw(st.sampled_from(_CONTROL))
        value = (ABSENT + "x" if var == "CNI_NETNS" else valid) + ctl
    elif kind == "text":
        text = draw(_TEXT)
        value = ABSENT + text if var == "CNI_NETNS" else \
            "/nonexistent-" + text if var == "CNI_PATH" else text
    elif kind == "notns":
        value = NOTNS
    elif kind == "self":
        value = "/proc/self/ns/net"  # the plugin's own namespace: the node
    elif kind == "absent":
        value = ABSENT + "x"
    elif kind == "lower":
        value = valid.lower()
    else:
        value = "FROB"
    notes.append(f"{var}: {kind}")
    return value


# --- cases ------------------------------------------------------------------------------


@dataclass
class Case:
    """One fuzz input: ``env`` (CNI_* variables; absent ones are unset; str or
    bytes values, placeholders inside), ``config`` (a JSON object with
    placeholders) or ``raw`` (stdin bytes as is), ``setup`` (a valid ADD runs
    first and a valid DEL after), ``notes`` (what was broken), ``node`` (the
    `NODE_FILTERS` the node has for the case)."""

    plugin: str
    verb: str
    env: dict[str, str | bytes]
    config: dict | None
    raw: bytes | None
    setup: bool
    notes: list[str] = field(default_factory=list)
    node: tuple[str, ...] = ()

    def stdin(self) -> bytes:
        """stdin with placeholders still in."""
        if self.raw is not None:
            return self.raw
        return json.dumps(self.config).encode()


#: Plugins that refuse older versions of the spec (code 1) whatever the verb:
#: their own versions are the valid ones, or most inputs would stop there.
_PLUGIN_VERSIONS = {"firewall": Firewall.supported_versions}


def _version_strategy(verb: str, plugin: str = "") -> st.SearchStrategy[str]:
    # Mostly a version the verb is defined for; any version of the spec now and then.
    valid = {"CHECK": ALL_VERSIONS[4:], "GC": ("1.1.0",), "STATUS": ("1.1.0",)}.get(
        verb, ALL_VERSIONS)
    if plugin in _PLUGIN_VERSIONS:
        valid = tuple(v for v in valid if v in _PLUGIN_VERSIONS[plugin])
    return st.sampled_from(valid) | st.just(CURRENT_VERSION) | st.sampled_from(ALL_VERSIONS)


@st.composite
def cases(draw: st.DrawFn, plugin: str, verb: str) -> Case:
    """One `Case` for ``plugin`` and ``verb``: valid about 40% of the time,
    else a broken environment, a broken config, or both."""
    notes: list[str] = []
    version = draw(_version_strategy(verb, plugin))
    conf = draw(configs(plugin, verb, version))
    setup = verb in ("DEL", "CHECK", "GC") and draw(st.booleans())
    if verb == "CHECK" and setup and plugin in ("bridge", "host-local", "loopback") \
            and draw(st.booleans()):
        conf["prevResult"] = PREV  # the setup ADD's own result
    env: dict[str, str | bytes] = {
        "CNI_COMMAND": verb, "CNI_CONTAINERID": CID, "CNI_NETNS": POD, "CNI_IFNAME": "eth0",
        "CNI_ARGS": draw(_cni_args(plugin)), "CNI_PATH": BIN}
    level = draw(st.sampled_from(["valid", "valid", "env", "config", "both"]))
    raw = None
    if level in ("env", "both"):
        for var in draw(st.lists(st.sampled_from(CNI_VARS), min_size=1, max_size=3,
                                 unique=True)):
            value = draw(env_mutation(var, str(env[var]), notes))
            if value is MISSING:
                del env[var]
            else:
                env[var] = value
    if level in ("config", "both"):
        if draw(st.integers(0, 5)) == 0:
            raw = draw(raw_stdin(conf, notes))
        else:
            conf = draw(mutated(conf, notes))
    if plugin in HUGE_PREV_PLUGINS and verb in ("ADD", "CHECK", "DEL") \
            and draw(st.integers(0, 7)) == 0:
        key = draw(st.sampled_from(["ips", "ips", "routes", "dns"]))
        size = draw(st.sampled_from(HUGE_PREV_SIZES))
        conf = {**conf, "prevResult": huge_prev_result(plugin, key, size, version)}
        raw = None
        notes.append(f"huge prevResult: {size} {key}")
    node: tuple[str, ...] = ()
    if plugin == "firewall":
        node = draw(st.sampled_from([NODE_FILTERS, *((f,) for f in NODE_FILTERS), ()]))
    return Case(plugin, verb, env, None if raw is not None else conf, raw, setup, notes, node)

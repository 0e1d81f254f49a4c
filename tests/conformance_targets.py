"""The configurations the conformance kit is run on in the suite (issue 50):
each reference plugin of ours that this kernel runs, alone or after ptp in a
list, with what it needs (a device in the node, capability args, a file).

`targets` gives, per name, the config document and the CLI options of
``cni-skel conformance`` (``--skip`` where a rule cannot hold by design: a
static address is the same in every pod; one host port cannot be mapped for
several pods at once; host-device has one device). ``root`` holds every
state directory. Every target runs without IPv6 duplicate address
detection (`NO_DAD`). Not a test module.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

#: No plugin asks the machine's D-Bus (firewall: firewalld).
NO_DBUS = "DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent/cnsk-no-dbus"
HOST_PORT = 18080
#: No wait for IPv6 duplicate address detection in the kit's namespaces
#: (some 1.5 s an ADD where plugins settle their addresses; the plugins'
#: own tests keep the wait).
NO_DAD = ["--sysctl", "net.ipv6.conf.default.accept_dad=0"]


@dataclass
class KitTarget:
    """One configuration: the document (a plugin object, or a list with
    ``plugins``) and the extra CLI options."""

    doc: dict[str, Any]
    options: list[str] = field(default_factory=list)

    def write(self, path: str) -> str:
        """Write it as ``path`` + ``.conf`` or ``.conflist``; the file's path."""
        path += ".conflist" if "plugins" in self.doc else ".conf"
        with open(path, "w") as fp:
            json.dump(self.doc, fp)
        return path


def _ipam(root: str, n: int) -> dict[str, Any]:
    return {"type": "host-local", "dataDir": os.path.join(root, "ipam"),
            "ranges": [[{"subnet": f"10.{80 + n}.0.0/24"}], [{"subnet": f"fd00:{80 + n}::/64"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}


def _after_ptp(root: str, name: str, n: int, plugin: dict[str, Any]) -> dict[str, Any]:
    return {"cniVersion": "1.1.0", "name": name, "plugins": [
        {"type": "ptp", "ipMasq": True, "ipam": _ipam(root, n)}, plugin]}


def targets(root: str) -> dict[str, KitTarget]:
    """Every configuration, by name, its state under ``root``."""
    subnet_env = os.path.join(root, "subnet.env")
    with open(subnet_env, "w") as fp:
        fp.write("FLANNEL_NETWORK=10.99.0.0/16\nFLANNEL_SUBNET=10.99.1.1/24\n"
                 "FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n")
    single = "1.1.0"
    found = {
        "ptp": KitTarget({"cniVersion": single, "name": "cfk-ptp", "type": "ptp",
                          "ipMasq": True, "ipam": _ipam(root, 0)}),
        "bridge": KitTarget({"cniVersion": single, "name": "cfk-bridge", "type": "bridge",
                             "bridge": "cfk-br0", "isGateway": True, "ipMasq": True,
                             "ipam": _ipam(root, 1)}),
        "macvlan": KitTarget({"cniVersion": single, "name": "cfk-macvlan", "type": "macvlan",
                              "master": "eth0", "mode": "bridge", "ipam": _ipam(root, 2)}),
        "host-device": KitTarget(
            {"cniVersion": single, "name": "cfk-hostdev", "type": "host-device",
             "device": "hdev0", "dataDir": os.path.join(root, "host-device"),
             "ipam": _ipam(root, 3)},
            # One device: no two attachments (at once, or GC's). The veth standing in for the
            # device dies when it is deleted in the pod or the pod's namespace
            # goes (a NIC would go back to the machine's root namespace): no
            # CHECK with it gone, no DEL with the netns gone.
            ["--node-setup", "ip link add hdev0 type veth peer name hdev0p; "
             "ip link set hdev0p up", "--skip", "concurrency.*", "--skip", "gc.*",
             "--skip", "del.netns-gone", "--skip", "check.detects-missing-interface"]),
        "tap": KitTarget({"cniVersion": single, "name": "cfk-tap", "type": "tap",
                          "ipam": _ipam(root, 4)}),
        "loopback": KitTarget({"cniVersion": single, "name": "cfk-lo", "type": "loopback"},
                              ["--ifname", "lo"]),
        # IPAM plugins run as a list's plugin read their own "ipam" section.
        "host-local": KitTarget({"cniVersion": single, "name": "cfk-hl", "type": "host-local",
                                 "ipam": {"type": "host-local", "subnet": "10.85.0.0/24",
                                          "dataDir": os.path.join(root, "hl")}}),
        "static": KitTarget({"cniVersion": single, "name": "cfk-static", "type": "static",
                             "ipam": {"type": "static",
                                      "addresses": [{"address": "10.86.0.2/24"}]}},
                            ["--skip", "concurrency.unique-addresses"]),
        "flannel": KitTarget({"cniVersion": single, "name": "cfk-flannel", "type": "flannel",
                              "subnetFile": subnet_env,
                              "dataDir": os.path.join(root, "flannel"),
                              "delegate": {"bridge": "cfk-fl0"}}),
        "portmap": KitTarget(
            _after_ptp(root, "cfk-portmap", 7, {"type": "portmap", "snat": True,
                                                "capabilities": {"portMappings": True}}),
            ["--capability-args", json.dumps({"portMappings": [
                {"hostPort": HOST_PORT, "containerPort": 80, "protocol": "tcp"}]}),
             # Every attachment asks for the same host port: not two at once.
             "--skip", "concurrency.*", "--skip", "gc.*"]),
        "tuning": KitTarget(_after_ptp(root, "cfk-tuning", 8, {
            "type": "tuning", "sysctl": {"net.core.somaxconn": "512"}, "mtu": 1400,
            "dataDir": os.path.join(root, "tuning")})),
        "bandwidth": KitTarget(
            _after_ptp(root, "cfk-bw", 9, {"type": "bandwidth",
                                           "capabilities": {"bandwidth": True}}),
            ["--capability-args", json.dumps({"bandwidth": {
                "ingressRate": 8_000_000, "ingressBurst": 80_000,
                "egressRate": 16_000_000, "egressBurst": 160_000}})]),
        "firewall": KitTarget(_after_ptp(root, "cfk-fw", 10, {"type": "firewall"}),
                              ["--env", NO_DBUS]),
        "sbr": KitTarget(_after_ptp(root, "cfk-sbr", 11, {"type": "sbr"})),
    }
    for target in found.values():
        target.options += NO_DAD
    return found

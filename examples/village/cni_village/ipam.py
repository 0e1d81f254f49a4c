"""CNI IPAM plugin ``village-ipam``: one address on the cluster, one on the LAN.

Its section of the network config (a bad value is code 7 naming its key):

    "ipam": {"type": "village-ipam",
             "cluster": {"subnet": "10.244.1.0/24"},
             "lan": {"subnet": "10.10.0.0/24",
                     "rangeStart": "10.10.0.200", "rangeEnd": "10.10.0.249"},
             "dataDir": "/var/lib/cni/networks"}

Each range is an IPv4 ``subnet`` with host-local's optional ``rangeStart``,
``rangeEnd`` (default: the subnet's first and last host) and ``gateway``
(never handed out). The cluster gateway, which the bridge holds, defaults to
the subnet's first address.

ADD answers two IPs, in this order: the cluster address with its gateway
(eth0's), then the LAN address (net1's), and a default route via the cluster
gateway. Both belong to the attachment (container ID, CNI_IFNAME), so DEL,
CHECK and GC treat them together; a repeated ADD answers the same two.

Allocations are stored as host-local stores them: one file per address,
``<dataDir>/<network>/<ip>``, holding ``<containerID>\\r\\n<ifname>``,
changed under flock(2) of ``<dataDir>/<network>/lock``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network

from cni_skel import CmdArgs, CNIError, IPAMConf, NetConf, Plugin, Result
from cni_skel.errors import ERR_IO_FAILURE, ERR_PLUGIN_NOT_AVAILABLE, ERR_UNKNOWN_CONTAINER
from cni_skel.model import CNIModel
from cni_skel.state import StateDir
from cni_skel.types import IPConfig, Route
from pydantic import Field, model_validator

__all__ = ["Range", "VillageIPAM", "VillageIPAMConf"]


class Range(CNIModel):
    """Addresses ``rangeStart``..``rangeEnd`` of ``subnet``, but ``gateway``."""

    subnet: IPv4Network
    range_start: IPv4Address | None = Field(None, alias="rangeStart")
    range_end: IPv4Address | None = Field(None, alias="rangeEnd")
    gateway: IPv4Address | None = None

    @model_validator(mode="after")
    def inside_subnet(self) -> Range:
        given = {"rangeStart": self.range_start, "rangeEnd": self.range_end,
                 "gateway": self.gateway}
        for key, ip in given.items():
            if ip is not None and ip not in self.subnet:
                raise ValueError(f"{key} {ip} is not in {self.subnet}")
        return self

    def addresses(self) -> Iterator[IPv4Address]:
        first = self.range_start or self.subnet.network_address + 1
        last = self.range_end or self.subnet.broadcast_address - 1
        for n in range(int(first), int(last) + 1):
            if IPv4Address(n) != self.gateway:
                yield IPv4Address(n)


class VillageIPAMConf(IPAMConf):
    """The ``ipam`` section: ``cluster`` and ``lan`` ranges, ``dataDir``."""

    cluster: Range
    lan: Range
    data_dir: str = Field("/var/lib/cni/networks", alias="dataDir")

    @model_validator(mode="after")
    def cluster_gateway(self) -> VillageIPAMConf:
        if self.cluster.gateway is None:
            self.cluster.gateway = self.cluster.subnet.network_address + 1
        return self


class VillageIPAMNetConf(NetConf):
    ipam: VillageIPAMConf


def _owner(container_id: str, ifname: str) -> str:
    """What host-local writes in an address file."""
    return f"{container_id.strip()}\r\n{ifname}"


@contextlib.contextmanager
def _locked(conf: VillageIPAMNetConf) -> Iterator[StateDir]:
    """The network's directory (made 0755 when missing, as host-local does),
    under host-local's lock. An I/O error is code 5."""
    try:
        with StateDir.open(conf.ipam.data_dir, 0o755) as top, \
                top.subdir(conf.name, 0o755) as store, store.lock("lock"):
            yield store
    except OSError as exc:
        raise CNIError(ERR_IO_FAILURE, f"village-ipam: {exc}") from None


def _allocations(store: StateDir) -> dict[IPv4Address, str]:
    """Every address file of the network: address -> its owner."""
    held = {}
    for name in store.names():
        try:
            ip = IPv4Address(name)
        except ValueError:
            continue  # "lock", host-local's last_reserved_ip.0, temp files
        held[ip] = store.read(name).decode(errors="replace").strip()
    return held


def _pick(what: str, rng: Range, held: dict[IPv4Address, str],
          owner: str | None = None) -> IPv4Address:
    """The owner's address in ``rng`` (a repeated ADD), else the first free
    one; code 50 when there is none."""
    mine = (ip for ip, who in held.items() if who == owner and ip in rng.subnet)
    free = (ip for ip in rng.addresses() if ip not in held)
    ip = next(mine, None) or next(free, None)
    if ip is None:
        raise CNIError(ERR_PLUGIN_NOT_AVAILABLE, f"village-ipam: the {what} range is full")
    return ip


class VillageIPAM(Plugin):
    """village-ipam: ADD, DEL, CHECK, GC and STATUS of the two-range pool."""

    name = "village-ipam"
    config_model = VillageIPAMNetConf

    def add(self, args: CmdArgs, conf: VillageIPAMNetConf) -> Result:
        """Reserve both addresses, or neither (code 50 when a range is full)."""
        owner, ipam = _owner(args.container_id, args.ifname), conf.ipam
        with _locked(conf) as store:
            held = _allocations(store)
            cluster = _pick("cluster", ipam.cluster, held, owner)
            lan = _pick("lan", ipam.lan, held, owner)
            for ip in (cluster, lan):  # host-local's bytes, mode and (lack of) fsync
                store.write(str(ip), owner.encode(), 0o600, durable=False)
        return Result(
            ips=[IPConfig(address=f"{cluster}/{ipam.cluster.subnet.prefixlen}",
                          gateway=ipam.cluster.gateway),
                 IPConfig(address=f"{lan}/{ipam.lan.subnet.prefixlen}", gateway=ipam.lan.gateway)],
            routes=[Route(dst="0.0.0.0/0", gw=ipam.cluster.gateway)])

    def delete(self, args: CmdArgs, conf: VillageIPAMNetConf) -> None:
        """Release what the attachment holds; nothing held is fine."""
        owner = _owner(args.container_id, args.ifname)
        with _locked(conf) as store:
            for ip, who in _allocations(store).items():
                if who == owner:
                    store.unlink(str(ip))

    def check(self, args: CmdArgs, conf: VillageIPAMNetConf) -> None:
        """The attachment holds an address in each range, else code 3."""
        owner = _owner(args.container_id, args.ifname)
        with _locked(conf) as store:
            mine = [ip for ip, who in _allocations(store).items() if who == owner]
        for what, rng in (("cluster", conf.ipam.cluster), ("lan", conf.ipam.lan)):
            if not any(ip in rng.subnet for ip in mine):
                raise CNIError(ERR_UNKNOWN_CONTAINER, f"village-ipam: {args.container_id} "
                                                      f"holds no {what} address")

    def gc(self, args: CmdArgs, conf: VillageIPAMNetConf) -> None:
        """Release every address no valid attachment holds (code 7 without
        the list), and what killed writers left."""
        keep = {_owner(a.container_id, a.ifname) for a in conf.gc_keep()}
        with _locked(conf) as store:
            for ip, who in _allocations(store).items():
                if who not in keep:
                    store.unlink(str(ip))
            store.remove_stale_temps()

    def status(self, args: CmdArgs, conf: VillageIPAMNetConf) -> None:
        """Code 50 when a range is full (or 5 when the store is unusable)."""
        with _locked(conf) as store:
            held = _allocations(store)
        _pick("cluster", conf.ipam.cluster, held)
        _pick("lan", conf.ipam.lan, held)


if __name__ == "__main__":
    VillageIPAM.main()

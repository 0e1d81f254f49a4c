"""village as a runtime runs it, on a node with a LAN: ADD a pod, reach the LAN
over net1 and the gateway over eth0, CHECK, DEL."""

import json
import pathlib

from cni_skel import netlink
from cni_skel.netns import NetNS
from cni_skel.runtime import Runtime, RuntimeConf
from cni_skel.testing import icmp_ping, install_plugin

PROJECT = pathlib.Path(__file__).resolve().parent.parent


def wire_lan(node, lan):
    """The node's uplink0 is a veth into the LAN namespace, which plays the
    LAN's router: 10.10.0.1, the node's default gateway; the node is 10.10.0.2."""
    with NetNS.open(node.path) as n, n.rtnl() as ipr, \
            NetNS.open(lan.path) as ln, ln.rtnl() as lipr:
        uplink, peer = netlink.create_veth_pair(ipr, "uplink0", "lan0", peer_netns=ln,
                                                peer_ipr=lipr)
        netlink.add_address(ipr, uplink, "10.10.0.2/24")
        netlink.link_up(ipr, uplink)
        netlink.add_route(ipr, "0.0.0.0/0", gw="10.10.0.1")
        netlink.add_address(lipr, peer, "10.10.0.1/24")
        netlink.link_up(lipr, peer)


def test_pod_on_the_cluster_and_on_the_lan(tmp_path, node_netns, pod_netns, netns_factory):
    lan = netns_factory("lan")
    wire_lan(node_netns, lan)
    bin_dir = tmp_path / "bin"  # our package is not installed yet: point at the project
    install_plugin(bin_dir, "village", "cni_village:Village", pythonpath=[str(PROJECT)])
    install_plugin(bin_dir, "village-ipam", "cni_village.ipam:VillageIPAM",
                   pythonpath=[str(PROJECT)])
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / "10-village.conflist").write_text(json.dumps({
        "cniVersion": "1.1.0", "name": "village-net", "plugins": [{
            "type": "village",                       # uplink: the default route's, uplink0
            "ipam": {"type": "village-ipam", "dataDir": str(tmp_path / "ipam"),
                     "cluster": {"subnet": "10.244.1.0/24"},
                     "lan": {"subnet": "10.10.0.0/24",
                             "rangeStart": "10.10.0.200", "rangeEnd": "10.10.0.249"}}}]}))
    cni = Runtime(conf_dir=str(conf_dir), bin_dirs=[str(bin_dir)],
                  cache_dir=str(tmp_path / "cache"), plugin_netns=node_netns.path)
    net = cni.load_conflist("village-net")
    rt = RuntimeConf("pod-1", pod_netns.path, "eth0")

    result = cni.add(net, rt)
    assert [i.name for i in result.interfaces][2:] == ["eth0", "net1"]
    assert [str(ip.address) for ip in result.ips] == ["10.244.1.2/24", "10.10.0.200/24"]
    assert icmp_ping(pod_netns, "10.10.0.1", count=1, timeout=2)     # the LAN, over net1
    assert icmp_ping(lan, "10.10.0.200", count=1, timeout=2)         # and back
    assert icmp_ping(pod_netns, "10.244.1.1", count=1, timeout=2)    # the bridge, over eth0
    cni.check(net, rt)

    cni.delete(net, rt)
    with NetNS.open(pod_netns.path) as pod, pod.rtnl() as ipr:
        assert [link.name for link in netlink.links(ipr)] == ["lo"]
    with NetNS.open(node_netns.path) as node, node.rtnl() as ipr:
        assert netlink.links(ipr, "veth") == [netlink.find_link(ipr, "uplink0")]
    assert [p.name for p in (tmp_path / "ipam" / "village-net").iterdir()] == ["lock"]

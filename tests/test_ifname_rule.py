"""One rule for interface names, before any side effect (issue 33, item 3).

The kernel takes a name holding ``%`` as a template (``eth%d``) and gives
the link a name of its own choosing; fuzzing found bridge ADD with
``CNI_IFNAME=%d`` answering 999 and leaving a veth pair DEL never removes
(Go 1.1.1 does the same). Now CNI_IFNAME breaking the rule is code 4 and a
config's interface name code 7, both naming the value, and nothing is made:
asserted on the kernel's links, bridge's nftables table and host-local's
files."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from cni_skel.config import IfName, NetConf, config_error
from cni_skel.env import ifname_problem, validate_ifname
from cni_skel.errors import CNIError
from cni_skel.harness import nft_table, run_plugin, run_plugin_raw
from cni_skel.netns import NetNS


@pytest.mark.parametrize("name", ["%d", "eth%d", "br%s", "%"])
def test_a_template_is_refused_naming_it(name):
    msg, details = ifname_problem(name)
    assert msg == "interface name contains %" and f'"{name}"' in details
    with pytest.raises(CNIError) as ei:
        validate_ifname(name)
    assert (ei.value.code, ei.value.msg) == (4, "interface name contains %")


@pytest.mark.parametrize(("name", "msg"), [
    ("", "interface name is empty"), ("a" * 16, "interface name is too long"),
    ("..", "interface name is . or .."),
    ("a:b", "interface name contains / or : or whitespace characters"),
    ("a\x01", "interface name contains control characters")])
def test_the_go_rules_keep_their_messages(name, msg):
    assert ifname_problem(name)[0] == msg
    with pytest.raises(CNIError, match=msg):
        validate_ifname(name)


@pytest.mark.parametrize("name", ["eth0", "a" * 15, "net1.100", "vé0"])
def test_good_names_pass(name):
    assert ifname_problem(name) is None
    validate_ifname(name)


def test_a_config_name_is_code_7_naming_key_and_value():
    class Conf(NetConf):
        master: IfName = "eth0"

    assert Conf.model_validate({"name": "n", "master": "bond0"}).master == "bond0"
    with pytest.raises(ValidationError) as ei:
        Conf.model_validate({"name": "n", "master": "eth%d"})
    err = config_error(ei.value)
    assert err.code == 7 and err.msg.startswith("invalid network config: master: interface "
                                                "name contains %: ")
    assert "'eth%d'" in err.msg


def links(ns) -> set[str]:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        return {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}


@pytest.fixture
def bridge(cni_bin):
    return os.path.join(cni_bin, "bridge")


def bridge_conf(tmp_path, **top):
    return {"cniVersion": "1.1.0", "name": "ifrule", "type": "bridge", "bridge": "cnsk0",
            "isGateway": True, "ipMasq": True,
            "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"),
                     "ranges": [[{"subnet": "10.79.0.0/24"}]]}, **top}


def assert_nothing_made(tmp_path, node, pod):
    assert links(node) == {"lo"} and links(pod) == {"lo"}
    assert not (tmp_path / "ipam").exists()  # IPAM never ran
    assert nft_table(node, "inet", "cni_skel_bridge") is None


@pytest.mark.parametrize("ifname", ["%d", "eth%d"])
def test_bridge_refuses_a_template_ifname_and_makes_nothing(bridge, tmp_path, node_netns,
                                                            pod_netns, ifname):
    run = run_plugin_raw(bridge, "ADD", bridge_conf(tmp_path), container_id="ifr1",
                         netns=pod_netns.path, ifname=ifname, node=node_netns)
    assert run.exit_code != 0
    assert (run.doc["code"], run.doc["msg"]) == (4, "interface name contains %"), run
    assert f'"{ifname}"' in run.doc["details"]
    assert_nothing_made(tmp_path, node_netns, pod_netns)
    # DEL of an attachment ADD refuses succeeds and runs nothing
    assert run_plugin(bridge, "DEL", bridge_conf(tmp_path), container_id="ifr1",
                      netns=pod_netns.path, ifname=ifname, node=node_netns) is None
    assert_nothing_made(tmp_path, node_netns, pod_netns)


def test_bridge_refuses_a_template_bridge_name_and_makes_nothing(bridge, tmp_path, node_netns,
                                                                 pod_netns):
    conf = bridge_conf(tmp_path, bridge="cnsk%d")
    run = run_plugin_raw(bridge, "ADD", conf, container_id="ifr2", netns=pod_netns.path,
                         node=node_netns)
    assert run.exit_code != 0 and run.doc["code"] == 7, run
    assert "bridge: interface name contains %" in run.doc["msg"] and "cnsk%d" in run.doc["msg"]
    assert_nothing_made(tmp_path, node_netns, pod_netns)

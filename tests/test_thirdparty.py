"""Plugins written only against the public SDK, as a third-party author
would: the README example (extracted from README.md and run for real),
delegation to a test IPAM plugin in a temporary CNI_PATH, error propagation
with code/msg/details intact, and IPAM DEL after a failed ADD."""

from __future__ import annotations

import io
import ipaddress
import os

import pytest
from conftest import HERE, THIRDPARTY, write_readme_example

from cni_skel import netlink
from cni_skel.env import CmdArgs
from cni_skel.errors import CNIError
from cni_skel.harness import SUITE_TAG, install_plugin, run_plugin
from cni_skel.invoke import delegate_add, delegate_del
from cni_skel.netns import NetNS
from cni_skel.warm.protocol import DEFAULT_SOCKET

README = HERE.parent / "README.md"


@pytest.fixture
def tp_bin(tmp_path, cni_worker_socket):
    # Launchers for this run's mode (tests/conftest.py): warm, the suite
    # worker serves these plugins (conftest.SUITE_PLUGINS).
    d = tmp_path / "bin"
    d.mkdir()
    path = [str(THIRDPARTY.parent)]
    install_plugin(d, "fake-ipam", "thirdparty.fakeipam:FakeIPAMPlugin", pythonpath=path,
                   worker_socket=cni_worker_socket)
    install_plugin(d, "fail-after-ipam", "thirdparty.failafteripam:FailAfterIPAM",
                   pythonpath=path, worker_socket=cni_worker_socket)
    return d


def readme_plugin(dest, worker_socket) -> str:
    code = write_readme_example(dest).read_text()
    assert 20 <= len(code.strip().splitlines()) <= 40
    return install_plugin(dest, "veth-ipam", "veth_ipam:VethPlugin", pythonpath=[str(dest)],
                          worker_socket=worker_socket)


def test_readme_example_with_go_host_local(tmp_path, go_cni_dir, node_netns, pod_netns,
                                           cni_worker_socket):
    exe = readme_plugin(tmp_path, cni_worker_socket)
    data_dir = tmp_path / "ipam"
    # Debian's Go host-local speaks up to 1.0.0.
    conf = {"cniVersion": "1.0.0", "name": "readme-net", "type": "veth-ipam", "mtu": 1400,
            "ipam": {"type": "host-local", "subnet": "10.77.0.0/24",
                     "routes": [{"dst": "10.99.0.0/16"},
                                {"dst": "10.98.0.0/16", "gw": "10.77.0.9"}],
                     "dataDir": str(data_dir)}}
    kw = dict(netns=pod_netns.path, ifname="net1", node=node_netns, container_id="readme1",
              cni_path=f"{tmp_path}:{go_cni_dir}")
    result = run_plugin(exe, "ADD", conf, **kw)
    assert result["cniVersion"] == "1.0.0"
    assert [i["name"] for i in result["interfaces"]] == ["vhreadme1", "net1"]
    addr = result["ips"][0]["address"]
    assert result["ips"][0]["interface"] == 1
    assert ipaddress.ip_interface(addr).network == ipaddress.ip_network("10.77.0.0/24")
    with NetNS.open(pod_netns.path) as ns, ns.iproute() as ipr:
        link = netlink.find_link(ipr, "net1")
        assert link.up and link.mtu == 1400 and link.kind == "veth"
        assert link.mac == result["interfaces"][1]["mac"]
        assert [str(a) for a in netlink.addresses(ipr, "net1", 4)] == [addr]
        # the routes the result names are the pod's (the IPAM's, via its gateway by default)
        have = {str(r["dst"]): r for r in netlink.routes(ipr, family=4)}
        for want in result["routes"]:
            got = have[str(ipaddress.ip_network(want["dst"]))]
            assert got["oif"] == link.index and str(got["gw"]) == want.get("gw", "None"), got
        assert {r["dst"] for r in result["routes"]} == {"10.99.0.0/16", "10.98.0.0/16"}
    with NetNS.open(node_netns.path) as ns, ns.iproute() as ipr:
        assert netlink.find_link(ipr, "vhreadme1").up, "host end stays on the node"
    ip_file = data_dir / "readme-net" / addr.split("/")[0]
    assert ip_file.exists(), "the Go host-local recorded the allocation"
    run_plugin(exe, "DEL", conf, **kw)
    with NetNS.open(pod_netns.path) as ns, ns.iproute() as ipr:
        assert netlink.find_link(ipr, "net1") is None
    with NetNS.open(node_netns.path) as ns, ns.iproute() as ipr:
        assert netlink.find_link(ipr, "vhreadme1") is None
    assert not ip_file.exists(), "DEL released the address through the Go host-local"
    run_plugin(exe, "DEL", conf, **kw)  # again: idempotent
    # In a 0.2.0 config the same plugin answers in the 0.2.0 shape.
    old = run_plugin(exe, "ADD", {**conf, "cniVersion": "0.2.0"}, **kw)
    assert set(old) == {"cniVersion", "ip4", "dns"} and old["ip4"]["gateway"] == "10.77.0.1"


def ipam_conf(tmp_path, **ipam):
    return {"cniVersion": "1.0.0", "name": "tpnet", "type": "fail-after-ipam",
            "ipam": {"type": "fake-ipam", "logFile": str(tmp_path / "ipam.log"), **ipam}}


def ipam_log(tmp_path):
    p = tmp_path / "ipam.log"
    return p.read_text().splitlines() if p.exists() else []


def test_failed_add_runs_ipam_del(tmp_path, tp_bin, node_netns, pod_netns):
    with pytest.raises(CNIError) as ei:
        run_plugin(str(tp_bin / "fail-after-ipam"), "ADD", ipam_conf(tmp_path),
                   netns=pod_netns.path, container_id="c1", ifname="eth3", node=node_netns)
    assert (ei.value.code, ei.value.msg) == (107, "bridge exploded")
    assert ipam_log(tmp_path) == ["ADD c1 eth3", "DEL c1 eth3"]


def test_ipam_error_propagates_intact(tmp_path, tp_bin, node_netns, pod_netns):
    fail = {"code": 11, "msg": "pool busy", "details": "try again in 2s"}
    with pytest.raises(CNIError) as ei:
        run_plugin(str(tp_bin / "fail-after-ipam"), "ADD", ipam_conf(tmp_path, fail=fail),
                   netns=pod_netns.path, container_id="c2", node=node_netns)
    assert (ei.value.code, ei.value.msg, ei.value.details) == (11, "pool busy", "try again in 2s")
    # IPAM ADD failed, so there is nothing to undo: no DEL.
    assert ipam_log(tmp_path) == ["ADD c2 eth0"]


def test_status_is_forwarded_to_ipam(tmp_path, tp_bin, node_netns):
    conf = {**ipam_conf(tmp_path), "cniVersion": "1.1.0"}
    assert run_plugin(str(tp_bin / "fail-after-ipam"), "STATUS", conf, node=node_netns,
                      container_id="", netns="", ifname="") is None
    assert ipam_log(tmp_path) == ["STATUS  "]


def test_missing_ipam_plugin_is_a_clear_error(tmp_path, tp_bin, node_netns, pod_netns):
    conf = ipam_conf(tmp_path)
    conf["ipam"]["type"] = "no-such-ipam"
    with pytest.raises(CNIError) as ei:
        run_plugin(str(tp_bin / "fail-after-ipam"), "ADD", conf, netns=pod_netns.path,
                   node=node_netns)
    assert ei.value.code == 7 and "no-such-ipam" in ei.value.msg


def test_delegate_timeout_and_stderr_pass_through(tmp_path):
    slow = tmp_path / "slow-ipam"
    slow.write_text("#!/bin/sh\necho 'slow-ipam: thinking' >&2\nsleep 5\n")
    slow.chmod(0o755)
    args = CmdArgs(command="ADD", container_id="c", ifname="eth0",
                   env={"CNI_PATH": str(tmp_path), "PATH": os.environ["PATH"]})
    err = io.StringIO()
    with pytest.raises(CNIError) as ei:
        delegate_add("slow-ipam", b"{}", args, timeout=0.5, stderr=err)
    assert ei.value.code == 11
    assert "slow-ipam: thinking" in err.getvalue()


def test_delegate_non_json_failure(tmp_path):
    bad = tmp_path / "bad-ipam"
    bad.write_text("#!/bin/sh\necho 'panic: nil map' >&2\nexit 2\n")
    bad.chmod(0o755)
    args = CmdArgs(command="DEL", env={"CNI_PATH": str(tmp_path)})
    with open(os.devnull, "w") as sink, pytest.raises(CNIError) as ei:
        delegate_del("bad-ipam", b"{}", args, stderr=sink)
    assert ei.value.code == 999 and "exit status 2" in ei.value.msg
    assert "panic: nil map" in ei.value.details


def test_test_helpers_are_isolated_by_default(tmp_path, netns_factory):
    """An author's suite neither runs a node's worker's (maybe stale) code by
    default nor shares namespace names with another suite on the machine."""
    exe = install_plugin(tmp_path, "lo-copy", "cni_skel_plugins.loopback:Loopback")
    with open(exe, "rb") as fp:
        text = fp.read()
    assert text.startswith(b"#!") and DEFAULT_SOCKET.encode() not in text
    ns = netns_factory("cnsk-iso")
    assert ns.name.startswith(f"cnsk-iso-{os.getpid()}-{SUITE_TAG}-"), ns.name
    assert os.path.exists(ns.path)


def test_status_and_gc_pass_to_ipam_by_default(tmp_path, tp_bin, node_netns, cni_worker_socket):
    """A plugin that leaves status/gc alone (the README example) passes them
    on to the IPAM plugin its config names (spec: GC and STATUS reach the
    IPAM), and that IPAM plugin's own defaults pass nothing on, even
    installed under another name than its class's (no exec loop)."""
    exe = readme_plugin(tp_bin, cni_worker_socket)
    path = [str(THIRDPARTY.parent)]
    install_plugin(tp_bin, "other-ipam", "thirdparty.fakeipam:FakeIPAMPlugin", pythonpath=path,
                   worker_socket=cni_worker_socket)
    conf = {"cniVersion": "1.1.0", "name": "tpnet", "type": "veth-ipam",
            "ipam": {"type": "fake-ipam", "logFile": str(tmp_path / "ipam.log")}}
    kw = dict(node=node_netns, container_id="", netns="", ifname="", timeout=30.0)
    assert run_plugin(exe, "STATUS", conf, **kw) is None
    assert ipam_log(tmp_path) == ["STATUS  "]
    gc = {**conf, "cni.dev/valid-attachments": []}
    assert run_plugin(exe, "GC", gc, **kw) is None
    other = {**gc, "ipam": {**gc["ipam"], "type": "other-ipam"}}
    assert run_plugin(exe, "GC", other, **kw) is None
    assert run_plugin(exe, "STATUS", other, **kw) is None
    assert ipam_log(tmp_path) == ["STATUS  ", "STATUS  "]

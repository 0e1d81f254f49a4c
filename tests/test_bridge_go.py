"""bridge against each Go yardstick's bridge (Debian's 1.1.1, upstream 1.9.1
when built: tests/yardsticks.py): the same result, key for key, for every
version Go speaks; each delegating to the other's host-local; pods of both
on one bridge talking to each other."""

from __future__ import annotations

import os

import pytest
from conftest import load_vector
from yardsticks import as_go

from cni_skel.harness import run_plugin, tcp_echo

GO_VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"]


@pytest.fixture(scope="session")
def bridge(cni_bin: str) -> str:
    return os.path.join(cni_bin, "bridge")


def conf(data_dir, version, **top) -> dict:
    # The vectors' config (isGateway, a default route, dns), in our test range.
    c = {"cniVersion": version, "name": "vecnet", "type": "bridge", "bridge": "vecbr0",
         "isGateway": True,
         "ipam": {"type": "host-local", "subnet": "10.66.0.0/24", "dataDir": str(data_dir),
                  "routes": [{"dst": "0.0.0.0/0"}]},
         "dns": {"nameservers": ["10.66.0.1"]}}
    c.update(top)
    return c


def masked(doc, sandbox):
    """The result with what differs per run (MACs, veth names, the netns
    path) masked; everything else must be equal."""
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if k == "mac":
                out[k] = "<mac>"
            elif k == "sandbox":
                out[k] = "<sandbox>" if v == sandbox else v
            elif k == "name" and isinstance(v, str) and v.startswith("veth"):
                out[k] = "<veth>"
            else:
                out[k] = masked(v, sandbox)
        return out
    if isinstance(doc, list):
        return [masked(x, sandbox) for x in doc]
    return doc


def keys(doc):
    if isinstance(doc, dict):
        return {k: keys(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [keys(x) for x in doc]
    return type(doc).__name__


@pytest.mark.parametrize("version", GO_VERSIONS)
def test_result_equals_go_bridge(bridge, go_yardstick, netns_factory, tmp_path, version):
    go_cni_dir = go_yardstick.dir
    go_node, our_node = netns_factory("cnsk-gonode"), netns_factory("cnsk-node")
    go_pod, our_pod = netns_factory("cnsk-gopod"), netns_factory("cnsk-pod")
    go = run_plugin(os.path.join(go_cni_dir, "bridge"), "ADD", conf(tmp_path / "go", version),
                    container_id="c1", netns=go_pod.path, node=go_node, cni_path=go_cni_dir)
    ours = run_plugin(bridge, "ADD", conf(tmp_path / "ours", version), container_id="c1",
                      netns=our_pod.path, node=our_node)
    assert masked(as_go(go_yardstick, "bridge", ours), our_pod.path) == masked(go, go_pod.path)
    # and the same shape as the recorded Go vector
    assert keys(ours) == keys(load_vector(f"bridge-add-{version}")["stdout"])
    for exe, node, pod, d, path in ((bridge, our_node, our_pod, "ours", None),
                                    (os.path.join(go_cni_dir, "bridge"), go_node, go_pod, "go",
                                     go_cni_dir)):
        for _ in range(2):  # as the del and del-again vectors: no output, exit 0
            assert run_plugin(exe, "DEL", conf(tmp_path / d, version), container_id="c1",
                              netns=pod.path, node=node, cni_path=path) is None


def test_our_bridge_with_go_host_local(bridge, go_yardstick, node_netns, pod_netns, tmp_path):
    go_cni_dir = go_yardstick.dir
    c = conf(tmp_path, "1.0.0")
    r = run_plugin(bridge, "ADD", c, container_id="c1", netns=pod_netns.path, node=node_netns,
                   cni_path=go_cni_dir)
    assert r["ips"][0]["address"] == "10.66.0.2/24"
    assert (tmp_path / "vecnet" / "10.66.0.2").read_bytes() == b"c1\r\neth0"
    run_plugin(bridge, "CHECK", dict(c, prevResult=r), container_id="c1", netns=pod_netns.path,
               node=node_netns, cni_path=go_cni_dir)
    run_plugin(bridge, "DEL", c, container_id="c1", netns=pod_netns.path, node=node_netns,
               cni_path=go_cni_dir)
    assert not (tmp_path / "vecnet" / "10.66.0.2").exists()


def test_go_bridge_with_our_host_local(go_yardstick, cni_bin, node_netns, pod_netns, tmp_path):
    go_cni_dir = go_yardstick.dir
    go_bridge = os.path.join(go_cni_dir, "bridge")
    c = conf(tmp_path, "1.0.0")
    r = run_plugin(go_bridge, "ADD", c, container_id="c1", netns=pod_netns.path,
                   node=node_netns, cni_path=cni_bin)
    assert r["ips"][0]["address"] == "10.66.0.2/24"
    run_plugin(go_bridge, "CHECK", dict(c, prevResult=r), container_id="c1",
               netns=pod_netns.path, node=node_netns, cni_path=cni_bin)
    run_plugin(go_bridge, "DEL", c, container_id="c1", netns=pod_netns.path, node=node_netns,
               cni_path=cni_bin)
    assert not (tmp_path / "vecnet" / "10.66.0.2").exists()


def test_pods_of_both_on_one_bridge(bridge, go_yardstick, node_netns, netns_factory, tmp_path):
    """One pod by Go's bridge, one by ours, one shared host-local store and
    bridge: both are set up, talk, and DEL cleanly, whichever goes first."""
    go_cni_dir = go_yardstick.dir
    go_pod, our_pod = netns_factory("cnsk-gopod"), netns_factory("cnsk-pod")
    c = conf(tmp_path, "1.0.0")
    go_bridge = os.path.join(go_cni_dir, "bridge")
    g = run_plugin(go_bridge, "ADD", c, container_id="go", netns=go_pod.path, node=node_netns,
                   cni_path=go_cni_dir)
    o = run_plugin(bridge, "ADD", c, container_id="ours", netns=our_pod.path, node=node_netns)
    assert g["ips"][0]["address"] != o["ips"][0]["address"]
    go_ip = g["ips"][0]["address"].split("/")[0]
    assert tcp_echo(go_pod, go_ip, our_pod)[0] == b"cni-skel"
    run_plugin(go_bridge, "CHECK", dict(c, prevResult=g), container_id="go",
               netns=go_pod.path, node=node_netns, cni_path=go_cni_dir)
    run_plugin(bridge, "CHECK", dict(c, prevResult=o), container_id="ours",
               netns=our_pod.path, node=node_netns)
    run_plugin(bridge, "DEL", c, container_id="ours", netns=our_pod.path, node=node_netns)
    run_plugin(go_bridge, "DEL", c, container_id="go", netns=go_pod.path, node=node_netns,
               cni_path=go_cni_dir)
    assert sorted(p.name for p in (tmp_path / "vecnet").iterdir()
                  if not p.name.startswith(("lock", "last_", "."))) == []

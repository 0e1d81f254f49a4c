"""Go's iptables layouts on a node whose ``iptables`` is iptables-legacy
(x_tables, not nftables): ``ipMasqBackend: "iptables"`` (bridge) and
portmap's ``backend: "iptables"``, side by side with Go 1.9.1 run with the
same PATH (go-iptables takes the ``iptables`` it finds there too).

The node's PATH is made to hold ``iptables``, ``ip6tables`` and their
``-restore``/``-save`` as links to ``xtables-legacy-multi`` (what Debian's
alternatives do with ``update-alternatives --set iptables
/usr/sbin/iptables-legacy``); `cni_skel.iptables.variant` then says
"legacy", and the chain look-ups go through ``iptables -S`` instead of
netlink. Our plugins run as one-shot executables, so each call sees the PATH
it is given. What the kernel holds is read with ``iptables-legacy -S``;
nftables must hold no ``nat`` table at all.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yardsticks
from cni_skel_plugins.portmap import goiptables as G
from test_gomasq import conf as masq_conf
from test_gomasq import nat
from test_portmap import Net, mapping, pm_conf

from cni_skel.harness import install_plugin, nft_table, run_plugin
from cni_skel.warm.install import plugin_registry

LEGACY = "/usr/sbin/xtables-legacy-multi"
CID = "lg-c1"


@pytest.fixture(scope="module")
def legacy_env(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("legacy-path")
    for name in ("iptables", "ip6tables", "iptables-restore", "ip6tables-restore",
                 "iptables-save", "ip6tables-save"):
        os.symlink(LEGACY, d / name)
    return {"PATH": f"{d}:{os.environ['PATH']}"}


@pytest.fixture(scope="module")
def oneshot(tmp_path_factory) -> str:
    """One-shot executables of ours (each call its own process and PATH)."""
    d = tmp_path_factory.mktemp("legacy-bin")
    refs = plugin_registry()
    for name in ("bridge", "portmap", "host-local"):
        install_plugin(d, name, refs[name])
    return str(d)


@pytest.fixture(scope="module")
def go() -> yardsticks.Yardstick:
    y = yardsticks.LATEST
    if not y.has("portmap"):
        pytest.fail(f"Go v{y.version} is missing in {y.dir}: run `make go-latest`")
    return y


def legacy_nat(node) -> dict[int, list[str]]:
    return nat(node, "legacy")


def node_ns(factory):
    node = factory("cnsk-lgnode")
    subprocess.run(["ip", "netns", "exec", node.name, "ip", "link", "set", "lo", "up"],
                   check=True, timeout=30)
    return node


def no_nft_nat(node) -> bool:
    return all(nft_table(node, f, "nat") is None for f in ("ip", "ip6"))


def test_portmap_layout_on_legacy_equals_go(oneshot, go, legacy_env, netns_factory, tmp_path):
    """Ours and Go 1.9.1 write the same legacy nat tables line for line;
    each CHECK passes; our DEL removes Go's pod, Go's DEL removes ours."""
    seen, made = {}, {}
    for who, exe in (("ours", os.path.join(oneshot, "portmap")), ("go", go.exe("portmap"))):
        node = node_ns(netns_factory)
        pod = Net(node, None, netns_factory, tmp_path / who, os.path.join(oneshot, "bridge"),
                  oneshot).pod(CID)
        c = pm_conf(pod.result, [mapping(8080, 80), mapping(8053, 53, "udp")],
                    backend="iptables")
        kw = {"container_id": CID, "netns": pod.ns.path, "node": node, "env": legacy_env}
        run_plugin(exe, "ADD", c, **kw)
        seen[who] = legacy_nat(node)
        run_plugin(exe, "CHECK", c, **kw)
        assert no_nft_nat(node), who
        made[who] = (node, c, kw)
    assert seen["ours"] == seen["go"]
    chain = G.dnat_chain("pmnet", CID)
    assert f"-N {chain}" in seen["ours"][4] and f"-N {chain}" in seen["ours"][6]
    for who, exe in (("go", os.path.join(oneshot, "portmap")), ("ours", go.exe("portmap"))):
        node, c, kw = made[who]  # the other implementation's DEL
        run_plugin(exe, "DEL", c, **kw)
        assert not [ln for v in (4, 6) for ln in legacy_nat(node)[v] if chain in ln], who


def test_bridge_masquerade_on_legacy_equals_go(oneshot, go, legacy_env, netns_factory,
                                               tmp_path):
    """``ipMasqBackend: "iptables"`` on legacy: the same tables as Go's;
    our DEL removes the chain with the pod's netns gone and CNI_NETNS
    empty (no addresses known)."""
    seen = {}
    for who, exe in (("ours", os.path.join(oneshot, "bridge")), ("go", go.exe("bridge"))):
        node, pod = node_ns(netns_factory), netns_factory("cnsk-lgpod")
        c = masq_conf("bridge", tmp_path / who, ipMasqBackend="iptables")
        kw = {"container_id": CID, "node": node, "env": legacy_env, "cni_path": oneshot}
        run_plugin(exe, "ADD", c, netns=pod.path, **kw)
        seen[who] = legacy_nat(node)
        assert no_nft_nat(node), who
        subprocess.run(["ip", "netns", "delete", pod.name], check=True, timeout=30)
        run_plugin(os.path.join(oneshot, "bridge"), "DEL", c, netns="", **kw)
        assert not [ln for v in (4, 6) for ln in legacy_nat(node)[v] if "CNI-" in ln], who
    assert seen["ours"] == seen["go"]

"""examples/ptp: Go's ptp written on cni-skel's public API, as a third-party
author would (issue 21). Its size and imports are held here; it runs as an
executable in test namespaces beside Go's ptp 1.1.1 (/usr/lib/cni/ptp) with
the same config, and the two leave the same result shape and pod routes."""

from __future__ import annotations

import ast
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import tokenize

import pytest
from test_bridge_go import keys  # a result's shape: values replaced by their type

from cni_skel import CNIError, netlink
from cni_skel.harness import icmp_ping, nft_table
from cni_skel.masq import FAMILY, TABLE, Masquerade
from cni_skel.netns import NetNS
from cni_skel.testing import install_plugin, run_plugin

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "ptp"
PLUGIN_PY = EXAMPLE / "cni_ptp" / "plugin.py"
MAX_CODE_LINES = 120  # issue 21: the author trial's 225 minus what the SDK owns


def code_lines(text: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a
    docstring (a string statement on its own)."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL)]
    layout = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines: set[int] = set()
    for i, tok in enumerate(toks):
        if tok.type in layout:
            continue
        if tok.type == tokenize.STRING and (i == 0 or toks[i - 1].type in layout) \
                and toks[i + 1].type == tokenize.NEWLINE:
            continue  # a docstring
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines)


def test_counter_counts_code_only():
    text = '"""doc\n\nstring"""\n\n# comment\nx = (1,\n     2)  # c\n\n\ndef f():\n' \
           '    """doc"""\n    return """not a\ndocstring"""\n'
    assert code_lines(text) == 5


def test_ptp_fits_the_budget():
    n = code_lines(PLUGIN_PY.read_text())
    assert n <= MAX_CODE_LINES, f"{PLUGIN_PY} has {n} code lines"


def test_docs_state_its_size():
    n = code_lines(PLUGIN_PY.read_text())
    for doc in (EXAMPLE.parent.parent / "docs" / "tutorial.md",
                EXAMPLE.parent.parent / "README.md"):
        stated = re.findall(r"(\d+) lines of code", doc.read_text())
        assert stated and set(stated) == {str(n)}, (doc.name, stated, n)


def test_ptp_imports_only_public_names():
    tree = ast.parse(PLUGIN_PY.read_text())
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported += [(node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            imported += [(a.name, "") for a in node.names]
    assert imported
    for module, name in imported:
        assert not module.startswith(("plugins", "cni_skel_plugins")), module
        assert not any(part.startswith("_") for part in module.split(".")
                       if part != "__future__"), module
        assert not name.startswith("_"), f"{module}.{name}"
        if module.startswith("cni_skel"):
            mod = __import__(module, fromlist=["_"])
            # the package pins its names in PUBLIC (it has no __all__)
            public = getattr(mod, "__all__", None) or getattr(mod, "PUBLIC", ())
            assert name in public or \
                isinstance(getattr(mod, name, None), type(sys)), f"{module}.{name}"


def test_ptp_is_lint_clean_as_a_third_party_project():
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    proc = subprocess.run([ruff, "check", "--isolated", "--no-cache", "--line-length", "100",
                           "--select", "E,F,W,I,B,UP", "."], cwd=EXAMPLE, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout


# --- running it ------------------------------------------------------------------------


@pytest.fixture
def ptp(tmp_path, cni_worker_socket):
    """Our ptp, and cni-skel's host-local beside it (GC needs 1.1.0), in
    each mode (warm: served by the suite worker, which loads cni_ptp)."""
    bin_dir = tmp_path / "bin"
    install_plugin(bin_dir, "host-local", "cni_skel_plugins.host_local:HostLocal",
                   worker_socket=cni_worker_socket)
    return install_plugin(bin_dir, "ptp", "cni_ptp:Ptp", pythonpath=[str(EXAMPLE)],
                          worker_socket=cni_worker_socket)


def _conf(tmp_path, subnet="10.48.0.0/24", **extra):
    return {"cniVersion": "1.0.0", "name": "ptp-net", "type": "ptp", "mtu": 1400,
            "ipam": {"type": "host-local", "subnet": subnet,
                     "routes": [{"dst": "0.0.0.0/0"}],
                     "dataDir": str(tmp_path / "ipam")}, **extra}


def _run(exe, verb, conf, pod, node, cid="ptp-ctr"):
    # Go's ptp with Go's host-local, ours with ours
    return run_plugin(exe, verb, conf, netns=pod.path if pod else "", node=node,
                      container_id=cid, cni_path=os.path.dirname(exe))


def _links(ns):
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        links = [netlink.find_link(ipr, m["index"]) for m in ipr.get_links()]
    return {link.name: link for link in links if link is not None}


def _routes(ns, family=4):
    with NetNS.open(ns.path) as n, n.rtnl() as ipr:
        return {(str(r["dst"]), str(r["gw"]) if r["gw"] else None, r["scope"],
                 str(r["src"]) if r["src"] else None)
                for r in netlink.routes(ipr, family)}


def _allocations(tmp_path):
    d = tmp_path / "ipam" / "ptp-net"
    return sorted(p.name for p in d.iterdir() if p.name[0].isdigit()) if d.exists() else []


def _masq_elements(node, tag):
    table = nft_table(node, FAMILY, TABLE)
    if table is None:
        return []
    m = Masquerade("ptp-net", nft=object())
    return [v for v4 in (4, 6) for name in m.set_names(v4)
            for v, c in table.elements(name) if c == tag]


def test_add_check_del(ptp, tmp_path, node_netns, pod_netns):
    conf = _conf(tmp_path, ipMasq=True, dns={"nameservers": ["10.48.0.53"]})
    result = _run(ptp, "ADD", conf, pod_netns, node_netns)
    host_if, cont_if = result["interfaces"]
    assert cont_if == {"name": "eth0", "mac": cont_if["mac"], "sandbox": pod_netns.path}
    assert host_if["name"].startswith("veth") and len(host_if["name"]) == 12
    assert result["ips"] == [{"address": "10.48.0.2/24", "gateway": "10.48.0.1", "interface": 1}]
    assert result["dns"] == {"nameservers": ["10.48.0.53"]}

    # node: the gateway as a /32 on the host veth, a host route to the pod
    node_links = _links(node_netns)
    host = node_links[host_if["name"]]
    assert host.up and host.mtu == 1400 and host.mac == host_if["mac"]
    with NetNS.open(node_netns.path) as n, n.rtnl() as ipr:
        assert [str(a) for a in netlink.addresses(ipr, host, 4)] == ["10.48.0.1/32"]
        assert any(str(r["dst"]) == "10.48.0.2/32" and r["oif"] == host.index
                   for r in netlink.routes(ipr, 4))
    # pod: the subnet via the gateway, only the gateway on-link (Go's trick)
    assert _routes(pod_netns) >= {
        ("10.48.0.1/32", None, 253, "10.48.0.2"),
        ("10.48.0.0/24", "10.48.0.1", 0, "10.48.0.2"),
        ("0.0.0.0/0", "10.48.0.1", 0, None)}
    assert not any(r[0] == "10.48.0.0/24" and r[1] is None for r in _routes(pod_netns))
    assert _links(pod_netns)["eth0"].mtu == 1400
    assert icmp_ping(pod_netns, "10.48.0.1", count=1, timeout=2)
    assert sorted(_masq_elements(node_netns, "ptp-ctr/eth0"), key=str)[0] == "10.48.0.2"

    _run(ptp, "CHECK", {**conf, "prevResult": result}, pod_netns, node_netns)
    with pytest.raises(CNIError) as err:
        _run(ptp, "CHECK", conf, pod_netns, node_netns)
    assert err.value.code == 7 and "prevResult" in err.value.msg

    _run(ptp, "DEL", conf, pod_netns, node_netns)
    assert "eth0" not in _links(pod_netns) and host_if["name"] not in _links(node_netns)
    assert _allocations(tmp_path) == [] and _masq_elements(node_netns, "ptp-ctr/eth0") == []
    _run(ptp, "DEL", conf, pod_netns, node_netns)             # repeatable
    _run(ptp, "DEL", conf, None, node_netns)                  # no netns at all


def test_failed_add_rolls_back(ptp, tmp_path, node_netns, pod_netns):
    with NetNS.open(pod_netns.path) as n, n.rtnl() as ipr:
        ipr.link("add", ifname="eth0", kind="veth", peer="peer0")  # CNI_IFNAME taken
    with pytest.raises(CNIError) as err:
        _run(ptp, "ADD", _conf(tmp_path, ipMasq=True), pod_netns, node_netns)
    assert err.value.code == 999 and "eth0" in err.value.msg
    assert _allocations(tmp_path) == []                       # IPAM DEL ran
    assert not [n for n in _links(node_netns) if n.startswith("veth")]


def test_gc_removes_masquerade_of_gone_attachments(ptp, tmp_path, node_netns, netns_factory):
    conf = _conf(tmp_path, ipMasq=True)
    conf["cniVersion"] = "1.1.0"
    pods = [netns_factory("cnsk-pod") for _ in range(2)]
    for i, pod in enumerate(pods):
        _run(ptp, "ADD", conf, pod, node_netns, cid=f"c{i}")
    keep = {**conf, "cni.dev/valid-attachments": [{"containerID": "c0", "ifname": "eth0"}]}
    _run(ptp, "GC", keep, None, node_netns)
    assert _masq_elements(node_netns, "c0/eth0") and not _masq_elements(node_netns, "c1/eth0")
    assert _allocations(tmp_path) == ["10.48.0.2"]           # host-local's GC too
    _run(ptp, "STATUS", conf, None, node_netns)


@pytest.mark.parametrize("bad, key", [({"ipam": None}, "ipam"), ({"mtu": -1}, "mtu"),
                                       ({"ipMasq": "often"}, "ipMasq")])
def test_bad_config_is_code_7_naming_the_key(ptp, tmp_path, node_netns, pod_netns, bad, key):
    conf = {k: v for k, v in {**_conf(tmp_path), **bad}.items() if v is not None}
    with pytest.raises(CNIError) as err:
        _run(ptp, "ADD", conf, pod_netns, node_netns)
    assert err.value.code == 7 and key in err.value.msg
    assert _links(pod_netns).keys() == {"lo"}


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_same_result_and_routes_as_go_ptp(ptp, tmp_path, node_netns, netns_factory, version):
    """Same config to Go's ptp 1.1.1 and ours (each its own pod and subnet):
    the same result keys and values but names and MACs, and the same pod
    routes."""
    ours_pod, go_pod = netns_factory("cnsk-pod"), netns_factory("cnsk-pod")
    results, routes = {}, {}
    for who, exe, pod, subnet in (("ours", ptp, ours_pod, "10.48.0.0/24"),
                                  ("go", "/usr/lib/cni/ptp", go_pod, "10.49.0.0/24")):
        conf = {**_conf(tmp_path / who, subnet), "cniVersion": version,
                "dns": {"nameservers": ["10.48.0.53"], "search": ["example"]}}
        results[who] = _run(exe, "ADD", conf, pod, node_netns, cid=f"cmp-{who}")
        routes[who] = {(d.replace(subnet[:7], "X"), g and g.replace(subnet[:7], "X"), sc,
                        s and s.replace(subnet[:7], "X")) for d, g, sc, s in _routes(pod)}
        _run(exe, "CHECK", {**conf, "prevResult": results[who]}, pod, node_netns,
             cid=f"cmp-{who}")
    assert keys(results["ours"]) == keys(results["go"])
    for key in ("cniVersion", "dns"):
        assert results["ours"][key] == results["go"][key]
    strip = json.dumps(results["go"]["ips"]).replace("10.49.0.", "10.48.0.")
    assert results["ours"]["ips"] == json.loads(strip)
    assert results["ours"]["routes"] == results["go"]["routes"]
    assert routes["ours"] == routes["go"]
    for who, exe, pod in (("ours", ptp, ours_pod), ("go", "/usr/lib/cni/ptp", go_pod)):
        _run(exe, "DEL", {**_conf(tmp_path / who), "cniVersion": version}, pod, node_netns,
             cid=f"cmp-{who}")

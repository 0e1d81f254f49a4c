"""A plugin written against cni-skel 0.1.0's documented API still works.

tests/compat010/pyptp is such a plugin, frozen (its files are pinned by hash
below): a ptp-like veth plugin whose class names its verbs as a module
(``verbs = "pyptp.verbs"``) and its config model as a string, whose IPAM goes
through ``ipam_add_guard``, whose netlink sockets are ``NetNS.iproute()`` and
which reads links as 0.1.0's dicts (``host["mac"]``, ``link["mtu"]``). It was
checked to run on 0.1.0 itself (the release's tree, Go's host-local).

Here it runs as an executable in both test modes (one-shot; warm, where the
suite worker preloads it: conftest.SUITE_PLUGINS) through ADD, CHECK, DEL,
GC and STATUS, and in-process to see the DeprecationWarnings it gets: exactly
the expected ones, each pointing at the fixture's own line.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import ipaddress
import json
import os
import pathlib
import sys
import warnings

import pytest
from conftest import COMPAT010

from cni_skel import CNIError, Plugin, netlink
from cni_skel.harness import install_plugin, run_plugin
from cni_skel.netns import NetNS
from cni_skel.skel import dispatch

FIXTURE = COMPAT010 / "pyptp"
REF = "pyptp.plugin:PyPtp"
HEADER = "# 0.1.0-style fixture: never edit (tests/test_compat_010.py pins its hash)\n"
#: sha256 of each file of the fixture. Do not update these to make a test pass:
#: the fixture is what a 0.1.0 author wrote, and it must keep working as is.
PINNED = {
    "__init__.py": "dde5cc2bebdd997bddcdd927b17da038b77621f3ecf2b765136ee7439d7fc63e",
    "plugin.py": "98f300ff786cba35b4204296d1b70ed8008823196ff15c58e56ba64e6b6561d8",
    "verbs.py": "1d3218b68491979b3ee2f95295f8f3debd031bbccbd5165d821625cce41c31f9",
}

#: What 0.1.0 documented: ``cni_skel.__all__`` at 0.1.0, and the modules its
#: README's example imported from (``__all__`` of each at 0.1.0).
V010_PUBLIC = {
    "cni_skel": {
        "ALL_VERSIONS", "CNIArgs", "CNIError", "CURRENT_VERSION", "CmdArgs", "DNS", "IPAMConf",
        "IPConfig", "Interface", "K8sArgs", "NetConf", "NetNS", "Plugin", "Result", "Route",
        "delegate_add", "delegate_check", "delegate_del", "delegate_gc", "delegate_status",
        "dispatch", "ipam_add_guard", "load_args", "open_netns", "parse_result",
        "netlink",  # the submodule, as the README imported it
    },
    "cni_skel.netns": {"CLONE_NEWNET", "NS_GET_NSTYPE", "NetNS", "NetNSNotFound",
                       "current_netns", "open_netns", "thread_netns_path"},
}
V010_NETLINK = {
    "LinkExists", "LinkNotFound", "add_address", "add_route", "addresses", "bridge_port",
    "bridge_port_set", "bridge_vlan_add", "bridge_vlan_del", "bridge_vlans", "create_veth_pair",
    "del_address", "del_route", "delete_link", "ensure_bridge", "find_link", "link_down",
    "link_index", "link_set", "link_up", "move_link", "routes", "wait_operstate",
}

NET = "compat010"
V4, V6 = ipaddress.ip_network("10.210.0.0/24"), ipaddress.ip_network("fd00:c010::/64")
ROUTES_V4 = [{"dst": "0.0.0.0/0"}, {"dst": "10.211.0.0/16", "gw": "10.210.0.9"}]


def host_if(cid: str) -> str:
    return "vp" + cid[:12]  # pyptp.verbs.host_ifname


# --------------------------------------------------------------------------
# (a) the fixture is frozen, and 0.1.0-only


def test_fixture_is_pinned():
    files = sorted(p.name for p in FIXTURE.iterdir() if p.name != "__pycache__")
    assert files == sorted(PINNED), f"{FIXTURE} holds {files}, pinned: {sorted(PINNED)}"
    for name, digest in PINNED.items():
        data = (FIXTURE / name).read_bytes()
        assert data.decode().startswith(HEADER), name
        assert hashlib.sha256(data).hexdigest() == digest, (
            f"tests/compat010/pyptp/{name} changed: it is a 0.1.0 author's plugin, never edit it")


def test_fixture_uses_only_what_010_documented():
    for name in PINNED:
        tree = ast.parse((FIXTURE / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert all(not a.name.startswith("cni_skel") for a in node.names), name
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cni_skel"):
                names = {a.name for a in node.names}
                assert node.module in V010_PUBLIC, (name, node.module)
                assert names <= V010_PUBLIC[node.module], (name, names - V010_PUBLIC[node.module])
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "netlink":
                assert node.attr in V010_NETLINK, (name, node.attr)


# --------------------------------------------------------------------------
# (b) as an executable, both modes


def conf_for(version: str, data_dir) -> dict:
    ranges, routes = [[{"subnet": str(V4)}]], list(ROUTES_V4)
    if version == "1.1.0":  # our host-local: dual stack
        ranges.append([{"subnet": str(V6)}])
        routes.append({"dst": "::/0"})
    return {"cniVersion": version, "name": NET, "type": "pyptp", "mtu": 1400,
            "ipam": {"type": "host-local", "dataDir": str(data_dir), "ranges": ranges,
                     "routes": routes}}


def allocations(data_dir, cid: str) -> set[str]:
    """Addresses host-local's store (Go's file format) holds for ``cid``."""
    d = data_dir / NET
    if not d.is_dir():
        return set()
    out = set()
    for p in d.iterdir():
        if p.is_file() and not p.name.startswith(("last_reserved_ip", "lock", ".")) \
                and p.read_bytes().split(b"\r\n")[0] == cid.encode():
            out.add(p.name)
    return out


def check_kernel(pod_netns, node_netns, result: dict, cid: str, ifname: str) -> None:
    """The pod holds the veth end of the result, with its addresses and routes;
    the node holds the other end, up."""
    with NetNS.open(pod_netns.path) as ns, ns.rtnl() as ipr:
        link = netlink.find_link(ipr, ifname)
        assert link is not None and link.up and link.kind == "veth" and link.mtu == 1400
        assert link.mac == result["interfaces"][1]["mac"]
        for fam in (4, 6):
            want = [ip["address"] for ip in result["ips"]
                    if ipaddress.ip_interface(ip["address"]).version == fam]
            have = [str(a) for a in netlink.addresses(ipr, link, fam)
                    if not a.ip.is_link_local]
            assert have == want, (fam, have, want)
            routes = {str(r["dst"]): r for r in netlink.routes(ipr, family=fam)
                      if r["oif"] == link.index and r["gw"] is not None}
            gateway = next((ip["gateway"] for ip in result["ips"]
                            if ipaddress.ip_interface(ip["address"]).version == fam), None)
            want_routes = {str(ipaddress.ip_network(r["dst"])): r.get("gw", gateway)
                           for r in result["routes"]
                           if ipaddress.ip_network(r["dst"]).version == fam}
            assert {d: str(r["gw"]) for d, r in routes.items()} == want_routes
        pod_index = link.index
    with NetNS.open(node_netns.path) as ns, ns.rtnl() as ipr:
        host = netlink.find_link(ipr, host_if(cid))
        assert host is not None and host.up and host.kind == "veth" and host.mtu == 1400
        assert host.mac == result["interfaces"][0]["mac"]
        assert host.peer_index == pod_index


def link_names(ns) -> set[str]:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        return {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}


# install_plugin imports the class (to bake its versions into the executable):
# its `verbs` DeprecationWarning, attributed to pyptp/plugin.py, is expected.
@pytest.mark.filterwarnings("ignore::DeprecationWarning:pyptp")
@pytest.mark.parametrize("version,ipam", [("1.1.0", "ours"), ("0.4.0", "go")],
                         ids=["1.1.0-our-host-local", "0.4.0-go-host-local"])
def test_pyptp_executable(version, ipam, request, tmp_path, cni_mode, cni_bin, cni_worker_socket,
                          go_cni_dir, node_netns, pod_netns):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = install_plugin(bin_dir, "pyptp", REF, pythonpath=[str(COMPAT010)],
                         worker_socket=cni_worker_socket)
    data_dir = tmp_path / "ipam"
    conf = conf_for(version, data_dir)
    ipam_dir = cni_bin if ipam == "ours" else go_cni_dir
    cid, ifname = "c010pod1", "net1"

    def call(command, config, *, container_id=cid, netns=pod_netns.path, ifname=ifname):
        return run_plugin(exe, command, config, container_id=container_id, netns=netns,
                          ifname=ifname, node=node_netns, cni_path=f"{bin_dir}:{ipam_dir}")

    # ADD: the result in the config's version. One-shot, the plugin's
    # DeprecationWarnings reach this test as an author's would see them
    # (run_plugin raises them again, at the fixture's lines); a worker's
    # calls do not carry them back.
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = call("ADD", conf)
    names = sorted({(pathlib.Path(w.filename).name, str(w.message).split(" ")[0])
                    for w in seen if issubclass(w.category, DeprecationWarning)})
    assert names == ([("plugin.py", "cni_skel.skel.Plugin.verbs"),
                      ("verbs.py", "cni_skel.invoke.ipam_add_guard"),
                      ("verbs.py", "cni_skel.netlink.Link.__getitem__")]
                     if cni_mode == "oneshot" else [])
    if cni_mode == "warm":  # the worker logged the class's warning when it loaded it
        logged = request.getfixturevalue("cni_worker").log()
        assert f"warm-up: {REF}: {COMPAT010 / 'pyptp' / 'plugin.py'}:12: DeprecationWarning: " \
               "cni_skel.skel.Plugin.verbs is deprecated" in logged
    families = (4, 6) if version == "1.1.0" else (4,)
    assert set(result) - {"dns"} == {"cniVersion", "interfaces", "ips", "routes"}
    assert result["cniVersion"] == version
    assert result["interfaces"] == [
        {"name": host_if(cid), "mac": result["interfaces"][0]["mac"]},
        {"name": ifname, "mac": result["interfaces"][1]["mac"], "sandbox": pod_netns.path}]
    assert [ipaddress.ip_interface(ip["address"]).version for ip in result["ips"]] \
        == list(families)
    for ip in result["ips"]:
        net = V4 if ipaddress.ip_interface(ip["address"]).version == 4 else V6
        assert ipaddress.ip_interface(ip["address"]).network == net
        assert ip["gateway"] == str(net[1]) and ip["interface"] == 1
        if version == "0.4.0":
            assert ip["version"] == "4"
    assert result["routes"] == conf["ipam"]["routes"]
    check_kernel(pod_netns, node_netns, result, cid, ifname)
    addrs = {ipaddress.ip_interface(ip["address"]).ip.compressed for ip in result["ips"]}
    assert allocations(data_dir, cid) == addrs

    # CHECK: passes on what ADD made; fails (pyptp's code 100) when the pod's end is down
    assert call("CHECK", {**conf, "prevResult": result}) is None
    with NetNS.open(pod_netns.path) as ns, ns.rtnl() as ipr:
        netlink.link_down(ipr, ifname)
    with pytest.raises(CNIError) as ei:
        call("CHECK", {**conf, "prevResult": result})
    assert ei.value.code == 100 and "up False" in ei.value.msg, ei.value
    with NetNS.open(pod_netns.path) as ns, ns.rtnl() as ipr:
        netlink.link_up(ipr, ifname)

    # An ADD failing after its IPAM ADD (the veth refuses MTU 0) gives the
    # address back: ipam_add_guard's IPAM DEL
    with pytest.raises(CNIError) as ei:
        call("ADD", {**conf, "mtu": 0}, container_id="c010pod3", ifname="net3")
    assert (ei.value.code, ei.value.msg) == (7, "invalid MTU 0"), ei.value
    assert allocations(data_dir, "c010pod3") == set()
    assert host_if("c010pod3") not in link_names(node_netns)
    assert "net3" not in link_names(pod_netns)

    if version == "1.1.0":
        # GC reaches host-local: what the keep-list lacks is released, the rest kept
        second = call("ADD", conf, container_id="c010pod2", ifname="net2")
        assert len(allocations(data_dir, "c010pod2")) == 2
        gc = {**conf, "cni.dev/valid-attachments": [{"containerID": cid, "ifname": ifname}]}
        assert call("GC", gc, container_id="", netns="", ifname="") is None
        assert allocations(data_dir, cid) == addrs
        assert allocations(data_dir, "c010pod2") == set()
        assert call("STATUS", conf, container_id="", netns="", ifname="") is None
        assert call("DEL", {**conf, "prevResult": second}, container_id="c010pod2",
                    ifname="net2") is None

    # DEL: everything goes, the addresses too; again (idempotent), and without a netns
    assert call("DEL", {**conf, "prevResult": result}) is None
    assert link_names(pod_netns) == {"lo"}
    assert link_names(node_netns) == {"lo"}
    assert allocations(data_dir, cid) == set()
    assert call("DEL", conf) is None
    assert call("DEL", conf, netns="") is None
    if version == "1.1.0":
        assert call("GC", {**conf, "cni.dev/valid-attachments": []},
                    container_id="", netns="", ifname="") is None
    assert link_names(pod_netns) == {"lo"}
    assert link_names(node_netns) == {"lo"}
    assert {p.name for p in (data_dir / NET).iterdir()
            if not p.name.startswith(("last_reserved_ip", "lock", "."))} == set()

    if cni_mode == "warm":  # served by the suite worker, which preloaded pyptp
        lines = request.getfixturevalue("cni_worker").served(cid)
        assert lines and all("exit=" in ln for ln in lines), lines


# --------------------------------------------------------------------------
# (c) in-process: the warnings, and where they point


@pytest.fixture
def fresh_pyptp(monkeypatch):
    """pyptp importable from tests/compat010 and not imported yet (so its
    class is created, and its verbs module loaded, inside the test)."""

    def drop():
        for name in [m for m in sys.modules if m == "pyptp" or m.startswith("pyptp.")]:
            del sys.modules[name]

    drop()
    monkeypatch.syspath_prepend(str(COMPAT010))
    yield
    drop()


def line_of(file: str, text: str) -> int:
    """The line number of the one line of fixture file ``file`` holding ``text``."""
    lines = (FIXTURE / file).read_text().splitlines()
    found = [n for n, line in enumerate(lines, 1) if text in line]
    assert len(found) == 1, (file, text, found)
    return found[0]


def where(seen: list[warnings.WarningMessage]) -> list[tuple[str, str, int]]:
    """(deprecated name, fixture file, line) of each warning; asserts each is
    a DeprecationWarning attributed to a file of the fixture."""
    out = []
    for w in seen:
        assert w.category is DeprecationWarning, (w.category, str(w.message))
        path = os.path.realpath(w.filename)
        assert os.path.dirname(path) == os.path.realpath(FIXTURE), \
            f"{w.filename}:{w.lineno}: {w.message}"
        name = str(w.message).split(" ", 1)[0]
        out.append((IPAM_ADD_GUARD if name in IPAM_ADD_GUARD_NAMES else name,
                    os.path.basename(path), w.lineno))
    return out


@contextlib.contextmanager
def recorded():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen


GETITEM = "cni_skel.netlink.Link.__getitem__"
#: The fixture imports ``cni_skel.ipam_add_guard``, which is
#: ``cni_skel.invoke.ipam_add_guard``: its warning may name either.
IPAM_ADD_GUARD = "ipam_add_guard"
IPAM_ADD_GUARD_NAMES = {"cni_skel.ipam_add_guard", "cni_skel.invoke.ipam_add_guard"}


def test_deprecations_point_at_the_fixture(fresh_pyptp, tmp_path, go_cni_dir, node_netns,
                                           pod_netns):
    with recorded() as seen:
        plugin = importlib.import_module("pyptp.plugin")
    assert where(seen) == [("cni_skel.skel.Plugin.verbs", "plugin.py",
                            line_of("plugin.py", "class PyPtp(Plugin):"))]
    assert "goes away in 0.3.0" in str(seen[0].message)

    conf = {"cniVersion": "1.0.0", "name": NET, "type": "pyptp",
            "ipam": {"type": "host-local", "dataDir": str(tmp_path / "ipam"),
                     "subnet": str(V4)}}
    env = {"CNI_CONTAINERID": "c010inproc", "CNI_NETNS": pod_netns.path, "CNI_IFNAME": "eth0",
           "CNI_PATH": go_cni_dir, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def run(command: str, config: dict) -> tuple[list, bytes]:
        with recorded() as seen, NetNS.open(node_netns.path) as node, node.enter():
            out, code = dispatch(plugin.PyPtp, {**env, "CNI_COMMAND": command},
                                 json.dumps(config).encode())
        assert code == 0, out
        return where(seen), out

    # ADD: the string config_model and iproute() say nothing; ipam_add_guard and
    # the two link["mac"] do, each at its own line of verbs.py
    got, out = run("ADD", conf)
    assert got == [
        (IPAM_ADD_GUARD, "verbs.py",
         line_of("verbs.py", "with ipam_add_guard(conf.ipam.type")),
        (GETITEM, "verbs.py", line_of("verbs.py", 'mac=host["mac"]')),
        (GETITEM, "verbs.py", line_of("verbs.py", 'mac=peer["mac"]')),
    ]
    result = json.loads(out)
    with NetNS.open(pod_netns.path) as ns, ns.rtnl() as ipr:
        assert [str(a) for a in netlink.addresses(ipr, "eth0", 4)] \
            == [result["ips"][0]["address"]]

    # CHECK: link["mtu"], link["up"] (one line) and host["up"]
    got, _ = run("CHECK", {**conf, "prevResult": result})
    mtu_line = line_of("verbs.py", 'if link["mtu"] != conf.mtu or not link["up"]:')
    assert got == [(GETITEM, "verbs.py", mtu_line), (GETITEM, "verbs.py", mtu_line),
                   (GETITEM, "verbs.py", line_of("verbs.py", 'not host["up"]'))]

    # DEL: nothing deprecated on its way (open_netns, iproute, delete_link, delegate_del)
    for _ in range(2):
        got, _ = run("DEL", conf)
        assert got == []
    assert link_names(pod_netns) == {"lo"} and link_names(node_netns) == {"lo"}
    assert not any((tmp_path / "ipam" / NET).glob("10.*")), "DEL released the address"


def test_current_api_of_010_does_not_warn(fresh_pyptp, node_netns):
    """What 0.1.0 documented and 0.2.0 keeps, outside the fixture: an
    ``iproute()`` socket, and a config model named by a string (resolved by
    dispatch, here importing pyptp.plugin), raise no warning at all."""
    with recorded():
        importlib.import_module("pyptp.plugin")  # its class's `verbs` warning: seen above
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with NetNS.open(node_netns.path) as ns, ns.iproute() as ipr:
            assert netlink.find_link(ipr, "lo").name == "lo"

        confs = []

        class Current(Plugin):
            name = "current"
            config_model = "pyptp.plugin:PtpConf"

            def delete(self, args, conf):
                confs.append(conf)

        env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c010", "CNI_IFNAME": "eth0",
               "CNI_NETNS": "", "CNI_PATH": "/nonexistent"}
        out, code = dispatch(Current, env, b'{"cniVersion": "1.0.0", "name": "n", "mtu": 9000}')
    assert (out, code) == (b"", 0)
    assert [type(c).__name__ for c in confs] == ["PtpConf"] and confs[0].mtu == 9000

"""DEL always can succeed, whatever the bytes of its identifiers; ADD refuses
them with code 4 (never 999). Every plugin, through the real executable, in
both modes.

A runtime retries a failed DEL forever, so a DEL that fails for good because
of CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS or CNI_ARGS (bytes that are not
UTF-8, control characters, empty, 100 kB) wedges the pod. The rule lives in
the skel (`cni_skel.env`): ADD and CHECK refuse such values with code 4; a
DEL whose container ID or ifname ADD would refuse names no attachment and
succeeds without touching anything; a DEL whose CNI_NETNS or CNI_ARGS ADD
would refuse runs as if they were not given, and removes the attachment.

Values reach the plugin as raw bytes: ``subprocess`` writes a str environment
with ``surrogateescape``, so ``"\\udcff"`` here is the byte 0xff there. State
is read back from the kernel (pyroute2, libnftables JSON) and the filesystem.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from cni_skel import netlink
from cni_skel.harness import PluginRun, TestNetNS, nft_table, run_plugin_raw
from cni_skel.netns import NetNS

CID = "cbytes1"
BIG = 100_000
PLUGINS = ["loopback", "bridge", "host-local", "tuning", "portmap"]

# (variable, kind, value) that ADD refuses, and the word its error names.
REFUSED = [
    ("CNI_CONTAINERID", "not UTF-8", "c\udcff1", "containerID"),
    ("CNI_CONTAINERID", "control character", "c\x011", "containerID"),
    ("CNI_CONTAINERID", "empty", "", "CNI_CONTAINERID"),
    ("CNI_CONTAINERID", "100 kB, not UTF-8 at the end", "c" * BIG + "\udcff", "containerID"),
    ("CNI_IFNAME", "not UTF-8", "e\udcff", "interface name"),
    ("CNI_IFNAME", "control character", "e\x01", "interface name"),
    ("CNI_IFNAME", "empty", "", "CNI_IFNAME"),
    ("CNI_IFNAME", "100 kB", "e" * BIG, "interface name"),
    ("CNI_NETNS", "not UTF-8", "/run/netns/\udcff", "CNI_NETNS"),
    ("CNI_NETNS", "control character", "/run/netns/x\x01", "CNI_NETNS"),
    ("CNI_NETNS", "empty", "", "CNI_NETNS"),
    ("CNI_NETNS", "100 kB", "/" + "n" * BIG, "CNI_NETNS"),
    ("CNI_ARGS", "not UTF-8", "IgnoreUnknown=1;K8S_POD_NAME=\udcff", "CNI_ARGS"),
    ("CNI_ARGS", "control character", "IgnoreUnknown=1;K8S_POD_NAME=p\x01", "CNI_ARGS"),
]
# What DEL takes as not given: the attachment is still found by its IDs.
DROPPED = [(var, kind, value) for var, kind, value, _ in REFUSED
           if var in ("CNI_NETNS", "CNI_ARGS")] + [
    ("CNI_ARGS", "100 kB", "IgnoreUnknown=1;K8S_POD_NAME=" + "p" * BIG),
    ("CNI_ARGS", "malformed", "FOO"),
    ("CNI_ARGS", "unknown key", "NOT_A_KEY=1"),
]
_KW = {"CNI_CONTAINERID": "container_id", "CNI_IFNAME": "ifname", "CNI_NETNS": "netns",
       "CNI_ARGS": "cni_args"}


# --- one plugin, one node, one pod ------------------------------------------------------


def _nft_state(node: TestNetNS, family: str, table: str) -> set[tuple[str, str, Any]]:
    t = nft_table(node, family, table)
    if t is None:
        return set()
    return {(name, json.dumps(key, sort_keys=True), comment)
            for name in [*t.sets, *t.maps] for key, _data, comment in t.entries(name)}


def _files(directory: str) -> dict[str, bytes]:
    """Allocation/saved-value files under ``directory`` (no locks, indexes, marks)."""
    out = {}
    for root, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            if name == "lock" or name.startswith((".", "last_reserved_ip")):
                continue
            path = os.path.join(root, name)
            with open(path, "rb") as fp:
                out[os.path.relpath(path, directory)] = fp.read()
    return out


def _link(ns: TestNetNS, name: str) -> netlink.Link | None:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        return netlink.find_link(ipr, name)


@dataclass
class Rig:
    """A plugin ready to run: ``conf(ifname)`` its config for an attachment
    on ``ifname``; ``state()`` what it holds, read from the kernel and the
    disk (empty when it holds nothing: ``stateful``)."""

    exe: str
    node: TestNetNS
    pod: TestNetNS
    conf: Callable[[str], dict]
    state: Callable[[], Any]
    stateful: bool

    def run(self, cmd: str, ifname: str = "eth0", **env: str) -> PluginRun:
        kw: dict[str, Any] = {"container_id": CID, "netns": self.pod.path, "ifname": ifname,
                              "cni_args": ""}
        for var, value in env.items():
            kw[_KW[var]] = value
        return run_plugin_raw(self.exe, cmd, self.conf(ifname), node=self.node, **kw)

    def ok(self, cmd: str, ifname: str = "eth0", **env: str) -> PluginRun:
        run = self.run(cmd, ifname, **env)
        assert run.exit_code == 0, (cmd, ifname, env.keys(), run.doc, run.stderr[-2000:])
        return run


def _veths(node: TestNetNS, pod: TestNetNS, names: list[str]) -> None:
    with NetNS.open(node.path) as n, NetNS.open(pod.path) as p, n.iproute() as ipr:
        for i, name in enumerate(names):
            netlink.create_veth_pair(ipr, f"vhb{i}", name, p)


def make_rig(plugin: str, cni_bin: str, node: TestNetNS, pod: TestNetNS, tmp_path: Any,
             ifnames: list[str]) -> Rig:
    exe = os.path.join(cni_bin, plugin)
    data = str(tmp_path / "data")
    v = "1.1.0"
    if plugin == "loopback":
        return Rig(exe, node, pod, lambda i: {"cniVersion": v, "name": "lonet", "type": plugin},
                   lambda: bool(getattr(_link(pod, "lo"), "up", False)), False)
    if plugin == "host-local":
        def hl_conf(i: str) -> dict:
            return {"cniVersion": v, "name": "hlnet", "type": plugin,
                    "ipam": {"type": plugin, "dataDir": data,
                             "ranges": [[{"subnet": "10.61.0.0/24"}]]}}
        return Rig(exe, node, pod, hl_conf, lambda: _files(data), True)
    if plugin == "bridge":
        def br_conf(i: str) -> dict:
            return {"cniVersion": v, "name": "brbytes", "type": plugin, "bridge": "cnskbb0",
                    "isGateway": True, "ipMasq": True, "macspoofchk": True,
                    "ipam": {"type": "host-local", "dataDir": data,
                             "ranges": [[{"subnet": "10.62.0.0/24"}]]}}

        def br_state() -> Any:
            return (_files(data), _nft_state(node, "inet", "cni_skel_bridge"),
                    _nft_state(node, "bridge", "cni_skel_bridge"))
        return Rig(exe, node, pod, br_conf, br_state, True)
    if plugin == "tuning":
        _veths(node, pod, ifnames)

        def tu_conf(i: str) -> dict:
            return {"cniVersion": v, "name": "tubytes", "type": plugin, "dataDir": data,
                    "mtu": 1400,
                    "prevResult": {"cniVersion": v,
                                   "interfaces": [{"name": i, "sandbox": pod.path}],
                                   "ips": [{"address": "10.63.0.5/24", "interface": 0}]}}
        return Rig(exe, node, pod, tu_conf, lambda: _files(data), True)
    assert plugin == "portmap"

    def pm_conf(i: str) -> dict:
        return {"cniVersion": v, "name": "pmbytes", "type": plugin,
                "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80,
                                                    "protocol": "tcp"}]},
                "prevResult": {"cniVersion": v,
                               "interfaces": [{"name": i, "sandbox": pod.path}],
                               "ips": [{"address": "10.64.0.5/24", "interface": 0}]}}
    return Rig(exe, node, pod, pm_conf, lambda: _nft_state(node, "inet", "cni_portmap"), True)


def _empty(state: Any) -> bool:
    if isinstance(state, tuple):
        return all(not s for s in state)
    return not state


# --- DEL ------------------------------------------------------------------------------


@pytest.mark.parametrize("plugin", PLUGINS)
def test_del_naming_an_attachment_add_refuses_succeeds_and_touches_nothing(
        plugin, cni_bin, node_netns, pod_netns, tmp_path):
    rig = make_rig(plugin, cni_bin, node_netns, pod_netns, tmp_path, ["eth0"])
    rig.ok("ADD")
    before = rig.state()
    assert before and not _empty(before), "ADD made nothing to compare with"
    for var, kind, value, _ in REFUSED:
        if var not in ("CNI_CONTAINERID", "CNI_IFNAME"):
            continue
        run = rig.run("DEL", **{var: value})
        assert (run.exit_code, run.stdout) == (0, b""), (var, kind, run.doc, run.stderr[-2000:])
        assert rig.state() == before, f"DEL with a {kind} {var} changed the attachment"
    # the real attachment still goes with its own DEL
    rig.ok("DEL")
    if rig.stateful:
        assert _empty(rig.state())


@pytest.mark.parametrize("plugin", PLUGINS)
def test_del_with_netns_or_args_add_refuses_still_removes_the_attachment(
        plugin, cni_bin, node_netns, pod_netns, tmp_path):
    ifnames = [f"eth{i}" for i in range(len(DROPPED))]
    rig = make_rig(plugin, cni_bin, node_netns, pod_netns, tmp_path, ifnames)
    for ifname, (var, kind, value) in zip(ifnames, DROPPED, strict=True):
        rig.ok("ADD", ifname)
        if rig.stateful:
            assert not _empty(rig.state())
        for _ in range(2):  # and again: DEL is idempotent
            run = rig.run("DEL", ifname, **{var: value})
            assert (run.exit_code, run.stdout) == (0, b""), (var, kind, run.doc,
                                                            run.stderr[-2000:])
        if rig.stateful:
            assert _empty(rig.state()), f"DEL with a {kind} {var} left the attachment's state"


# --- ADD --------------------------------------------------------------------------------


@pytest.mark.parametrize("plugin", PLUGINS)
def test_add_with_identifiers_that_are_not_text_is_code_4_and_makes_nothing(
        plugin, cni_bin, node_netns, pod_netns, tmp_path):
    rig = make_rig(plugin, cni_bin, node_netns, pod_netns, tmp_path, ["eth0"])
    before = rig.state()
    for var, kind, value, word in REFUSED:
        for cmd in ("ADD", "CHECK"):
            run = rig.run(cmd, **{var: value})
            assert run.exit_code == 1, (cmd, var, kind, run.doc)
            doc = run.doc
            assert doc["code"] == 4, (cmd, var, kind, doc)
            assert word in doc["msg"], (cmd, var, kind, doc)
            assert set(doc) <= {"cniVersion", "code", "msg", "details"}
            # the value is named, readable, and short
            assert len(doc.get("details", "")) < 300
        assert rig.state() == before, f"ADD with a {kind} {var} left something behind"


def test_error_details_show_the_bad_bytes_escaped(cni_bin, node_netns, pod_netns, tmp_path):
    rig = make_rig("loopback", cni_bin, node_netns, pod_netns, tmp_path, [])
    run = rig.run("ADD", CNI_IFNAME="e\udcff\x01")
    assert run.doc["msg"] == "interface name is not valid UTF-8"
    assert run.doc["details"] == "e\\xff\\x01"
    run = rig.run("ADD", CNI_CONTAINERID="c" * BIG + "\x01")
    assert run.doc["msg"] == "invalid characters in containerID", run.doc
    assert len(run.doc["details"]) < 300, "cut, not 100 kB of details"
    # A long ID is an ID: the spec sets no length.
    rig.ok("ADD", CNI_CONTAINERID="c" * BIG)
    rig.ok("DEL", CNI_CONTAINERID="c" * BIG)
    # bytes that are UTF-8 are text: an ifname of two UTF-8 bytes is fine
    rig.ok("ADD", ifname="\udcc3\udca9")  # the bytes of "é", as the kernel allows
    rig.ok("DEL", ifname="\udcc3\udca9")


# --- GC ---------------------------------------------------------------------------------


@pytest.mark.parametrize("plugin", ["bridge", "host-local", "tuning", "portmap"])
def test_gc_with_listed_names_no_add_accepts_still_collects(
        plugin, cni_bin, node_netns, pod_netns, tmp_path):
    """A GC list entry may hold anything (``\\udcff`` escapes decode to lone
    surrogates, which are not UTF-8): it keeps nothing and breaks nothing."""
    rig = make_rig(plugin, cni_bin, node_netns, pod_netns, tmp_path, ["eth0"])
    rig.ok("ADD")
    assert not _empty(rig.state())
    conf = dict(rig.conf("eth0"), **{"cni.dev/valid-attachments": [
        {"containerID": "\udcff", "ifname": "eth0"},
        {"containerID": CID, "ifname": "e\udcff\x01"},
        {"containerID": "c" * BIG, "ifname": "eth0"}]})
    conf.pop("prevResult", None)
    run = run_plugin_raw(rig.exe, "GC", conf, container_id="", netns="", ifname="",
                         node=node_netns)
    assert (run.exit_code, run.stdout) == (0, b""), (run.doc, run.stderr[-2000:])
    assert _empty(rig.state()), "the attachment is not listed: GC removes it"

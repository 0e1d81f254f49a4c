"""dhcp (IPAM) through the real executables, its leases held by the worker's
keeper: a real DHCP server (dnsmasq, tests/dhcp_lan.py) on a LAN namespace
joined to the node; pods with our macvlan and with our bridge get their
address from it, side by side with Go 1.1.1's macvlan + dhcp and its daemon
on the same server. What the server logs and its lease table are the proof:
the address and options it gave, renewals at T1, RELEASE at DEL and GC, the
same address asked for again by a restarted worker, a NAK; and what the pod
holds (its address, read back with netlink; a ping from the LAN).

Leases live in a worker: these tests run against the suite's worker (or one
of their own when they kill it); without a worker dhcp answers code 11."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yardsticks
from conftest import HERE, SuiteWorker, worker_command
from dhcp_lan import (
    DNS_SERVER,
    DOMAIN,
    RANGE_END,
    RANGE_START,
    ROUTER,
    GoDhcpDaemon,
    client_id_hex,
    make_dhcp_lan,
)
from podlink_common import link_of, pod_state

from cni_skel import netlink
from cni_skel.harness import icmp_ping, run_plugin_raw
from cni_skel.netns import NetNS
from cni_skel.testing import create_netns, remove_netns
from cni_skel.warm.doctor import diagnose
from cni_skel.warm.install import write_executable
from cni_skel.warm.protocol import REQUIRED_ENV

PLUGINS = {"macvlan": "cni_skel_plugins.macvlan:Macvlan",
           "bridge": "cni_skel_plugins.bridge:Bridge", "dhcp": "cni_skel_plugins.dhcp:Dhcp"}


def bin_for(directory: Path, sock: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, ref in PLUGINS.items():
        write_executable(str(directory), name, ref, worker_socket=sock)
    return directory


class Node:
    """Our plugins served by ``worker`` (its socket ``sock``), a network name
    of the test's own, the LAN with its server."""

    def __init__(self, bin_dir: Path, sock: str, lan: Any, net: str) -> None:
        self.bin, self.sock, self.lan, self.net = bin_dir, sock, lan, net

    @property
    def server(self) -> Any:
        return self.lan.server

    def conf(self, ipam: dict | None = None, **top: Any) -> dict:
        return {"cniVersion": "1.0.0", "name": self.net, "type": "macvlan", "master": "eth0",
                "ipam": {"type": "dhcp", **(ipam or {})}, **top}

    def call(self, verb: str, conf: dict, pod: Any, cid: str = "dh-c1",
             plugin: str | None = None, **kw: Any) -> Any:
        exe = str(self.bin / (plugin or conf["type"]))
        return run_plugin_raw(exe, verb, conf, container_id=cid,
                              netns=pod.path if pod is not None else "",
                              node=self.lan.node, **kw)

    def held(self) -> str:
        proc = subprocess.run([*worker_command(), "worker", "--check", "--socket", self.sock],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc
        return proc.stdout

    def lease_of(self, ip: str) -> Any:
        return next((lease for lease in self.server.leases() if lease.ip == ip), None)


@pytest.fixture
def warm_env(cni_worker: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Launchers must be served by the worker (no one-shot fallback)."""
    monkeypatch.setenv(REQUIRED_ENV, "1")
    return cni_worker


@pytest.fixture
def dhcp_node(warm_env: Any, netns_factory: Any, tmp_path: Path) -> Iterator[Any]:
    """A function ``make(**server_kwargs) -> Node`` on the suite's worker; at
    the end a GC of the test's network releases whatever a failed test left."""
    made: list[Node] = []
    bin_dir = bin_for(tmp_path / "bin", warm_env.sock)

    def make(**server_kwargs: Any) -> Node:
        lan = make_dhcp_lan(netns_factory, tmp_path / f"lan{len(made)}", **server_kwargs)
        node = Node(bin_dir, warm_env.sock, lan, f"dhnet-{uuid.uuid4().hex[:6]}")
        made.append(node)
        return node

    yield make
    for node in made:
        gc = {"cniVersion": "1.1.0", "name": node.net, "type": "dhcp",
              "cni.dev/valid-attachments": []}
        with contextlib.suppress(Exception):
            run_plugin_raw(str(node.bin / "dhcp"), "GC", gc, node=node.lan.node)
        node.lan.server.stop()


def lease_masked(doc: dict) -> dict:
    """A macvlan + dhcp result with what differs per pod masked: the MAC,
    the sandbox and the leased host address (its prefix kept)."""
    doc["interfaces"][0]["mac"] = "-"
    doc["interfaces"][0]["sandbox"] = "-"
    doc["ips"][0]["address"] = re.sub(r"^[\d.]+/", "A/", doc["ips"][0]["address"])
    return doc


def ip_of(result: dict) -> str:
    return result["ips"][0]["address"].split("/")[0]


# --- the main job ------------------------------------------------------------


def test_macvlan_pod_leases_checks_and_releases(dhcp_node: Any, netns_factory: Any) -> None:
    """ADD leases an address from the server (its lease table names our
    client ID and the pod's MAC), the pod holds it, the LAN pings it, the
    worker lists the lease, CHECK passes, DEL releases it (the server frees
    it) and a second DEL is no error."""
    node = dhcp_node()
    pod = netns_factory("cnsk-dhp")
    run = node.call("ADD", node.conf(), pod)
    assert run.exit_code == 0, run
    r = run.doc
    ip = ip_of(r)
    assert RANGE_START <= ip <= RANGE_END and r["ips"][0]["address"].endswith("/24")
    assert r["ips"][0]["gateway"] == ROUTER
    assert r["routes"] == [{"dst": "0.0.0.0/0", "gw": ROUTER}]
    mac = link_of(pod, "eth0").mac
    lease = node.lease_of(ip)
    assert lease is not None and lease.mac == mac
    assert lease.client_id == client_id_hex("dh-c1", node.net, "eth0")
    assert pod_state(pod)["addresses"] == [f"{ip}/24"]
    assert icmp_ping(node.lan.lan, ip, count=2, timeout=2.0)
    listing = node.held()
    assert re.search(rf"clientID=dh-c1/{node.net}/eth0 network={node.net} .*address={ip} "
                     r"expires in \d+ s state=bound", listing), listing
    doctor = diagnose(str(node.bin), ["dhcp"], str(node.bin))
    assert any(f"address={ip} " in line for line in "\n".join(doctor.lines).splitlines()), \
        doctor.lines
    assert node.call("CHECK", {**node.conf(), "prevResult": r}, pod).exit_code == 0
    since = node.server.mark()
    assert node.call("DEL", node.conf(), pod).exit_code == 0
    node.server.wait_for(rf"DHCPRELEASE\(lan0\) {re.escape(ip)} ", 5.0, since=since)
    assert node.lease_of(ip) is None
    assert node.call("DEL", node.conf(), pod).exit_code == 0
    assert f"clientID=dh-c1/{node.net}/eth0" not in node.held()


def test_same_result_as_go_with_its_daemon(dhcp_node: Any, netns_factory: Any,
                                           go_yardstick: yardsticks.Yardstick,
                                           tmp_path: Path) -> None:
    """Go's macvlan + dhcp with its daemon (each set), and ours, on the same
    server with classless routes (option 121, asked for): the same result
    but for the address each pod got; the same client ID shape in the lease
    table."""
    y = go_yardstick
    node = dhcp_node(classless_routes=[("10.77.0.0/16", "10.56.0.254"),
                                       ("0.0.0.0/0", ROUTER)])
    ipam = {"request": [{"option": "121"}]}
    with GoDhcpDaemon(node.lan.node, tmp_path / "go", binary=y.exe("dhcp")) as go:
        go_pod, our_pod = netns_factory("cnsk-dhg"), netns_factory("cnsk-dho")
        go_conf = node.conf({**go.ipam(), **ipam})
        go_run = run_plugin_raw(y.exe("macvlan"), "ADD", go_conf, container_id="dh-go",
                                netns=go_pod.path, node=node.lan.node, cni_path=y.dir)
        assert go_run.exit_code == 0, (go_run, go.log())
        ours = node.call("ADD", node.conf(ipam), our_pod, cid="dh-ours")
        assert ours.exit_code == 0, ours
        # ours as that Go prints it (1.1.1's empty dns: tests/yardsticks.py)
        g = lease_masked(go_run.doc)
        o = yardsticks.as_go(y, "macvlan", lease_masked(ours.doc))
        assert o == g
        assert list(o) == list(g)
        assert o["routes"] == [{"dst": "10.77.0.0/16", "gw": "10.56.0.254"},
                               {"dst": "0.0.0.0/0", "gw": ROUTER}]
        ids = {lease.client_id for lease in node.server.leases()}
        assert client_id_hex("dh-go", node.net, "eth0") in ids
        assert client_id_hex("dh-ours", node.net, "eth0") in ids
        assert run_plugin_raw(y.exe("macvlan"), "DEL", go_conf, container_id="dh-go",
                              netns=go_pod.path, node=node.lan.node,
                              cni_path=y.dir).exit_code == 0
        assert node.call("DEL", node.conf(ipam), our_pod, cid="dh-ours").exit_code == 0


def test_dns_and_options_the_server_gives(dhcp_node: Any, netns_factory: Any) -> None:
    """Called as the IPAM plugin (as macvlan calls it): DNS from options 6,
    15 and 119 (asked for; its names compressed by the server), the routes'
    metric from ``priority``, a provided option (the host name from
    CNI_ARGS) seen by the server."""
    node = dhcp_node(options=("option:domain-search,a.lan.test,b.lan.test,lan.test",))
    pod = netns_factory("cnsk-dhp")
    with NetNS.open(pod.path) as p, p.rtnl() as pipr, NetNS.open(node.lan.node.path) as n, \
            n.rtnl() as ipr:
        netlink.create_macvlan(ipr, "eth0", "eth0", netns=p, netns_ipr=pipr)
    conf = {**node.conf({"priority": 50, "request": [{"option": "domain-search"}], "provide": [
        {"option": "host-name", "fromArg": "K8S_POD_NAME"}]}), "type": "dhcp"}
    since = node.server.mark()
    run = node.call("ADD", conf, pod, cni_args="IgnoreUnknown=1;K8S_POD_NAME=dh-pod-1")
    assert run.exit_code == 0, run
    assert run.doc["dns"] == {"nameservers": [DNS_SERVER], "domain": DOMAIN,
                              "search": ["a.lan.test", "b.lan.test", "lan.test"]}
    assert run.doc["routes"] == [{"dst": "0.0.0.0/0", "gw": ROUTER, "priority": 50}]
    assert "interfaces" not in run.doc
    node.server.wait_for(r"client provides name: dh-pod-1", 5.0, since=since)
    assert node.call("DEL", conf, pod).exit_code == 0


def test_bridge_pod_over_dhcp(dhcp_node: Any, netns_factory: Any) -> None:
    """Our bridge with dhcp: the node's LAN port is on the bridge, the pod's
    veth too, its address comes from the LAN's server and the LAN pings it."""
    node = dhcp_node()
    with NetNS.open(node.lan.node.path) as n, n.rtnl() as ipr:
        br = netlink.ensure_bridge(ipr, "cnskdbr0")
        netlink.link_set(ipr, "eth0", master=br.index)
        netlink.link_up(ipr, br)
    conf = {"cniVersion": "1.0.0", "name": node.net, "type": "bridge", "bridge": "cnskdbr0",
            "ipam": {"type": "dhcp"}}
    pod = netns_factory("cnsk-dhb")
    run = node.call("ADD", conf, pod)
    assert run.exit_code == 0, run
    ip = ip_of(run.doc)
    assert node.lease_of(ip) is not None
    assert icmp_ping(node.lan.lan, ip, count=2, timeout=2.0)
    assert node.call("DEL", conf, pod).exit_code == 0
    assert node.lease_of(ip) is None


def test_gc_releases_leases_not_valid(dhcp_node: Any, netns_factory: Any) -> None:
    node = dhcp_node()
    pods = {cid: netns_factory("cnsk-dhp") for cid in ("dh-k1", "dh-k2")}
    ips = {}
    for cid, pod in pods.items():
        run = node.call("ADD", node.conf(), pod, cid=cid)
        assert run.exit_code == 0, run
        ips[cid] = ip_of(run.doc)
    gc = {"cniVersion": "1.1.0", "name": node.net, "type": "dhcp",
          "cni.dev/valid-attachments": [{"containerID": "dh-k1", "ifname": "eth0"}]}
    since = node.server.mark()
    assert node.call("GC", gc, None, cid="").exit_code == 0
    node.server.wait_for(rf"DHCPRELEASE\(lan0\) {re.escape(ips['dh-k2'])} ", 5.0, since=since)
    assert node.lease_of(ips["dh-k1"]) is not None
    check = node.call("CHECK", node.conf(), pods["dh-k2"], cid="dh-k2", plugin="dhcp")
    assert check.exit_code == 1 and check.doc["code"] == 3, check
    assert node.call("CHECK", node.conf(), pods["dh-k1"], cid="dh-k1",
                     plugin="dhcp").exit_code == 0
    assert node.call("GC", {**gc, "cni.dev/valid-attachments": []}, None,
                     cid="").exit_code == 0
    assert node.lease_of(ips["dh-k1"]) is None


# --- renewals, restarts ----------------------------------------------------------


@pytest.fixture
def own_worker(tmp_path: Path) -> Iterator[Any]:
    """A function making workers of the test's own on one socket (killable)."""
    wdir = tempfile.mkdtemp(prefix="cnsk-dhw-")  # short: sun_path holds 108 bytes
    workers: list[SuiteWorker] = []

    def start(*args: str) -> SuiteWorker:
        w = SuiteWorker(os.path.join(wdir, "w.sock"), str(tmp_path / "worker.log"),
                        pythonpath=(str(HERE),), args=args)
        workers.append(w)
        return w

    yield start
    for w in workers:
        w.stop()
    shutil.rmtree(wdir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_worker(worker: SuiteWorker) -> None:
    """SIGKILL to the worker's whole process group (parent, serving
    processes, keeper): a crash, not a stop."""
    os.killpg(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait(10)


def test_renewed_at_t1_and_taken_over_by_a_restarted_worker(own_worker: Any, tmp_path: Path,
                                                           netns_factory: Any,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The lease is renewed at T1 (the server sees REQUEST/ACK again; the
    metrics count it and the lease held); the worker killed (every process
    of it) and started again asks the server for the same address and goes
    on renewing it; DEL through the new worker releases it."""
    monkeypatch.setenv(REQUIRED_ENV, "1")
    metrics = f"127.0.0.1:{free_port()}"
    worker = own_worker("--metrics-address", metrics)
    lan = make_dhcp_lan(netns_factory, tmp_path / "lan", t1=5, t2=100)
    with lan:
        node = Node(bin_for(tmp_path / "bin", worker.sock), worker.sock, lan, "dhnet-rn")
        pod = netns_factory("cnsk-dhp")
        run = node.call("ADD", node.conf(), pod)
        assert run.exit_code == 0, run
        ip = ip_of(run.doc)
        since = lan.server.mark()
        lan.server.wait_for(rf"DHCPACK\(lan0\) {re.escape(ip)} ", 12.0, since=since)
        # the server logs its ACK as it sends it; the worker once it has it
        deadline = time.monotonic() + 5
        while "renewed" not in worker.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "renewed" in worker.log()
        want = {'cni_skel_keeper_held{service="dhcp"}': 1.0,
                'cni_skel_keeper_events_total{event="acquired",service="dhcp"}': 1.0,
                'cni_skel_keeper_events_total{event="renewed",service="dhcp"}': 1.0,
                'cni_skel_keeper_events_total{event="timeout",service="dhcp"}': 0.0}

        def scraped() -> dict[str, float]:
            with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as r:
                text = r.read().decode()
            samples = dict(re.findall(r"^(\S+) (\S+)$", text, re.M))
            return {k: float(samples[k]) for k in want if k in samples}

        def counted() -> bool:  # renewals: at least the one seen (T1 comes every 5 s)
            got = scraped()
            return got.get(renewed, 0) >= 1 and {**got, renewed: 1.0} == want

        renewed = 'cni_skel_keeper_events_total{event="renewed",service="dhcp"}'
        deadline = time.monotonic() + 5
        while not counted() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert counted(), scraped()
        kill_worker(worker)
        leases = os.path.join(os.path.dirname(worker.sock), "dhcp")
        assert os.listdir(leases) == ["dh-c1_eth0.json"]
        assert os.stat(leases).st_mode & 0o777 == 0o700
        assert os.stat(os.path.join(leases, "dh-c1_eth0.json")).st_mode & 0o777 == 0o600
        since = lan.server.mark()
        again = own_worker()
        lan.server.wait_for(rf"DHCPACK\(lan0\) {re.escape(ip)} ", 12.0, since=since)
        assert "lease of " + ip + " taken over" in again.log()
        since = lan.server.mark()
        lan.server.wait_for(rf"DHCPACK\(lan0\) {re.escape(ip)} ", 12.0, since=since)  # T1 again
        assert pod_state(pod)["addresses"] == [f"{ip}/24"]
        assert node.call("DEL", node.conf(), pod).exit_code == 0
        assert node.lease_of(ip) is None


def test_nak_at_renewal_gives_a_new_address_and_check_says_so(dhcp_node: Any,
                                                             netns_factory: Any) -> None:
    """The server pins the client to another address: its renewal is NAK'd,
    the worker leases the new address, and CHECK with the old result fails
    naming both."""
    node = dhcp_node(t1=5, t2=100)
    pod = netns_factory("cnsk-dhp")
    run = node.call("ADD", node.conf(), pod)
    assert run.exit_code == 0, run
    old = ip_of(run.doc)
    new = "10.56.0.150" if old != "10.56.0.150" else "10.56.0.151"
    since = node.server.mark()
    node.server.set_hosts([f"id:{client_id_hex('dh-c1', node.net, 'eth0')},{new}"])
    node.server.wait_for(r"DHCPNAK", 12.0, since=since)
    node.server.wait_for(rf"DHCPACK\(lan0\) {re.escape(new)} ", 12.0, since=since)
    check = node.call("CHECK", {**node.conf(), "prevResult": run.doc}, pod, plugin="dhcp")
    assert check.exit_code == 1 and check.doc["code"] == 999, check
    assert new in check.doc["msg"] and old in check.doc["msg"]
    assert node.call("DEL", node.conf(), pod).exit_code == 0


def test_del_while_renewal_goes_unanswered(dhcp_node: Any, netns_factory: Any) -> None:
    """The server goes away after ADD; at T1 the worker renews into silence;
    DEL then answers at once, releases (into the void) and forgets it."""
    node = dhcp_node(t1=5, t2=100)
    pod = netns_factory("cnsk-dhp")
    assert node.call("ADD", node.conf(), pod).exit_code == 0
    node.server.stop()
    time.sleep(6)  # past T1: renewing, no answer
    t0 = time.monotonic()
    assert node.call("DEL", node.conf(), pod).exit_code == 0
    assert time.monotonic() - t0 < 5
    assert "clientID=dh-c1/" not in node.held()


def test_del_with_the_netns_gone_still_releases(dhcp_node: Any, netns_factory: Any) -> None:
    """The runtime removed the pod's namespace before DEL (its path is gone,
    or CNI_NETNS is empty): the lease's thread still holds the namespace,
    so DEL sends the RELEASE from the pod's interface, the server frees the
    address, nothing stays held, and the namespace (with the macvlan in it)
    goes once the thread lets go of it."""
    node = dhcp_node()
    for cid, netns in (("dh-gone1", "path"), ("dh-gone2", "")):
        pod = netns_factory("cnsk-dhp")
        run = node.call("ADD", node.conf(), pod, cid=cid)
        assert run.exit_code == 0, run
        ip = ip_of(run.doc)
        with NetNS.open(pod.path) as ns:
            ino = os.fstat(ns.fd).st_ino
        remove_netns(pod)
        assert _netns_held(ino)  # the lease's thread
        since = node.server.mark()
        gone = node.call("DEL", node.conf(), None, cid=cid) if netns == "" else \
            run_plugin_raw(str(node.bin / "macvlan"), "DEL", node.conf(), container_id=cid,
                           netns=pod.path, node=node.lan.node)
        assert gone.exit_code == 0, gone
        node.server.wait_for(rf"DHCPRELEASE\(lan0\) {re.escape(ip)} ", 5.0, since=since)
        assert node.lease_of(ip) is None
        assert f"clientID={cid}/" not in node.held()
        # No process keeps the namespace alive any more (the kernel frees it,
        # and the macvlan in it, once its last reference goes).
        deadline = time.monotonic() + 5.0
        while _netns_held(ino) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _netns_held(ino), f"a process still holds the pod's netns {ino}"
        assert node.call("DEL", node.conf(), None, cid=cid).exit_code == 0


def _netns_held(ino: int) -> bool:
    """Whether any process has a thread in, or an fd on, network namespace ``ino``."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{pid}/task/{tid}/ns/net").st_ino == ino:
                        return True
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    if st.st_ino == ino and st.st_dev == _NSFS_DEV:
                        return True
    return False


_NSFS_DEV = os.stat("/proc/self/ns/net").st_dev


# --- bad input and failures ------------------------------------------------------


def test_no_server_answers_add_fails_in_time_and_leaves_nothing(dhcp_node: Any,
                                                               netns_factory: Any) -> None:
    node = dhcp_node(ignore_all=True)
    pod = netns_factory("cnsk-dhp")
    t0 = time.monotonic()
    run = node.call("ADD", node.conf({"timeout": 2}), pod)
    took = time.monotonic() - t0
    assert run.exit_code == 1 and run.doc["code"] == 11, run
    assert "no DHCP lease on eth0 within 2 s" in run.doc["msg"]
    assert took < 8, took
    assert link_of(pod, "eth0") is None  # macvlan rolled its link back
    assert "clientID=dh-c1/" not in node.held()
    node.server.wait_for(r"DHCPDISCOVER\(lan0\) .* ignored", 1.0)


@pytest.mark.parametrize(("ipam", "key"), [
    ({"request": [{"option": "no-such-option"}]}, "ipam.request[0].option"),
    ({"request": [{"option": "0"}]}, "ipam.request[0].option"),
    ({"request": [{"option": 255}]}, "ipam.request[0].option"),
    ({"provide": [{"option": "300", "value": "x"}]}, "ipam.provide[0].option"),
    ({"provide": [{"option": "host-name", "value": "x" * 256}]}, "ipam.provide[0]"),
    ({"provide": [{"option": "51", "value": "x"}]}, "ipam.provide[0].option"),
    ({"timeout": 0}, "ipam.timeout"),
])
def test_bad_options_are_code_7_naming_them(dhcp_node: Any, netns_factory: Any, ipam: dict,
                                            key: str) -> None:
    node = dhcp_node()
    pod = netns_factory("cnsk-dhp")
    run = node.call("ADD", node.conf(ipam), pod)
    assert run.exit_code == 1 and run.doc["code"] == 7, run
    assert key in run.doc["msg"], run.doc
    assert link_of(pod, "eth0") is None
    assert node.server.leases() == []


def test_without_a_worker_every_verb_but_version_is_11(tmp_path: Path,
                                                        netns_factory: Any) -> None:
    """One-shot (the launcher's socket has no worker): ADD, CHECK and DEL
    answer 11 naming the socket, STATUS 50; nothing was done."""
    sock = str(tmp_path / "nobody.sock")
    bin_dir = bin_for(tmp_path / "bin", sock)
    pod = netns_factory("cnsk-dhp")
    with NetNS.open(pod.path) as p, p.rtnl() as ipr:
        netlink.create_veth_pair(ipr, "eth0", "eth0p")
    conf = {"cniVersion": "1.1.0", "name": "dhnet-1s", "type": "dhcp", "ipam": {"type": "dhcp"}}
    for verb in ("ADD", "CHECK", "DEL"):
        run = run_plugin_raw(str(bin_dir / "dhcp"), verb, conf, container_id="dh-c1",
                             netns=pod.path)
        assert run.exit_code == 1 and run.doc["code"] == 11, (verb, run)
        assert sock in run.doc["details"]
    assert not link_of(pod, "eth0").up  # ADD did not even bring it up
    run = run_plugin_raw(str(bin_dir / "dhcp"), "STATUS", conf)
    assert run.exit_code == 1 and run.doc["code"] == 50, run


def test_churn_of_200_pods_8_at_a_time_never_gives_an_address_twice(
        dhcp_node: Any, tmp_path: Path) -> None:
    """200 pods through ADD and DEL, 8 at once, over a pool of 100: no two
    live pods ever hold the same address, every ADD succeeds, and at the end
    the server holds no lease."""
    node = dhcp_node()
    prefix = f"cnsk-dhc{uuid.uuid4().hex[:4]}"
    # (ip, cid, after its ADD answered, before its DEL was sent): the pod
    # certainly held the address in between.
    held_spans: list[tuple[str, str, float, float]] = []
    lock = threading.Lock()

    def pod_life(i: int) -> str | None:
        pod = create_netns(prefix)
        cid = f"dh-churn-{i:03d}"
        try:
            run = node.call("ADD", node.conf(), pod, cid=cid)
            if run.exit_code != 0:
                return f"{cid}: ADD {run.doc}"
            ip = ip_of(run.doc)
            added = time.monotonic()
            held = pod_state(pod)["addresses"]
            with lock:
                held_spans.append((ip, cid, added, time.monotonic()))
            run = node.call("DEL", node.conf(), pod, cid=cid)
            if run.exit_code != 0:
                return f"{cid}: DEL {run.doc}"
            if held != [f"{ip}/24"]:
                return f"{cid}: pod holds {held}, not {ip}"
            return None
        finally:
            remove_netns(pod)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        problems = [p for p in pool.map(pod_life, range(200)) if p]
    assert problems == []
    twice = [f"{ip}: {a} and {b}" for i, (ip, a, start, end) in enumerate(held_spans)
             for ip2, b, start2, end2 in held_spans[i + 1:]
             if ip == ip2 and start < end2 and start2 < end]
    assert twice == []
    assert len(held_spans) == 200
    assert node.server.leases() == []


"""End to end with a real runtime: Debian's containerd 1.6 and runc run pods
on our plugins, installed by `cni-skel install` into containerd's bin dir.

The kubelet path (CRI runtime.v1 over containerd's socket) and `ctr run
--cni`. containerd runs in a node network namespace and a private mount
namespace made here (`containerd_node`); the test talks to the node, the
pods and a client namespace only. Every plugin call is traced
(``CNI_SKEL_TRACE``), so the test asserts on what containerd really sent
(../shared/spec/runtime-captures.md: capitalised portMappings keys, loopback
at 0.3.1 beside the main network, DEL repeated with an empty CNI_NETNS) as
well as on what the kernel holds afterwards.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time

import containerd_node as cn
import pytest
from pyroute2 import IPRoute

from cni_skel.harness import create_netns, nft_table, remove_netns
from cni_skel.netns import NetNS
from cni_skel.nft import attachment_tag
from cni_skel.warm import client as launcher

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")
SUBNET = ipaddress.ip_network("10.77.0.0/24")
BRIDGE = "e2ebr0"
NODE_IP, CLIENT_IP = "10.78.0.1", "10.78.0.2"
SYSCTL = "net.ipv4.conf.eth0.send_redirects"
#: The second network: a macvlan on the node's link to a LAN the client is
#: on too, where the node has no address (a NIC given to pods only): replies
#: to the node's own address keep going through eth0.
LAN_IP, LAN_RANGE = "10.79.0.2", ("10.79.0.100", "10.79.0.150")
TABLES = (("inet", "cni_portmap"), ("inet", "cni_skel_bridge"))


@pytest.fixture(scope="module", autouse=True)
def _tools():
    missing = cn.missing_tools()
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: `make test` installs Debian's "
                    f"{' '.join(cn.PACKAGES)}")


def conflist(d: str) -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": "e2e",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": os.path.join(d, "ipam"),
                      "ranges": [[{"subnet": str(SUBNET)}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "tuning", "sysctl": {SYSCTL: "0"}, "dataDir": os.path.join(d, "tuning")},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }


def lan_conflist(d: str) -> dict:
    """The pods' second network (eth1): a bridge-mode macvlan on the node's
    link to the LAN (``e2e-lan``), addresses of that LAN."""
    return {
        "cniVersion": "1.0.0",
        "name": "lan",
        "plugins": [
            {"type": "macvlan", "master": "e2e-lan", "mode": "bridge",
             "ipam": {"type": "host-local", "dataDir": os.path.join(d, "ipam"),
                      "ranges": [[{"subnet": "10.79.0.0/24", "rangeStart": LAN_RANGE[0],
                                   "rangeEnd": LAN_RANGE[1]}]]}},
        ],
    }


class Node:
    """Everything one test needs: node + client namespaces, our plugins
    installed, the conflist, containerd started with the image imported."""

    def __init__(self, d: str, mode: str, worker_socket: str,
                 conflists: dict[str, dict] | None = None) -> None:
        self.d = d
        self.trace = os.path.join(d, "trace.jsonl")
        self.conf_dir = os.path.join(d, "net.d")
        self.bin_dir = os.path.join(d, "bin")
        os.makedirs(self.conf_dir)
        # launchers on the mode's socket: the worker's in warm mode, nothing
        # listening in oneshot mode (the launchers' in-process fallback)
        subprocess.run([CLI, "install", "--no-systemd", "--bin-dir", self.bin_dir,
                        "--worker-socket", worker_socket], check=True, capture_output=True,
                       timeout=60)
        if conflists is None:
            conflists = {"10-e2e.conflist": conflist(d), "20-lan.conflist": lan_conflist(d)}
        for name, doc in conflists.items():
            with open(os.path.join(self.conf_dir, name), "w") as f:
                json.dump(doc, f)
        self.mode = mode
        self.pods: list[Pod] = []
        self.node_ns = create_netns("cnsk-ctd")
        self.client_ns = create_netns("cnsk-ctc")
        self._wire()
        env = {"CNI_SKEL_TRACE": self.trace}
        if mode == "warm":  # a launcher falling back would answer code 11
            env[launcher.REQUIRED_ENV] = "1"
        self.ctd = cn.ContainerdNode(os.path.join(d, "ctd"), self.node_ns.path, self.conf_dir,
                                     self.bin_dir, env=env)
        self.image = cn.build_image(os.path.join(d, "busybox-oci.tar"))

    def _wire(self) -> None:
        with NetNS.open(self.node_ns.path) as ns, ns.enter(), IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            ipr.link("add", ifname="e2e-client", kind="veth", peer="e2e-peer")
            peer = ipr.link_lookup(ifname="e2e-peer")[0]
            with open(self.client_ns.path) as f:
                ipr.link("set", index=peer, net_ns_fd=f.fileno())
            idx = ipr.link_lookup(ifname="e2e-client")[0]
            ipr.addr("add", index=idx, address=NODE_IP, prefixlen=24)
            ipr.link("set", index=idx, state="up")
            ipr.link("add", ifname="e2e-lan", kind="veth", peer="e2e-lan-peer")
            with open(self.client_ns.path) as f:
                ipr.link("set", index=ipr.link_lookup(ifname="e2e-lan-peer")[0],
                         net_ns_fd=f.fileno())
            ipr.link("set", index=ipr.link_lookup(ifname="e2e-lan")[0], state="up")
        with NetNS.open(self.client_ns.path) as ns, ns.enter(), IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            for name, address in (("e2e-peer", CLIENT_IP), ("e2e-lan-peer", LAN_IP)):
                idx = ipr.link_lookup(ifname=name)[0]
                ipr.addr("add", index=idx, address=address, prefixlen=24)
                ipr.link("set", index=idx, state="up")

    def close(self) -> list[int]:
        try:
            return self.ctd.stop()
        finally:
            remove_netns(self.node_ns)
            remove_netns(self.client_ns)

    def calls(self) -> list[dict]:
        with contextlib.suppress(FileNotFoundError), open(self.trace) as f:
            return [json.loads(line) for line in f]
        return []


@contextlib.contextmanager
def running_node(tmp_path, mode: str, worker_socket: str,
                 conflists: dict[str, dict] | None = None):
    """A started `Node` (its conflists: ours above unless given), and at
    exit the checks that nothing of it is left: processes, mounts, cgroups."""
    n = Node(str(tmp_path), mode, worker_socket, conflists)
    try:
        n.ctd.start()
        n.ctd.import_image(n.image)
        yield n
    finally:
        clean = all(p.removed for p in n.pods)
        for p in n.pods:  # a failed test: remove its pods the way kubelet would
            if not p.removed:
                with contextlib.suppress(Exception):
                    p.stop()
        leftovers = n.close()
        if not clean:  # shims of pods the test did not remove: expected
            leftovers = []
        assert not n.ctd.processes(), "processes of the node survived containerd"
        assert not [m for m in _mounts() if str(tmp_path) in m], "mounts left behind"
        assert not n.ctd.remove_cgroups(), "cgroups left behind"
        assert leftovers == [], f"shims/containers still running at teardown: {leftovers}"


@pytest.fixture
def node(tmp_path, cni_mode, cni_worker_socket):
    with running_node(tmp_path, cni_mode, cni_worker_socket) as n:
        yield n


def _mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return f.read().splitlines()


def http_get(ns_path: str, ip: str, port: int, timeout: float = 5.0) -> str:
    """GET / from inside a namespace; the body (busybox httpd answers HTTP/1.0)."""
    with NetNS.open(ns_path) as ns, ns.enter():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with s:
        s.settimeout(timeout)
        s.connect((ip, port))
        s.sendall(f"GET / HTTP/1.0\r\nHost: {ip}\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.decode(errors="replace").partition("\r\n\r\n")
    assert head.startswith("HTTP/1.") and " 200 " in head.splitlines()[0], head
    return body


class Pod:
    def __init__(self, node: Node, name: str, host_port: int,
                 annotations: dict[str, str] | None = None) -> None:
        ctd, pb = node.ctd, node.ctd.pb
        self.name, self.node, self.host_port = name, node, host_port
        self.removed, self.web = False, ""
        self.config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=f"uid-{name}", namespace="e2e"),
            hostname=name, log_directory=os.path.join(node.d, "logs", name),
            annotations=annotations or {},
            port_mappings=[pb.PortMapping(protocol=pb.TCP, container_port=8080,
                                          host_port=host_port)],
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=ctd.cgroup_parent))
        self.id = ctd.cri.RunPodSandbox(pb.RunPodSandboxRequest(config=self.config),
                                        timeout=180).pod_sandbox_id
        node.pods.append(self)
        status = ctd.cri.PodSandboxStatus(
            pb.PodSandboxStatusRequest(pod_sandbox_id=self.id, verbose=True), timeout=30)
        self.ip = status.status.network.ip
        self.pid = json.loads(status.info["info"])["pid"]
        cc = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name="web"), image=pb.ImageSpec(image=cn.IMAGE),
            command=["/bin/sh", "-c",
                     f"echo pod {name} > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"],
            log_path="web.log")
        self.web = ctd.cri.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=self.id, config=cc, sandbox_config=self.config),
            timeout=60).container_id
        ctd.cri.StartContainer(pb.StartContainerRequest(container_id=self.web), timeout=60)

    @property
    def netns(self) -> str:
        return f"/proc/{self.pid}/ns/net"

    def exec(self, *cmd: str, timeout: int = 10) -> tuple[int, str]:
        pb = self.node.ctd.pb
        r = self.node.ctd.cri.ExecSync(pb.ExecSyncRequest(container_id=self.web, cmd=list(cmd),
                                                          timeout=timeout), timeout=timeout + 20)
        return r.exit_code, (r.stdout + r.stderr).decode(errors="replace")

    def wget(self, ip: str, port: int) -> str:
        # httpd may need a moment after StartContainer: retry briefly. (No
        # `-T`: Debian's static busybox wget crashes with it; ExecSync's
        # timeout bounds the call.)
        for _ in range(20):
            code, out = self.exec("wget", "-q", "-O", "-", f"http://{ip}:{port}/", timeout=5)
            if code == 0:
                return out
            time.sleep(0.25)
        raise AssertionError(f"{self.name}: wget {ip}:{port} failed: {out}")

    def stop(self) -> None:
        pb = self.node.ctd.pb
        if self.web:
            self.node.ctd.cri.StopContainer(pb.StopContainerRequest(container_id=self.web,
                                                                    timeout=2), timeout=60)
            self.node.ctd.cri.RemoveContainer(pb.RemoveContainerRequest(container_id=self.web),
                                              timeout=60)
        # kubelet stops a sandbox more than once; each must succeed
        for _ in range(2):
            self.node.ctd.cri.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=self.id),
                                             timeout=120)
        self.node.ctd.cri.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=self.id),
                                           timeout=120)
        self.removed = True


def _link_state(ns_path: str) -> dict[str, dict]:
    with NetNS.open(ns_path) as ns, ns.enter(), IPRoute() as ipr:
        out = {}
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            info = link.get_attr("IFLA_LINKINFO")
            out[name] = {
                "index": link["index"],
                "up": bool(link["flags"] & 1),
                "kind": info.get_attr("IFLA_INFO_KIND") if info else None,
                "master": link.get_attr("IFLA_MASTER"),
                "addrs": [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=link["index"])],
            }
        return out


def _sysctl_in(ns_path: str, key: str) -> str:
    with NetNS.open(ns_path) as ns:
        return ns.run(lambda: open("/proc/sys/" + key.replace(".", "/")).read().strip())


def _tags_in_nft(ns_path: str) -> set[str]:
    tags: set[str] = set()
    for family, name in TABLES:
        table = nft_table(ns_path, family, name)
        if table is None:
            continue
        for set_name in [*table.sets, *table.maps]:
            tags.update(c for _v, _d, c in table.entries(set_name) if c)
    return tags


def _files(path: str) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(path):
        out += [os.path.relpath(os.path.join(dirpath, f), path) for f in files]
    return sorted(out)


def test_cri_pods_on_our_plugins(node):
    """The kubelet path: RunPodSandbox with a host port for two pods on
    bridge + host-local -> tuning -> portmap (eth0) and a macvlan network
    (eth1, max_conf_num 2); traffic pod to pod, host port from the node and
    from a client, the client to each pod's LAN address; stop twice, remove;
    nothing left."""
    a, b = Pod(node, "pod-a", 18080), Pod(node, "pod-b", 18081)
    pods = (a, b)
    node_ns = node.node_ns.path

    # addresses from our host-local: in the range, on disk in Go's format
    assert a.ip != b.ip
    ipam_dir = os.path.join(node.d, "ipam", "e2e")
    for p in pods:
        assert ipaddress.ip_address(p.ip) in SUBNET
        with open(os.path.join(ipam_dir, p.ip), "rb") as f:
            assert f.read() == f"{p.id}\r\neth0".encode()

    # the pods: eth0 with the address, lo up (CRI's own loopback call), tuning's sysctl
    for p in pods:
        links = _link_state(p.netns)
        assert p.ip in links["eth0"]["addrs"]
        assert links["lo"]["up"] and "127.0.0.1" in links["lo"]["addrs"]
        assert _sysctl_in(p.netns, SYSCTL) == "0"
    links = _link_state(node_ns)
    ports = [n for n, v in links.items()
             if v["kind"] == "veth" and v["master"] == links[BRIDGE]["index"]]
    assert len(ports) == 2

    # the second network: eth1, a macvlan holding a LAN address, reached by
    # the client directly (not through the node's host port)
    lan_ips = []
    for p in pods:
        eth1 = _link_state(p.netns)["eth1"]
        assert eth1["kind"] == "macvlan" and eth1["up"]
        (lan_ip,) = [a for a in eth1["addrs"] if ipaddress.ip_address(a).version == 4]
        assert LAN_RANGE[0] <= lan_ip <= LAN_RANGE[1]
        lan_ips.append(lan_ip)
        assert http_get(node.client_ns.path, lan_ip, 8080) == f"pod {p.name}\n"
    assert lan_ips[0] != lan_ips[1]

    # nftables: both pods' entries are tagged in the node
    tags = _tags_in_nft(node_ns)
    for p in pods:
        assert attachment_tag(p.id, "eth0") in tags

    # traffic: pod to pod, host port from the node, from a client, and hairpin
    assert a.wget(b.ip, 8080) == "pod pod-b\n"
    assert b.wget(a.ip, 8080) == "pod pod-a\n"
    assert http_get(node_ns, NODE_IP, 18080) == "pod pod-a\n"
    assert http_get(node.client_ns.path, NODE_IP, 18081) == "pod pod-b\n"
    assert http_get(node.client_ns.path, NODE_IP, 18080) == "pod pod-a\n"
    assert a.wget(NODE_IP, 18081) == "pod pod-b\n"

    for p in pods:
        p.stop()

    # nothing left: veths, address files, nftables entries, tuning state
    assert [n for n, v in _link_state(node_ns).items() if v["kind"] == "veth"] \
        == ["e2e-client", "e2e-lan"]
    for d in (ipam_dir, os.path.join(node.d, "ipam", "lan")):
        assert [f for f in _files(d) if not f.startswith(("last_reserved_ip", "lock"))
                and not f.startswith(".")] == []
    assert not (_tags_in_nft(node_ns) & {attachment_tag(p.id, "eth0") for p in pods})
    assert _files(os.path.join(node.d, "tuning")) == []

    # what containerd sent, as runtime-captures.md recorded it
    calls = node.calls()
    assert calls and all(c["exit"] == 0 for c in calls), \
        [(c["plugin"], c["command"], c["result"]) for c in calls if c["exit"]]
    for p in pods:
        mine = [c for c in calls if c["containerID"] == p.id]
        lo_adds = [c for c in mine if c["plugin"] == "loopback" and c["command"] == "ADD"]
        assert len(lo_adds) == 1
        assert lo_adds[0]["ifname"] == "lo" and lo_adds[0]["config"]["cniVersion"] == "0.3.1"
        pm_add = next(c for c in mine if c["plugin"] == "portmap" and c["command"] == "ADD")
        assert pm_add["config"]["runtimeConfig"]["portMappings"] == [
            {"HostPort": p.host_port, "ContainerPort": 8080, "Protocol": "tcp", "HostIP": ""}]
        assert "IgnoreUnknown=1" in pm_add["args"] and f"K8S_POD_NAME={p.name}" in pm_add["args"]
        assert {c["plugin"] for c in mine} >= {"loopback", "bridge", "host-local", "tuning",
                                               "portmap", "macvlan"}
        assert {c["ifname"] for c in mine if c["plugin"] == "macvlan"} == {"eth1"}
        dels = [c for c in mine if c["command"] == "DEL" and c["plugin"] == "bridge"]
        # StopPodSandbox (with the netns), again and RemovePodSandbox (netns gone)
        assert len(dels) >= 3 and dels[0]["netns"] != ""
        assert any(c["netns"] == "" for c in dels[1:])


def test_ctr_run_cni(node):
    """`ctr run --cni` reads the fixed /etc/cni/net.d and /opt/cni/bin (our
    bind mounts inside the node's mount namespace): the container gets an
    address from our plugins and everything is removed when it exits."""
    ns = "cniskel-e2e"
    node.ctd.import_image(node.image, namespace=ns)
    res = node.ctd.ctr(
        "run", "--cni", "--rm", "--snapshotter", "native",
        "--cgroup", f"{node.ctd.cgroup_parent}/ctr1", cn.IMAGE, "ctr1",
        "/bin/sh", "-c", "ip -o -4 addr show dev eth0; ip -o link show lo",
        namespace=ns, timeout=120)
    out = res.stdout
    addr = next(w for w in out.split() if w.startswith(str(SUBNET.network_address)[:-1]))
    assert ipaddress.ip_interface(addr).ip in SUBNET
    calls = [c for c in node.calls() if c["containerID"].endswith("ctr1")]
    assert {(c["plugin"], c["command"]) for c in calls} >= {
        ("bridge", "ADD"), ("host-local", "ADD"), ("tuning", "ADD"), ("portmap", "ADD"),
        ("bridge", "DEL"), ("host-local", "DEL"), ("portmap", "DEL")}
    assert all(c["exit"] == 0 for c in calls)
    assert calls[0]["netns"].startswith("/proc/") and calls[0]["netns"].endswith("/ns/net")
    assert calls[0]["path"].split(":")[0] == "/opt/cni/bin"
    # cleaned after the task exited: no veth, no address file, no tag
    assert [n for n, v in _link_state(node.node_ns.path).items() if v["kind"] == "veth"] \
        == ["e2e-client", "e2e-lan"]
    ipam_dir = os.path.join(node.d, "ipam", "e2e")
    assert [f for f in _files(ipam_dir) if not f.startswith(("last_reserved_ip", "lock"))
            and not f.startswith(".")] == []
    cid = calls[0]["containerID"]
    assert attachment_tag(cid, "eth0") not in _tags_in_nft(node.node_ns.path)

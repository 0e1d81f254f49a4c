"""The node image and its DaemonSet (issue 19), end to end without a registry.

image/build.sh (what `make image` runs) builds the OCI archive into pytest's
temp dir; a private containerd (`containerd_node`, in a node network
namespace made here) imports it, and the DaemonSet's pod runs through CRI as
kubelet would run deploy/daemonset.yaml (`image_node.DaemonSetPod`: host
network = the test's node namespace, host PID, the manifest's hostPaths,
capabilities and probes). The init container installs the launchers into the
node's bin dir; the worker answers `cni-skel worker --check` on the socket
in the shared host dir. Then kubelet's pod lifecycle runs through those
launchers (`--fallback none`: static, no Python on the node's side), served
by the worker container (`--mount-namespace own`); with the worker stopped
every call answers CNI error 11, and once it is back calls are served.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time

import containerd_node as cn
import image_node as inode
import pytest
import test_containerd as tc

from cni_skel.harness import create_netns, remove_netns

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")
PLUGINS = ("bandwidth", "bridge", "dhcp", "dummy", "firewall", "flannel", "host-device",
           "host-local", "ipvlan", "loopback", "macvlan", "portmap", "ptp", "sbr", "static",
           "tap", "tuning", "vlan", "vrf")
NET = "img-e2e"
SUBNET = "10.81.0.0/24"
SYSCTL = "net.ipv4.conf.eth0.send_redirects"


pytestmark = pytest.mark.root


@pytest.fixture(scope="module", autouse=True)
def _tools():
    missing = cn.missing_tools() + [t for t in inode.PACKAGES if not _which(t)]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: `make test` installs Debian's "
                    f"{' '.join(cn.PACKAGES + inode.PACKAGES)}")


def _which(tool: str) -> bool:
    return any(os.access(os.path.join(p, tool), os.X_OK)
               for p in os.environ.get("PATH", "/usr/bin").split(os.pathsep))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The image, built once for the module: (archive, name, work dir, seconds)."""
    d = tmp_path_factory.mktemp("image")
    archive, work = str(d / "cni-skel.tar"), str(d / "work")
    t0 = time.monotonic()
    # -k keeps the work dir: the launchers are compared with what lands on the node
    name, log = inode.build_image(archive, work, keep=True)
    seconds = time.monotonic() - t0
    print(f"\nimage build {seconds:.0f} s:\n{log}")
    yield archive, name, work, seconds
    subprocess.run(["rm", "-rf", work], check=False)


class _NodeRef:
    """What test_containerd.Pod reads of its node."""

    def __init__(self, ctd, d: str) -> None:
        self.ctd, self.d, self.pods = ctd, d, []


@pytest.fixture
def node(tmp_path, built):
    """containerd in a node namespace with our image imported, the bin dir
    holding a stand-in for a Go plugin and an unrelated plugin, and the
    DaemonSet's pod sandbox running (no containers yet)."""
    archive, name, _work, _s = built
    d = str(tmp_path)
    conf_dir = os.path.join(d, "net.d")
    os.makedirs(conf_dir)
    with open(os.path.join(conf_dir, "10-img.conflist"), "w") as f:
        json.dump(conflist(), f)
    netns = create_netns("cnsk-img")
    # CRI's bin_dir is the node's /opt/cni/bin, as on a node (CNI_PATH is what
    # the worker resolves delegates in): inside containerd's mount namespace
    # it is an overlay whose writes land in the test's directory.
    ctd = cn.ContainerdNode(os.path.join(d, "ctd"), netns.path, conf_dir, "/opt/cni/bin",
                            env={"CNI_SKEL_WORKER_REQUIRED": "1"})
    pod = None
    try:
        ctd.start()
        bin_dir = f"/proc/{ctd.pid}/root/opt/cni/bin"
        for fname, body in (("bridge", b"#!/bin/sh\necho go bridge\n"),
                            ("whereabouts", b"a third-party plugin\n")):
            with open(os.path.join(bin_dir, fname), "wb") as f:
                f.write(body)
            os.chmod(os.path.join(bin_dir, fname), 0o755)
        ctd.import_image(cn.build_image(os.path.join(d, "busybox-oci.tar")))
        ctd.import_image(archive)
        ds = inode.daemonset()
        for c in ds["spec"]["template"]["spec"]["containers"] + \
                ds["spec"]["template"]["spec"]["initContainers"]:
            assert c["image"] == name, (c["image"], name)
        pod = inode.DaemonSetPod(ctd, ds, name)
        pod.run_sandbox()
        pod.bin_dir, pod.ref = bin_dir, _NodeRef(ctd, d)
        yield pod
    finally:
        if pod is not None:
            for p in pod.ref.pods if hasattr(pod, "ref") else []:
                if not p.removed:
                    with contextlib.suppress(Exception):
                        p.stop()
            with contextlib.suppress(Exception):
                pod.remove()
        ctd.stop()
        remove_netns(netns)
        assert not ctd.processes(), "processes of the node survived containerd"
        assert not ctd.remove_cgroups(), "cgroups left behind"


def conflist() -> dict:
    """Default data dirs: the DaemonSet's hostPaths are where they land."""
    return {"cniVersion": "1.0.0", "name": NET, "plugins": [
        {"type": "bridge", "bridge": "imgbr0", "isGateway": True, "ipMasq": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]],
                  "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "tuning", "sysctl": {SYSCTL: "0"}},
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True}]}


def _spec(pod) -> dict:
    return pod.spec


def _worker(pod) -> dict:
    return next(c for c in pod.spec["containers"] if c["name"] == "worker")


def _worker_args(pod) -> list[str]:
    """The manifest's args for the worker."""
    return list(_worker(pod).get("args", []))


def _install(pod) -> str:
    init = pod.spec["initContainers"][0]
    cid = pod.start(init)
    assert pod.wait_exit(cid) == 0, pod.log(init["name"])
    return pod.log(init["name"])


def _start_worker(pod) -> str:
    w = _worker(pod)
    cid = pod.start(w, args=_worker_args(pod))
    pod.wait_ready(w)
    return cid


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _call(pod, plugin: str, command: str, netns: str, conf: dict,
          cid: str = "img-direct") -> tuple[int, dict | None, str]:
    """Run launcher ``plugin`` as the runtime does: in containerd's mount and
    network namespaces (the node's), root with every capability it holds."""
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns,
           "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin", "PATH": "/usr/bin:/bin",
           "CNI_SKEL_WORKER_REQUIRED": "1"}
    res = subprocess.run(["nsenter", f"--target={pod.node.pid}", "--mount", "--net", "--",
                          f"/opt/cni/bin/{plugin}"], input=json.dumps(conf).encode(),
                         env=env, capture_output=True, timeout=60)
    out = res.stdout.decode(errors="replace")
    try:
        return res.returncode, json.loads(out), res.stderr.decode(errors="replace")
    except ValueError:
        return res.returncode, None, out + res.stderr.decode(errors="replace")


# -- the image and the DaemonSet's pod ----------------------------------------------

def test_image_archive(built):
    """An OCI archive (what `ctr image import` and `podman load` read) with
    one layer: the worker entrypoint, the launchers, the init step."""
    archive, name, work, seconds = built
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert "oci-layout" in names and "index.json" in names
        index = json.load(tar.extractfile("index.json"))
        manifest = json.load(tar.extractfile(
            "blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]))
        config = json.load(tar.extractfile(
            "blobs/sha256/" + manifest["config"]["digest"].split(":")[1]))
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == name
    assert config["config"]["Entrypoint"] == ["/usr/local/bin/cni-skel", "worker"]
    assert len(manifest["layers"]) == 1
    with tarfile.open(os.path.join(work, "rootfs.tar")) as root:
        files = {m.name.lstrip("./"): m for m in root.getmembers()}
    for plugin in PLUGINS:
        m = files[f"usr/lib/cni-skel/bin/{plugin}"]
        assert m.mode & 0o777 == 0o755
    for f in ("usr/lib/cni-skel/install-launchers",
              "usr/local/bin/cni-skel", "usr/bin/python3"):
        assert f in files, f
    size = os.path.getsize(archive) / 1e6
    unpacked = sum(m.size for m in files.values()) / 1e6
    print(f"\n{name}: {size:.0f} MB archive, {unpacked:.0f} MB unpacked, built in {seconds:.0f} s")


def test_daemonset_pod(node):
    """The DaemonSet's pod as kubelet runs it: the init step replaces same-named
    plugins atomically and leaves others alone; the worker runs with host
    network (the test's node namespace), host PID and exactly the manifest's
    capabilities, and answers its probes and `cni-skel worker --check` on the
    socket in the shared host dir."""
    pod = node
    log = _install(pod)
    for plugin in PLUGINS:
        path = os.path.join(pod.bin_dir, plugin)
        assert f"installed /host/opt/cni/bin/{plugin}" in log, log
        assert os.stat(path).st_mode & 0o777 == 0o755
        with open(path, "rb") as f:
            assert f.read(4) == b"\x7fELF"  # the Go stand-in "bridge" was replaced
    assert f"install-launchers: {len(PLUGINS)} launchers" in log
    with open(os.path.join(pod.bin_dir, "whereabouts"), "rb") as f:
        assert f.read() == b"a third-party plugin\n"  # not ours: untouched
    assert not [f for f in os.listdir(pod.bin_dir) if "cni-skel-tmp" in f]  # no temp files

    # a second run (a DaemonSet update) replaces its own files in place
    first = {p: os.stat(os.path.join(pod.bin_dir, p)).st_ino for p in PLUGINS}
    _install(pod)
    assert all(os.stat(os.path.join(pod.bin_dir, p)).st_ino != first[p] for p in PLUGINS)

    cid = _start_worker(pod)
    w = _worker(pod)
    pid = pod.pid(cid)
    want = {c.upper() for c in w["securityContext"]["capabilities"]["add"]}
    assert inode.caps_of(pid) == want and inode.caps_of(pid, "CapBnd") == want
    assert os.readlink(f"/proc/{pid}/ns/net") == os.readlink(f"/proc/{pod.node.pid}/ns/net")
    assert os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink(f"/proc/{pod.node.pid}/ns/mnt")
    for probe in ("livenessProbe", "readinessProbe"):
        code, out = pod.probe(w, probe)
        assert code == 0 and ": ok" in out, out
    # the worker (--mount-namespace own) made /proc/sys writable in its container only
    code, out = pod.exec(cid, ["sh", "-c", "test -w /proc/sys/net/core/somaxconn && echo rw"])
    assert out.strip() == "rw", out
    sock = pod.host_path("/run/cni-skel/worker.sock")
    assert os.stat(sock).st_mode & 0o777 == 0o600
    res = subprocess.run([CLI, "worker", "--check", "--socket", sock], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "listening on /run/cni-skel/worker.sock" in pod.log("worker")

    # SIGTERM (StopContainer with the grace period) ends it cleanly, within it
    t0 = time.monotonic()
    pod.stop("worker")
    assert time.monotonic() - t0 < w.get("terminationGracePeriodSeconds", 45)
    assert not os.path.exists(sock)


# -- the pod lifecycle ------------------------------------------------------------------

def test_pod_lifecycle_through_image(node):
    """kubelet's pod lifecycle on the launchers the init step installed, served
    by the worker container; no Python anywhere on the node's side: with the
    worker stopped every call answers CNI error 11, and once it is back calls
    are served again."""
    pod = node
    _install(pod)
    _start_worker(pod)

    # the launchers alone, in an empty root: static, VERSION answered natively
    # and, with no worker, code 11 -- no interpreter is reachable there
    empty = os.path.join(pod.node.d, "empty-root")
    os.makedirs(empty)
    subprocess.run(["cp", os.path.join(pod.bin_dir, "loopback"), empty], check=True)
    res = subprocess.run(["/usr/sbin/chroot", empty, "/loopback"], input=b"", capture_output=True,
                         env={"CNI_COMMAND": "VERSION"}, timeout=30)
    assert res.returncode == 0 and "supportedVersions" in json.loads(res.stdout)

    a = tc.Pod(pod.ref, "img-a", 18180)
    assert a.ip.startswith(SUBNET.rsplit(".", 2)[0])
    with open(pod.host_path(f"/var/lib/cni/networks/{NET}/{a.ip}"), "rb") as f:
        assert f.read() == f"{a.id}\r\neth0".encode()
    assert tc._sysctl_in(a.netns, SYSCTL) == "0"
    assert os.listdir(pod.host_path("/run/cni/tuning"))
    for _ in range(40):  # httpd may need a moment after StartContainer
        with contextlib.suppress(ConnectionRefusedError):
            assert tc.http_get(pod.node.netns, a.ip, 8080) == "pod img-a\n"
            break
        time.sleep(0.25)
    else:
        raise AssertionError(f"no HTTP answer from {a.ip}:8080 seen from the node")

    # the worker goes away mid-run: every call answers 11 on stdout, non-zero
    pod.stop("worker")
    # a namespace of the node's own (created in containerd's mount namespace,
    # where the launchers open CNI_NETNS)
    probe = f"cnsk-imgq-{os.getpid()}"
    pod.nsenter("ip", "netns", "add", probe)
    probe_netns = type("NS", (), {"path": f"/run/netns/{probe}"})
    try:
        lo = {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}
        code, answer, text = _call(pod, "loopback", "ADD", probe_netns.path, lo)
        assert code != 0 and answer and answer["code"] == 11, text
        code, answer, text = _call(pod, "bridge", "DEL", probe_netns.path,
                                   conflist()["plugins"][0] | {"cniVersion": "1.0.0",
                                                               "name": NET})
        assert code != 0 and answer and answer["code"] == 11, text
        res = subprocess.run(["/usr/sbin/chroot", empty, "/loopback"],
                             input=json.dumps(lo).encode(), capture_output=True, timeout=30,
                             env={"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "x",
                                  "CNI_NETNS": "/proc/1/ns/net", "CNI_IFNAME": "lo",
                                  "CNI_PATH": "/"})
        assert res.returncode != 0 and json.loads(res.stdout)["code"] == 11

        # back again: served
        _start_worker(pod)
        code, answer, text = _call(pod, "loopback", "ADD", probe_netns.path, lo)
        assert code == 0 and answer and "cniVersion" in answer, (answer, text)
        code, answer, text = _call(pod, "loopback", "DEL", probe_netns.path, lo)
        assert code == 0, (answer, text)
    finally:
        pod.nsenter("ip", "netns", "del", probe, check=False)

    b = tc.Pod(pod.ref, "img-b", 18181)
    assert b.ip != a.ip
    for p in (a, b):
        p.stop()
    left = [f for f in os.listdir(pod.host_path(f"/var/lib/cni/networks/{NET}"))
            if not f.startswith(("last_reserved_ip", "lock", "."))]
    assert left == []
    assert os.listdir(pod.host_path("/run/cni/tuning")) == []
    served = pod.log("worker")
    # (the restarted worker served pod b: one log line per call)
    assert any("ADD" in line and "bridge" in line.lower() and ("exit=0" in line or "exit 0" in line)
               for line in served.splitlines()), served

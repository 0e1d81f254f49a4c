"""A throw-away containerd "node" for the end-to-end tests.

containerd (Debian's 1.6) runs inside a network namespace made by the test
and inside a private mount namespace, so nothing it or the plugins write
reaches the machine's own network namespace or its fixed paths:

- a fresh sysfs for the node namespace (what `ip netns exec` does), with the
  host's cgroup tree moved back under it (runc needs it);
- overlays over /etc, /opt, /var and /run whose upper layers live in the
  test's directory: containerd's shim sockets (/run/containerd/s), libcni's
  cache (/var/lib/cni), `ctr run --cni`'s fixed /etc/cni/net.d and
  /opt/cni/bin all land there and vanish with the namespace;
- /etc/cni/net.d and /opt/cni/bin are the test's conflist dir and our
  installed plugins (bind mounts), for `ctr run --cni`.

The CRI client speaks runtime.v1 over containerd's socket through grpc and
`cri/cri_subset.proto` (the messages the test needs), the way kubelet does.
No registry is reachable: the image is an OCI archive built here from
Debian's busybox-static and imported with `ctr image import`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGE = "docker.io/library/cni-skel-busybox:e2e"
BUSYBOX = "/bin/busybox"
#: Debian packages the end-to-end tests need (installed by `make test`).
PACKAGES = ("containerd", "runc", "busybox-static")
OVERLAID = ("/etc", "/opt", "/var", "/run")
#: busybox applets the image links (the pods' tools).
APPLETS = ("sh", "sleep", "httpd", "wget", "cat", "echo", "hostname", "ip", "nc", "ls")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(busybox: str) -> bytes:
    """An uncompressed rootfs tar: busybox, its applet links, empty dirs."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        for d in ("bin", "dev", "etc", "proc", "sys", "run", "var", "www"):
            add_dir(d)
        add_dir("tmp", 0o1777)
        with open(busybox, "rb") as f:
            data = f.read()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        page = b"cni-skel e2e\n"
        info = tarfile.TarInfo("www/index.html")
        info.size, info.mode = len(page), 0o644
        tar.addfile(info, io.BytesIO(page))
    return buf.getvalue()


def build_image(path: str, name: str = IMAGE, busybox: str = BUSYBOX) -> str:
    """Write an OCI image-layout archive (what `ctr image import` reads) of a
    one-layer busybox image called ``name``; its default command sleeps, so
    it also serves as the CRI sandbox ("pause") image. Returns ``path``."""
    layer = _layer(busybox)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["/bin/sleep", "2147483647"], "Env": ["PATH=/bin"],
                   "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _digest(layer), "size": len(layer)}],
    }, sort_keys=True).encode()
    index = json.dumps({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": _digest(manifest), "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
        }],
    }, sort_keys=True).encode()
    with tarfile.open(path, "w") as tar:
        def put(arcname: str, data: bytes) -> None:
            info = tarfile.TarInfo(arcname)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))

        put("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        put("index.json", index)
        for blob in (layer, config, manifest):
            put(f"blobs/sha256/{_digest(blob)[7:]}", blob)
    return path


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def containerd_config(d: str, conf_dir: str, bin_dir: str) -> str:
    """containerd's config.toml (version 2) for a private node rooted at ``d``.

    CRI facts for this machine: root lacks CAP_SYS_RESOURCE, so pods may not
    lower their oom_score_adj (``restrict_oom_score_adj``); the native
    snapshotter avoids overlay-on-overlay; pod netns files live under the
    private state dir (as in runtime-captures.md)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join([
        "version = 2",
        f"root = {_toml_str(os.path.join(d, 'root'))}",
        f"state = {_toml_str(os.path.join(d, 'state'))}",
        "disabled_plugins = [\"io.containerd.snapshotter.v1.aufs\", "
        "\"io.containerd.snapshotter.v1.btrfs\", \"io.containerd.snapshotter.v1.zfs\", "
        "\"io.containerd.snapshotter.v1.devmapper\", \"io.containerd.tracing.processor.v1.otlp\", "
        "\"io.containerd.internal.v1.tracing\"]",
        "[grpc]",
        f"  address = {_toml_str(os.path.join(d, 'containerd.sock'))}",
        "[ttrpc]",
        f"  address = {_toml_str(os.path.join(d, 'containerd.sock.ttrpc'))}",
        "[debug]",
        "  level = \"info\"",
        '[plugins."io.containerd.internal.v1.opt"]',
        f"  path = {_toml_str(os.path.join(d, 'opt'))}",
        f"[{cri}]",
        f"  sandbox_image = {_toml_str(IMAGE)}",
        "  restrict_oom_score_adj = true",
        "  disable_apparmor = true",
        "  netns_mounts_under_state_dir = true",
        "  stream_server_address = \"127.0.0.1\"",
        f"[{cri}.containerd]",
        "  snapshotter = \"native\"",
        "  default_runtime_name = \"runc\"",
        f"[{cri}.containerd.runtimes.runc]",
        "  runtime_type = \"io.containerd.runc.v2\"",
        f"[{cri}.cni]",
        f"  bin_dir = {_toml_str(bin_dir)}",
        f"  conf_dir = {_toml_str(conf_dir)}",
        # a pod joins each of the first two networks (eth0, eth1), as with Multus'
        # secondary networks; `ctr run --cni` still takes the first one only
        "  max_conf_num = 2",
        "",
    ])


def _mount_script(d: str, conf_dir: str, bin_dir: str) -> str:
    """Shell run inside the new mount namespace before exec'ing containerd."""
    lines = ["set -eu",
             f"cg={d}/mnt/cgroup",
             'mkdir -p "$cg"',
             # keep the host's cgroup tree across the fresh sysfs (runc needs it)
             'mount --rbind /sys/fs/cgroup "$cg"',
             "mount -t sysfs sysfs /sys",
             'mount --move "$cg" /sys/fs/cgroup']
    for top in OVERLAID:
        key = top.strip("/")
        up, work = f"{d}/mnt/{key}-upper", f"{d}/mnt/{key}-work"
        lines += [f"mkdir -p {up} {work}",
                  f"mount -t overlay overlay -o lowerdir={top},upperdir={up},workdir={work} {top}"]
    lines += ["mkdir -p /etc/cni/net.d /opt/cni/bin",
              f"mount --bind {conf_dir} /etc/cni/net.d",
              f"mount --bind {bin_dir} /opt/cni/bin",
              'exec "$@"']
    return "\n".join(lines)


@dataclass
class ContainerdNode:
    """containerd in node namespace ``netns`` (a path under /run/netns),
    rooted at directory ``d``. ``env``: extra environment for containerd,
    inherited by every plugin it runs."""

    d: str
    netns: str
    conf_dir: str
    bin_dir: str
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    #: containerd's private mount namespace (``mnt:[inode]``), once started
    mntns: str | None = None
    _cri: Any = None

    @property
    def socket(self) -> str:
        return os.path.join(self.d, "containerd.sock")

    @property
    def log_path(self) -> str:
        return os.path.join(self.d, "containerd.log")

    def start(self, timeout: float = 30.0) -> None:
        os.makedirs(os.path.join(self.d, "mnt"), exist_ok=True)
        config = os.path.join(self.d, "config.toml")
        with open(config, "w") as f:
            f.write(containerd_config(self.d, self.conf_dir, self.bin_dir))
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               **self.env}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["nsenter", f"--net={self.netns}", "--", "unshare", "--mount", "--propagation",
                 "private", "--", "sh", "-c", _mount_script(self.d, self.conf_dir, self.bin_dir),
                 "containerd-node", "containerd", "--config", config],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited {self.proc.returncode}:\n{self.log()}")
            if os.path.exists(self.socket):
                try:
                    self.cri.Version(self.pb.VersionRequest(version="v1"), timeout=2)
                    self.mntns = os.readlink(f"/proc/{self.pid}/ns/mnt")
                    return
                except Exception:  # not serving yet
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"containerd did not answer in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        with contextlib.suppress(OSError), open(self.log_path, errors="replace") as f:
            return f.read()[-6000:]
        return ""

    @property
    def pid(self) -> int:
        """containerd's own pid (the sh in front exec'd it)."""
        assert self.proc is not None
        return self.proc.pid

    # -- CRI ---------------------------------------------------------------

    @property
    def pb(self) -> Any:
        return _protos()[0]

    @property
    def cri(self) -> Any:
        if self._cri is None:
            channel = grpc.insecure_channel(f"unix://{self.socket}")
            self._cri = _protos()[1].RuntimeServiceStub(channel)
        return self._cri

    # -- ctr ---------------------------------------------------------------

    def ctr(self, *args: str, namespace: str = "k8s.io", timeout: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run ``ctr`` inside containerd's namespaces (its mount namespace
        holds /etc/cni/net.d and /opt/cni/bin for `ctr run --cni`)."""
        cmd = ["nsenter", f"--target={self.pid}", "--mount", "--net", "--",
               "ctr", "--address", self.socket, "--namespace", namespace, *args]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **self.env}
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {res.returncode}\n{res.stdout}{res.stderr}")
        return res

    def import_image(self, archive: str, namespace: str = "k8s.io") -> None:
        self.ctr("images", "import", "--snapshotter", "native", archive, namespace=namespace)

    # -- teardown ----------------------------------------------------------

    def processes(self) -> list[int]:
        """Processes started for this node (containerd, shims, containers):
        everything whose command line or mount namespace is ours."""
        mine: list[int] = []
        mntns = self.mntns
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
                ns = os.readlink(f"/proc/{pid}/ns/mnt")
            except OSError:
                continue
            if self.d.encode() in cmdline or (mntns is not None and ns == mntns) \
                    or self._in_our_cgroup(pid):
                mine.append(pid)
        return mine

    @property
    def cgroup_parent(self) -> str:
        """The cgroup every pod and container of this node is put under
        (CRI ``linux.cgroup_parent``, ``ctr run --cgroup``): lets teardown find
        container processes and remove the cgroups runc made."""
        return f"/cni-skel-e2e-{os.getpid()}"

    def _in_our_cgroup(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                return f"{self.cgroup_parent}/" in f.read()
        except OSError:
            return False

    def remove_cgroups(self) -> list[str]:
        """rmdir the cgroups under `cgroup_parent` in every hierarchy, deepest
        first; returns those that could not be removed."""
        stuck = []
        root = "/sys/fs/cgroup"
        for hierarchy in [root, *(os.path.join(root, h) for h in os.listdir(root))]:
            top = hierarchy + self.cgroup_parent
            if not os.path.isdir(top):
                continue
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    stuck.append(dirpath)
        return stuck

    def stop(self, timeout: float = 20.0) -> list[int]:
        """Stop containerd, then kill whatever of ours is left (shims,
        containers). Returns the pids that had to be killed besides
        containerd (should be none after a clean test)."""
        # A shim exits on its own shortly after its sandbox is removed: give
        # it a moment before counting it as left over.
        grace = time.monotonic() + 5.0
        while True:
            leftovers = [p for p in self.processes() if self.proc is None or p != self.pid]
            if not leftovers or time.monotonic() > grace:
                break
            time.sleep(0.1)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        # a cgroup stays busy until its last (dying) task is reaped
        while self.remove_cgroups() and time.monotonic() < deadline:
            time.sleep(0.1)
        return leftovers


_PROTOS: tuple[Any, Any] | None = None


def _protos() -> tuple[Any, Any]:
    global _PROTOS
    if _PROTOS is None:
        cri_dir = os.path.join(HERE, "cri")
        if cri_dir not in sys.path:
            sys.path.insert(0, cri_dir)
        _PROTOS = grpc.protos_and_services("cri_subset.proto")
    return _PROTOS


@contextlib.contextmanager
def node(d: str, netns: str, conf_dir: str, bin_dir: str,
         env: dict[str, str] | None = None) -> Iterator[ContainerdNode]:
    """A started `ContainerdNode`; stopped and cleaned however the body ends."""
    n = ContainerdNode(d, netns, conf_dir, bin_dir, env=dict(env or {}))
    try:
        n.start()
        yield n
    finally:
        n.stop()


def missing_tools() -> list[str]:
    return [t for t in ("containerd", "ctr", "runc", "containerd-shim-runc-v2", "nsenter",
                        "unshare") if shutil.which(t) is None] + \
        ([BUSYBOX] if not os.path.exists(BUSYBOX) else [])

"""The node image's DaemonSet, run the way kubelet runs it (tests/test_image.py).

- `load_yaml`: deploy/*.yaml (PyYAML), so the test runs exactly what the
  manifest says.
- `DaemonSetPod`: the DaemonSet's pod on a `containerd_node.ContainerdNode`
  through CRI, translated as kubelet translates a pod spec: hostNetwork /
  hostPID -> NODE namespaces, hostPath volumes (DirectoryOrCreate made first,
  HostToContainer -> rslave on a shared source), securityContext ->
  capabilities, privileged, seccomp and AppArmor, and kubelet's default masked
  and read-only /proc paths for an unprivileged container. Host paths resolve
  in containerd's mount namespace, where /run, /var, /etc and /opt are
  overlays in the test's directory and /opt/cni/bin is the node's bin dir:
  the manifest's own paths land in temp dirs.

The CRI messages the containerd test's subset lacks (mounts, security
contexts, namespace options) are defined here in a package of their own
(``cniskel_image.cri``, the CRI's field numbers) and sent on the CRI's
method paths, so both definitions load in one process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import grpc
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEPLOY = os.path.join(REPO, "deploy")
BUILD = os.path.join(REPO, "image", "build.sh")
#: kubelet's defaults for a container with procMount Default, unprivileged
#: (pkg/securitycontext/util.go).
MASKED_PATHS = ["/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
                "/sys/firmware", "/sys/devices/virtual/powercap"]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
#: Debian packages `make image` and this test need besides the end-to-end test's.
PACKAGES = ("mmdebstrap", "buildah")


def load_yaml(path: str) -> Any:
    """One YAML document (deploy/*.yaml), as kubectl reads it."""
    with open(path) as f:
        return yaml.safe_load(f)


def daemonset() -> dict:
    """deploy/daemonset.yaml, checked to be listed in the kustomization."""
    kust = load_yaml(os.path.join(DEPLOY, "kustomization.yaml"))
    assert "daemonset.yaml" in kust["resources"], kust
    return load_yaml(os.path.join(DEPLOY, "daemonset.yaml"))


# -- building the image ----------------------------------------------------------

def build_image(out: str, work: str | None = None, env: dict[str, str] | None = None,
                keep: bool = False, timeout: float = 900) -> tuple[str, str]:
    """Run image/build.sh (what `make image` runs) into ``out`` (``keep``:
    leave the work dir); returns (image name, build output)."""
    cmd = [BUILD, "-o", out] + (["-w", work] if work else []) + (["-k"] if keep else [])
    full_env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if res.returncode != 0:
        raise RuntimeError(f"image/build.sh failed ({res.returncode}):\n{res.stdout}\n"
                           f"{res.stderr[-6000:]}")
    m = re.search(r"build\.sh: (\S+) -> ", res.stdout)
    assert m, res.stdout
    return m.group(1), res.stdout + res.stderr


# -- CRI with the fields kubelet sets for this pod -----------------------------------

_PROTO = """
syntax = "proto3";
package cniskel_image.cri;
enum NamespaceMode { POD = 0; CONTAINER = 1; NODE = 2; TARGET = 3; }
message NamespaceOption { NamespaceMode network = 1; NamespaceMode pid = 2;
                          NamespaceMode ipc = 3; }
message SecurityProfile {
    enum ProfileType { RuntimeDefault = 0; Unconfined = 1; Localhost = 2; }
    ProfileType profile_type = 1; string localhost_ref = 2; }
message LinuxSandboxSecurityContext { NamespaceOption namespace_options = 1; bool privileged = 6;
    string seccomp_profile_path = 7; SecurityProfile seccomp = 9; }
message LinuxPodSandboxConfig { string cgroup_parent = 1;
                                LinuxSandboxSecurityContext security_context = 2; }
message PodSandboxMetadata { string name = 1; string uid = 2; string namespace = 3;
                             uint32 attempt = 4; }
message PodSandboxConfig { PodSandboxMetadata metadata = 1; string hostname = 2;
    string log_directory = 3; map<string, string> labels = 6;
    map<string, string> annotations = 7; LinuxPodSandboxConfig linux = 8; }
message RunPodSandboxRequest { PodSandboxConfig config = 1; string runtime_handler = 2; }
message RunPodSandboxResponse { string pod_sandbox_id = 1; }
enum MountPropagation { PROPAGATION_PRIVATE = 0; PROPAGATION_HOST_TO_CONTAINER = 1;
                        PROPAGATION_BIDIRECTIONAL = 2; }
message Mount { string container_path = 1; string host_path = 2; bool readonly = 3;
                bool selinux_relabel = 4; MountPropagation propagation = 5; }
message Capability { repeated string add_capabilities = 1; repeated string drop_capabilities = 2; }
message LinuxContainerSecurityContext { Capability capabilities = 1; bool privileged = 2;
    NamespaceOption namespace_options = 3; bool readonly_rootfs = 7;
    string apparmor_profile = 9; string seccomp_profile_path = 10; bool no_new_privs = 11;
    repeated string masked_paths = 13; repeated string readonly_paths = 14;
    SecurityProfile seccomp = 15; SecurityProfile apparmor = 16; }
message LinuxContainerConfig { LinuxContainerSecurityContext security_context = 2; }
message ImageSpec { string image = 1; }
message ContainerMetadata { string name = 1; uint32 attempt = 2; }
message ContainerConfig { ContainerMetadata metadata = 1; ImageSpec image = 2;
    repeated string command = 3; repeated string args = 4; string working_dir = 5;
    repeated Mount mounts = 7; map<string, string> labels = 9;
    map<string, string> annotations = 10; string log_path = 11; LinuxContainerConfig linux = 15; }
message CreateContainerRequest { string pod_sandbox_id = 1; ContainerConfig config = 2;
                                 PodSandboxConfig sandbox_config = 3; }
message CreateContainerResponse { string container_id = 1; }
"""
_PB: Any = None


def pb() -> Any:
    global _PB
    if _PB is None:
        d = tempfile.mkdtemp(prefix="cniskel-image-proto-")
        with open(os.path.join(d, "cniskel_image_cri.proto"), "w") as f:
            f.write(_PROTO)
        sys.path.insert(0, d)
        try:
            _PB = grpc.protos("cniskel_image_cri.proto")
        finally:
            sys.path.remove(d)
    return _PB


def _profile(spec: dict | None, kind: str) -> tuple[Any, str]:
    """(SecurityProfile, legacy path string) for a seccompProfile /
    appArmorProfile; kubelet's default when absent is unconfined."""
    p = pb()
    kind_ = (spec or {}).get("type", "Unconfined")
    profile = p.SecurityProfile(profile_type=getattr(p.SecurityProfile, kind_))
    legacy = {"RuntimeDefault": "runtime/default", "Unconfined": "unconfined"}[kind_]
    if kind == "apparmor" and legacy == "unconfined":
        legacy = "unconfined"
    return profile, legacy


class DaemonSetPod:
    """The DaemonSet's pod on ``node`` (a started ContainerdNode), through CRI."""

    def __init__(self, node: Any, ds: dict, image: str, name: str = "cni-skel-node") -> None:
        self.node, self.ds, self.image = node, ds, image
        self.spec = ds["spec"]["template"]["spec"]
        self.name = name
        self.sandbox_id = ""
        self.logs = os.path.join(node.d, "pod-logs", name)
        os.makedirs(self.logs, exist_ok=True)
        self.attempts: dict[str, int] = {}
        self.containers: dict[str, str] = {}  # name -> running container id
        p = pb()
        ch = grpc.insecure_channel(f"unix://{node.socket}")
        self._run = ch.unary_unary("/runtime.v1.RuntimeService/RunPodSandbox",
                                   request_serializer=p.RunPodSandboxRequest.SerializeToString,
                                   response_deserializer=p.RunPodSandboxResponse.FromString)
        self._create = ch.unary_unary(
            "/runtime.v1.RuntimeService/CreateContainer",
            request_serializer=p.CreateContainerRequest.SerializeToString,
            response_deserializer=p.CreateContainerResponse.FromString)

    # -- kubelet's side ------------------------------------------------------------

    def nsenter(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        """A command in containerd's mount and network namespaces (the node's)."""
        res = subprocess.run(["nsenter", f"--target={self.node.pid}", "--mount", "--net", "--",
                              *cmd], capture_output=True, text=True, timeout=60)
        if check and res.returncode:
            raise RuntimeError(f"{cmd}: {res.returncode} {res.stdout}{res.stderr}")
        return res

    def host_path(self, path: str) -> str:
        """A node path as the test sees it (through containerd's root)."""
        return f"/proc/{self.node.pid}/root{path}"

    def _namespaces(self) -> Any:
        p = pb()
        return p.NamespaceOption(network=p.NODE if self.spec.get("hostNetwork") else p.POD,
                                 pid=p.NODE if self.spec.get("hostPID") else p.CONTAINER,
                                 ipc=p.NODE if self.spec.get("hostIPC") else p.POD)

    def _prepare_volumes(self) -> None:
        for vol in self.spec.get("volumes", []):
            hp = vol.get("hostPath")
            if hp is None:
                raise AssertionError(f"volume kind not emulated: {vol}")
            if hp.get("type") == "DirectoryOrCreate":
                self.nsenter("mkdir", "-p", "-m", "755", hp["path"])
            propagated = any(m.get("mountPropagation") == "HostToContainer"
                             for c in self.spec["containers"] + self.spec.get("initContainers", [])
                             for m in c.get("volumeMounts", []) if m["name"] == vol["name"])
            if propagated:
                # rslave needs a shared (or slave) source mount: make it one,
                # and every mount of containerd's private namespace shared, as
                # / is on a systemd host (a host mount hidden under the /run
                # overlay carries the same path, and containerd may look at it)
                path = hp["path"]
                self.nsenter("sh", "-c", f"mount --bind {path} {path} && "
                             "mount --make-rshared /")

    @property
    def sandbox_config(self) -> Any:
        p = pb()
        return p.PodSandboxConfig(
            metadata=p.PodSandboxMetadata(name=self.name, uid=f"uid-{self.name}",
                                          namespace=self.ds["metadata"]["namespace"]),
            log_directory=self.logs,
            labels=self.ds["spec"]["template"]["metadata"]["labels"],
            linux=p.LinuxPodSandboxConfig(
                cgroup_parent=self.node.cgroup_parent,
                security_context=p.LinuxSandboxSecurityContext(
                    namespace_options=self._namespaces(), privileged=any(
                        (c.get("securityContext") or {}).get("privileged")
                        for c in self.spec["containers"] + self.spec.get("initContainers", [])),
                    seccomp_profile_path="unconfined",
                    seccomp=p.SecurityProfile(profile_type=p.SecurityProfile.Unconfined))))

    def run_sandbox(self) -> None:
        self._prepare_volumes()
        self.sandbox_id = self._run(pb().RunPodSandboxRequest(config=self.sandbox_config),
                                    timeout=120).pod_sandbox_id

    def container_config(self, c: dict, args: list[str] | None = None) -> Any:
        p = pb()
        vols = {v["name"]: v for v in self.spec.get("volumes", [])}
        mounts = []
        for m in c.get("volumeMounts", []):
            prop = {None: p.PROPAGATION_PRIVATE, "None": p.PROPAGATION_PRIVATE,
                    "HostToContainer": p.PROPAGATION_HOST_TO_CONTAINER,
                    "Bidirectional": p.PROPAGATION_BIDIRECTIONAL}[m.get("mountPropagation")]
            mounts.append(p.Mount(container_path=m["mountPath"],
                                  host_path=vols[m["name"]]["hostPath"]["path"],
                                  readonly=bool(m.get("readOnly")), propagation=prop))
        sc = c.get("securityContext") or {}
        caps = sc.get("capabilities") or {}
        seccomp, seccomp_legacy = _profile(sc.get("seccompProfile"), "seccomp")
        apparmor, apparmor_legacy = _profile(sc.get("appArmorProfile"), "apparmor")
        privileged = bool(sc.get("privileged"))
        attempt = self.attempts.get(c["name"], -1) + 1
        self.attempts[c["name"]] = attempt
        return p.ContainerConfig(
            metadata=p.ContainerMetadata(name=c["name"], attempt=attempt),
            image=p.ImageSpec(image=c["image"]), command=c.get("command", []),
            args=c.get("args", []) if args is None else args,
            mounts=mounts, log_path=f"{c['name']}/{attempt}.log",
            linux=p.LinuxContainerConfig(security_context=p.LinuxContainerSecurityContext(
                capabilities=p.Capability(add_capabilities=caps.get("add") or [],
                                          drop_capabilities=caps.get("drop") or []),
                privileged=privileged, namespace_options=self._namespaces(),
                readonly_rootfs=bool(sc.get("readOnlyRootFilesystem")),
                no_new_privs=sc.get("allowPrivilegeEscalation") is False,
                masked_paths=[] if privileged else MASKED_PATHS,
                readonly_paths=[] if privileged else READONLY_PATHS,
                seccomp=seccomp, seccomp_profile_path=seccomp_legacy,
                apparmor=apparmor, apparmor_profile=apparmor_legacy)))

    def start(self, c: dict, args: list[str] | None = None) -> str:
        cri, cpb = self.node.cri, self.node.pb
        cid = self._create(pb().CreateContainerRequest(
            pod_sandbox_id=self.sandbox_id, config=self.container_config(c, args),
            sandbox_config=self.sandbox_config), timeout=60).container_id
        cri.StartContainer(cpb.StartContainerRequest(container_id=cid), timeout=60)
        self.containers[c["name"]] = cid
        return cid

    def status(self, cid: str) -> Any:
        cpb = self.node.pb
        return self.node.cri.ContainerStatus(
            cpb.ContainerStatusRequest(container_id=cid, verbose=True), timeout=30)

    def pid(self, cid: str) -> int:
        return json.loads(self.status(cid).info["info"])["pid"]

    def wait_exit(self, cid: str, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status(cid).status
            if st.state == self.node.pb.CONTAINER_EXITED:
                return st.exit_code
            time.sleep(0.2)
        raise TimeoutError(f"container {cid} still running after {timeout}s")

    def log(self, name: str) -> str:
        path = os.path.join(self.logs, name, f"{self.attempts[name]}.log")
        try:
            with open(path, errors="replace") as f:
                # CRI log lines: "<time> <stream> <tag> <text>"
                return "".join(line.split(" ", 3)[3] if line.count(" ") >= 3 else line
                               for line in f)
        except FileNotFoundError:
            return ""

    def exec(self, cid: str, cmd: list[str], timeout: int = 10) -> tuple[int, str]:
        cpb = self.node.pb
        r = self.node.cri.ExecSync(cpb.ExecSyncRequest(container_id=cid, cmd=cmd,
                                                       timeout=timeout), timeout=timeout + 20)
        return r.exit_code, (r.stdout + r.stderr).decode(errors="replace")

    def probe(self, c: dict, kind: str = "readinessProbe") -> tuple[int, str]:
        probe = c[kind]
        return self.exec(self.containers[c["name"]], probe["exec"]["command"],
                         timeout=probe.get("timeoutSeconds", 1))

    def wait_ready(self, c: dict, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            st = self.status(self.containers[c["name"]]).status
            if st.state == self.node.pb.CONTAINER_EXITED:
                raise RuntimeError(f"{c['name']} exited {st.exit_code}:\n{self.log(c['name'])}")
            code, out = self.probe(c)
            if code == 0:
                return
            time.sleep(0.3)
        raise TimeoutError(f"{c['name']} not ready in {timeout}s: {out}\n{self.log(c['name'])}")

    def stop(self, name: str, timeout: int | None = None) -> None:
        """Stop and remove container ``name`` as kubelet does (grace period:
        terminationGracePeriodSeconds)."""
        cid = self.containers.pop(name)
        cpb, cri = self.node.pb, self.node.cri
        grace = self.spec.get("terminationGracePeriodSeconds", 30) if timeout is None else timeout
        cri.StopContainer(cpb.StopContainerRequest(container_id=cid, timeout=grace),
                          timeout=grace + 60)
        cri.RemoveContainer(cpb.RemoveContainerRequest(container_id=cid), timeout=60)

    def remove(self) -> None:
        for name in list(self.containers):
            with contextlib.suppress(grpc.RpcError):
                self.stop(name, timeout=5)
        if self.sandbox_id:
            cpb, cri = self.node.pb, self.node.cri
            cri.StopPodSandbox(cpb.StopPodSandboxRequest(pod_sandbox_id=self.sandbox_id),
                               timeout=120)
            cri.RemovePodSandbox(cpb.RemovePodSandboxRequest(pod_sandbox_id=self.sandbox_id),
                                 timeout=120)
            self.sandbox_id = ""


CAP_NAMES = ["CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID",
             "SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST",
             "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO",
             "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
             "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE",
             "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM",
             "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE"]


def caps_of(pid: int, field: str = "CapEff") -> set[str]:
    """Capability names in ``field`` of /proc/<pid>/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                mask = int(line.split()[1], 16)
                return {n for i, n in enumerate(CAP_NAMES) if mask >> i & 1}
    raise KeyError(field)

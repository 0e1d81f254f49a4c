"""Tests that need kernel features the host may lack, run in a VM that has them.

A test names what it needs: ``@pytest.mark.kernel("dummy", "ipvlan", "8021q",
"vrf", "bridge_vlan_filtering")`` (`FEATURES`). `KernelVM`, a pytest plugin
conftest.py registers, probes the host kernel once (`probe`: each link kind
created in a throwaway network namespace). A marked test whose features the
host has runs here as any other; the others are replaced by `VMItem`s. Once
collection is done it boots ONE qemu VM of Debian's own kernel (`start_vm`),
in the background: the host's tests run meanwhile, and the `VMItem`s, moved
to the end of the run, wait for it (`finish_vm`). The VM has this
machine's root over 9p, read-only, under a tmpfs overlay, no network.
It runs ``python -m pytest`` on all their node ids at once, with
`IN_VM_ENV` set (inside, tests run normally), and writes its JUnit XML to
a second, writable 9p share of a host temporary directory. Each `VMItem`
then reports the VM's outcome for its node id: a skip there, or no result
(a crash, the timeout), is a failure here.
"""

from __future__ import annotations

import contextlib
import gzip
import lzma
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from cni_skel.harness import create_netns, remove_netns
from cni_skel.netns import NetNS

#: Set (to "1") in the VM: marked tests run there, whatever the probe says.
IN_VM_ENV = "CNI_SKEL_IN_KERNEL_VM"
#: Seconds the whole VM run (boot and tests) may take before qemu is killed.
#: It runs beside the host's tests, so it takes longer than alone.
TIMEOUT_ENV = "CNI_SKEL_KERNEL_VM_TIMEOUT"
TIMEOUT = 45 * 60
#: qemu's priority beside the host's tests: they keep most of the CPU when
#: both want it; the VM takes what they leave (their waits, their I/O).
NICE = 5
#: The plugin modes (conftest's ``cni_mode``) a test runs in when it runs in
#: the VM: warm by default. Under emulation a one-shot call pays seconds of
#: Python start-up (two for a plugin with IPAM) and a warm one does not: the
#: one-shot items were five sixths of the VM's ~16 min. What differs
#: between the modes is the transport, not the plugin: the host runs every
#: other plugin in both. ``CNI_SKEL_KERNEL_VM_MODES=oneshot,warm`` (a comma list) runs
#: those; the other mode's items are deselected (not skipped).
VM_MODES_ENV = "CNI_SKEL_KERNEL_VM_MODES"
VM_MODES = ("warm",)
QEMU = "qemu-system-x86_64"
BUSYBOX = "/bin/busybox"
#: What the initramfs loads, in this order, to mount the host's root (the
#: rest, dummy, vrf and the like, the kernel loads from it on demand).
INITRD_MODULES = ("virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev",
                  "virtio_pci", "netfs", "fscache", "9pnet", "9pnet_virtio", "9p", "overlay")
#: The writable results share, inside the VM.
RESULTS = "/run/kernelvm"
DEPS = "run `make deps`: it installs qemu-system-x86, linux-image-amd64 and busybox-static"
TAIL_LINES = 60


# --------------------------------------------------------------------------
# what the kernel can do


def _veth(ipr: IPRoute, parent: int) -> bool:
    ipr.link("add", ifname="kp-veth2", kind="veth", peer="kp-veth3")
    return True


def _plain(kind: str) -> Callable[[IPRoute, int], bool]:
    def make(ipr: IPRoute, parent: int) -> bool:
        ipr.link("add", ifname=f"kp-{kind}"[:15], kind=kind)
        return True
    return make


def _macvlan(ipr: IPRoute, parent: int) -> bool:
    ipr.link("add", ifname="kp-macvlan", kind="macvlan", link=parent, macvlan_mode="bridge")
    return True


def _ipvlan(ipr: IPRoute, parent: int) -> bool:
    ipr.link("add", ifname="kp-ipvlan", kind="ipvlan", link=parent, ipvlan_mode=0)
    return True


def _vlan(ipr: IPRoute, parent: int) -> bool:
    ipr.link("add", ifname="kp-vlan", kind="vlan", link=parent, vlan_id=100)
    return True


def _vrf(ipr: IPRoute, parent: int) -> bool:
    ipr.link("add", ifname="kp-vrf", kind="vrf", vrf_table=100)
    return True


def _vxlan(ipr: IPRoute, parent: int) -> bool:
    ipr.link("add", ifname="kp-vxlan", kind="vxlan", vxlan_id=100, vxlan_link=parent)
    return True


def _bridge_vlan_filtering(ipr: IPRoute, parent: int) -> bool:
    ipr.link("add", ifname="kp-brvf", kind="bridge", br_vlan_filtering=1)
    (link,) = ipr.link("get", ifname="kp-brvf")
    return link.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA", "IFLA_BR_VLAN_FILTERING") == 1


#: Feature name -> a probe creating it (given a veth as the lower link);
#: the names ``@pytest.mark.kernel`` takes.
FEATURES: dict[str, Callable[[IPRoute, int], bool]] = {
    "veth": _veth,
    "bridge": _plain("bridge"),
    "ifb": _plain("ifb"),
    "dummy": _plain("dummy"),
    "macvlan": _macvlan,
    "ipvlan": _ipvlan,
    "8021q": _vlan,
    "vrf": _vrf,
    "vxlan": _vxlan,
    "bridge_vlan_filtering": _bridge_vlan_filtering,
}


def probe(features: Iterable[str]) -> dict[str, bool]:
    """Which of ``features`` (names in `FEATURES`) the running kernel has:
    each is created in a throwaway network namespace (``cnsk-probe-...``,
    removed after; the root namespace is never touched). Needs root."""
    ns = create_netns("cnsk-probe")
    try:
        with NetNS.open(ns.path) as netns, netns.iproute() as ipr:
            ipr.link("add", ifname="kp-veth0", kind="veth", peer="kp-veth1")
            parent = ipr.link_lookup(ifname="kp-veth0")[0]
            have = {}
            for name in features:
                try:
                    have[name] = FEATURES[name](ipr, parent)
                except (NetlinkError, OSError):
                    have[name] = False
            return have
    finally:
        remove_netns(ns)


def vm_modes(item: pytest.Item, modes: list[str]) -> list[str]:
    """The plugin modes of ``modes`` that ``item`` runs in inside the VM: a
    ``kernel`` marker's ``vm_modes=(...)`` narrows them (an item costly in
    one mode under emulation, such as a fuzz slice)."""
    for marker in item.iter_markers("kernel"):
        if "vm_modes" in marker.kwargs:
            return [m for m in modes if m in marker.kwargs["vm_modes"]]
    return modes


def needs(item: pytest.Item) -> list[str]:
    """The features ``item``'s ``kernel`` markers name (UsageError for an unknown one)."""
    names = [f for m in item.iter_markers("kernel") for f in m.args]
    unknown = sorted(set(names) - set(FEATURES))
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: unknown kernel feature(s) {unknown}; "
                                f"@pytest.mark.kernel takes {sorted(FEATURES)}")
    return names


# --------------------------------------------------------------------------
# the VM: kernel, initramfs, boot


class VMUnavailable(Exception):
    """qemu, a kernel with its modules, or a static busybox is missing."""


def _version_key(version: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", version) if p]


def find_kernel(boot: str = "/boot", modules: str = "/lib/modules") -> tuple[Path, str]:
    """The newest ``/boot/vmlinuz-<ver>`` that has ``/lib/modules/<ver>``, and ``<ver>``."""
    found = [(p, p.name.removeprefix("vmlinuz-")) for p in Path(boot).glob("vmlinuz-*")]
    found = [(p, v) for p, v in found if (Path(modules) / v / "modules.dep").is_file()]
    if not found:
        raise VMUnavailable(f"no kernel image in {boot} with its modules in {modules}; {DEPS}")
    return max(found, key=lambda pv: _version_key(pv[1]))


def _module(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".xz":
        return lzma.decompress(data)
    if path.suffix == ".gz":
        return gzip.decompress(data)
    if path.suffix != ".ko":
        raise VMUnavailable(f"cannot unpack kernel module {path} (ko, ko.xz or ko.gz)")
    return data


def _cpio(entries: list[tuple[str, int, bytes, int]]) -> bytes:
    """A newc cpio archive of ``(name, mode, data, rdev minor of major 5)`` entries."""
    out = bytearray()
    for ino, (name, mode, data, minor) in enumerate([*entries, ("TRAILER!!!", 0, b"", 0)], 1):
        raw = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 5 if minor else 0, minor, len(raw), 0)
        out += b"070701" + "".join(f"{v:08x}" for v in fields).encode() + raw
        out += b"\0" * (-len(out) % 4) + data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


_INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "kernelvm: init: $*"; poweroff -f; }
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev \\
  || fail "mounting proc, sys, dev"
for m in %(modules)s; do insmod /lib/modules/$m.ko || fail "insmod $m"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /host \\
  || fail "mounting the host's root (9p)"
mount -t tmpfs -o mode=0755 tmpfs /rw && mkdir /rw/upper /rw/work \\
  && mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \\
  || fail "overlay on the host's root"
mount -t tmpfs -o mode=0755 tmpfs /newroot/run && mkdir -p /newroot/run/netns /newroot%(results)s \\
  && mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /newroot%(results)s \\
  || fail "mounting the results share (9p)"
for d in proc sys dev; do mount --move /$d /newroot/$d || fail "moving /$d"; done
mkdir -p /newroot/dev/pts /newroot/dev/shm && mount -t devpts devpts /newroot/dev/pts \\
  && mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm || fail "devpts, /dev/shm"
exec switch_root /newroot /bin/sh -c "/bin/sh %(run)s; sync; /bin/busybox poweroff -f"
"""


def build_initramfs(version: str, dest: Path) -> Path:
    """Write ``dest``: a gzipped newc initramfs holding a static busybox, the
    modules of kernel ``version`` in `INITRD_MODULES` (built-in ones
    skipped) and an /init that mounts the host's root and runs the run
    script from the results share (`_INIT`). The host's root is mounted
    with cache=loose (the guest caches what it read: Python's imports are
    ten times faster than uncached), the results share uncached."""
    busybox = Path(BUSYBOX)
    if not busybox.is_file() or b"ld-linux" in busybox.read_bytes()[:4096]:
        raise VMUnavailable(f"{BUSYBOX} missing or not static (busybox-static); {DEPS}")
    moddir = Path("/lib/modules") / version
    paths = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        rel = line.split(":", 1)[0]
        paths[Path(rel).name.split(".ko")[0].replace("-", "_")] = moddir / rel
    builtin_file = moddir / "modules.builtin"
    builtin = {Path(rel).name.split(".ko")[0].replace("-", "_")
               for rel in (builtin_file.read_text().split() if builtin_file.is_file() else ())}
    entries = [(d, 0o40755, b"", 0) for d in
               ("bin", "dev", "proc", "sys", "host", "rw", "newroot", "lib", "lib/modules")]
    entries.append(("dev/console", 0o20600, b"", 1))
    entries.append(("bin/busybox", 0o100755, busybox.read_bytes(), 0))
    loaded = []
    for name in INITRD_MODULES:
        if name in paths:
            entries.append((f"lib/modules/{name}.ko", 0o100644, _module(paths[name]), 0))
            loaded.append(name)
        elif name not in builtin:
            raise VMUnavailable(f"kernel {version} has no module {name}")
    init = _INIT % {"modules": " ".join(loaded), "results": RESULTS, "run": f"{RESULTS}/run.sh"}
    entries.append(("init", 0o100755, init.encode(), 0))
    dest.write_bytes(gzip.compress(_cpio(entries), 6))
    return dest


@dataclass
class Outcome:
    """A test's outcome in the VM: ``passed``, ``failed`` or ``skipped``, and its text."""

    status: str
    text: str = ""


@dataclass
class VMRun:
    """What one VM run gave: outcomes by node id; ``problem``: why some may be
    missing (empty when the VM's pytest ended); its console log; timings."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    problem: str = ""
    console: Path | None = None
    kernel: str = ""
    seconds: float = 0.0
    #: Seconds from boot until its result was asked for (its items reached).
    waited: float = 0.0
    #: Guest uptime (s) when the tests started and when they ended.
    marks: dict[str, float] = field(default_factory=dict)

    def tail(self, lines: int = TAIL_LINES) -> str:
        if self.console is None or not self.console.exists():
            return "(no console output)"
        text = self.console.read_bytes().decode("utf-8", "replace").replace("\r", "")
        return "\n".join(text.splitlines()[-lines:])


def parse_junit(path: Path) -> dict[str, Outcome]:
    """Outcomes by node id from a JUnit XML written by the VM's pytest (each
    testcase carries its node id as the property ``nodeid``, `KernelVM` adds
    it there); a failure or error wins over a skip."""
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        prop = case.find("properties/property[@name='nodeid']")
        if prop is None:
            continue
        bad = [e for e in case if e.tag in ("failure", "error")]
        skipped = case.find("skipped")
        if bad:
            text = "\n".join(f"[{e.tag}] {e.get('message', '')}\n{e.text or ''}" for e in bad)
            outcomes[prop.get("value", "")] = Outcome("failed", text.strip())
        elif skipped is not None:
            outcomes[prop.get("value", "")] = Outcome("skipped", skipped.get("message", ""))
        else:
            outcomes[prop.get("value", "")] = Outcome("passed")
    return outcomes


def _run_script(nodeids: list[str], rootdir: Path, pytest_args: list[str],
                env: dict[str, str]) -> str:
    exports = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8", **env, IN_VM_ENV: "1"}
    cmd = [sys.executable, "-m", "pytest", "-v", "-rfEs", "--color=no", "--basetemp=/tmp/cnsk-vm",
           "--durations=15",  # on the console: where the emulated minutes go
           f"--junitxml={RESULTS}/junit.xml", *pytest_args, *nodeids]
    return "\n".join([
        *(f"export {k}={shlex.quote(v)}" for k, v in exports.items()),
        'echo "kernelvm: tests start at $(cut -d" " -f1 /proc/uptime)"',
        f"cd {shlex.quote(str(rootdir))} || exit 1",
        shlex.join(cmd),
        "status=$?",
        f"echo $status > {RESULTS}/status",
        'echo "kernelvm: tests end at $(cut -d" " -f1 /proc/uptime), pytest status $status"',
        ""])


def _virtfs(path: Path | str, tag: str, extra: str = "") -> list[str]:
    return ["-virtfs", f"local,path={str(path).replace(',', ',,')},mount_tag={tag},"
                       f"security_model=none,multidevs=remap{extra}"]


@dataclass
class VMBoot:
    """A VM `start_vm` booted: its qemu process, running until `finish_vm`."""

    proc: subprocess.Popen
    run: VMRun
    workdir: Path
    started: float
    wall_started: float
    log: Any


def start_vm(nodeids: list[str], workdir: Path, *, rootdir: Path, pytest_args: list[str],
             env: dict[str, str], nice: int = 0) -> VMBoot:
    """Boot the VM (without waiting) to run ``python -m pytest <nodeids>`` in
    it (from ``rootdir``, with ``pytest_args`` and ``env``), qemu at priority
    ``nice``. Raises VMUnavailable when qemu or a kernel is missing. The
    qemu process must be started by the thread that lives as long as the
    run (it gets SIGKILL when that thread ends: ``--pdeathsig``)."""
    qemu = shutil.which(QEMU)
    if qemu is None:
        raise VMUnavailable(f"{QEMU} not found; {DEPS}")
    kernel, version = find_kernel()
    initrd = build_initramfs(version, workdir / "initrd.gz")
    results = workdir / "results"
    results.mkdir()
    (results / "run.sh").write_text(_run_script(nodeids, rootdir, pytest_args, env))
    run = VMRun(console=workdir / "console.log", kernel=version)
    cmd = ["nice", "-n", str(nice),
           "setpriv", "--pdeathsig", "KILL", "--",  # qemu dies with this process
           qemu, "-nodefaults", "-no-user-config", "-machine", "accel=tcg", "-m", "4096M",
           "-smp", "2", "-nic", "none", "-display", "none", "-monitor", "none",
           "-serial", f"file:{run.console}", "-no-reboot", "-kernel", str(kernel),
           "-initrd", str(initrd), "-append", "console=ttyS0 quiet panic=-1",
           *_virtfs("/", "hostroot", ",readonly=on"), *_virtfs(results, "results")]
    log = open(workdir / "qemu.log", "wb")  # noqa: SIM115 (closed by finish_vm)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    except BaseException:
        log.close()
        raise
    return VMBoot(proc=proc, run=run, workdir=workdir, started=time.monotonic(),
                  wall_started=time.time(), log=log)


def finish_vm(boot: VMBoot, timeout: float) -> VMRun:
    """Wait for ``boot``'s VM until ``timeout`` seconds after it started
    (then qemu is killed) and read what its pytest reported."""
    proc, run, workdir = boot.proc, boot.run, boot.workdir
    try:
        status = proc.wait(max(0.0, boot.started + timeout - time.monotonic()))
    except subprocess.TimeoutExpired:
        status = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        boot.log.close()
    run.waited = time.monotonic() - boot.started
    # qemu's own run: until the console's last line (power-down), which may
    # be long before its items were reached (it runs in the background).
    ended = time.time()
    if run.console:
        with contextlib.suppress(OSError):
            ended = min(ended, run.console.stat().st_mtime)
    run.seconds = max(0.0, ended - boot.wall_started)
    console = run.tail(10**6)
    for what in ("start", "end"):
        m = re.search(rf"^kernelvm: tests {what} at ([\d.]+)", console, re.M)
        if m:
            run.marks[what] = float(m.group(1))
    results = workdir / "results"
    junit, exit_file = results / "junit.xml", results / "status"
    if junit.is_file():
        with contextlib.suppress(ET.ParseError):
            run.outcomes = parse_junit(junit)
    qemu_log = (workdir / "qemu.log").read_text(errors="replace").strip()
    if status is None:
        run.problem = f"the VM did not finish within {timeout:.0f} s; qemu was killed"
    elif not exit_file.is_file():
        run.problem = (f"qemu exited with status {status} before the VM's pytest ended"
                       + (f" (qemu: {qemu_log[-2000:]})" if qemu_log else ""))
    elif not run.outcomes:
        run.problem = (f"the VM's pytest exited {exit_file.read_text().strip()} and reported "
                       "no test")
    return run


# --------------------------------------------------------------------------
# the pytest side


class VMItem(pytest.Item):
    """Stands in for a marked test whose features the host lacks: its run
    reports the VM's outcome for the same node id (the VM boots at the
    first one)."""

    def __init__(self, *, original: pytest.Item, plugin: KernelVM, **kwargs) -> None:
        super().__init__(**kwargs)
        self.original, self.plugin = original, plugin
        self.own_markers = list(original.own_markers)
        self.keywords.update(original.keywords)

    def reportinfo(self):
        return self.original.reportinfo()

    def runtest(self) -> None:
        run = self.plugin.vm_run(self.config)
        outcome = run.outcomes.get(self.nodeid)
        where = f"in the kernel VM (Linux {run.kernel})" if run.kernel else "in the kernel VM"
        if outcome is None:
            why = run.problem or "the VM's pytest reported nothing for it"
            tail = "" if run.console is None else (
                f"\n--- last console lines ({run.console}) ---\n{run.tail()}")
            pytest.fail(f"not run {where}: {why}{tail}", pytrace=False)
        if outcome.status == "failed":
            pytest.fail(f"failed {where} (console: {run.console}):\n{outcome.text}",
                        pytrace=False)
        if outcome.status == "skipped":
            pytest.fail(f"skipped {where}, so it did not run: {outcome.text}", pytrace=False)


class KernelVM:
    """The plugin: probes the host once, swaps marked tests it cannot run
    for `VMItem`s, runs them all in one VM on first use; in the VM
    (`IN_VM_ENV`), tags each test's JUnit entry with its node id.
    ``env``: variables the VM's pytest gets (the suite's mode choice...)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.in_vm = os.environ.get(IN_VM_ENV) == "1"
        self.items: list[VMItem] = []
        self.boot: VMBoot | None = None
        self.run: VMRun | None = None

    @pytest.hookimpl(trylast=True)  # after -k/-m/--deselect: only what runs
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        wanted = {id(i): needs(i) for i in items}
        if self.in_vm:
            for item in items:
                item.user_properties.append(("nodeid", item.nodeid))
            return
        features = sorted({f for names in wanted.values() for f in names})
        if not features:
            return
        if os.geteuid() != 0:
            for item in items:
                if wanted[id(item)]:
                    item.add_marker(pytest.mark.skip(reason="kernel features are probed in a "
                                                            "network namespace: needs root"))
            return
        have = probe(features)
        modes = [m for m in os.environ.get(VM_MODES_ENV, ",".join(VM_MODES)).split(",") if m]
        dropped = []
        for n, item in enumerate(items):
            if not all(have[f] for f in wanted[id(item)]):
                callspec = getattr(item, "callspec", None)
                mode = callspec.params.get("cni_mode") if callspec is not None else None
                if mode is not None and mode not in vm_modes(item, modes):
                    dropped.append(item)
                    continue
                items[n] = VMItem.from_parent(item.parent, name=item.name, original=item,
                                              plugin=self)
                self.items.append(items[n])
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [i for i in items if i not in dropped]
        # Last: the host's tests run while the VM does.
        items[:] = ([i for i in items if not isinstance(i, VMItem)]
                    + [i for i in items if isinstance(i, VMItem)])

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.items and not session.config.option.collectonly:
            self._start(session.config)

    def _start(self, config: pytest.Config) -> None:
        if self.boot is not None or self.run is not None:
            return
        args = config.invocation_params.args
        passed = [a for i, a in enumerate(args)  # -p options: plugins on or off
                  if a.startswith("-p") or (i and args[i - 1] == "-p")]
        workdir = config._tmp_path_factory.mktemp("kernelvm")
        try:
            self.boot = start_vm([i.nodeid for i in self.items], workdir,
                                 rootdir=config.rootpath, pytest_args=passed, env=self.env,
                                 nice=NICE)
        except VMUnavailable as e:
            self.run = VMRun(problem=f"cannot boot the kernel VM: {e}")
        except Exception as e:  # every VMItem fails with it; none boots again
            self.run = VMRun(problem=f"cannot boot the kernel VM: {type(e).__name__}: {e}")

    def vm_run(self, config: pytest.Config) -> VMRun:
        """The VM's run of every `VMItem` (waited for by the first)."""
        self._start(config)
        if self.run is None:
            assert self.boot is not None
            self.run = finish_vm(self.boot, float(os.environ.get(TIMEOUT_ENV, TIMEOUT)))
        return self.run

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        # A run that ended before its VMItems (-x, ^C): the VM goes too.
        if self.boot is not None and self.run is None:
            self.run = finish_vm(self.boot, 0)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        run = self.run
        if run is None or not run.kernel:
            return
        terminalreporter.write_sep("-", f"kernel VM (Linux {run.kernel}, qemu TCG)")
        start, end = run.marks.get("start"), run.marks.get("end")
        boot = f"boot {start:.1f} s, " if start is not None else ""
        tests = f"tests {end - start:.1f} s, " if start is not None and end is not None else ""
        terminalreporter.write_line(f"{len(self.items)} tests: {boot}{tests}"
                                    f"{run.seconds:.1f} s in all, its items reached after "
                                    f"{run.waited:.1f} s; console: {run.console}")
        if run.problem:
            terminalreporter.write_line(f"problem: {run.problem}")

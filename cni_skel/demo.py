"""The project's main job, end to end, in namespaces made for it (``cni-skel demo``).

A "node" namespace and two "pod" namespaces are created with
`cni_skel.harness`; our plugins are installed into a temporary bin dir (or
those of ``plugin_dir`` are used); a conflist (bridge with host-local IPAM on
`DEMO_SUBNET`, tuning, portmap) and a single-plugin loopback ``.conf`` go to a
temporary config dir. Through `cni_skel.runtime`, both pods are ADDed (the
plugins run inside the node namespace), pod-a pings pod-b, TCP goes pod-b ->
pod-a and node -> hostPort (portmap) -> pod-a (`cni_skel.harness.icmp_ping`,
`cni_skel.harness.tcp_echo`), then CHECK, DEL and a summary.

The plugins run warm by default, the way ``cni-skel install`` sets a node up:
launchers (``--fallback none``, so every call is the worker's) and the
worker's systemd units, run as systemd runs them
(`cni_skel.harness.SocketActivation`: the first call starts the worker);
``mode="oneshot"`` runs them one Python process per call instead.

Everything is removed at the end, also on failure or KeyboardInterrupt; the
machine's own network namespace is never touched. Needs root. The click
command (`cni_skel.cli`) handles signals and exit codes; this module only
runs the demo and writes its report.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any

from . import netlink
from .errors import CNIError
from .harness import SocketActivation, TestNetNS, create_netns, icmp_ping, remove_netns, tcp_echo
from .netns import NetNS
from .runtime import NetworkConfigList, Runtime, RuntimeConf, describe_error
from .types import Result
from .version import ALL_VERSIONS, parse_version
from .warm.install import plugin_registry, write_executable

__all__ = ["DEMO_BRIDGE", "DEMO_HOST_PORT", "DEMO_POD_PORT", "DEMO_SUBNET", "DEMO_TYPES",
           "DemoFailure", "demo_conflist", "pick_version", "run_demo"]

DEMO_SUBNET = "10.99.0.0/24"
DEMO_BRIDGE = "cnsk-demo0"
DEMO_HOST_PORT = 18080
DEMO_POD_PORT = 8080
#: The plugin types the demo's configs use.
DEMO_TYPES = ("bridge", "host-local", "tuning", "portmap", "loopback")

#: One summary line: step name, passed, what was seen.
Step = tuple[str, bool, str]
#: An attachment the demo ADDed: its list and its RuntimeConf.
Attachment = tuple[NetworkConfigList, RuntimeConf]


class DemoFailure(Exception):
    """The demo cannot start (plugins missing, no usable cniVersion); the
    message says why."""


def demo_conflist(version: str, data_dir: str) -> dict[str, Any]:
    """The demo's network list ``demo-net``: bridge `DEMO_BRIDGE` as the
    gateway with host-local on `DEMO_SUBNET`, tuning (MTU 1400, a sysctl),
    portmap with SNAT; plugin state under ``data_dir``."""
    return {
        "cniVersion": version,
        "name": "demo-net",
        "plugins": [
            {"type": "bridge", "bridge": DEMO_BRIDGE, "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": DEMO_SUBNET}]],
                      "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": os.path.join(data_dir, "ipam")}},
            {"type": "tuning", "mtu": 1400,
             "sysctl": {"net.ipv4.conf.eth0.arp_notify": "1"},
             "dataDir": os.path.join(data_dir, "tuning")},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }


def pick_version(cni: Runtime, wanted: str) -> tuple[str, dict[str, list[str]]]:
    """The cniVersion to run with, and what each of `DEMO_TYPES` supports
    (asked with VERSION): ``wanted``, or for ``"auto"`` the highest version
    of 0.4.0 or later (the demo runs CHECK) that every plugin supports.

    Raises:
        DemoFailure: a plugin cannot be asked, or no version suits all.
    """
    supported: dict[str, list[str]] = {}
    for ptype in DEMO_TYPES:
        try:
            supported[ptype] = list(cni.get_version_info(ptype).get("supportedVersions") or [])
        except CNIError as exc:
            raise DemoFailure(describe_error(exc, operation=f"pre-flight VERSION of {ptype}")) \
                from None
    common = [v for v in ALL_VERSIONS if all(v in s for s in supported.values())]
    if wanted != "auto":
        if wanted not in common:
            raise DemoFailure(f"cniVersion {wanted} is not supported by every plugin "
                              f"(common: {', '.join(common) or 'none'})")
        return wanted, supported
    usable = [v for v in common if parse_version(v) >= (0, 4, 0)]
    if not usable:
        raise DemoFailure("the plugins share no cniVersion of 0.4.0 or later "
                          f"(common: {', '.join(common) or 'none'})")
    return max(usable, key=parse_version), supported


def _pod_link(pod_path: str, name: str) -> netlink.Link | None:
    with NetNS.open(pod_path) as ns, ns.iproute() as ipr:
        return netlink.find_link(ipr, name)


def _lo_state(pod_path: str) -> str:
    link = _pod_link(pod_path, "lo")
    return "UP" if link is not None and link.up else "DOWN"


def _set_lo_up(ns_path: str) -> None:
    with NetNS.open(ns_path) as ns, ns.iproute() as ipr:
        netlink.link_up(ipr, "lo")


class _Report:
    """Writes the demo's lines (stdout, or stderr for errors) as they happen."""

    def __init__(self, out: IO[str], err: IO[str]) -> None:
        self.out, self.err = out, err

    def __call__(self, line: str = "", *, error: bool = False) -> None:
        stream = self.err if error else self.out
        stream.write(line + "\n")
        stream.flush()


def run_demo(plugin_dir: str | None = None, cni_version: str = "auto", verbose: bool = False,
             *, out: IO[str] | None = None, err: IO[str] | None = None,
             mode: str = "warm", pause: IO[str] | None = None) -> bool:
    """Run the demo, writing its report to ``out`` (default sys.stdout) and
    errors to ``err`` (default sys.stderr).

    ``plugin_dir``: run the executables found there instead of installing
    ours. ``cni_version``: a version, or ``"auto"`` (see `pick_version`).
    ``verbose``: log each plugin execution (and, warm, the worker's lines).
    ``mode``: "warm" (ours through a socket-activated worker, as
    ``cni-skel install`` sets up) or "oneshot". ``pause``: once both pods
    are ADDed, say how to look at them and wait for a line (or EOF) on it.

    Returns:
        True when every step passed. A CNI error stops the demo and counts
        as a failed step (described on ``err``).

    Raises:
        DemoFailure: it could not start (see `pick_version`).
        KeyboardInterrupt: passed on, after the cleanup.
    """
    say = _Report(out or sys.stdout, err or sys.stderr)
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="cni-skel-demo-") as tmp, \
            _namespaces() as made, contextlib.ExitStack() as stack:
        cni: Runtime | None = None
        added: list[Attachment] = []
        interrupted = False
        try:
            node, pods = made("node"), {label: made(label) for label in ("pod-a", "pod-b")}
            _set_lo_up(node.path)
            say("cni-skel demo: a pod network in namespaces made for the demo "
                "(the machine's own network is not touched)")
            say(f"  node netns   {node.path}   (the plugins run here, as on a node)")
            for label, ns in pods.items():
                say(f"  {label} netns  {ns.path}")
            bin_dir = _plugins(plugin_dir, tmp, say, mode, stack, verbose)
            log = (lambda line: say(f"    [runtime] {line}")) if verbose else None
            cni = Runtime(conf_dir=os.path.join(tmp, "net.d"), bin_dirs=[bin_dir],
                          cache_dir=os.path.join(tmp, "cache"), plugin_netns=node.path,
                          stderr=sys.stderr, timeout=60, log=log)
            version, supported = pick_version(cni, cni_version)
            say("\npre-flight (VERSION):")
            for ptype, versions in supported.items():
                say(f"  {ptype:<11} {', '.join(versions)}")
            say(f"  -> cniVersion {version}")
            net, lo_net = _write_configs(cni, version, tmp, say)
            results = _add_pods(cni, net, lo_net, pods, added, say)
            steps.append(("ADD", True, ", ".join(f"{k} {r.ips[0].address}"
                                                 for k, r in results.items())))
            say("\nADD result of pod-a on demo-net (cached in "
                f"{cni.cache_path('demo-net', added[1][1])}):")
            say(json.dumps(results["pod-a"].to_version(version), indent=4))
            if pause is not None:
                say(f"\npaused with both pods up: look at them, e.g. `ip netns exec "
                    f"{pods['pod-a'].name} ip address` or `nft list ruleset`; press Enter to "
                    "go on (Ctrl-C: stop, everything is still removed)")
                pause.readline()
            steps.extend(_traffic(node, pods, results, say))
            steps.append(_check_all(cni, added, say))
            steps.append(_delete_all(cni, added, pods, say))
        except CNIError as exc:
            say("Error: " + describe_error(exc, operation="demo"), error=True)
            steps.append(("error", False, f"code {exc.code}: {exc}"))
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            # Cleaning up must not be cut short by a second Ctrl-C.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if added and cni is not None and not interrupted:
                _cleanup_dels(cni, added)
    say("\nsummary:")
    for name, good, detail in steps:
        say(f"  {name:<8} {'ok' if good else 'FAILED':<7} {detail}")
    ok = bool(steps) and all(good for _, good, _ in steps)
    say("demo passed: namespaces and temporary files removed" if ok else
        "demo FAILED: namespaces and temporary files removed")
    return ok


@contextlib.contextmanager
def _namespaces() -> Iterator[Callable[[str], TestNetNS]]:
    """Yields ``make(label)``, which creates ``cnsk-demo-<label>-...``;
    every namespace made is removed on the way out."""
    made: list[TestNetNS] = []

    def make(label: str) -> TestNetNS:
        made.append(create_netns(f"cnsk-demo-{label}"))
        return made[-1]

    try:
        yield make
    finally:
        for ns in reversed(made):
            remove_netns(ns)


def _plugins(plugin_dir: str | None, tmp: str, say: _Report, mode: str,
             stack: contextlib.ExitStack, verbose: bool) -> str:
    """The bin dir: ``plugin_dir``, or ours installed under ``tmp`` (warm:
    with the worker's units, activated as systemd would; stopped by
    ``stack``)."""
    if plugin_dir:
        bin_dir = os.path.abspath(plugin_dir)
        say(f"  plugins      {bin_dir} (--plugin-dir)")
        return bin_dir
    bin_dir = os.path.join(tmp, "bin")
    registry = plugin_registry()
    missing = [t for t in DEMO_TYPES if t not in registry]
    if missing:
        raise DemoFailure(f"plugin(s) not installed: {', '.join(missing)}")
    if mode != "warm":
        for ptype in DEMO_TYPES:
            write_executable(bin_dir, ptype, registry[ptype], force=True, worker_socket=None)
        say(f"  plugins      ours, one-shot (a Python process per call), in {bin_dir}")
        return bin_dir
    sock = os.path.join(tmp, "run", "worker.sock")
    for ptype in DEMO_TYPES:
        write_executable(bin_dir, ptype, registry[ptype], force=True, worker_socket=sock,
                         fallback="none")
    units = os.path.join(tmp, "units")
    try:
        activation = SocketActivation.install(units, sock, os.path.join(tmp, "worker.log"))
    except RuntimeError as exc:
        raise DemoFailure(f"{exc}; or run `cni-skel demo --one-shot`") from None
    stack.callback(_stop_worker, activation, say, verbose)
    say(f"  plugins      ours, warm, as `cni-skel install` sets a node up: launchers in "
        f"{bin_dir}")
    say(f"               (--fallback none) and the worker's units in {units}, socket-activated "
        f"on {sock}")
    return bin_dir


def _stop_worker(activation: SocketActivation, say: _Report, verbose: bool) -> None:
    activation.stop()
    lines = activation.log().splitlines()
    served = [ln for ln in lines if " exit=" in ln]
    say(f"\nworker: {len(served)} plugin calls served warm by {len(activation.procs)} "
        "socket-activated worker process(es); none ran one-shot")
    if verbose:
        for line in lines:
            say(f"    [worker] {line}")


def _write_configs(cni: Runtime, version: str, tmp: str,
                   say: _Report) -> tuple[NetworkConfigList, NetworkConfigList]:
    conflist = demo_conflist(version, tmp)
    os.makedirs(cni.conf_dir)
    with open(os.path.join(cni.conf_dir, "10-demo-net.conflist"), "w") as fp:
        json.dump(conflist, fp, indent=2)
    with open(os.path.join(cni.conf_dir, "99-demo-lo.conf"), "w") as fp:
        json.dump({"cniVersion": version, "name": "demo-lo", "type": "loopback"}, fp)
    net = cni.load_conflist("demo-net")
    lo_net = cni.load_conflist("demo-lo")
    say(f"\nconfig dir {cni.conf_dir}:")
    say(f"  10-demo-net.conflist  {' + '.join(p.type for p in net.plugins)} "
        f"(IPAM host-local {DEMO_SUBNET})")
    say("  99-demo-lo.conf       loopback (a single-plugin .conf, run as a list of one)")
    say(json.dumps(conflist, indent=2))
    return net, lo_net


def _add_pods(cni: Runtime, net: NetworkConfigList, lo_net: NetworkConfigList,
              pods: dict[str, TestNetNS], added: list[Attachment],
              say: _Report) -> dict[str, Result]:
    """ADD each pod to demo-lo (lo) and demo-net (eth0, pod-a with a port
    mapping); ``added`` grows as each ADD starts, for the cleanup."""
    results = {}
    for label, ns in pods.items():
        say(f"\n{label}: before ADD, lo in the pod is {_lo_state(ns.path)}")
        lo_rt = RuntimeConf(f"demo-{label}", ns.path, "lo")
        added.append((lo_net, lo_rt))
        cni.add(lo_net, lo_rt)
        say(f"{label}: ADD demo-lo (lo): ok")
        caps = {}
        if label == "pod-a":
            caps = {"portMappings": [{"hostPort": DEMO_HOST_PORT, "containerPort": DEMO_POD_PORT,
                                      "protocol": "tcp"}]}
        rt = RuntimeConf(f"demo-{label}", ns.path, "eth0",
                         args="IgnoreUnknown=1;K8S_POD_NAME=" + label, capability_args=caps)
        added.append((net, rt))
        results[label] = cni.add(net, rt)
        ip = results[label].ips[0]
        eth0 = _pod_link(ns.path, "eth0")
        say(f"{label}: ADD demo-net (eth0): ok -> {ip.address} gateway {ip.gateway}, "
            f"mtu {eth0 and eth0.mtu} (tuning), mac {eth0 and eth0.mac}")
        say(f"{label}: after ADD, lo in the pod is {_lo_state(ns.path)}")
    return results


def _traffic(node: TestNetNS, pods: dict[str, TestNetNS], results: dict[str, Result],
             say: _Report) -> list[Step]:
    """Ping pod-a -> pod-b; TCP pod-b -> pod-a and node -> hostPort -> pod-a."""
    addr = {k: str(r.ips[0].address.ip) for k, r in results.items()}
    gateway = str(results["pod-a"].ips[0].gateway)
    say("\nconnectivity:")
    steps: list[Step] = []
    rtts = icmp_ping(pods["pod-a"], addr["pod-b"])
    detail = f"pod-a -> pod-b {addr['pod-b']}: {len(rtts)}/3 replies" + \
        (f", rtt avg {sum(rtts) / len(rtts):.2f} ms" if rtts else "")
    steps.append(("ping", len(rtts) > 0, detail))
    say(f"  ping     {detail}")
    for step, client, who, host, port in (
            ("tcp", pods["pod-b"], "pod-b", addr["pod-a"], DEMO_POD_PORT),
            ("portmap", node, "node", gateway, DEMO_HOST_PORT)):
        what = f"{who} -> {host}:{port}" + \
            (f" -> pod-a:{DEMO_POD_PORT}" if step == "portmap" else "")
        message = f"hello from {who}".encode()
        try:
            echoed, seen = tcp_echo(pods["pod-a"], addr["pod-a"], client, host,
                                    port=DEMO_POD_PORT, dest_port=port, payload=message,
                                    timeout=3)
        except OSError as exc:
            good, detail = False, f"{what}: {exc.strerror or exc}"
        else:
            good = echoed == message
            detail = (f"{what}: pod-a echoed {echoed.decode(errors='replace')!r} "
                      f"(it saw {seen})")
        steps.append((step, good, detail))
        say(f"  {step:<8} {detail}")
    return steps


def _check_all(cni: Runtime, added: list[Attachment], say: _Report) -> Step:
    say("")
    for netlist, rt in added:
        cni.check(netlist, rt)
        say(f"CHECK {netlist.name:<8} {rt.container_id} ({rt.ifname}): ok")
    return "CHECK", True, f"{len(added)} attachment(s) ok"


def _delete_all(cni: Runtime, added: list[Attachment], pods: dict[str, TestNetNS],
                say: _Report) -> Step:
    """DEL in reverse ADD order; passed when eth0 is gone from both pods
    and nothing is left in the cache."""
    say("")
    for netlist, rt in reversed(list(added)):
        cni.delete(netlist, rt)
        added.remove((netlist, rt))
        say(f"DEL   {netlist.name:<8} {rt.container_id} ({rt.ifname}): ok")
    gone = all(_pod_link(ns.path, "eth0") is None for ns in pods.values())
    cache_left = cni.get_cached_attachments()
    for label, ns in pods.items():
        say(f"{label}: after DEL, lo in the pod is {_lo_state(ns.path)}")
    if gone and not cache_left:
        return "DEL", True, "eth0 gone from both pods, cache empty"
    return "DEL", False, f"eth0 gone: {gone}, cache left: {len(cache_left)}"


def _cleanup_dels(cni: Runtime, added: list[Attachment]) -> None:
    """After a failure, DEL what was ADDed (a runtime always does), quietly."""
    cni.stderr = io.StringIO()
    for netlist, rt in reversed(added):
        with contextlib.suppress(CNIError):
            cni.delete(netlist, rt)

"""The interface plugins' ADD and DEL (each with host-local), ours against Go's.

ptp, macvlan, ipvlan, vlan, host-device and dummy: ``pods`` pods each, every
mode interleaved call by call (the mode order rotated per pod), a fresh pod
namespace per pod. Each mode's node namespace gets an uplink (``up0``, a veth
whose peer stays there) for the kinds that sit on a master; host-device gets
a fresh veth to move per pod, made before the ADD and removed after the DEL
(neither counted). A kind this kernel cannot create is not measured and the
report says so (this machine's kernel has no ipvlan, vlan or dummy: run
``make bench`` on a kernel with them, e.g. Debian's). Go 1.1.1 has no dummy:
its row has no ratio.

Budgets (issue 33): ADD and DEL of every plugin measured, warm <= 0.6x Go,
the one-shot fallback <= 13x Go.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from cni_skel import netlink
from cni_skel.errors import CNIError
from cni_skel.harness import create_netns, remove_netns
from cni_skel.netns import NetNS

from .stats import log, med, ms, ratio, rx

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .run import Bench

PLUGINS = ("ptp", "macvlan", "ipvlan", "vlan", "host-device", "dummy")
#: Plugins Go 1.1.1 does not ship (no ratio).
NOT_IN_GO = frozenset({"dummy"})
UPLINK = "up0"
WARM_LIMIT, ONESHOT_LIMIT = 0.6, 13.0
_SUBNETS = {p: f"10.{91 + i}.0.0/16" for i, p in enumerate(PLUGINS)}
_KIND = {"ipvlan": "ipvlan", "vlan": "vlan", "dummy": "dummy"}


def kernel_lacks(plugin: str) -> str | None:
    """Why this kernel cannot run ``plugin`` (None: it can): a link of its
    kind is created in a throwaway namespace."""
    kind = _KIND.get(plugin)
    if kind is None:
        return None
    ns = create_netns("cnbk")
    try:
        with NetNS.open(ns.path) as handle, handle.rtnl() as ipr:
            netlink.create_veth_pair(ipr, "p0", "p1")
            if kind == "ipvlan":
                netlink.create_ipvlan(ipr, "k0", "p0")
            elif kind == "vlan":
                netlink.create_vlan(ipr, "k0", "p0", 100)
            else:
                netlink.create_dummy(ipr, "k0")
        return None
    except CNIError as exc:
        return f"this kernel has no {kind} ({exc.msg})"
    finally:
        remove_netns(ns)


def config(plugin: str, store: str, device: str = "") -> dict:
    """The network config of one pod's ADD/DEL of ``plugin``."""
    ipam = {"type": "host-local", "dataDir": store, "ranges": [[{"subnet": _SUBNETS[plugin]}]]}
    conf: dict = {"cniVersion": "1.0.0", "name": f"bench-{plugin}", "type": plugin, "ipam": ipam}
    if plugin in ("macvlan", "ipvlan", "vlan"):
        conf["master"] = UPLINK
    if plugin == "vlan":
        conf["vlanId"] = 100
    if plugin == "host-device":
        # its saved states beside the IPAM store: never the node's /run/cni
        conf.update(device=device, dataDir=os.path.join(store, "host-device"))
    return conf


def _node_links(bench: Bench) -> None:
    for mode in bench.modes:
        with NetNS.open(mode.node.ns.path) as ns, ns.rtnl() as ipr:
            if netlink.find_link(ipr, UPLINK) is None:
                netlink.create_veth_pair(ipr, UPLINK, UPLINK + "p")
                netlink.link_up(ipr, UPLINK)
                netlink.link_up(ipr, UPLINK + "p")


def _device(mode, name: str, make: bool) -> None:
    """Make (or remove) host-device's veth ``name`` in the mode's node."""
    with NetNS.open(mode.node.ns.path) as ns, ns.rtnl() as ipr:
        if make:
            netlink.create_veth_pair(ipr, name, name + "p")
        else:
            netlink.delete_link(ipr, name)


def run(bench: Bench) -> None:
    """Measure every plugin this kernel can run; results under
    ``bench.results["interfaces"]`` (``{"lacking": {plugin: why}}``),
    samples in scenario ``interfaces``."""
    n = bench.prof.pods
    lacking = {p: why for p in PLUGINS if (why := kernel_lacks(p))}
    bench.results["interfaces"] = {"lacking": lacking}
    _node_links(bench)
    for plugin in PLUGINS:
        if plugin in lacking:
            log(f"interfaces: {plugin} not measured: {lacking[plugin]}")
            continue
        modes = [m for m in bench.modes if not (m.key == "go" and plugin in NOT_IN_GO)]
        log(f"interfaces: {plugin}, {n} pods per mode, interleaved")
        for i in range(n):
            for mode in bench.rotation(i, modes):
                device = f"hd{i}{mode.key[:3]}"
                if plugin == "host-device":
                    _device(mode, device, True)
                pod = bench.pod()
                conf = config(plugin, bench.store(mode, f"if-{plugin}"), device)
                kw = {"scenario": "interfaces", "cid": f"{mode.key}-{plugin}-{i}",
                      "netns": pod.path}
                bench.call(mode, plugin, "ADD", conf, **kw)
                bench.call(mode, plugin, "DEL", conf, **kw)
                bench.drop_pod(pod)
                if plugin == "host-device":
                    with contextlib.suppress(CNIError):
                        _device(mode, device, False)


def report(bench: Bench, w) -> None:
    """The section of the report: a row per plugin and verb."""
    res = bench.results.get("interfaces")
    if res is None:
        return
    n = bench.prof.pods
    w(f"\n## Interface plugins, {n} pods each: ADD and DEL with host-local\n")
    w("| plugin | verb | Go ms | warm ms | warm/Go | one-shot ms | one-shot/Go |")
    w("|---|---|---|---|---|---|---|")
    for plugin in PLUGINS:
        if plugin in res["lacking"]:
            w(f"| {plugin} | - | not measured: {res['lacking'][plugin]} | | | | |")
            continue
        for verb in ("ADD", "DEL"):
            g, wm, o = (med(bench.sel("interfaces", m, plugin, verb))
                        for m in ("go", "warm", "oneshot"))
            w(f"| {plugin} | {verb} | {ms(g)} | {ms(wm)} | {rx(ratio(wm, g))} | {ms(o)} "
              f"| {rx(ratio(o, g))} |")
    w("\nDEL runs right after the ADD, the pod still there. Go 1.1.1 has no dummy plugin: "
      "its row has no ratio.")


def budgets(bench: Bench) -> list[tuple[str, str, bool | None]]:
    """Issue 33's: warm <= 0.6x Go and one-shot <= 13x Go, ADD and DEL of
    each plugin Go ships (the worst ratio of each)."""
    res = bench.results.get("interfaces")
    if res is None:
        return [("interface plugins vs Go", "not run", None)]
    out: list[tuple[str, str, bool | None]] = []
    for key, lim, label in (("warm", WARM_LIMIT, "warm"), ("oneshot", ONESHOT_LIMIT,
                                                            "one-shot")):
        worst: tuple[float, str] | None = None
        for plugin in PLUGINS:
            if plugin in res["lacking"] or plugin in NOT_IN_GO:
                continue
            for verb in ("ADD", "DEL"):
                r = ratio(med(bench.sel("interfaces", key, plugin, verb)),
                          med(bench.sel("interfaces", "go", plugin, verb)))
                if r is not None and (worst is None or r > worst[0]):
                    worst = (r, f"{plugin} {verb}")
        name = f"interface plugins: {label} ADD and DEL <= {lim:g}x Go, every plugin"
        if worst is None:
            out.append((name, "not run", None))
        else:
            out.append((name, f"max {rx(worst[0])} ({worst[1]})", worst[0] <= lim))
    if res["lacking"]:
        out.append(("interface plugins: every kind measured",
                    "not on this kernel: " + ", ".join(sorted(res["lacking"])), None))
    return out

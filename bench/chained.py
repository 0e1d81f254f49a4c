"""The chained and IPAM plugins' ADD and DEL (issue 34), ours against Go's.

static (called as a runtime's interface plugin calls its IPAM), sbr and
bandwidth (each chained after ptp + host-local, whose ADD before and DEL after
are not counted) and flannel (delegating to bridge + host-local, counted:
that is its call): ``pods`` pods each, every mode interleaved call by call (the
mode order rotated per pod), a fresh pod namespace per pod. Debian's Go set
has no flannel: its row has no ratio. A plugin not registered in this
install is not measured (the report says so).

Budget (issue 34): warm <= 0.6x Go for each plugin Go ships.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from cni_skel.warm.install import plugin_registry

from .stats import log, med, ms, ratio, rx

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .run import Bench

PLUGINS = ("static", "sbr", "bandwidth", "flannel")
NOT_IN_GO = frozenset({"flannel"})
#: What each plugin is chained after (its ADD before, its DEL after: not counted).
CHAINED_AFTER = {"sbr": "ptp", "bandwidth": "ptp"}
WARM_LIMIT = 0.6
_SUBNETS = {p: f"10.{101 + i}.0.0/16" for i, p in enumerate(PLUGINS)}
SUBNET_ENV = "FLANNEL_NETWORK=10.104.0.0/16\nFLANNEL_SUBNET=10.104.1.1/24\nFLANNEL_MTU=1450\n" \
             "FLANNEL_IPMASQ=false\n"


def config(plugin: str, store: str) -> dict:
    """The network config of one pod's calls of ``plugin`` (sbr's and
    bandwidth's without prevResult: the chained ADD adds it)."""
    host_local = {"type": "host-local", "dataDir": store,
                  "ranges": [[{"subnet": _SUBNETS[plugin]}]]}
    conf: dict = {"cniVersion": "1.0.0", "name": f"bench-{plugin}", "type": plugin}
    if plugin == "static":
        conf.update(type="ptp", ipam={"type": "static", "addresses": [
            {"address": "10.101.0.5/24", "gateway": "10.101.0.1"}],
            "routes": [{"dst": "0.0.0.0/0"}]})
    elif plugin == "flannel":
        subnet = os.path.join(store, "subnet.env")
        if not os.path.exists(subnet):
            os.makedirs(store, exist_ok=True)
            with open(subnet, "w") as fp:
                fp.write(SUBNET_ENV)
        conf.update(subnetFile=subnet, dataDir=os.path.join(store, "flannel"),
                    delegate={"bridge": "cnbkfl0"}, ipam={"dataDir": store})
    elif plugin == "bandwidth":
        conf.update(ingressRate=100_000_000, ingressBurst=1_000_000, egressRate=100_000_000,
                    egressBurst=1_000_000)
    if plugin in CHAINED_AFTER:
        conf["ipam"] = host_local  # the ptp ADD before it reads it
    return conf


def run(bench: Bench) -> None:
    """Measure every registered plugin; results under
    ``bench.results["chained"]`` (``{"missing": {plugin: why}}``), samples in
    scenario ``chained``."""
    n = bench.prof.pods
    installed = plugin_registry()
    missing = {p: "not registered in this install" for p in PLUGINS if p not in installed}
    bench.results["chained"] = {"missing": missing}
    for plugin in PLUGINS:
        if plugin in missing:
            log(f"chained: {plugin} not measured: {missing[plugin]}")
            continue
        modes = [m for m in bench.modes if not (m.key == "go" and plugin in NOT_IN_GO)]
        log(f"chained: {plugin}, {n} pods per mode, interleaved")
        for i in range(n):
            for mode in bench.rotation(i, modes):
                pod = bench.pod()
                conf = config(plugin, bench.store(mode, f"ch-{plugin}"))
                kw = {"scenario": "chained", "cid": f"{mode.key}-{plugin}-{i}",
                      "netns": pod.path}
                first = CHAINED_AFTER.get(plugin)
                if first is not None:
                    base = dict(conf, type=first)
                    _, prev = bench.call(mode, first, "ADD", base, record=False, **kw)
                    conf["prevResult"] = prev
                bench.call(mode, plugin, "ADD", conf, **kw)
                bench.call(mode, plugin, "DEL", conf, **kw)
                if first is not None:
                    bench.call(mode, first, "DEL", dict(conf, type=first), record=False, **kw)
                bench.drop_pod(pod)


def report(bench: Bench, w) -> None:
    """The section of the report: a row per plugin and verb."""
    res = bench.results.get("chained")
    if res is None:
        return
    w(f"\n## Chained and IPAM plugins, {bench.prof.pods} pods each\n")
    w("| plugin | verb | Go ms | warm ms | warm/Go | one-shot ms | one-shot/Go |")
    w("|---|---|---|---|---|---|---|")
    for plugin in PLUGINS:
        if plugin in res["missing"]:
            w(f"| {plugin} | - | not measured: {res['missing'][plugin]} | | | | |")
            continue
        for verb in ("ADD", "DEL"):
            g, wm, o = (med(bench.sel("chained", m, plugin, verb))
                        for m in ("go", "warm", "oneshot"))
            w(f"| {plugin} | {verb} | {ms(g)} | {ms(wm)} | {rx(ratio(wm, g))} | {ms(o)} "
              f"| {rx(ratio(o, g))} |")
    w("\nstatic: the IPAM call alone. sbr, bandwidth: the call chained after ptp + host-local "
      "(not counted). flannel: its call, bridge + host-local delegated in it; Debian's Go set "
      "has no flannel: no ratio.")


def budgets(bench: Bench) -> list[tuple[str, str, bool | None]]:
    """Issue 34's: warm <= 0.6x Go, ADD and DEL of each plugin Go ships
    (the worst ratio)."""
    res = bench.results.get("chained")
    if res is None:
        return [("chained and IPAM plugins vs Go", "not run", None)]
    worst: tuple[float, str] | None = None
    for plugin in PLUGINS:
        if plugin in res["missing"] or plugin in NOT_IN_GO:
            continue
        for verb in ("ADD", "DEL"):
            r = ratio(med(bench.sel("chained", "warm", plugin, verb)),
                      med(bench.sel("chained", "go", plugin, verb)))
            if r is not None and (worst is None or r > worst[0]):
                worst = (r, f"{plugin} {verb}")
    name = f"chained and IPAM plugins: warm ADD and DEL <= {WARM_LIMIT:g}x Go, every plugin"
    if worst is None:
        return [(name, "not run", None)]
    return [(name, f"max {rx(worst[0])} ({worst[1]})", worst[0] <= WARM_LIMIT)]

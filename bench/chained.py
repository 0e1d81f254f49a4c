"""The chained and IPAM plugins' ADD and DEL (issue 34), ours against Go's.

static (called as a runtime's interface plugin calls its IPAM), sbr,
bandwidth and firewall (each chained after ptp + host-local, whose ADD before
and DEL after are not counted) and flannel (delegating to bridge +
host-local, counted: that is its call): ``pods`` pods each, every mode
interleaved call by call (the mode order rotated per pod), a fresh pod
namespace per pod. Debian's Go set has no flannel: its row has no ratio. A
plugin not registered in this install is not measured (the report says so).

Firewall scale (`scale`): a probe pod's firewall ADD and DEL with 0 and
``fw_levels`` other pods let through (ours: an ipset entry each; Go's: two
iptables rules each in CNI-FORWARD), ``go`` and ``warm`` only.

Budgets (issue 34): warm <= 0.6x Go for each plugin Go ships; warm firewall
ADD at the top level <= 1.2x its cost at 0.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from cni_skel.warm.install import plugin_registry

from .stats import CNI_VERSION, REFERENCES, fake_result, log, med, ms, ratio, rx

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .modes import Mode
    from .run import Bench

PLUGINS = ("static", "sbr", "bandwidth", "flannel", "firewall")
NOT_IN_GO = frozenset({"flannel"})
#: What each plugin is chained after (its ADD before, its DEL after: not counted).
CHAINED_AFTER = {"sbr": "ptp", "bandwidth": "ptp", "firewall": "ptp"}
WARM_LIMIT = 0.6
#: The firewall scale run's modes (one-shot, ~200 ms a call, would take minutes to fill).
SCALE_MODES = ("go", "warm")
SCALE_LIMIT = 1.2
#: The probe pod's address: beside the fillers' (`filler_ip`), away from the
#: chained run's 10.105.0.0/16.
PROBE_IP = "10.106.255.2/16"
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
    elif plugin == "firewall":
        # records beside the IPAM store: never the node's /run/cni/firewall
        conf.update(backend="iptables", dataDir=os.path.join(store, "firewall"))
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
        modes = [m for m in bench.modes if not (m.key in REFERENCES and plugin in NOT_IN_GO)]
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


def filler_ip(j: int) -> str:
    """The j-th other pod's address (CIDR) in the firewall scale run: 250
    to a /24 of 10.106.0.0/16 (the probe's `PROBE_IP` stays apart)."""
    return f"10.106.{j // 250}.{j % 250 + 2}/16"


def scale_config(store: str, pod_path: str, ip: str) -> dict:
    """One firewall call of the scale run: ``ip`` (CIDR) as the pod's
    address in a fabricated prevResult (the plugin reads only its ``ips``:
    no interface is made)."""
    return {"cniVersion": CNI_VERSION, "name": "bench-fw-scale", "type": "firewall",
            "backend": "iptables", "dataDir": os.path.join(store, "firewall"),
            "prevResult": fake_result(pod_path, ip)}


def scale(bench: Bench) -> None:
    """Issue 34's firewall scale: ``fw_samples`` ADD+DEL pairs of one probe
    pod per mode, interleaved (scenario ``scale-fw``, tagged ``level``, the
    other pods let through, and ``round``), at each of ``fw_levels`` going
    up, then again on the way back down to 0: level 0 is sampled before the
    filling and after the clean-up, so a drift of the machine's load over
    the minute Go's filling takes falls on both sides. The other pods are
    firewall ADDs (DELs on the way down) with fabricated prevResults through
    each mode's own path, in bulk (`Bench.bulk`). Results under
    ``bench.results["firewall_scale"]``: seconds spent filling (``fill``)
    and emptying (``clean``) per mode, and the records of ours left once all
    are DELed (``left``)."""
    prof = bench.prof
    missing = {m.key: "no firewall executable" for m in bench.modes if m.key in SCALE_MODES
               and not os.access(os.path.join(m.bin_dir, "firewall"), os.X_OK)}
    modes = [m for m in bench.modes if m.key in SCALE_MODES and m.key not in missing]
    res = bench.results["firewall_scale"] = {
        "levels": list(prof.fw_levels), "modes": [m.key for m in modes], "missing": missing,
        "fill": {}, "clean": {}, "left": {}}
    if not modes:
        return
    pod = bench.pod()
    stores = {m.key: bench.store(m, "fw-scale") for m in modes}

    def probe(mode: Mode, verb: str, cid: str, **tags) -> None:
        bench.call(mode, "firewall", verb, scale_config(stores[mode.key], pod.path, PROBE_IP),
                   scenario="scale-fw", cid=cid, netns=pod.path, **tags)

    def others(mode: Mode, verb: str):
        def req(j: int) -> dict:
            conf = scale_config(stores[mode.key], pod.path, filler_ip(j))
            return mode.request("firewall", bench.env(mode, verb, f"fwfill-{j}", pod.path, "eth0"),
                                json.dumps(conf))
        return req

    # Level 0 means the chains and set there with no pod in them: a first
    # ADD would pay for making them.
    for mode in modes:
        for verb in ("ADD", "DEL"):
            probe(mode, verb, "fw-warm-up", record=False)
    filled = 0
    for rnd, lvl in enumerate((*prof.fw_levels, *reversed(prof.fw_levels[:-1]))):
        verb, key = ("ADD", "fill") if lvl >= filled else ("DEL", "clean")
        log(f"scale: firewall with {lvl} other pods let through ({verb} {abs(lvl - filled)})")
        for mode in modes:
            done = res[key].get(mode.key, 0.0)
            res[key][mode.key] = done + bench.bulk(mode, "firewall", verb, others(mode, verb),
                                                   min(filled, lvl), max(filled, lvl),
                                                   "scale-fw-others")
        filled = lvl
        for k in range(prof.fw_samples):
            for mode in bench.rotation(k, modes):
                for verb in ("ADD", "DEL"):
                    probe(mode, verb, f"{mode.key}-fw-{rnd}-{k}", level=lvl, round=rnd)
    for mode in modes:
        if mode.key != "go":  # Go keeps no records (its DEL's misses are its errors)
            res["left"][mode.key] = mode.node.request(
                {"op": "inspect", "files": os.path.join(stores[mode.key], "firewall")})["files"]
    bench.drop_pod(pod)


def scale_report(bench: Bench, w) -> None:
    """The firewall scale section: a row per verb and level."""
    res = bench.results.get("firewall_scale")
    if res is None:
        return
    top = res["levels"][-1]
    w(f"\n## Scale: firewall with other pods let through ({bench.prof.fw_samples} samples "
      "per level and pass)\n")
    w("A probe pod's ADD, then its DEL (backend iptables, a fabricated prevResult), with N other "
      "pods let through: ours an ipset entry and a record file each, Go's two iptables rules "
      "each in CNI-FORWARD. The N are N firewall ADDs through the mode's own path "
      f"({bench.prof.fill_workers} threads), DELed the same way after the top level; level 0 is "
      "sampled before the filling and after the clean-up (the median of both). `go` and "
      "`warm` only.\n")
    if res["missing"]:
        w("Not measured: " + "; ".join(f"`{k}`: {v}" for k, v in res["missing"].items()) + "\n")
    w("| verb @ pods | Go ms med | warm ms med | warm/Go | Go vs its 0 | warm vs its 0 |")
    w("|---|---|---|---|---|---|")
    for verb in ("ADD", "DEL"):
        for lvl in res["levels"]:
            bench.scale_row(w, verb, "scale-fw", "firewall", verb, lvl, [], ours="warm")
    w(f"\nFilling to {top:,} pods / DELing them all, s: "
      + ", ".join(f"`{m}` {res['fill'].get(m, 0):.1f} / {res['clean'].get(m, 0):.1f}"
                  for m in res["modes"])
      + ". Records of ours left: "
      + ", ".join(f"`{m}` {len(left)}" for m, left in res["left"].items()) + ".")


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
    w("\nstatic: the IPAM call alone. sbr, bandwidth, firewall (iptables backend): the call "
      "chained after ptp + host-local (not counted). flannel: its call, bridge + host-local "
      "delegated in it; Debian's Go set has no flannel: no ratio.")


def budgets(bench: Bench) -> list[tuple[str, str, bool | None]]:
    """Issue 34's: warm <= 0.6x Go, ADD and DEL of each plugin Go ships
    (the worst ratio); warm firewall ADD at the top scale level <= 1.2x its
    cost at 0."""
    return [_chained_budget(bench), _scale_budget(bench)]


def _chained_budget(bench: Bench) -> tuple[str, str, bool | None]:
    res = bench.results.get("chained")
    if res is None:
        return ("chained and IPAM plugins vs Go", "not run", None)
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
        return (name, "not run", None)
    return (name, f"max {rx(worst[0])} ({worst[1]})", worst[0] <= WARM_LIMIT)


def _scale_budget(bench: Bench) -> tuple[str, str, bool | None]:
    top = bench.prof.fw_levels[-1]
    name = f"firewall ADD at {top:,} pods <= {SCALE_LIMIT:g}x its cost at 0 (warm)"
    if "warm" not in bench.results.get("firewall_scale", {}).get("modes", ()):
        return (name, "not run", None)
    return bench.scale_budget(name, "scale-fw", "warm", "firewall", "ADD", top, SCALE_LIMIT)

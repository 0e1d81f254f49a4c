"""The bench's headline ratios, ours / Go, as an SVG bar chart.

    python -m bench.chart bench/results/bench-full-<stamp>.json [-o chart.svg] [--ours warm]

`draw` reads the dict `bench.run` writes to ``bench-<profile>-<stamp>.json``
and draws one horizontal bar per ratio it can compute, from 1 (Go) on a log
axis, so 0.5x and 2x are the same length either side of Go. Bars in blue are
where ours does better than Go, orange where it does worse. Whatever the run
did not measure (``--only``, a mode left out) is left out of the chart; with
nothing to draw there is no file.

"Ours" is the default install (mode ``warm``) when the run has it, else the
one-shot fallback (``oneshot``); ``--ours`` picks another mode. The numbers are
computed as `bench.run` computes them for its tables and summary line:

* per call (scenario ``lifecycle``): from ``samples``, the successful samples
  (``code`` 0) of ``scenario == "lifecycle"``; a chain row is the median over
  pods of the per-pod sum of ``wall`` for one verb (``Bench.chain_totals``),
  "pod total" the median of the per-pod sum over every verb, and a plugin row
  the median ``wall`` of that plugin and verb (``Bench.sel``). Ratio: median of
  ours / median of Go.
* bridge churn: ``results["churn"][<workers>][<mode>]["pods_per_s"]`` per
  worker count, and ``["cpu_per_pod"]`` at the largest worker count (the one
  issue 20's budget reads).
* chain churn: ``results["chain_churn"][<mode>]["pods_per_s"]`` and
  ``["cpu_per_pod"]``, with its ``pods`` and ``workers``.

The title names the profile (``profile["name"]``), the run's date and commit
from the top-level keys ``date`` and ``commit`` when the JSON has them, else
the date from the ``bench-<profile>-YYYYMMDD-HHMMSS`` stamp in the output
file's name (`draw`'s ``path``, which the CLI derives from the JSON's name).

matplotlib is optional (``pip install matplotlib``): without it `draw` logs
one line and returns None, and the bench goes on. The figure is built with
matplotlib's object-oriented API and its SVG canvas (no pyplot, no GUI
backend, no global state changed); text stays text (``svg.fonttype: none``)
laid out with the DejaVu Sans metrics matplotlib ships, the ids are salted
with a constant and the date metadata is left out, so the same input gives
the same bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field

from .stats import log, med, ratio

try:
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
except ImportError:  # the chart is optional: draw() says so and returns None
    matplotlib = None

#: the lifecycle scenario's plugins and verbs drawn one bar each (run.py's table rows)
LIFECYCLE_PLUGINS = ("loopback", "bridge", "tuning", "portmap")
LIFECYCLE_VERBS = ("ADD", "DEL")
#: the mode a ratio's numerator comes from, first one the run has
OURS = ("warm", "oneshot")
BETTER, WORSE = "#4477AA", "#EE7733"  # Paul Tol's bright/vibrant: safe for colour blindness
#: rcParams for the figure (inside a context: the caller's settings are left alone)
STYLE = {
    "svg.hashsalt": "cni-skel-bench-chart",
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
STAMP = re.compile(r"bench-(?P<profile>[a-z]+)-(?P<d>\d{8})-(?P<t>\d{6})")
MODE_NAMES = {"warm": "the default install (warm: launchers + worker)",
              "oneshot": "the one-shot fallback (oneshot: no worker)",
              "script": "plain scripts (script)", "inproc": "in-process (inproc)"}


@dataclass
class Bar:
    label: str
    ratio: float
    higher_is_better: bool = False
    headline: bool = False  # a chain or the pod: bold

    @property
    def better(self) -> bool:
        return self.ratio > 1 if self.higher_is_better else self.ratio < 1


@dataclass
class Group:
    title: str
    bars: list[Bar] = field(default_factory=list)


def pick_ours(results: dict) -> str | None:
    """The mode whose numbers are "ours": the first of `OURS` the run has."""
    modes = set(results.get("modes") or ())
    modes |= {s.get("mode") for s in results.get("samples", ())}
    return next((m for m in OURS if m in modes), None)


def lifecycle(results: dict, ours: str) -> Group | None:
    """Per-call ratios of the lifecycle scenario: the chains, the pod and
    each plugin's ADD and DEL (median wall time, ours / Go)."""
    samples = [s for s in results.get("samples", ())
               if s.get("scenario") == "lifecycle" and s.get("code") == 0
               and s.get("wall") is not None]
    if not samples:
        return None

    def chain(mode: str) -> dict[str, list[float]]:
        """Per verb (and "total"): the per-pod sums of wall time."""
        per: dict[tuple, float] = {}
        for s in samples:
            if s["mode"] == mode:
                key = (s.get("pod"), s["verb"])
                per[key] = per.get(key, 0.0) + s["wall"]
        out: dict[str, list[float]] = {}
        pods: dict = {}
        for (pod, verb), wall in per.items():
            out.setdefault(verb, []).append(wall)
            pods[pod] = pods.get(pod, 0.0) + wall
        out["total"] = list(pods.values())
        return out

    def walls(mode: str, plugin: str, verb: str) -> list[float]:
        return [s["wall"] for s in samples
                if s["mode"] == mode and s["plugin"] == plugin and s["verb"] == verb]

    go, us = chain("go"), chain(ours)
    pods = len({s.get("pod") for s in samples if s["mode"] == "go"})
    group = Group(f"Per call: median wall time over a lifecycle of {count(pods)} pods "
                  "(lower is better)")
    for label, key in (("ADD chain", "ADD"), ("DEL chain", "DEL"),
                       ("pod total (ADD, CHECK, DEL)", "total")):
        add(group, label, ratio(med(us.get(key, [])), med(go.get(key, []))), headline=True)
    for verb in LIFECYCLE_VERBS:
        for plugin in LIFECYCLE_PLUGINS:
            add(group, f"{plugin} {verb}",
                ratio(med(walls(ours, plugin, verb)), med(walls("go", plugin, verb))))
    return group


def churn(results: dict, ours: str) -> Group | None:
    """Bridge churn: pods/s per worker count, CPU per pod at the most workers."""
    rounds = (results.get("results") or {}).get("churn") or {}
    workers = sorted(rounds, key=int)
    if not workers:
        return None
    pods = next((o.get("pods") for res in rounds.values() for o in res.values()
                 if o.get("pods")), None)
    group = Group("Bridge churn" + (f", {count(pods)} pods a round" if pods else "")
                  + " (pods/s: higher is better; CPU: lower is better)")
    for wk in workers:
        add(group, f"pods/s, {wk} workers", vs_go(rounds[wk], ours, "pods_per_s"), True)
    top = workers[-1]
    add(group, f"CPU per pod, {top} workers", vs_go(rounds[top], ours, "cpu_per_pod"))
    return group


def chain_churn(results: dict, ours: str) -> Group | None:
    """Chain churn (the lifecycle's chain, every pod live at once): pods/s, CPU per pod."""
    cc = (results.get("results") or {}).get("chain_churn") or {}
    one = cc.get(ours) or cc.get("go")
    if not one:
        return None
    group = Group(f"Chain churn, {count(one.get('pods'))} pods, {one.get('workers', '?')} workers "
                  "(pods/s: higher is better; CPU: lower is better)")
    add(group, "pods/s", vs_go(cc, ours, "pods_per_s"), True)
    add(group, "CPU per pod", vs_go(cc, ours, "cpu_per_pod"))
    return group


def count(n: object) -> str:
    return f"{n:,}" if isinstance(n, int) else str(n if n is not None else "?")


def vs_go(res: dict, ours: str, key: str) -> float | None:
    return ratio((res.get(ours) or {}).get(key), (res.get("go") or {}).get(key))


def add(group: Group, label: str, r: float | None, higher_is_better: bool = False,
        headline: bool = False) -> None:
    if r is not None and r > 0 and math.isfinite(r):
        group.bars.append(Bar(label, r, higher_is_better, headline))


def groups(results: dict, ours: str | None = None) -> list[Group]:
    """Every group of bars the run has, in the chart's order (empty groups left out)."""
    ours = ours or pick_ours(results)
    if ours is None or ours == "go":
        return []
    found = (lifecycle(results, ours), churn(results, ours), chain_churn(results, ours))
    return [g for g in found if g is not None and g.bars]


def title(results: dict, path: str, ours: str) -> tuple[str, str]:
    """The chart's title and its second line (profile, date, commit, ours)."""
    m = STAMP.search(os.path.basename(path))
    profile = (results.get("profile") or {}).get("name") or (m["profile"] if m else None)
    date = results.get("date")
    if not date and m:
        d, t = m["d"], m["t"]
        date = f"{d[:4]}-{d[4:6]}-{d[6:]} {t[:2]}:{t[2:4]}"
    commit = results.get("commit")
    bits = [f"{profile} run" if profile else None, str(date) if date else None,
            f"commit {str(commit)[:12]}" if commit else None]
    sub = ", ".join(b for b in bits if b)
    sub = (sub + "; " if sub else "") + f"ours = {MODE_NAMES.get(ours, ours)}"
    return "cni-skel vs the Go reference plugins: ours / Go", sub


def ticks(lo: float, hi: float) -> list[float]:
    """Tick positions for a log axis from ``lo`` to ``hi``: 1, 2, 5 per decade."""
    out = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        out += [k * 10.0 ** e for k in (1, 2, 5) if lo <= k * 10.0 ** e <= hi]
    return out


def tick_label(v: float, _pos: object = None) -> str:
    return "Go = 1x" if v == 1 else f"{v:g}x"


def draw(results: dict, path: str, ours: str | None = None) -> str | None:
    """Write the ratio chart of ``results`` (a bench JSON, loaded) to
    ``path`` (SVG); return ``path``, or None when the run has nothing to draw
    or matplotlib is not installed (then one line on stderr says so)."""
    ours = ours or pick_ours(results)
    found = groups(results, ours)
    if not found:
        log("chart: no ours/Go ratio in these results, no chart drawn")
        return None
    if matplotlib is None:
        log("chart: matplotlib is not installed, no chart drawn (pip install matplotlib)")
        return None
    try:
        plot(found, *title(results, path, ours), path)
    except Exception as exc:  # the chart is an extra: it never fails the bench
        log(f"chart: not drawn: {exc!r}")
        return None
    return path


def plot(found: list[Group], head: str, sub: str, path: str) -> None:
    """Draw ``found`` under the title ``head`` and ``sub`` into the SVG ``path``."""
    bars = [b for g in found for b in g.bars]
    # at least 0.5x-2x, and room for the value labels beyond the longest bars
    lo_e = min(-0.3, *(math.log10(b.ratio) for b in bars))
    hi_e = max(0.3, *(math.log10(b.ratio) for b in bars))
    pad = 0.14 * (hi_e - lo_e)
    lo, hi = 10 ** (lo_e - pad), 10 ** (hi_e + pad)
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(8, 1.1 + sum(0.5 + 0.27 * len(g.bars) for g in found)),
                     layout="constrained")
        FigureCanvasSVG(fig)
        axes = fig.subplots(len(found), 1, sharex=True, squeeze=False,
                            height_ratios=[0.9 + len(g.bars) for g in found])[:, 0]
        for ax, group in zip(axes, found, strict=True):
            y = list(range(len(group.bars)))
            rs = [b.ratio for b in group.bars]
            ax.barh(y, [abs(r - 1) for r in rs], left=[min(r, 1.0) for r in rs], height=0.62,
                    color=[BETTER if b.better else WORSE for b in group.bars])
            for yy, b in zip(y, group.bars, strict=True):
                right = b.ratio >= 1
                ax.annotate(f"{b.ratio:.2f}x", (b.ratio, yy), xytext=(3 if right else -3, 0),
                            textcoords="offset points", va="center",
                            ha="left" if right else "right")
            ax.axvline(1.0, color="black", linewidth=1.1)
            ax.set_yticks(y, [b.label for b in group.bars])
            for tick, b in zip(ax.get_yticklabels(), group.bars, strict=True):
                tick.set_fontweight("bold" if b.headline else "normal")
            ax.set_ylim(len(y) - 0.45, -0.55)  # first bar on top
            ax.tick_params(axis="y", length=0)
            ax.set_title(group.title, loc="left")
            ax.set_xscale("log")
            ax.grid(axis="x", color="#dddddd", linewidth=0.6)
            ax.set_axisbelow(True)
        ax = axes[-1]
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(FixedLocator(ticks(lo, hi)))
        ax.xaxis.set_major_formatter(FuncFormatter(tick_label))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("ours / Go (log scale; blue: ours better than Go, orange: worse)")
        fig.suptitle(f"{head}\n{sub}", x=0.01, ha="left", fontsize=10)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, format="svg", metadata={"Date": None, "Title": f"{head} ({sub})"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.chart",
                                 description="Draw a bench run's ours/Go ratios as an SVG.")
    ap.add_argument("results", help="a bench-<profile>-<stamp>.json written by python -m bench")
    ap.add_argument("-o", "--output", help="the SVG to write (default: the JSON's name, .svg)")
    ap.add_argument("--ours", choices=("warm", "oneshot", "script", "inproc"),
                    help="the mode drawn against Go (default: warm if the run has it, "
                    "else oneshot)")
    args = ap.parse_args(argv)
    with open(args.results) as fp:
        results = json.load(fp)
    out = args.output or os.path.splitext(args.results)[0] + ".svg"
    path = draw(results, out, args.ours)
    if path is None:
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

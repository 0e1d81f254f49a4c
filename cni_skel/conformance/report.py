"""A conformance run's report: a table for people, JSON for tools, JUnit XML
for CI systems.

`Report.ok` is true when no check failed; checks that are not applicable
(a plugin without IPAM has no failing-IPAM rollback) or not selected do not
count. Timings are reported per verb, never judged: machines differ.
"""

from __future__ import annotations

import json
import statistics
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["STATUSES", "CheckOutcome", "Report", "timing_table"]

#: What a check can end as.
STATUSES = ("pass", "fail", "n/a", "not run", "skipped")


@dataclass
class CheckOutcome:
    """One check's end: ``status`` (one of `STATUSES`), the ``failures``
    (``[scenario] what showed it``, one each) and ``why`` (for n/a, not run
    and skipped)."""

    name: str
    section: str
    rule: str
    status: str
    failures: list[str] = field(default_factory=list)
    why: str = ""


def timing_table(timings: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per verb: ``calls``, ``median_ms``, ``p90_ms``, ``max_ms``."""
    out: dict[str, dict[str, float]] = {}
    for verb, seconds in sorted(timings.items()):
        ms = sorted(x * 1000.0 for x in seconds)
        p90 = ms[min(len(ms) - 1, round(0.9 * (len(ms) - 1)))]
        out[verb] = {"calls": len(ms), "median_ms": round(statistics.median(ms), 1),
                     "p90_ms": round(p90, 1), "max_ms": round(ms[-1], 1)}
    return out


@dataclass
class Report:
    """What a run found: the ``target`` (network, plugins, executables),
    each check's `CheckOutcome` in `CHECKS` order, what each plugin
    ``claims`` (VERSION), per-verb ``timings``, the run's ``seconds``, and
    ``errors``: scenarios the kit itself failed to run (its checks are then
    "not run"; the run is not ok)."""

    target: dict[str, Any]
    checks: list[CheckOutcome]
    claims: dict[str, list[str]] = field(default_factory=dict)
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No check failed and the kit ran every scenario it wanted."""
        return not self.failed and not self.errors

    @property
    def failed(self) -> list[str]:
        """The names of the checks that failed."""
        return [c.name for c in self.checks if c.status == "fail"]

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``cni-skel conformance --json``)."""
        return {"ok": self.ok, "target": self.target, "counts": self.counts(),
                "checks": [asdict(c) for c in self.checks], "claims": self.claims,
                "timings": self.timings, "seconds": round(self.seconds, 2),
                "errors": self.errors}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def table(self, *, verbose: bool = False) -> str:
        """The terminal report: one line per check, each failure under it
        (at most 5 unless ``verbose``), the timings, a summary line."""
        width = max(len(c.name) for c in self.checks)
        plugins = ", ".join(p["type"] for p in self.target.get("plugins", []))
        lines = [f"network {self.target.get('network')} (cniVersion "
                 f"{self.target.get('cniVersion')}; plugins {plugins})", ""]
        for c in self.checks:
            mark = {"pass": "PASS", "fail": "FAIL", "n/a": "n/a ", "not run": "----",
                    "skipped": "skip"}[c.status]
            tail = f"  ({c.why})" if c.why and c.status != "skipped" else ""
            lines.append(f"{mark}  {c.name:<{width}}  spec {c.section}{tail}")
            shown = c.failures if verbose else c.failures[:5]
            for failure in shown:
                lines.append(f"        - {_one_line(failure, None if verbose else 300)}")
            if len(c.failures) > len(shown):
                lines.append(f"        ... {len(c.failures) - len(shown)} more (--verbose)")
        if self.timings:
            lines += ["", "timings (ms; reported, not judged):"]
            for verb, t in self.timings.items():
                lines.append(f"  {verb:<10} {int(t['calls']):>4} calls  median "
                             f"{t['median_ms']:>7.1f}  p90 {t['p90_ms']:>7.1f}  "
                             f"max {t['max_ms']:>7.1f}")
        for error in self.errors:
            lines += ["", f"KIT ERROR  {error}"]
        n = self.counts()
        lines += ["", f"{'OK' if self.ok else 'FAILED'}: {n['pass']} passed, {n['fail']} "
                  f"failed, {n['n/a']} not applicable, {n['not run']} not run, "
                  f"{n['skipped']} skipped in {self.seconds:.1f} s"]
        return "\n".join(lines) + "\n"

    def junit(self) -> str:
        """JUnit XML: one testsuite, a testcase per check (failures as
        <failure>, n/a, not run and skipped as <skipped>)."""
        n = self.counts()
        suite = ET.Element("testsuite", name=f"cni-conformance {self.target.get('network')}",
                           tests=str(len(self.checks)), failures=str(n["fail"]), errors="0",
                           skipped=str(n["n/a"] + n["not run"] + n["skipped"]),
                           time=f"{self.seconds:.3f}")
        for c in self.checks:
            case = ET.SubElement(suite, "testcase", classname="cni.conformance", name=c.name)
            if c.status == "fail":
                failure = ET.SubElement(case, "failure", message=f"{c.rule} (spec {c.section})")
                failure.text = "\n".join(c.failures)
            elif c.status != "pass":
                ET.SubElement(case, "skipped", message=f"{c.status}: {c.why}")
        ET.indent(suite)
        return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _one_line(text: str, limit: int | None) -> str:
    flat = " ".join(text.split())
    return flat if limit is None or len(flat) <= limit else flat[:limit] + " ..."

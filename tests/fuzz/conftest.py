"""Session figures of the fuzz run: inputs, calls, worker deaths, deviations
by class, calls per second. Written to ``fuzz-summary.json`` in pytest's
base temporary directory at the end of the session and printed in the
terminal summary."""

from __future__ import annotations

import json
from typing import Any

import pytest

_TOTALS = pytest.StashKey["FuzzTotals"]()


class FuzzTotals:
    """Sums over the fuzz test functions of the session (`add` one rig each)."""

    def __init__(self) -> None:
        self.tests = 0
        self.inputs = 0
        self.calls = 0
        self.worker_deaths = 0
        self.resets = 0
        self.seconds = 0.0
        self.seeds: set[int] = set()
        self.codes: dict[str, int] = {}
        self.by_class: dict[str, int] = {}
        self.where: dict[str, dict[str, int]] = {}  # class -> "mode plugin verb" -> count
        self.smallest: dict[str, Any] = {}  # class -> smallest Deviation
        self.path = ""

    def add(self, rig: Any) -> None:
        self.tests += 1
        self.inputs += rig.inputs
        self.calls += rig.calls
        self.worker_deaths += rig.worker_deaths
        self.resets += rig.resets
        self.seconds += rig.seconds
        if rig.seed is not None:
            self.seeds.add(rig.seed)
        for code, n in rig.codes.items():
            self.codes[code] = self.codes.get(code, 0) + n
        for cls, (n, dev) in rig.by_class.items():
            self.by_class[cls] = self.by_class.get(cls, 0) + n
            where = self.where.setdefault(cls, {})
            label = f"{rig.mode} {rig.plugin} {rig.verb}"
            where[label] = where.get(label, 0) + n
            if cls not in self.smallest or dev.size < self.smallest[cls].size:
                self.smallest[cls] = dev

    def as_dict(self) -> dict[str, Any]:
        return {
            "tests": self.tests, "inputs": self.inputs, "calls": self.calls,
            "worker_deaths": self.worker_deaths, "namespace_resets": self.resets,
            "seconds": round(self.seconds, 1),
            "calls_per_second": round(self.calls / self.seconds, 2) if self.seconds else None,
            "seeds": sorted(self.seeds), "answers": dict(sorted(self.codes.items())),
            "deviations": dict(sorted(self.by_class.items())),
            "deviations_where": self.where,
            "reproducers": {cls: dev.render() for cls, dev in sorted(self.smallest.items())},
        }

    def lines(self) -> list[str]:
        rate = f"{self.calls / self.seconds:.1f}" if self.seconds else "-"
        out = [f"{self.tests} test functions, {self.inputs} inputs, {self.calls} plugin calls "
               f"in {self.seconds:.0f} s ({rate} calls/s), {self.worker_deaths} worker "
               f"death(s), {sum(self.by_class.values())} deviation(s)"
               + (f", seeds {sorted(self.seeds)}" if self.seeds else "")]
        out.append("answers: "
                   + ", ".join(f"{k}: {v}" for k, v in sorted(self.codes.items())))
        for cls, n in sorted(self.by_class.items()):
            where = ", ".join(f"{k} {v}" for k, v in sorted(self.where[cls].items()))
            out.append(f"  {cls}: {n} ({where})")
        if self.path:
            out.append(f"summary: {self.path}")
        return out


@pytest.fixture(scope="session")
def fuzz_totals(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Any:
    totals = FuzzTotals()
    request.config.stash[_TOTALS] = totals
    yield totals
    path = tmp_path_factory.getbasetemp() / "fuzz-summary.json"
    path.write_text(json.dumps(totals.as_dict(), indent=2) + "\n")
    totals.path = str(path)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    totals = config.stash.get(_TOTALS, None)
    if totals is None or not totals.tests:
        return
    terminalreporter.write_sep("-", "cni-skel fuzz")
    for line in totals.lines():
        terminalreporter.write_line(line)

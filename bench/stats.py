"""The benchmark's statistics, number formats and the small helpers shared
by bench.run and its scenario modules."""

from __future__ import annotations

import math
import statistics
import sys
import time

MiB = 1024  # KiB per MiB: memory is read in KiB
CNI_VERSION = "1.0.0"  # the newest Go 1.1.1 speaks
#: The Go reference modes (bench.modes): their failures are reported, not ours.
REFERENCES = ("go", "go191")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cpu_ticks() -> tuple[int, int]:
    """(all, idle + iowait) jiffies of the machine's CPUs (/proc/stat)."""
    with open("/proc/stat") as fp:
        values = [int(v) for v in fp.readline().split()[1:]]
    return sum(values), values[3] + values[4]


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """The share of the machine's CPU time that was busy between two `cpu_ticks`."""
    total = after[0] - before[0]
    return None if total <= 0 else 1 - (after[1] - before[1]) / total


def med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ms(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x * 1000:.{digits}f}"


def mib(kib: float | None) -> str:
    return "-" if kib is None else f"{kib / MiB:.1f}"


def pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}%"


def rx(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def fake_result(pod_path: str, ip: str) -> dict:
    """A prevResult naming one interface in ``pod_path`` and ``ip`` (CIDR)
    on it, for a chained plugin called without the interface plugin's ADD
    (portmap and firewall read only these fields)."""
    return {"cniVersion": CNI_VERSION,
            "interfaces": [{"name": "eth0", "sandbox": pod_path}],
            "ips": [{"address": ip, "interface": 0}]}

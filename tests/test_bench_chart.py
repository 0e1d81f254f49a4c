"""bench/chart.py: the ours/Go ratio chart `make bench` draws from its JSON.

No root, no benchmark run: the results are made here in the shape
bench/run.py dumps (``samples`` of the lifecycle scenario, ``results["churn"]``
per worker count and mode, ``results["chain_churn"]`` per mode), with round
numbers so each ratio is known."""

from __future__ import annotations

import copy
import importlib
import json
import pathlib
import sys
import xml.etree.ElementTree as ET

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is not installed: a package of the checkout
    sys.path.insert(0, str(ROOT))
chart = importlib.import_module("bench.chart")

needs_mpl = pytest.mark.skipif(chart.matplotlib is None,
                               reason="matplotlib not installed (pip install matplotlib)")
STAMP = "bench-full-20261127-184838"
PLUGINS = ("loopback", "bridge", "tuning", "portmap")


def sample(scenario: str, mode: str, plugin: str, verb: str, wall: float, code: int = 0,
           **tags) -> dict:
    return {"scenario": scenario, "mode": mode, "plugin": plugin, "verb": verb, "wall": wall,
            "cpu": wall / 2, "rss": 4000, "code": code, **tags}


def churn_round(pods_per_s: float, cpu_per_pod: float, pods: int = 100) -> dict:
    return {"pods": pods, "seconds": pods / pods_per_s, "add_seconds": 1.0, "del_seconds": 1.0,
            "add_busy": 0.5, "del_busy": 0.5, "pods_per_s": pods_per_s,
            "cpu_per_pod": cpu_per_pod, "p99": 0.05, "errors": 0, "duplicates": 0, "leaks": []}


def lifecycle_samples() -> list[dict]:
    """Two pods: every Go call 10 ms, every warm call 5 ms except portmap DEL
    (1 ms), one-shot 100 ms; plus a failed warm call that must not count."""
    out = []
    for pod in range(2):
        for verb in ("ADD", "CHECK", "DEL"):
            for plugin in PLUGINS:
                out.append(sample("lifecycle", "go", plugin, verb, 0.010, pod=pod))
                fast = plugin == "portmap" and verb == "DEL"
                out.append(sample("lifecycle", "warm", plugin, verb, 0.001 if fast else 0.005,
                                  pod=pod))
                out.append(sample("lifecycle", "oneshot", plugin, verb, 0.100, pod=pod))
    out.append(sample("lifecycle", "warm", "bridge", "ADD", 9.0, code=1, pod=0))
    return out


def full_results() -> dict:
    """A full run: lifecycle, bridge churn at 2 and 8 workers, chain churn."""
    churn = {"2": {"go": churn_round(40.0, 0.016), "oneshot": churn_round(2.0, 0.8),
                   "warm": churn_round(80.0, 0.012)},
             "8": {"go": churn_round(80.0, 0.020), "oneshot": churn_round(2.0, 0.9),
                   "warm": churn_round(60.0, 0.015)}}
    chain = {m: {**churn_round(pps, cpu, 1000), "workers": 8, "calls": 10000,
                 "nft_checked": True, "nft_live": 0}
             for m, pps, cpu in (("go", 10.0, 0.8), ("warm", 120.0, 0.04))}
    samples = [*lifecycle_samples(), sample("churn", "go", "bridge", "ADD", 0.01, workers=2)]
    return {"profile": {"name": "full", "pods": 2, "churn_workers": [2, 8]},
            "modes": ["go", "oneshot", "warm"], "skipped": {},
            "results": {"memory": {}, "churn": churn, "chain_churn": chain, "seconds": 60.0},
            "budgets": [["a budget", "1 / 2 ms = 0.50x", True]], "errors": [], "go_errors": [],
            "summary": "bench full ok", "samples": samples}


def churn_only() -> dict:
    """``--only churn``: no lifecycle samples, no chain churn."""
    res = full_results()
    res["results"] = {"churn": res["results"]["churn"], "memory": {}, "seconds": 30.0}
    res["samples"] = [s for s in res["samples"] if s["scenario"] == "churn"]
    return res


def texts(svg: pathlib.Path) -> str:
    """Every piece of text in the SVG (it keeps text as text), one a line."""
    root = ET.parse(svg).getroot()
    return "\n".join(t.strip() for t in root.itertext() if t.strip())


def bars(results: dict, ours: str | None = None) -> dict[str, float]:
    return {f"{g.title.split(',')[0].split(':')[0]} / {b.label}": round(b.ratio, 6)
            for g in chart.groups(results, ours) for b in g.bars}


def test_ratios_as_run_computes_them():
    got = bars(full_results())
    assert got == {
        "Per call / ADD chain": 0.5, "Per call / DEL chain": 0.4,
        "Per call / pod total (ADD, CHECK, DEL)": 0.466667,
        **{f"Per call / {p} ADD": 0.5 for p in PLUGINS},
        **{f"Per call / {p} DEL": 0.1 if p == "portmap" else 0.5 for p in PLUGINS},
        "Bridge churn / pods/s, 2 workers": 2.0, "Bridge churn / pods/s, 8 workers": 0.75,
        "Bridge churn / CPU per pod, 8 workers": 0.75,
        "Chain churn / pods/s": 12.0, "Chain churn / CPU per pod": 0.05}
    oneshot = bars(full_results(), "oneshot")
    assert oneshot["Per call / ADD chain"] == 10.0
    assert "Chain churn / pods/s" not in oneshot  # the chain churn runs go and warm only


def test_ours_is_oneshot_without_warm():
    res = full_results()
    res["modes"] = ["go", "oneshot"]
    res["samples"] = [s for s in res["samples"] if s["mode"] != "warm"]
    for rounds in res["results"]["churn"].values():
        del rounds["warm"]
    del res["results"]["chain_churn"]["warm"]
    assert chart.pick_ours(res) == "oneshot"
    assert bars(res)["Bridge churn / pods/s, 2 workers"] == 0.05


@needs_mpl
def test_full_run_draws_every_ratio(tmp_path):
    path = tmp_path / f"{STAMP}.svg"
    assert chart.draw(full_results(), str(path)) == str(path)
    text = texts(path)
    for label in ("ADD chain", "DEL chain", "pod total (ADD, CHECK, DEL)", "loopback ADD",
                  "bridge ADD", "tuning ADD", "portmap ADD", "loopback DEL", "portmap DEL",
                  "pods/s, 2 workers", "pods/s, 8 workers", "CPU per pod, 8 workers",
                  "pods/s", "CPU per pod", "Go = 1x",
                  "0.50x", "0.40x", "0.47x", "0.10x", "2.00x", "0.75x", "12.00x", "0.05x"):
        assert label in text.splitlines(), label
    assert "Chain churn, 1,000 pods, 8 workers" in text
    assert "full run, 2026-11-27 18:48" in text  # from the file name's stamp
    assert "default install" in text


@needs_mpl
def test_churn_only_run_draws_the_churn_bars_only(tmp_path):
    path = tmp_path / "bench-full-20261128-042126.svg"
    assert chart.draw(churn_only(), str(path)) == str(path)
    lines = texts(path).splitlines()
    assert {"pods/s, 2 workers", "pods/s, 8 workers", "CPU per pod, 8 workers"} <= set(lines)
    assert "ADD chain" not in lines
    assert not any(t.startswith(("Per call", "Chain churn")) for t in lines)


@needs_mpl
def test_date_and_commit_from_the_json(tmp_path):
    res = {**full_results(), "date": "2026-11-28 10:00", "commit": "0123456789abcdef0123"}
    path = tmp_path / "chart.svg"
    chart.draw(res, str(path))
    assert "full run, 2026-11-28 10:00, commit 0123456789ab" in texts(path)


def test_nothing_to_draw_gives_none(tmp_path):
    path = tmp_path / "none.svg"
    fw_only = {**full_results(), "results": {"firewall_scale": {}, "seconds": 5.0},
               "samples": [sample("scale-fw", "go", "firewall", "ADD", 0.01, level=0)]}
    go_only = copy.deepcopy(full_results())
    go_only["modes"] = ["go"]
    go_only["samples"] = [s for s in go_only["samples"] if s["mode"] == "go"]
    go_only["results"]["churn"] = {wk: {"go": r["go"]}
                                   for wk, r in go_only["results"]["churn"].items()}
    go_only["results"]["chain_churn"] = {"go": go_only["results"]["chain_churn"]["go"]}
    for res in ({}, {"results": {}, "samples": []}, fw_only, go_only):
        assert chart.draw(res, str(path)) is None
    assert not path.exists()


@needs_mpl
def test_same_input_same_bytes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    chart.draw(full_results(), str(a / f"{STAMP}.svg"))
    chart.draw(full_results(), str(b / f"{STAMP}.svg"))
    assert (a / f"{STAMP}.svg").read_bytes() == (b / f"{STAMP}.svg").read_bytes()


def test_without_matplotlib_none_and_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(chart, "matplotlib", None)
    assert chart.draw(full_results(), str(tmp_path / "x.svg")) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "pip install matplotlib" in err[0]
    assert not (tmp_path / "x.svg").exists()


@needs_mpl
def test_cli_writes_next_to_the_json(tmp_path, capsys):
    js = tmp_path / f"{STAMP}.json"
    js.write_text(json.dumps(full_results()))
    assert chart.main([str(js)]) == 0
    svg = tmp_path / f"{STAMP}.svg"
    assert capsys.readouterr().out.strip() == str(svg)
    ET.parse(svg)
    out = tmp_path / "sub" / "o.svg"
    assert chart.main([str(js), "-o", str(out), "--ours", "oneshot"]) == 0
    assert "one-shot fallback" in texts(out)
    js.write_text(json.dumps({"results": {}, "samples": []}))
    assert chart.main([str(js), "-o", str(tmp_path / "none.svg")]) == 1


@needs_mpl
def test_a_failing_draw_never_raises(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert chart.draw(full_results(), str(blocker / "x.svg")) is None  # its dir is a file
    assert "chart: not drawn" in capsys.readouterr().err

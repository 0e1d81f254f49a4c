"""The operators' dashboard and alerts work on a real worker's metrics (issue 36, item 4).

``test_every_dashboard_query_returns_data`` starts a ``cni-skel worker`` with
``--metrics-address`` (its own socket, `conftest.SuiteWorker`) and Debian's
``prometheus`` scraping it every second with deploy/prometheus-alerts.yaml
loaded. Real calls go through the launchers into namespaces made here:
loopback ADD/DEL (successes), a bad ADD (CNI error 1) and a bridge pod's ADD
and DEL (a link deletion batch of one, made to wait behind the test holding
the node's commit lock), plus one call of
each kind that fills a series of its own: a serving process that dies during
a call, one that recycles itself, an idle one killed from outside, a plugin
the worker does not serve, and a launcher falling back to one-shot. Then
every query of every panel of deploy/grafana-dashboard.json, with its
variables set to "All", returns at least one series with a number in it
through Prometheus' HTTP API; the dashboard's variables find values; every
metric the worker exports is on the dashboard; the rules are loaded and
healthy, and the alerts about the events made here are pending.

``test_alerts_fire_when_they_should`` runs ``promtool test rules`` on made-up
series: a node in trouble raises each alert, and a node that had the same
trouble more than 10 minutes ago, or that has only a few failing calls,
raises none.

Without ``prometheus``/``promtool`` the tests fail as root (``make deps``
installs Debian's prometheus package) and skip otherwise.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import yaml
from conftest import HERE, SuiteWorker, serving_processes

from cni_skel import linkbatch, netlink
from cni_skel.harness import TestNetNS, run_plugin_raw
from cni_skel.netns import NetNS
from cni_skel.warm.install import plugin_registry, write_executable

pytestmark = pytest.mark.root

DEPLOY = HERE.parent / "deploy"
DASHBOARD = DEPLOY / "grafana-dashboard.json"
ALERTS = DEPLOY / "prometheus-alerts.yaml"
JOB = "cni-skel-worker"
LOOPBACK = "cni_skel_plugins.loopback:Loopback"
PROBE_REF = "worker_plugins.probe:WorkerProbe"
#: Values for Grafana's built-in variables (the scrape interval here is 1 s,
#: so one minute holds plenty of samples).
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
#: ``$name``, ``${name}`` and ``${name:format}`` in a query.
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
#: loopback ADD+DEL pairs per round of calls.
PAIRS = 4
WAIT = 30.0  # seconds, for anything to show up


def tools() -> tuple[str, str]:
    """Paths of prometheus and promtool; without them fail as root (CI),
    skip otherwise."""
    found = {name: shutil.which(name) for name in ("prometheus", "promtool")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        why = f"{', '.join(missing)} missing: `make deps` installs Debian's prometheus package"
        if os.geteuid() != 0:
            pytest.skip(why)
        pytest.fail(why, pytrace=False)
    return found["prometheus"] or "", found["promtool"] or ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def wait_for(what: str, probe: Callable[[], Any], timeout: float = WAIT,
              log: Callable[[], str] = str) -> Any:
    """Poll ``probe`` until it returns something true; fail after ``timeout``
    seconds, saying what did not happen and its last value."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout:g} s (last: {got!r})\n{log()}",
                        pytrace=False)
        time.sleep(0.2)


class Prometheus:
    """Debian's prometheus in a temporary directory, scraping ``target``
    every second and evaluating deploy/prometheus-alerts.yaml every second,
    listening on 127.0.0.1 only."""

    def __init__(self, binary: str, promtool: str, workdir: str, target: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(workdir, "prometheus.log")
        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as fp:
            yaml.safe_dump({
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                           "evaluation_interval": "1s"},
                "rule_files": [str(ALERTS)],
                "scrape_configs": [{"job_name": JOB,
                                    "static_configs": [{"targets": [target]}]}],
            }, fp)
        checked = subprocess.run([promtool, "check", "config", config], capture_output=True,
                                 text=True, timeout=60, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        self.log_fp = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            cwd=workdir, stdin=subprocess.DEVNULL, stdout=self.log_fp,
            stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for("prometheus ready", self._ready, log=self.log)
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited {self.proc.returncode}:\n" \
                                         + self.log()
        try:
            http_get(self.base + "/-/ready", timeout=2)
        except OSError:
            return False
        return True

    def log(self) -> str:
        with open(self.log_path, "rb") as fp:
            return "prometheus log:\n" + fp.read()[-4000:].decode("utf-8", "replace")

    def api(self, path: str, **params: str | list[str]) -> Any:
        """``/api/v1/<path>``'s ``data``, asserting ``status`` is success."""
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            doc = json.loads(http_get(url))
        except urllib.error.HTTPError as exc:  # 400/422: the query is bad
            doc = json.loads(exc.read() or b"{}")
        assert doc.get("status") == "success", f"{path} {params}: {doc}"
        return doc["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query at now: its vector, as a list of series."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        assert data["resultType"] == "vector", data
        return data["result"]

    def scalar(self, expr: str) -> float | None:
        """The one value of ``expr`` (None: no series)."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: {result}"
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.log_fp.close()


# -- the dashboard file ---------------------------------------------------------------

def load_dashboard() -> dict:
    with open(DASHBOARD) as fp:
        return json.load(fp)


def panels(dashboard: dict) -> Iterator[dict]:
    """Every panel, those inside collapsed rows too."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def variable_values(dashboard: dict) -> dict[str, str]:
    """What each variable stands for with "All" selected (the built-in
    ones as `BUILTINS`)."""
    values = dict(BUILTINS)
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            assert var.get("includeAll") and var.get("allValue"), \
                f"variable {var['name']}: offers no All value"
            values[var["name"]] = var["allValue"]
    return values


def expand(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"{expr}: unknown variable ${name}"
        return values[name]
    return VARIABLE.sub(one, expr)


def check_layout(dashboard: dict) -> list[tuple[str, str]]:
    """What Grafana needs to import the file, checked; returns (panel title
    and refId, expr) of every query."""
    assert dashboard["uid"] and dashboard["title"] and 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    queries = []
    for panel in panels(dashboard):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel.get("description"), f"{panel['title']}: no description"
        targets = panel["targets"]
        assert targets, f"{panel['title']}: no query"
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        for t in targets:
            assert t["datasource"]["uid"] == "${datasource}", panel["title"]
            queries.append((f"{panel['title']} [{t['refId']}]", t["expr"]))
    return queries


# -- the calls that fill the series -----------------------------------------------------

class Node:
    """Launchers for the test's worker, and the namespaces calls run in
    (one pod; the node namespace the runtime would run launchers in)."""

    def __init__(self, wdir: str, sock: str, node: TestNetNS, pod: TestNetNS) -> None:
        self.wdir, self.node, self.pod = wdir, node, pod
        bin_dir = os.path.join(wdir, "bin")
        self.loopback = write_executable(bin_dir, "loopback", LOOPBACK, worker_socket=sock,
                                         fallback="none")
        self.probe = write_executable(bin_dir, "worker-probe", PROBE_REF,
                                      pythonpath=[str(HERE)], worker_socket=sock,
                                      fallback="none")
        # A plugin the worker was not started with: not served, counted.
        self.unknown = write_executable(os.path.join(wdir, "odd"), "nope", "nosuch.mod:Nope",
                                        worker_socket=sock, fallback="none", force=True)
        # A launcher whose worker does not answer (a socket nothing listens
        # on, beside the real one): it runs the call itself and logs the
        # fallback where the worker counts them.
        # A bridge pod: its DEL deletes the veth by its host end, a batch of one.
        for name in ("bridge", "host-local"):
            write_executable(bin_dir, name, plugin_registry()[name], worker_socket=sock,
                             fallback="none")
        self.bridge = os.path.join(bin_dir, "bridge")
        self.falls_back = write_executable(os.path.join(wdir, "bin-down"), "loopback",
                                           LOOPBACK, worker_socket=os.path.join(wdir, "down.sock"),
                                           fallback="oneshot")
        self.calls = 0

    def call(self, exe: str, command: str, conf: dict, ifname: str = "lo") -> Any:
        self.calls += 1
        return run_plugin_raw(exe, command, conf, container_id=f"dash-{self.calls}",
                              netns=self.pod.path, ifname=ifname, node=self.node, timeout=60)

    def loopback_round(self) -> int:
        """PAIRS loopback ADD/DEL and one ADD with a bad cniVersion (CNI
        error 1); returns the number of calls the worker answered."""
        conf = {"cniVersion": "1.0.0", "name": "lonet", "type": "loopback"}
        for _ in range(PAIRS):
            for command in ("ADD", "DEL"):
                run = self.call(self.loopback, command, conf)
                assert run.exit_code == 0, run
        bad = self.call(self.loopback, "ADD", {**conf, "cniVersion": "0.0.9"})
        assert bad.exit_code == 1 and bad.doc["code"] == 1, bad
        bridge = {"cniVersion": "1.0.0", "name": "dashnet", "type": "bridge",
                  "bridge": "cnsk-dash0", "ipam": {
                      "type": "host-local", "dataDir": os.path.join(self.wdir, "ipam"),
                      "ranges": [[{"subnet": "10.87.0.0/24"}]]}}
        run = self.call(self.bridge, "ADD", bridge, ifname="eth0")
        assert run.exit_code == 0, run
        # The DEL joins a batch: the test holds the node's commit lock (as a
        # deletion in flight would) until the DEL has marked its host end.
        with ThreadPoolExecutor(1) as ex:
            with NetNS.open(self.node.path) as node, node.rtnl() as ipr, \
                    linkbatch.alone(ipr) as alone:
                assert alone
                deleting = ex.submit(self.call, self.bridge, "DEL", bridge, "eth0")
                deadline = time.monotonic() + WAIT
                while not any(linkbatch._ours(linkbatch._link_group(ipr, link.index))
                              for link in netlink.links(ipr, kind="veth")):
                    assert time.monotonic() < deadline and not deleting.done(), deleting
                    time.sleep(0.01)
            run = deleting.result(timeout=WAIT)
        assert run.exit_code == 0, run
        return 2 * PAIRS + 1 + 4  # bridge's calls and its host-local's, served in-process

    def odd_calls(self) -> int:
        """One call of each kind the other series count; returns the number
        the worker answered."""
        probe = {"cniVersion": "1.1.0", "name": "probenet", "type": "worker-probe"}
        died = self.call(self.probe, "ADD", {**probe, "mode": "exit"}, ifname="eth0")
        assert died.doc["code"] == 11, died  # the worker answers for its dead process
        report = os.path.join(self.wdir, "pollute.json")
        recycled = self.call(self.probe, "ADD", {**probe, "mode": "pollute", "report": report,
                                                 "pollute": ["fd"]}, ifname="eth0")
        assert recycled.exit_code == 0, recycled  # answered, then the process steps down
        refused = self.call(self.unknown, "ADD", {"cniVersion": "1.0.0", "name": "lonet",
                                                  "type": "nope"})
        assert refused.doc["code"] == 11 and "unknown plugin" in refused.doc["details"], refused
        fell_back = self.call(self.falls_back, "ADD", {"cniVersion": "1.0.0", "name": "lonet",
                                                       "type": "loopback"})
        assert fell_back.exit_code == 0, fell_back
        return 2


def kill_an_idle_child(worker: SuiteWorker) -> int:
    """SIGKILL one serving process waiting for a call; returns its pid."""
    pid = worker.proc.pid

    def idle() -> int | None:
        for child in serving_processes(pid):
            with contextlib.suppress(OSError), open(f"/proc/{child}/wchan") as fp:
                if "epoll" in fp.read():
                    return child
        return None

    child = wait_for("an idle serving process", idle, log=worker.log)
    os.kill(child, signal.SIGKILL)
    return child


# -- the tests --------------------------------------------------------------------------

@pytest.fixture
def wdir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="cnsk-dash-")  # short: sun_path holds 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_every_dashboard_query_returns_data(wdir: str, netns_factory: Any) -> None:
    """Every panel query of deploy/grafana-dashboard.json returns data from
    a real worker's metrics scraped by a real Prometheus, and
    deploy/prometheus-alerts.yaml loads there, evaluates without error and
    turns the events made here into pending alerts."""
    prometheus, promtool = tools()
    dashboard = load_dashboard()
    queries = check_layout(dashboard)
    checked = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                             text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    node, pod = netns_factory("cnsk-node"), netns_factory("cnsk-pod")
    metrics = f"127.0.0.1:{free_port()}"
    sock = os.path.join(wdir, "w.sock")
    with contextlib.ExitStack() as stack:
        worker = SuiteWorker(sock, os.path.join(wdir, "worker.log"), preload=(PROBE_REF,),
                             pythonpath=(str(HERE),), args=("--metrics-address", metrics))
        stack.callback(worker.stop)
        prom = Prometheus(prometheus, promtool, wdir, metrics)
        stack.callback(prom.stop)

        def logs() -> str:
            return prom.log() + "\nworker log:\n" + worker.log()[-4000:]

        def seen(expr: str, want: Callable[[float | None], bool]) -> Callable[[], bool]:
            return lambda: want(prom.scalar(expr))

        wait_for("a first scrape of the worker", seen(f'up{{job="{JOB}"}}', lambda v: v == 1),
                 log=logs)
        calls = Node(wdir, sock, node, pod)
        # Two rounds with a scrape between them: a counter's first sample
        # only starts its series, the second round makes rate() non-zero.
        answered = calls.loopback_round()
        # The bridge DEL's batch is reported once the kernel has finished
        # deleting (its serving process may serve meanwhile): before the
        # odd calls, one of which kills the process that serves it.
        wait_for("the batch reported", lambda: re.search(
            r"^cni_skel_link_batch_size_count 1\.0$",
            http_get(f"http://{metrics}/metrics").decode(), re.M), log=logs)
        answered += calls.odd_calls()
        kill_an_idle_child(worker)
        total = "sum(cni_skel_requests_total)"
        for expr, want in ((total, lambda v: v == answered),
                           ("sum(cni_skel_child_deaths_total)", lambda v: v == 2),
                           ("sum(cni_skel_not_served_total)", lambda v: v == 1),
                           ("sum(cni_skel_launcher_fallbacks_total)", lambda v: v == 1),
                           ("sum(cni_skel_link_batch_size_count)", lambda v: v == 1),
                           ("sum(cni_skel_recycled_total)", lambda v: (v or 0) >= 1)):
            wait_for(f"prometheus sees {expr}", seen(expr, want), log=logs)
        answered += calls.loopback_round()
        wait_for(f"prometheus sees {total} = {answered}",
                 seen(total, lambda v: v == answered), log=logs)

        values = variable_values(dashboard)
        empty = []
        for where, expr in queries:
            result = prom.query(expand(expr, values))
            numbers = [float(s["value"][1]) for s in result]
            if not any(not math.isnan(n) for n in numbers):
                empty.append(f"{where}: {expr}\n  -> {result}")
        assert not empty, "dashboard queries without data:\n" + "\n".join(empty)

        # The variables' own queries (label_values) find the worker's labels.
        for var in dashboard["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
            assert m, var["query"]
            found = prom.api(f"label/{m.group(2)}/values", **{"match[]": expand(m.group(1),
                                                                               values)})
            assert found, f"variable {var['name']} finds no values"

        # Every metric the worker exports has a panel.
        text = http_get(f"http://{metrics}/metrics").decode()
        exported = {m for m in re.findall(r"^# TYPE (\w+) ", text, re.M)
                    if not m.endswith("_created")}
        assert len(exported) >= 10, text
        on_dashboard = " ".join(expr for _, expr in queries)
        assert not [m for m in exported if m not in on_dashboard], \
            f"metrics without a panel: {sorted(m for m in exported if m not in on_dashboard)}"

        # The rules: loaded, healthy, and the alerts about what happened here pending.
        with open(ALERTS) as fp:
            names = {r["alert"] for g in yaml.safe_load(fp)["groups"] for r in g["rules"]}
        expected = {"CniSkelLauncherFallbacks", "CniSkelChildDeaths", "CniSkelCallsNotServed",
                    "CniSkelHighErrorRatio"}

        def rules() -> dict[str, dict] | None:
            loaded = {r["name"]: r for g in prom.api("rules")["groups"] for r in g["rules"]}
            active = {n for n, r in loaded.items() if r["state"] in ("pending", "firing")}
            return loaded if expected <= active else None

        loaded = wait_for("alerts pending", rules, log=lambda: json.dumps(
            prom.api("rules"), indent=1)[-6000:])
        assert set(loaded) == names, loaded.keys()
        for name, rule in loaded.items():
            assert rule["health"] == "ok" and not rule.get("lastError"), (name, rule)
        deaths = {a["labels"]["during"] for a in loaded["CniSkelChildDeaths"]["alerts"]}
        assert deaths == {"request", "idle"}, loaded["CniSkelChildDeaths"]
        assert [a["labels"]["reason"] for a in loaded["CniSkelCallsNotServed"]["alerts"]] \
            == ["unknown-plugin"]
        assert worker.alive(), worker.log()


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{text}}}", "values": values}


def _alert(name: str, **labels: str) -> dict:
    text = ",".join(f'{k}="{v}"' for k, v in
                    {"alertname": name, "alertstate": "firing", "severity": "warning",
                     **labels}.items())
    return {"labels": f"ALERTS{{{text}}}", "value": 1}


def test_alerts_fire_when_they_should(tmp_path: Any) -> None:
    """Each rule of deploy/prometheus-alerts.yaml fires on the trouble it is
    about (a first child death or refused call too, whose series only then
    appears), and none fires for trouble over 10 minutes old, for a healthy
    node, or for too few calls to judge an error ratio."""
    _, promtool = tools()
    with open(ALERTS) as fp:
        doc = yaml.safe_load(fp)
    for rule in (r for g in doc["groups"] for r in g["rules"]):
        assert rule.get("for") and rule["labels"].get("severity"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]

    node = {"job": JOB, "instance": "node-1:9743"}
    req, bucket = "cni_skel_requests_total", "cni_skel_request_duration_seconds_bucket"
    fast = {"0.01": "0+10x40", "0.5": "0+10x40", "1.0": "0+10x40", "+Inf": "0+10x40"}
    trouble = [  # one sample a minute; the trouble starts at minute 25
        _series("cni_skel_launcher_fallbacks_total", node, "0x25 1x15"),
        _series("cni_skel_child_deaths_total", {**node, "during": "request"}, "_x25 1x15"),
        _series("cni_skel_not_served_total", {**node, "reason": "unknown-plugin"},
                "_x25 1x15"),
        _series(req, {**node, "plugin": "bridge", "verb": "ADD", "code": "0"}, "0+10x40"),
        _series(req, {**node, "plugin": "bridge", "verb": "ADD", "code": "7"}, "0+2x40"),
        # Half the calls take between 1 and 2 s: p99 about 2 s.
        *(_series(bucket, {**node, "plugin": "bridge", "verb": "ADD", "le": le}, values)
          for le, values in {"0.5": "0+6x40", "1.0": "0+6x40", "2.0": "0+12x40",
                             "+Inf": "0+12x40"}.items()),
    ]
    past = [  # the same trouble, over by minute 20
        _series("cni_skel_launcher_fallbacks_total", node, "0x5 1x35"),
        _series("cni_skel_child_deaths_total", {**node, "during": "idle"}, "_x5 1x35"),
        _series("cni_skel_not_served_total", {**node, "reason": "refused"}, "_x5 1x35"),
        _series(req, {**node, "plugin": "bridge", "verb": "ADD", "code": "0"}, "0+10x40"),
        _series(req, {**node, "plugin": "bridge", "verb": "ADD", "code": "7"}, "0+5x10 50x30"),
        *(_series(bucket, {**node, "plugin": "bridge", "verb": "ADD", "le": le}, values)
          for le, values in fast.items()),
    ]
    few = [  # one call in two fails, but only two calls in ten minutes
        _series(req, {**node, "plugin": "ptp", "verb": "DEL", "code": "0"}, "0+0.1x40"),
        _series(req, {**node, "plugin": "ptp", "verb": "DEL", "code": "11"}, "0+0.1x40"),
    ]
    fired = [_alert("CniSkelLauncherFallbacks", **node),
             _alert("CniSkelChildDeaths", **node, during="request"),
             _alert("CniSkelCallsNotServed", **node, reason="unknown-plugin"),
             _alert("CniSkelHighErrorRatio", **node),
             _alert("CniSkelSlowCalls", **node, plugin="bridge", verb="ADD")]
    firing = 'ALERTS{alertstate="firing"}'
    tests = [{"interval": "1m", "input_series": series,
              "promql_expr_test": [{"expr": firing, "eval_time": "30m", "exp_samples": want}]}
             for series, want in ((trouble, fired), (past, []), (few, []))]
    spec = tmp_path / "alerts-test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(ALERTS)], "evaluation_interval": "1m",
                                    "tests": tests}))
    run = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr

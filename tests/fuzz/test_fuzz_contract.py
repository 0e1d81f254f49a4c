"""The CNI contract under fuzzed input, for every plugin and verb, through the
real executables in both modes (``cni_bin``: oneshot and warm).

Each test function (one plugin, one verb, one mode) makes a node namespace
(plugins run in it, through ``ip netns exec``) and a pod namespace, primes
them with one valid ADD and DEL (so the network's lasting infrastructure, the
bridge or the nftables layout, is there), and takes a `snapshot` of
everything (the baseline). Each example (`strategies.cases`) then runs:
optionally a valid setup ADD, the fuzzed call, and for a successful ADD the
DEL a runtime would send with the same input; then the setup's DEL. After
every call:

* stdout is empty or exactly one JSON object;
* exit 0 and no Error object, or non-zero and an Error object (code > 0, msg);
  no traceback on stderr (an uncaught exception answered 999);
* a successful ADD prints a result in the config's cniVersion; successful
  DEL, CHECK, GC and STATUS print nothing; VERSION prints a version object;
  an unknown CNI_COMMAND is code 4;
* warm mode: the suite's worker is the same process and answers ping;

and after the example: a failed ADD left nothing (links, addresses, nftables
objects and elements in both namespaces, iptables-nft's rules, ipset entries,
sysctls, files in the dataDirs),
ADD then DEL left nothing, CHECK, STATUS and VERSION changed nothing, and
the namespaces are back to the baseline. A difference is reported, the
namespaces are made afresh and the run goes on.

Deviations are collected, not raised at the first one, so a run counts them
by class (`conftest.FuzzTotals`: terminal summary and ``fuzz-summary.json``
in pytest's temporary directory); the test then fails listing each class
with its smallest reproducer. Hypothesis does not shrink here (an example
costs real calls); the reproducer is the smallest input of the class seen.

Size: ``CNI_SKEL_FUZZ_EXAMPLES`` inputs in total, split evenly across the
plugin x verb x mode test functions (default `DEFAULT_PER_TEST` each, a
bounded CI slice); derandomized unless ``CNI_SKEL_FUZZ_SEED`` is set or more
than the default is asked for (the seed used is then in the summary).

firewall: the node namespace gets, per example, the node filter the case
names (`strategies.NODE_FILTERS`: an iptables FORWARD policy DROP, a native
nftables forward chain dropping by policy, both or neither), the baseline
retaken when it changes; every call gets ``DBUS_SYSTEM_BUS_ADDRESS`` naming
a socket that does not exist, so no plugin ever asks the machine's D-Bus
(firewall then takes iptables + nftables when no backend is configured).

ipvlan, vlan, dummy and vrf (`strategies.KERNEL_PLUGINS`) have a test function of
their own, marked with the kernel feature each needs: on a host whose kernel
lacks it, the suite's kernel VM runs it, warm only and at most
`VM_MAX_PER_TEST` inputs per function (tests/kernelvm.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import pytest
from conftest import MODES
from hypothesis import HealthCheck, Phase, given, settings
from kernelvm import IN_VM_ENV

from cni_skel import netlink
from cni_skel.conformance import snapshot
from cni_skel.conformance.contract import Call, answer_contract, error_of
from cni_skel.harness import TestNetNS, create_netns, remove_netns
from cni_skel.netns import NetNS
from cni_skel.nft import Nft
from cni_skel.warm import client as launcher

from . import strategies as S

pytestmark = [pytest.mark.fuzz, pytest.mark.root]

EXAMPLES_ENV = "CNI_SKEL_FUZZ_EXAMPLES"
SEED_ENV = "CNI_SKEL_FUZZ_SEED"
DEFAULT_PER_TEST = 4
#: Inputs per test of the kernel link kinds inside the kernel VM (emulated).
VM_MAX_PER_TEST = 8
N_TESTS = len(S.PLUGINS) * len(S.VERBS) * len(MODES)
CALL_TIMEOUT = 120.0
IP = shutil.which("ip") or "/usr/sbin/ip"
DBUS_ENV = "DBUS_SYSTEM_BUS_ADDRESS"
#: The node's own nftables filter of `strategies.NODE_FILTERS` "nft-drop".
NODE_FW = {"family": "inet", "name": "nodefw"}
NODE_SYSCTLS = ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding",
                *(f"net/ipv4/conf/{i}/route_localnet" for i in ("all", "lo", S.PM_LINK, S.BRIDGE))]
POD_SYSCTLS = S.sysctl_paths()
RESOLV_CONF = "nameserver 10.0.0.53\nsearch fz.local\noptions ndots:2\n"
SUBNET_ENV = ("FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.0.1/24\nFLANNEL_MTU=1450\n"
              "FLANNEL_IPMASQ=false\n")


def budget() -> tuple[int, int | None]:
    """(examples per test function, seed or None for derandomized)."""
    raw = os.environ.get(EXAMPLES_ENV, "").strip()
    total = int(raw) if raw else DEFAULT_PER_TEST * N_TESTS
    per_test = max(1, -(-total // N_TESTS))
    seed_raw = os.environ.get(SEED_ENV, "").strip()
    if seed_raw:
        return per_test, int(seed_raw)
    if total > DEFAULT_PER_TEST * N_TESTS:  # a long run: new inputs each time
        return per_test, random.SystemRandom().randrange(2**32)
    return per_test, None


# --- one call ---------------------------------------------------------------------------


def actual_verb(env: dict[bytes, bytes]) -> str:
    """The verb the plugin sees: a spec verb, ``about`` (unset or empty:
    a human asking) or ``unknown``."""
    raw = env.get(b"CNI_COMMAND", b"")
    if not raw:
        return "about"
    text = raw.decode("utf-8", "replace")
    return text if text in S.VERBS else "unknown"


def contract(call: Call, verb: str, stdin: bytes) -> list[tuple[str, str]]:
    """(class, detail) for every rule of the output contract ``call`` breaks:
    the conformance kit's answer contract, and our worker's own failures
    (code 11 naming it) told apart from a plugin's."""
    found = [tuple(b) for b in answer_contract(call, verb, stdin, timeout=CALL_TIMEOUT)]
    err = error_of(call)
    msg = err.get("msg") if err is not None else None
    if isinstance(msg, str) and err is not None and err.get("code") == 11:
        worker = ("worker-child-crashed" if "ended without answering in the cni-skel worker"
                  in msg else "worker-did-not-serve" if "cni-skel worker" in msg else None)
        if worker is not None:
            found = [f for f in found if not f[0].startswith("uncaught-exception-")]
            found.append((worker, call.brief()))
    return found


# --- deviations -------------------------------------------------------------------------


def _abbrev(data: bytes, limit: int = 700) -> str:
    text = data.decode("utf-8", "backslashreplace")
    text = re.sub(r"(.)\1{49,}", lambda m: f"<{len(m.group(0))} x {m.group(1)!r}>", text,
                  flags=re.S)
    return text if len(text) <= limit else text[:limit] + f"... <{len(data)} bytes in all>"


@dataclass
class Deviation:
    """One broken rule, with the input that broke it (resolved: real paths)."""

    cls: str
    detail: str
    plugin: str
    verb: str
    mode: str
    notes: list[str]
    env: dict[bytes, bytes]
    stdin: bytes
    setup: bool
    node: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return len(self.stdin) + sum(len(v) for v in self.env.values())

    def render(self) -> str:
        env = " ".join(f"{k.decode()}={_abbrev(v, 200)!r}" for k, v in self.env.items()
                       if (k.startswith(b"CNI_") and k != b"CNI_SKEL_WORKER_REQUIRED")
                       or k == DBUS_ENV.encode())
        return "\n".join([
            f"[{self.mode}] {self.plugin} {self.verb}: {self.cls}",
            f"    {self.detail[:1500]}",
            f"    broken: {', '.join(self.notes) or 'nothing (a valid input)'}"
            + ("; after a valid setup ADD" if self.setup else ""),
            *([f"    node filter: {', '.join(self.node)}"] if self.node else []),
            f"    env: {env}",
            f"    stdin ({len(self.stdin)} bytes): {_abbrev(self.stdin)}",
            f"    run as: ip netns exec <node netns> <bin dir>/{self.plugin} (mode {self.mode}),"
            " CNI_NETNS a pod netns",
        ])


# --- the rig ------------------------------------------------------------------------------


@dataclass
class Rig:
    """One node + pod namespace pair, the dataDirs, and the bookkeeping of
    one test function."""

    plugin: str
    verb: str
    mode: str
    bin_dir: str
    root: str
    worker: Any = None
    seed: int | None = None
    node: TestNetNS | None = None
    pod: TestNetNS | None = None
    observer: snapshot.Observer | None = None
    baseline: snapshot.Snapshot = field(default_factory=dict)
    node_filter: tuple[str, ...] = ()  # strategies.NODE_FILTERS the node has now
    inputs: int = 0
    calls: int = 0
    resets: int = 0
    worker_deaths: int = 0
    seconds: float = 0.0
    started: float = 0.0
    last: Deviation | None = None  # the last input, for a late worker death
    codes: dict[str, int] = field(default_factory=dict)
    by_class: dict[str, list] = field(default_factory=dict)  # cls -> [count, smallest]
    _ids: Any = field(default_factory=itertools.count)

    # -- set-up ------------------------------------------------------------------------

    @property
    def exe(self) -> str:
        return os.path.join(self.bin_dir, self.plugin)

    @property
    def data(self) -> str:
        return os.path.join(self.root, "data")

    def tokens(self, cid: str) -> dict[str, str]:
        assert self.pod is not None
        return {S.POD: self.pod.path, S.NOTNS: os.path.join(self.root, "not-a-netns"),
                S.BIN: self.bin_dir, S.DATA: os.path.join(self.data, "ipam"),
                S.TUNING: os.path.join(self.data, "tuning"),
                S.HOSTDEV: os.path.join(self.data, "host-device"),
                S.RESOLV: os.path.join(self.root, "resolv.conf"), S.CID: cid,
                S.SUBNET: os.path.join(self.root, "subnet.env"),
                S.FLANNEL: os.path.join(self.data, "flannel"),
                S.FIREWALL: os.path.join(self.data, "firewall")}

    def start(self) -> None:
        self.started = time.monotonic()
        os.makedirs(self.data, exist_ok=True)
        with open(os.path.join(self.root, "resolv.conf"), "w") as fp:
            fp.write(RESOLV_CONF)
        with open(os.path.join(self.root, "not-a-netns"), "w") as fp:
            fp.write("a regular file\n")
        with open(os.path.join(self.root, "subnet.env"), "w") as fp:
            fp.write(SUBNET_ENV)
        self._fresh()

    def _fresh(self) -> None:
        """New namespaces, empty dataDirs, primed, baseline taken."""
        self._drop_namespaces()
        shutil.rmtree(self.data, ignore_errors=True)
        os.makedirs(self.data)
        self.node, self.pod = create_netns("cnsk-fzn"), create_netns("cnsk-fzp")
        node_link = {"portmap": (S.PM_LINK, S.PM_NODE), "macvlan": (S.UPLINK, ()),
                     "ipvlan": (S.UPLINK, ()), "vlan": (S.UPLINK, ()),
                     "host-device": (S.DEVICE, ())}.get(self.plugin)
        if node_link is not None:
            with NetNS.open(self.node.path) as ns, ns.iproute() as ipr:
                _link(ipr, *node_link)
        with NetNS.open(self.pod.path) as ns, ns.iproute() as ipr:
            if self.plugin == "tuning":
                _link(ipr, "eth0", ())
            if self.plugin in ("sbr", "vrf"):  # the interface an earlier plugin made
                _link(ipr, "eth0", S.POD_IPS)
            if self.plugin == "loopback":
                # lo keeps 127.0.0.1 once it has been up: as after a loopback ADD and DEL.
                for state in ("up", "down"):
                    ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state=state)
        if self.plugin == "bandwidth":  # a pod's veth: its node end is shaped
            with NetNS.open(self.node.path) as ns, ns.rtnl() as ipr, \
                    NetNS.open(self.pod.path) as pod:
                netlink.create_veth_pair(ipr, S.BW_HOST, "eth0", peer_netns=pod)
                netlink.link_up(ipr, S.BW_HOST)
        self._filter(self.node_filter, ())
        self.observer = snapshot.Observer({"node": self.node.path, "pod": self.pod.path},
                                          [self.data], {"node": NODE_SYSCTLS, "pod": POD_SYSCTLS})
        # The network's lasting infrastructure (bridge, nftables layout,
        # iptables' tables) is made by the first ADD; a node has it before
        # the pods that matter.
        for verb in ("ADD", "DEL") if self.plugin in ("bridge", "portmap", "ptp", "flannel",
                                                      "firewall") else ():
            call = self.call(self.valid_env(verb, "fzprime"), self.valid_stdin("fzprime"))
            devs = contract(call, verb, b"")
            if call.exit_code != 0 or devs:
                raise AssertionError(f"priming {self.plugin} with a valid {verb} failed "
                                     f"[{self.mode}]: {call.brief()}; {devs}")
        self.baseline = self.snap()

    def _filter(self, want: tuple[str, ...], have: tuple[str, ...]) -> None:
        """Switch the node's own filter from ``have`` to ``want`` (both of
        `strategies.NODE_FILTERS`), inside the node namespace only."""
        assert self.node is not None
        if ("iptables-drop" in want) != ("iptables-drop" in have):
            policy = "DROP" if "iptables-drop" in want else "ACCEPT"
            for tool in ("iptables", "ip6tables"):
                subprocess.run([IP, "netns", "exec", self.node.name, tool, "-w", "10", "-P",
                                "FORWARD", policy], capture_output=True, timeout=60,
                               check=True)
        if ("nft-drop" in want) != ("nft-drop" in have):
            if "nft-drop" in want:
                cmds = [{"add": {"table": NODE_FW}},
                        {"add": {"chain": {"family": NODE_FW["family"], "table": NODE_FW["name"],
                                           "name": "forward", "type": "filter",
                                           "hook": "forward", "prio": 0, "policy": "drop"}}}]
            else:
                cmds = [{"delete": {"table": NODE_FW}}]
            with NetNS.open(self.node.path) as ns:
                ns.run(lambda: Nft().run(cmds, what="the node's own filter"))

    def _drop_namespaces(self) -> None:
        if self.observer is not None:
            self.observer.close()
            self.observer = None
        for ns in (self.pod, self.node):
            if ns is not None:
                remove_netns(ns)
        self.node = self.pod = None

    def close(self) -> None:
        self._drop_namespaces()
        self.seconds = time.monotonic() - self.started if self.started else 0.0

    # -- calls ---------------------------------------------------------------------------

    def resolve(self, data: bytes, cid: str, prev: Any = None) -> bytes:
        data = data.replace(json.dumps(S.PREV).encode(), json.dumps(prev).encode())
        for tok, real in self.tokens(cid).items():
            data = data.replace(tok.encode(), real.encode())
        return data

    def env(self, values: dict[str, str | bytes], cid: str) -> dict[bytes, bytes]:
        env = {b"PATH": os.environb.get(b"PATH", b"/usr/sbin:/usr/bin:/sbin:/bin"),
               # the machine's D-Bus is never asked (firewall's firewalld)
               DBUS_ENV.encode(): f"unix:path={self.root}/no-dbus/bus".encode()}
        if os.environ.get(launcher.REQUIRED_ENV):  # warm mode: no quiet one-shot fallback
            env[launcher.REQUIRED_ENV.encode()] = os.environ[launcher.REQUIRED_ENV].encode()
        for key, value in values.items():
            env[key.encode()] = self.resolve(value.encode() if isinstance(value, str) else value,
                                             cid)
        return env

    def valid_env(self, verb: str, cid: str) -> dict[bytes, bytes]:
        return self.env({"CNI_COMMAND": verb, "CNI_CONTAINERID": cid, "CNI_NETNS": S.POD,
                         "CNI_IFNAME": "eth0", "CNI_ARGS": "", "CNI_PATH": S.BIN}, cid)

    def valid_stdin(self, cid: str, case: S.Case | None = None) -> bytes:
        """The base config; for sbr with the case's own ``table`` when it is a
        valid one: a runtime's setup ADD and its DEL share the config, and a
        DEL into another table than ADD's leaves ADD's routes where they are."""
        conf = S.base_config(self.plugin)
        table = (case.config or {}).get("table") if case is not None else None
        if self.plugin == "sbr" and type(table) is int and 0 < table < 2**32:
            conf["table"] = table
        return self.resolve(json.dumps(conf).encode(), cid)

    def call(self, env: dict[bytes, bytes], stdin: bytes) -> Call:
        assert self.node is not None
        start = time.monotonic()
        self.calls += 1
        try:
            proc = subprocess.run([IP, "netns", "exec", self.node.name, self.exe], input=stdin,
                                  env=env, capture_output=True, timeout=CALL_TIMEOUT,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            self._count("timeout")
            return Call(None, exc.stdout or b"", (exc.stderr or b"").decode("utf-8", "replace"),
                        time.monotonic() - start)
        call = Call(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"),
                    time.monotonic() - start)
        doc = call.doc
        if proc.returncode == 0:
            self._count("ok")
        elif isinstance(doc, dict) and "code" in doc:
            self._count(f"code {doc['code']}")
        else:
            self._count(f"exit {proc.returncode} without an Error")
        return call

    def _count(self, key: str) -> None:
        self.codes[key] = self.codes.get(key, 0) + 1

    def snap(self) -> snapshot.Snapshot:
        assert self.observer is not None
        return self.observer.take()

    def worker_problem(self) -> str | None:
        if self.worker is None:
            return None
        if not self.worker.alive():
            return f"the suite's worker exited (status {self.worker.proc.returncode})"
        ok, why = launcher.ping(self.worker.sock, 10.0)
        if not ok:
            return f"the suite's worker does not answer ping: {why}"
        if json.loads(why).get("pid") != self.worker.proc.pid:
            return f"another process answers on the worker's socket: {why}"
        return None

    # -- one example ---------------------------------------------------------------------

    def run(self, case: S.Case) -> None:
        if self.worker_deaths or self.check_worker("noticed before the next input"):
            return  # every call would be answered 11 now; the death is reported
        self.inputs += 1
        if case.node != self.node_filter:
            self._filter(case.node, self.node_filter)
            self.node_filter = case.node
            self.baseline = self.snap()
        cid = f"fz{next(self._ids):05d}"
        found: list[tuple[str, str]] = []
        setup_result = None
        valid_stdin = self.valid_stdin(cid, case)
        if case.setup:
            call = self.call(self.valid_env("ADD", cid), valid_stdin)
            found += contract(call, "ADD", valid_stdin)
            if call.exit_code == 0 and isinstance(call.doc, dict):
                setup_result = call.doc
            else:
                found.append(("setup-add-failed", call.brief()))
        before = self.snap() if case.setup else self.baseline
        env = self.env(case.env, cid)
        stdin = self.resolve(case.stdin(), cid, setup_result)
        verb = actual_verb(env)
        call = self.call(env, stdin)
        found += contract(call, verb, stdin)
        if any(n.startswith("huge prevResult") for n in case.notes) \
                and call.seconds > S.HUGE_PREV_SECONDS:
            found.append(("slow-on-huge-prevresult",
                          f"{call.seconds:.1f} s (bound {S.HUGE_PREV_SECONDS:.0f} s); "
                          f"{call.brief()}"))
        after = self.snap()
        state: list[tuple[str, str]] = []
        if verb == "ADD" and call.exit_code == 0:
            undo = self.call({**env, b"CNI_COMMAND": b"DEL"}, stdin)
            found += contract(undo, "DEL", stdin)
            if undo.exit_code != 0:
                found.append(("del-after-successful-add-failed", undo.brief()))
            changes = snapshot.diff(before, self.snap())
            if changes:
                state.append(("add-then-del-left-state", "; ".join(changes)))
        elif verb == "ADD":
            changes = snapshot.diff(before, after)
            if changes:
                state.append(("failed-add-left-state", f"{call.brief()}; left: "
                              + "; ".join(changes)))
        elif verb in ("CHECK", "STATUS", "VERSION", "about", "unknown"):
            changes = snapshot.diff(before, after)
            if changes:
                state.append((f"{verb.lower()}-changed-state", "; ".join(changes)))
        if setup_result is not None:
            cleanup = self.call(self.valid_env("DEL", cid), valid_stdin)
            found += contract(cleanup, "DEL", valid_stdin)
            if cleanup.exit_code != 0:
                found.append(("setup-del-failed", cleanup.brief()))
        final = self.snap()
        changes = snapshot.diff(self.baseline, final)
        # GC told that the setup's attachment is gone, or a DEL told that its
        # netns is (a CNI_NETNS naming no file), may release what the setup's
        # DEL needs to restore the pod's own settings: a runtime has destroyed
        # that sandbox by then (tuning drops its saved values then, so that
        # nothing leaks when pods die). The node and the files must still be
        # clean.
        sandbox_gone = verb == "GC" or (
            verb == "DEL" and not os.path.exists(os.fsdecode(env.get(b"CNI_NETNS") or b"/")))
        shown = snapshot.diff(self.baseline, final, _node_side) if sandbox_gone and case.setup \
            else changes
        if shown and not state:
            state.append(("state-left-behind", "; ".join(shown)))
        self.last = Deviation("", "", self.plugin, self.verb, self.mode, case.notes,
                              {k: v for k, v in env.items()
                               if k.startswith(b"CNI_") or k == DBUS_ENV.encode()}, stdin,
                              case.setup, case.node)
        for cls, detail in found + state:
            self._record(dataclasses.replace(self.last, cls=cls, detail=detail))
        if not self.check_worker() and changes:
            self.resets += 1
            self._fresh()

    def check_worker(self, when: str = "") -> bool:
        """Record a ``worker-died`` deviation against the last input when the
        suite's worker is gone. The worker's parent may die a moment after
        the child answered (it reads the request's details asynchronously),
        so this also runs before the next input and at the end."""
        problem = self.worker_problem() if not self.worker_deaths else None
        if problem is None:
            return bool(self.worker_deaths)
        self.worker_deaths += 1
        if self.last is not None:
            self._record(dataclasses.replace(self.last, cls="worker-died",
                                             detail=f"{problem}{f' ({when})' if when else ''}"))
        return True

    def _record(self, dev: Deviation) -> None:
        entry = self.by_class.setdefault(dev.cls, [0, dev])
        entry[0] += 1
        if dev.size < entry[1].size:
            entry[1] = dev

    def report(self) -> str:
        total = sum(n for n, _ in self.by_class.values())
        head = (f"{total} contract deviation(s) in {len(self.by_class)} class(es) over "
                f"{self.inputs} input(s), {self.calls} call(s)"
                + (f", seed {self.seed}" if self.seed is not None else "") + ":")
        parts = [head]
        for cls, (count, dev) in sorted(self.by_class.items()):
            parts.append(f"--- {cls}: {count}x; smallest input:\n{dev.render()}")
        return "\n".join(parts)


def _node_side(key: tuple, old: Any, new: Any, before: snapshot.Snapshot,
               after: snapshot.Snapshot) -> bool:
    """`snapshot.is_infra`, and the pod namespace is left out."""
    if key[0] != "file" and key[1] == "pod":
        return True
    return snapshot.is_infra(key, old, new, before, after)


def _link(ipr: Any, name: str, addresses: tuple[str, ...]) -> None:
    """A veth pair ``name`` / ``name`` + "p" in one namespace, both up (a
    plain link to carry addresses; not every kernel has dummy links)."""
    ipr.link("add", ifname=name, kind="veth", peer=f"{name}p")
    index = ipr.link_lookup(ifname=name)[0]
    for cidr in addresses:
        ip, prefix = cidr.split("/")
        ipr.addr("add", index=index, address=ip, prefixlen=int(prefix))
    for link in (name, f"{name}p"):
        ipr.link("set", index=ipr.link_lookup(ifname=link)[0], state="up")


# --- the tests ----------------------------------------------------------------------------


@pytest.mark.parametrize("verb", S.VERBS)
@pytest.mark.parametrize("plugin", S.PLUGINS)
def test_contract_holds_under_fuzzed_input(plugin: str, verb: str, cni_bin: str,
                                           cni_mode: str, request: pytest.FixtureRequest,
                                           tmp_path: Any, fuzz_totals: Any) -> None:
    fuzz(plugin, verb, cni_bin, cni_mode, request, tmp_path, fuzz_totals, *budget())


@pytest.mark.parametrize("verb", S.VERBS)
@pytest.mark.parametrize("plugin", [
    # In a VM (a host kernel without the kind) warm only: a one-shot call
    # there pays seconds of emulated Python start-up per input.
    pytest.param(p, marks=pytest.mark.kernel(feature, vm_modes=("warm",)))
    for p, feature in S.KERNEL_PLUGINS.items()])
def test_contract_holds_for_kernel_link_kinds(plugin: str, verb: str, cni_bin: str,
                                              cni_mode: str, request: pytest.FixtureRequest,
                                              tmp_path: Any, fuzz_totals: Any) -> None:
    """ipvlan, vlan, dummy and vrf as the others; inside the kernel VM at most
    `VM_MAX_PER_TEST` inputs each, whatever the run's budget."""
    per_test, seed = budget()
    if os.environ.get(IN_VM_ENV) == "1":
        per_test = min(per_test, VM_MAX_PER_TEST)
    fuzz(plugin, verb, cni_bin, cni_mode, request, tmp_path, fuzz_totals, per_test, seed)


def fuzz(plugin: str, verb: str, cni_bin: str, cni_mode: str, request: pytest.FixtureRequest,
         tmp_path: Any, fuzz_totals: Any, per_test: int, seed: int | None) -> None:
    """Run ``per_test`` fuzzed inputs of ``plugin`` ``verb`` through the
    executable and fail naming every deviation from the contract."""
    worker = request.getfixturevalue("cni_worker") if cni_mode == "warm" else None
    rig = Rig(plugin, verb, cni_mode, cni_bin, str(tmp_path), worker, seed)

    @settings(max_examples=per_test, deadline=None, derandomize=seed is None, database=None,
              phases=[Phase.generate], print_blob=False, suppress_health_check=list(HealthCheck))
    @given(case=S.cases(plugin, verb))
    def run(case: S.Case) -> None:
        rig.run(case)

    if seed is not None:
        run = hypothesis.seed(seed)(run)
    try:
        if worker is not None:
            problem = rig.worker_problem()
            assert problem is None, f"before the first input: {problem} (it died in an " \
                "earlier test: see the worker-died deviation there)"
        rig.start()
        run()
        if worker is not None:
            time.sleep(0.5)  # a late death still belongs to this test's inputs
            rig.check_worker("noticed after the last input")
    finally:
        rig.close()
        fuzz_totals.add(rig)
    if rig.by_class:
        pytest.fail(rig.report(), pytrace=False)

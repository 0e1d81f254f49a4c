"""The conformance checks: each a rule of the CNI spec, named and cited.

A *check* is one rule (`CHECKS`: its name, the spec section it comes from,
what it requires). A *scenario* is what the kit does to see the rules at
work (an ADD, CHECK and DEL; a DEL with the netns gone; an IPAM that
fails; ...): several scenarios feed one check, and one scenario feeds
several checks, so a plugin breaking one rule fails that check wherever
the kit sees it, and no other. Section numbers are those of the upstream
SPEC.md (spec 1.1.0): section 2 "Execution Protocol" (parameters, errors,
the verbs), section 3 "Execution of Network Configurations" (lifecycle),
section 4 "Plugin Delegation", section 5 "Result Types".

`run_checks` runs the scenarios the selected checks need on a `Rig` and
returns a `Report`.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import fnmatch
import ipaddress
import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from ..config import GCAttachment
from ..netns import NetNS
from ..version import ALL_VERSIONS, parse_version
from . import snapshot
from .contract import error_of
from .report import CheckOutcome, Report, timing_table
from .rig import ChainRun, Rig

__all__ = ["CHECKS", "DEFAULT_CONCURRENCY", "FAILING_IPAM", "CheckInfo", "run_checks",
           "select"]

DEFAULT_CONCURRENCY = 4
#: The kit's IPAM that always fails ADD (and succeeds at everything else).
FAILING_IPAM = "cnsk-failing-ipam"
#: A version no release of the spec has: what a plugin claiming every real
#: one is asked for to see it refuse.
NO_SUCH_VERSION = "9.9.9"


@dataclass(frozen=True)
class CheckInfo:
    """One check: ``name`` (``group.rule``), the spec ``section`` it comes
    from, and the ``rule`` in one sentence."""

    name: str
    section: str
    rule: str


_ALL = [
    CheckInfo("version.answers", "2, VERSION",
              "VERSION exits 0 printing {cniVersion, supportedVersions}"),
    CheckInfo("version.claimed-accepted", "2, VERSION; 5",
              "ADD at every version all plugins of the list claim succeeds"),
    CheckInfo("version.unclaimed-refused", "2, Errors (code 1)",
              "ADD at a version the plugin does not claim fails with code 1"),
    CheckInfo("env.required", "2, Parameters; Errors (code 4)",
              "an ADD without a required CNI_* variable fails with code 4 naming it; a DEL "
              "without one fails so, or succeeds changing nothing"),
    CheckInfo("env.invalid", "2, Parameters; Errors (code 4)",
              "an invalid CNI_CONTAINERID or CNI_IFNAME: code 4"),
    CheckInfo("input.unknown-verb", "2, Errors (code 4)",
              "an unknown CNI_COMMAND fails with code 4"),
    CheckInfo("input.bad-json", "2, Errors (code 6)",
              "a config that is not JSON fails with code 6"),
    CheckInfo("input.wrong-type", "1; 2, Errors (codes 6, 7)",
              "a config key of the wrong type (name a number) fails with code 6 or 7"),
    CheckInfo("answer.contract", "2, Overview; Errors",
              "every answer: stdout empty or one JSON object, never a traceback; exit 0 "
              "without an Error object, non-zero with one; nothing printed on a "
              "successful DEL, CHECK, GC or STATUS"),
    CheckInfo("add.succeeds", "2, ADD", "ADD of the configuration as given succeeds"),
    CheckInfo("add.result-valid", "5",
              "every ADD result is valid for its config's cniVersion and written in it"),
    CheckInfo("check.passes", "2, CHECK", "CHECK right after ADD passes"),
    CheckInfo("check.detects-missing-interface", "2, CHECK",
              "CHECK fails once the interface the result names is gone from the pod"),
    CheckInfo("del.succeeds", "2, DEL; 3, Lifecycle",
              "DEL after ADD (and after a failed ADD) succeeds"),
    CheckInfo("del.leaves-nothing", "2, DEL",
              "after DEL the node, the pod and the state directories are as before ADD"),
    CheckInfo("del.twice", "2, DEL", "a second DEL of the same attachment succeeds"),
    CheckInfo("del.netns-gone", "2, DEL; 3, Lifecycle",
              "DEL with the netns gone (CNI_NETNS its old path, or empty) succeeds"),
    CheckInfo("del.without-prevresult", "2, DEL; 3, Lifecycle",
              "DEL without prevResult (a runtime that lost its cache) succeeds"),
    CheckInfo("failure.leaves-nothing", "2, ADD; 4",
              "after every failed call the node, the pod and the state directories are "
              "as before it (a failed ADD rolls back)"),
    CheckInfo("add.ipam-failure-fails", "4",
              "ADD fails, with an Error object, when its IPAM plugin fails"),
    CheckInfo("add.ifname-taken-fails", "2, ADD",
              "ADD fails when CNI_IFNAME is already taken in the pod"),
    CheckInfo("readonly.changes-nothing", "2, CHECK; STATUS; VERSION",
              "CHECK, STATUS and VERSION change nothing"),
    CheckInfo("status.answers", "2, STATUS",
              "STATUS exits 0, or fails with code 50 or 51"),
    CheckInfo("gc.frees-stale", "2, GC",
              "GC frees the state of an attachment left out of cni.dev/valid-attachments "
              "and keeps the others'"),
    CheckInfo("concurrency.adds", "3, Lifecycle",
              "ADDs (then DELs) of different containers at the same time all succeed"),
    CheckInfo("concurrency.unique-addresses", "3, Lifecycle",
              "attachments added at the same time never get the same address"),
]
#: Every check, by name, in report order.
CHECKS: dict[str, CheckInfo] = {c.name: c for c in _ALL}

#: Breaches of the answer contract counted against a check of their own.
_CONTRACT_CHECK = {
    "add-result-invalid": "add.result-valid", "add-result-wrong-version": "add.result-valid",
    "add-success-without-result": "add.result-valid",
    "unknown-command-not-code-4": "input.unknown-verb",
    "unknown-command-succeeded": "input.unknown-verb",
}


def select(checks: Sequence[str] = (), skip: Sequence[str] = ()) -> list[str]:
    """The check names matching any of ``checks`` (shell patterns; all when
    empty) and none of ``skip``.

    Raises:
        ValueError: a pattern that matches no check.
    """
    for pattern in (*checks, *skip):
        if not fnmatch.filter(CHECKS, pattern):
            raise ValueError(f"no check matches {pattern!r} (checks: {', '.join(CHECKS)})")
    chosen = [n for n in CHECKS if not checks or any(fnmatch.fnmatch(n, p) for p in checks)]
    return [n for n in chosen if not any(fnmatch.fnmatch(n, p) for p in skip)]


# --- the session: what the scenarios found ----------------------------------------------


@dataclass
class _State:
    judged: bool = False
    failures: list[str] = field(default_factory=list)
    why_na: str = ""


class _Session:
    def __init__(self, rig: Rig, selected: Iterable[str], concurrency: int,
                 progress: Callable[[str], None] | None) -> None:
        self.rig = rig
        self.selected = set(selected)
        self.concurrency = concurrency
        self.progress = progress or (lambda _msg: None)
        self.states = {name: _State() for name in CHECKS}
        self.claims: dict[str, list[str]] = {}
        self.primed = False
        self.result: dict[str, Any] | None = None  # the lifecycle's ADD result
        self.why_not_primed = ""
        self.errors: list[str] = []

    def wants(self, *names: str) -> bool:
        return any(n in self.selected for n in names)

    def judge(self, name: str, ok: bool = True, detail: str = "") -> bool:
        state = self.states[name]
        state.judged = True
        if not ok:
            state.failures.append(f"[{self.rig.scenario}] {detail}")
        return ok

    def na(self, name: str, why: str) -> None:
        if not self.states[name].why_na:
            self.states[name].why_na = why

    # -- helpers the scenarios share ---------------------------------------------------

    @property
    def version(self) -> str:
        return self.rig.target.netlist.cni_version

    def claims_all(self, version: str) -> bool:
        return all(version in self.claims.get(t, []) for t in self.rig.target.types)

    def leaves(self, name: str, before: snapshot.Snapshot, after: snapshot.Snapshot,
               what: str, *, node_side: bool = False) -> None:
        changes = snapshot.diff(before, after, _node_side if node_side else snapshot.is_infra)
        self.judge(name, not changes, f"{what} left: " + "; ".join(changes))

    def no_pod_interface(self, name: str, why_lo: str) -> bool:
        """True, with ``name`` marked n/a, when the lifecycle's ADD made no
        CNI_IFNAME in the pod, or CNI_IFNAME is lo (``why_lo``)."""
        if not self.creates_ifname():
            self.na(name, f"the ADD result names no {self.rig.target.ifname} in the sandbox")
            return True
        if self.rig.target.ifname == "lo":
            self.na(name, why_lo)
            return True
        return False

    def creates_ifname(self) -> bool:
        """Does the lifecycle's ADD result name CNI_IFNAME in the sandbox?"""
        for iface in (self.result or {}).get("interfaces") or []:
            if isinstance(iface, dict) and iface.get("name") == self.rig.target.ifname \
                    and iface.get("sandbox"):
                return True
        return False


def _node_side(key: tuple, old: Any, new: Any, before: snapshot.Snapshot,
               after: snapshot.Snapshot) -> bool:
    """`snapshot.is_infra`, and the pod namespace left out."""
    if key[0] != "file" and key[1] == "pod":
        return True
    return snapshot.is_infra(key, old, new, before, after)


def _code(run: ChainRun) -> int | None:
    step = run.failed
    err = error_of(step.call) if step is not None else None
    code = err.get("code") if err is not None else None
    return code if type(code) is int else None


# --- scenarios ------------------------------------------------------------------------------


def _probe(s: _Session) -> None:
    """VERSION of every plugin of the list: what each claims."""
    rig = s.rig
    stdin = json.dumps({"cniVersion": s.version}).encode()
    for ptype in rig.target.types:
        call = rig.call(ptype, "VERSION", rig.env("VERSION"), stdin)
        doc = call.doc
        ok = call.exit_code == 0 and isinstance(doc, dict) \
            and isinstance(doc.get("supportedVersions"), list)
        s.judge("version.answers", ok, f"{ptype}: {call.brief()}")
        if ok:
            s.claims[ptype] = [v for v in doc["supportedVersions"] if isinstance(v, str)]


def _prime(s: _Session) -> None:
    """One ADD and DEL before anything is compared: the network's lasting
    infrastructure (a bridge, a shared nftables table) comes with a node's
    first pod."""
    rig = s.rig
    pod = rig.pod()
    cid = rig.container_id("prime")
    add = rig.add(cid, pod.path)
    s.judge("add.succeeds", add.ok, add.brief())
    dele = rig.delete(cid, pod.path, add.result)
    s.judge("del.succeeds", dele.ok, dele.brief())
    rig.drop(pod)
    s.primed = add.ok
    if not add.ok:
        s.why_not_primed = f"ADD fails: {add.brief()}"


@contextmanager
def _attachment(s: _Session, tag: str) -> Iterator[tuple[Any, str, snapshot.Observer,
                                                      snapshot.Snapshot, ChainRun]]:
    """A fresh pod, watched with the node, and the list's ADD in it (judged
    as ``add.succeeds``): (pod, container ID, observer, the picture before
    ADD, the ADD). The pod goes afterwards."""
    rig = s.rig
    pod = rig.pod()
    cid = rig.container_id(tag)
    with rig.observer(pod) as obs:
        before = obs.take()
        add = rig.add(cid, pod.path)
        s.judge("add.succeeds", add.ok, add.brief())
        yield pod, cid, obs, before, add
    rig.drop(pod)


def _lifecycle(s: _Session) -> None:
    """ADD, CHECK, DEL, DEL again, in a fresh pod."""
    rig = s.rig
    with _attachment(s, "life") as (pod, cid, obs, before, add):
        if add.ok:
            s.result = add.result
            added = obs.take()
            if parse_version(s.version) >= (0, 4, 0) and not rig.target.netlist.disable_check:
                check = rig.check(cid, pod.path, add.result)
                s.judge("check.passes", check.ok, check.brief())
                s.leaves("readonly.changes-nothing", added, obs.take(), "CHECK")
            else:
                s.na("check.passes", f"cniVersion {s.version} has no CHECK"
                     if not rig.target.netlist.disable_check else "the list disables CHECK")
        else:
            s.leaves("failure.leaves-nothing", before, obs.take(), "the failed ADD")
        dele = rig.delete(cid, pod.path, add.result)
        s.judge("del.succeeds", dele.ok, dele.brief())
        s.leaves("del.leaves-nothing", before, obs.take(), "ADD then DEL")
        again = rig.delete(cid, pod.path, add.result)
        s.judge("del.twice", again.ok, again.brief())
        s.leaves("del.leaves-nothing", before, obs.take(), "the second DEL")


def _without_prev(s: _Session) -> None:
    rig = s.rig
    with _attachment(s, "noprev") as (pod, cid, obs, before, add):
        if add.ok:
            dele = rig.delete(cid, pod.path, None)
            s.judge("del.without-prevresult", dele.ok, dele.brief())
            s.leaves("del.leaves-nothing", before, obs.take(), "DEL without prevResult")
            rig.delete(cid, pod.path, add.result)


def _netns_gone(s: _Session) -> None:
    """ADD; the sandbox destroyed; DEL with its path (a runtime that kept
    it), and for a second attachment with none (one that did not)."""
    rig = s.rig
    with rig.observer(None) as obs:  # holding a pod open would keep it alive
        before = obs.take()
        for tag, keep_path in (("gone", True), ("nonetns", False)):
            pod = rig.pod()
            cid = rig.container_id(tag)
            add = rig.add(cid, pod.path)
            if s.judge("add.succeeds", add.ok, add.brief()):
                rig.drop(pod)
                netns = pod.path if keep_path else ""
                dele = rig.delete(cid, netns, add.result)
                s.judge("del.netns-gone", dele.ok,
                        f"CNI_NETNS {netns or 'empty'}: {dele.brief()}")
            rig.drop(pod)
        s.leaves("del.leaves-nothing", before, obs.take(), "DEL with the netns gone",
                 node_side=True)


def _check_missing(s: _Session) -> None:
    rig = s.rig
    if parse_version(s.version) < (0, 4, 0) or rig.target.netlist.disable_check:
        s.na("check.detects-missing-interface", f"no CHECK at cniVersion {s.version}")
        return
    if s.no_pod_interface("check.detects-missing-interface", "a pod's lo cannot be removed"):
        return
    with _attachment(s, "nolink") as (pod, cid, obs, before, add):
        if not add.ok:
            return
        try:
            with NetNS.open(pod.path) as ns, ns.iproute() as ipr:
                for index in ipr.link_lookup(ifname=rig.target.ifname):
                    ipr.link("del", index=index)
        except NetlinkError as exc:  # a device that cannot be deleted
            s.na("check.detects-missing-interface",
                 f"{rig.target.ifname} cannot be removed: {exc}")
            rig.delete(cid, pod.path, add.result)
            return
        check = rig.check(cid, pod.path, add.result)
        s.judge("check.detects-missing-interface", not check.ok and _code(check) is not None,
                f"CHECK with {rig.target.ifname} deleted: "
                + (check.brief() if not check.ok else "passed"))
        dele = rig.delete(cid, pod.path, add.result)
        s.judge("del.succeeds", dele.ok, dele.brief())
        s.leaves("del.leaves-nothing", before, obs.take(), f"DEL after {rig.target.ifname} went")


def _each_version(s: _Session) -> None:
    rig = s.rig
    shared = [v for v in ALL_VERSIONS if s.claims_all(v) and v != s.version]
    if len(rig.target.netlist.plugins) > 1:  # no prevResult, no chaining, before 0.3.0
        shared = [v for v in shared if parse_version(v) >= (0, 3, 0)]
    if not shared:
        s.na("version.claimed-accepted", "the plugins claim no other version in common")
    for version in shared:
        netlist = rig.target.netlist.with_version(version)
        pod = rig.pod()
        cid = rig.container_id("v" + version.replace(".", ""))
        with rig.observer(pod) as obs:
            before = obs.take()
            add = rig.add(cid, pod.path, netlist=netlist)
            s.judge("version.claimed-accepted", add.ok, f"{version}: {add.brief()}")
            dele = rig.delete(cid, pod.path, add.result, netlist=netlist)
            s.judge("del.succeeds", dele.ok, f"{version}: {dele.brief()}")
            s.leaves("del.leaves-nothing", before, obs.take(), f"ADD then DEL at {version}")
        rig.drop(pod)


def _one_plugin_failure(s: _Session, check: str, ptype: str, stdin: bytes,
                        env: dict[str, str], want: Callable[[int], bool], what: str,
                        obs: snapshot.Observer, *, verb: str = "ADD",
                        contract_verb: str | None = None, name_in_msg: str = "",
                        success_ok: bool = False) -> None:
    before = obs.take()
    call = s.rig.call(ptype, verb, env, stdin, contract_verb=contract_verb)
    err = error_of(call)
    code = err.get("code") if err is not None else None
    if call.exit_code != 0 and err is None:  # answer.contract says so
        s.na(check, f"{ptype}: {what}: no Error object to judge (see answer.contract)")
    elif call.exit_code == 0:
        s.judge(check, success_ok, f"{ptype}: {what}: succeeded")
    elif type(code) is int and not want(code):
        s.judge(check, False, f"{ptype}: {what}: code {code}: {err.get('msg')!r}")
    elif name_in_msg and name_in_msg not in f"{err.get('msg')} {err.get('details')}":
        s.judge(check, False, f"{ptype}: {what}: the error names no {name_in_msg}: "
                f"{err.get('msg')!r}")
    else:
        s.judge(check)
    s.leaves("failure.leaves-nothing", before, obs.take(), f"{ptype} {what}")


def _refusals(s: _Session) -> None:
    """Bad environment, bad input, an unclaimed version: each plugin of the
    list alone, as ADD in a fresh pod, must refuse and change nothing."""
    rig = s.rig
    pod = rig.pod()
    with rig.observer(pod) as obs:
        for index, plugin in enumerate(rig.target.netlist.plugins):
            ptype = plugin.type
            if any(p.type == ptype for p in rig.target.netlist.plugins[:index]):
                continue
            cid = rig.container_id("bad")
            good = rig.request(plugin, "ADD")
            env = rig.env("ADD", container_id=cid, netns=pod.path)
            if s.wants("env.required"):
                for verb, names in (("ADD", ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME")),
                                    ("DEL", ("CNI_CONTAINERID", "CNI_IFNAME"))):
                    for name in names:
                        e = rig.env(verb, container_id=cid, netns=pod.path, drop=[name])
                        # A DEL naming no attachment may also succeed, changing
                        # nothing: it has nothing to remove.
                        _one_plugin_failure(s, "env.required", ptype, good, e,
                                            lambda c: c == 4, f"{verb} without {name}", obs,
                                            verb=verb, name_in_msg=name,
                                            success_ok=verb == "DEL")
            if s.wants("env.invalid"):
                for name, value in (("CNI_CONTAINERID", "-not a valid id!"),
                                    ("CNI_IFNAME", "a-name-too-long-for-linux"),
                                    ("CNI_IFNAME", "..")):
                    e = {**env, name: value}
                    _one_plugin_failure(s, "env.invalid", ptype, good, e, lambda c: c == 4,
                                        f"{name}={value!r}", obs)
            if s.wants("input.unknown-verb"):
                e = {**env, "CNI_COMMAND": "FROBNICATE"}
                _one_plugin_failure(s, "input.unknown-verb", ptype, good, e, lambda c: c == 4,
                                    "CNI_COMMAND=FROBNICATE", obs, verb="FROBNICATE",
                                    contract_verb="unknown")
            if s.wants("input.bad-json"):
                _one_plugin_failure(s, "input.bad-json", ptype,
                                    good[: max(1, len(good) // 2)], env, lambda c: c == 6,
                                    "a config cut in half", obs)
            if s.wants("input.wrong-type"):
                doc = json.loads(good)
                doc["name"] = 5
                _one_plugin_failure(s, "input.wrong-type", ptype, json.dumps(doc).encode(),
                                    env, lambda c: c in (6, 7), '"name": 5', obs)
            if s.wants("version.unclaimed-refused") and ptype in s.claims:
                claimed = s.claims[ptype]
                others = [v for v in ALL_VERSIONS if v not in claimed]
                version = others[-1] if others else NO_SUCH_VERSION
                doc = json.loads(good)
                doc["cniVersion"] = version
                _one_plugin_failure(s, "version.unclaimed-refused", ptype,
                                    json.dumps(doc).encode(), env, lambda c: c == 1,
                                    f"cniVersion {version}", obs)
    rig.drop(pod)


def _failing_ipam(s: _Session) -> None:
    rig = s.rig
    # An IPAM plugin run as the list's plugin reads the section as its own.
    with_ipam = [i for i, p in enumerate(rig.target.netlist.plugins)
                 if isinstance(p.conf.get("ipam"), dict) and p.conf["ipam"].get("type") != p.type]
    if not with_ipam:
        s.na("add.ipam-failure-fails", "no plugin of the list delegates to an IPAM plugin")
        return
    exe = os.path.join(rig.kit_bin, FAILING_IPAM)
    with open(exe, "w") as fp:
        fp.write(_FAILING_IPAM_SCRIPT)
    os.chmod(exe, os.stat(exe).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    netlist = rig.target.netlist
    plugins = [dataclasses.replace(p, conf=copy.deepcopy(p.conf)) for p in netlist.plugins]
    for i in with_ipam:
        plugins[i].conf["ipam"]["type"] = FAILING_IPAM
    failing = dataclasses.replace(netlist, plugins=plugins)
    cni_path = ":".join([rig.kit_bin, *rig.target.plugin_dirs])
    pod = rig.pod()
    cid = rig.container_id("ipamfail")
    with rig.observer(pod) as obs:
        before = obs.take()
        add = rig.add(cid, pod.path, netlist=failing, cni_path=cni_path)
        s.judge("add.ipam-failure-fails", not add.ok and _code(add) is not None,
                "ADD with its IPAM failing: " + ("succeeded" if add.ok else add.brief()))
        s.leaves("failure.leaves-nothing", before, obs.take(), "ADD with its IPAM failing")
        dele = rig.delete(cid, pod.path, None, netlist=failing, cni_path=cni_path)
        s.judge("del.succeeds", dele.ok, f"DEL after the failed ADD: {dele.brief()}")
        s.leaves("del.leaves-nothing", before, obs.take(), "DEL after the failed ADD")
    rig.drop(pod)


_FAILING_IPAM_SCRIPT = """#!/bin/sh
# The conformance kit's IPAM: ADD always fails (code 11), the rest succeeds.
cat >/dev/null
case "$CNI_COMMAND" in
  ADD) echo '{"code": 11, "msg": "conformance kit: this IPAM always fails ADD"}'; exit 1 ;;
  VERSION) echo '{"cniVersion": "1.1.0", "supportedVersions": ["0.1.0", "0.2.0", "0.3.0", \
"0.3.1", "0.4.0", "1.0.0", "1.1.0"]}' ;;
esac
exit 0
"""


def _ifname_taken(s: _Session) -> None:
    rig = s.rig
    if s.no_pod_interface("add.ifname-taken-fails", "every pod has its lo: ADD configures it"):
        return
    pod = rig.pod()
    cid = rig.container_id("taken")
    with NetNS.open(pod.path) as ns, ns.iproute() as ipr:
        ipr.link("add", ifname=rig.target.ifname, kind="veth", peer="cnsk-taken")
    with rig.observer(pod) as obs:
        before = obs.take()
        add = rig.add(cid, pod.path)
        s.judge("add.ifname-taken-fails", not add.ok and _code(add) is not None,
                f"ADD with {rig.target.ifname} taken: "
                + ("succeeded" if add.ok else add.brief()))
        s.leaves("failure.leaves-nothing", before, obs.take(),
                 f"ADD with {rig.target.ifname} taken")
        dele = rig.delete(cid, pod.path, add.result)
        s.judge("del.succeeds", dele.ok, f"DEL after the failed ADD: {dele.brief()}")
        # Its DEL may take the pod's interface of that name for its own: the node and
        # the state directories must be clean.
        s.leaves("del.leaves-nothing", before, obs.take(), "DEL after the failed ADD",
                 node_side=True)
    rig.drop(pod)


def _status(s: _Session) -> None:
    rig = s.rig
    if not s.claims_all("1.1.0") or parse_version(s.version) < (1, 1, 0):
        s.na("status.answers", "STATUS is 1.1.0: the list's cniVersion or a plugin is older")
        return
    with rig.observer(None) as obs:
        before = obs.take()
        run = rig.status()
        for step in run.steps:
            err = error_of(step.call)
            code = err.get("code") if err is not None else None
            s.judge("status.answers", step.call.exit_code == 0 or code in (50, 51),
                    f"{step.plugin}: {step.call.brief()}")
        s.leaves("readonly.changes-nothing", before, obs.take(), "STATUS", node_side=True)


def _gc(s: _Session) -> None:
    rig = s.rig
    if not s.claims_all("1.1.0") or parse_version(s.version) < (1, 1, 0):
        s.na("gc.frees-stale", "GC is 1.1.0: the list's cniVersion or a plugin is older")
        return
    if rig.target.netlist.disable_gc:
        s.na("gc.frees-stale", "the list disables GC")
        return
    if not rig.target.state_roots():
        s.na("gc.frees-stale", "no state directory to watch (give --state-dir)")
        return
    keep, stale = rig.pod(), rig.pod()
    cid_keep, cid_stale = rig.container_id("gckeep"), rig.container_id("gcstale")
    with rig.observer(None) as obs:
        before = obs.take()
        add_keep = rig.add(cid_keep, keep.path)
        if s.judge("add.succeeds", add_keep.ok, add_keep.brief()):
            only_keep = _files(obs.take())
            add_stale = rig.add(cid_stale, stale.path)
            if s.judge("add.succeeds", add_stale.ok, add_stale.brief()):
                gc = rig.gc([GCAttachment(cid_keep, rig.target.ifname)])
                after = _files(obs.take())
                changes = snapshot.diff(only_keep, after)
                s.judge("gc.frees-stale", gc.ok and not changes,
                        ("GC: " + "; ".join(f"{st.plugin}: {st.call.brief()}"
                                            for st in gc.steps if st.call.exit_code != 0))
                        if not gc.ok else "the state directories after GC differ from "
                        "those with the kept attachment alone: " + "; ".join(changes))
            dele = rig.delete(cid_stale, stale.path, add_stale.result)
            s.judge("del.succeeds", dele.ok, f"DEL after GC freed it: {dele.brief()}")
        dele = rig.delete(cid_keep, keep.path, add_keep.result)
        s.judge("del.succeeds", dele.ok, dele.brief())
        rig.drop(stale)
        rig.drop(keep)
        s.leaves("del.leaves-nothing", before, obs.take(), "GC and the DELs", node_side=True)


def _files(snap: snapshot.Snapshot) -> snapshot.Snapshot:
    return {k: v for k, v in snap.items() if k[0] == "file"}


def _addresses(result: dict[str, Any] | None) -> list[str]:
    """The IP addresses of a result, any version's shape, loopback ones left out."""
    out: list[str] = []
    if not isinstance(result, dict):
        return out
    entries = list(result.get("ips") or [])
    entries += [result[k] for k in ("ip4", "ip6") if isinstance(result.get(k), dict)]
    for entry in entries:
        raw = entry.get("address") or entry.get("ip") if isinstance(entry, dict) else None
        try:
            ip = ipaddress.ip_interface(raw).ip
        except ValueError:
            continue
        if not ip.is_loopback:  # every pod's lo has 127.0.0.1
            out.append(str(ip))
    return out


def _concurrency(s: _Session) -> None:
    rig = s.rig
    n = s.concurrency
    if n < 2:
        s.na("concurrency.adds", "--concurrency below 2")
        s.na("concurrency.unique-addresses", "--concurrency below 2")
        return
    pods = [rig.pod() for _ in range(n)]
    cids = [rig.container_id("many") for _ in range(n)]
    with rig.observer(None) as obs, concurrent.futures.ThreadPoolExecutor(n) as pool:
        before = obs.take()
        adds = list(pool.map(lambda i: rig.add(cids[i], pods[i].path), range(n)))
        for cid, add in zip(cids, adds, strict=True):
            s.judge("concurrency.adds", add.ok, f"{cid}: {add.brief()}")
        seen: dict[str, str] = {}
        for cid, add in zip(cids, adds, strict=True):
            for ip in _addresses(add.result):
                if ip in seen:
                    s.judge("concurrency.unique-addresses", False,
                            f"{ip} given to {seen[ip]} and {cid}")
                seen[ip] = cid
        if seen:
            s.judge("concurrency.unique-addresses")
        else:
            s.na("concurrency.unique-addresses", "the results hold no address")
        dels = list(pool.map(lambda i: rig.delete(cids[i], pods[i].path, adds[i].result),
                             range(n)))
        for cid, dele in zip(cids, dels, strict=True):
            s.judge("concurrency.adds", dele.ok, f"DEL {cid}: {dele.brief()}")
        for pod in pods:
            rig.drop(pod)
        s.leaves("del.leaves-nothing", before, obs.take(), f"{n} ADDs and DELs at once",
                 node_side=True)


@dataclass(frozen=True)
class _Scenario:
    name: str
    run: Callable[[_Session], None]
    feeds: tuple[str, ...]
    needs_prime: bool = True


_SCENARIOS = [
    _Scenario("refusals", _refusals,
              ("env.required", "env.invalid", "input.unknown-verb", "input.bad-json",
               "input.wrong-type", "version.unclaimed-refused"), needs_prime=False),
    _Scenario("lifecycle", _lifecycle,
              ("add.succeeds", "check.passes", "del.succeeds", "del.leaves-nothing",
               "del.twice", "readonly.changes-nothing", "add.result-valid",
               "check.detects-missing-interface", "add.ifname-taken-fails")),
    _Scenario("del-without-prevresult", _without_prev, ("del.without-prevresult",)),
    _Scenario("netns-gone", _netns_gone, ("del.netns-gone",)),
    _Scenario("check-missing-interface", _check_missing, ("check.detects-missing-interface",)),
    _Scenario("each-version", _each_version, ("version.claimed-accepted",)),
    _Scenario("failing-ipam", _failing_ipam, ("add.ipam-failure-fails",)),
    _Scenario("ifname-taken", _ifname_taken, ("add.ifname-taken-fails",)),
    _Scenario("status", _status, ("status.answers",)),
    _Scenario("gc", _gc, ("gc.frees-stale",)),
    _Scenario("concurrency", _concurrency,
              ("concurrency.adds", "concurrency.unique-addresses")),
]


def run_checks(rig: Rig, selected: Iterable[str] | None = None, *,
               concurrency: int = DEFAULT_CONCURRENCY, cni_version: str | None = None,
               progress: Callable[[str], None] | None = None) -> Report:
    """Run the scenarios the ``selected`` checks (default: all) need on
    ``rig`` and return the `Report`: each check passed, failed (with what
    showed it), not applicable to this plugin (and why), not run (a check
    it needs failed first), or skipped (not selected). ``cni_version``: the
    list's cniVersion instead of its own, or ``"auto"``, the highest every
    plugin claims (as a runtime negotiates it). ``progress`` is told each
    scenario's name as it starts."""
    chosen = list(CHECKS) if selected is None else list(selected)
    s = _Session(rig, chosen, concurrency, progress)
    started = time.monotonic()
    rig.scenario = "probe"
    s.progress("probe: VERSION of each plugin")
    if cni_version not in (None, "auto"):
        rig.target = dataclasses.replace(rig.target,
                                         netlist=rig.target.netlist.with_version(cni_version))
    _probe(s)
    if cni_version == "auto":
        common = [v for v in ALL_VERSIONS if s.claims_all(v)]
        if common:
            rig.target = dataclasses.replace(
                rig.target, netlist=rig.target.netlist.with_version(common[-1]))
    rig.scenario = "prime"
    s.progress("prime: a first ADD and DEL")
    _prime(s)
    for sc in _SCENARIOS:
        if not s.wants(*sc.feeds):
            continue
        if sc.needs_prime and not s.primed:
            for name in sc.feeds:
                s.na(name, f"not run: {s.why_not_primed}")
            continue
        rig.scenario = sc.name
        s.progress(sc.name)
        try:
            sc.run(s)
        except Exception as exc:  # the kit's own failure: told, and the run goes on
            s.errors.append(f"scenario {sc.name}: {type(exc).__name__}: {exc}")
            for name in sc.feeds:
                s.na(name, f"not run: the kit failed in scenario {sc.name}")
    for scenario, ptype, verb, breach in rig.breaches:
        name = _CONTRACT_CHECK.get(breach.rule, "answer.contract")
        rig.scenario = scenario
        s.judge(name, False, f"{ptype} {verb}: {breach.rule}: {breach.detail}")
    if rig.timings:
        s.judge("answer.contract")
        if s.states["add.succeeds"].judged and not s.states["add.result-valid"].failures:
            s.judge("add.result-valid")
    outcomes = []
    for name, info in CHECKS.items():
        st = s.states[name]
        if name not in s.selected:
            status, why = "skipped", "not selected"
        elif st.failures:
            status, why = "fail", ""
        elif st.judged:
            status, why = "pass", ""
        else:
            status = "not run" if st.why_na.startswith("not run") else "n/a"
            why = st.why_na or "nothing in this configuration exercises it"
        outcomes.append(CheckOutcome(name, info.section, info.rule, status, st.failures, why))
    return Report(target=_describe(rig), checks=outcomes, claims=s.claims,
                  timings=timing_table(rig.timings), seconds=time.monotonic() - started,
                  errors=s.errors)


def _describe(rig: Rig) -> dict[str, Any]:
    t = rig.target
    return {"network": t.netlist.name, "cniVersion": t.netlist.cni_version,
            "plugins": [{"type": p, "executable": t.exe(p)} for p in t.types],
            "source": t.netlist.source, "ifname": t.ifname, "stateDirs": t.state_roots()}

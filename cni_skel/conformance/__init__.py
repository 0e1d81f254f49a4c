"""A conformance kit for any CNI plugin (``cni-skel conformance``).

Runs a plugin, or a network configuration list of plugins, the way a
runtime does, in throw-away namespaces it makes (a node the plugins run in,
pods beside it; never the machine's own namespace), and holds it to the
rules of the CNI spec, each a named check citing its section
(`cni_skel.conformance.checks.CHECKS`): the answers (one JSON object, an
Error object exactly when the exit status is not 0, the right codes for a
bad environment, bad JSON, an unknown verb or an unclaimed version), the
lifecycle (ADD, CHECK, DEL; DEL twice, with the netns gone, without
prevResult), nothing left behind after a DEL or a failed call (links,
addresses, routes, rules, nftables and iptables rules, state files, as
`cni_skel.conformance.snapshot` sees them), rollback when IPAM fails or
the interface name is taken, STATUS and GC, and ADDs at the same time. The
plugin need not be written with this SDK, nor in Python::

    from cni_skel.conformance import Target, run_conformance

    target = Target.from_file("10-mynet.conflist", ["/opt/cni/bin"])
    report = run_conformance(target)
    print(report.table())
    assert report.ok, report.failed

Modules: `rig` (the namespaces and the calls), `contract` (the rules of one
answer), `checks` (the checks and the scenarios that exercise them),
`report` (table, JSON, JUnit), `snapshot` (what the kernel and the state
directories hold). Needs root, as every runtime does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence

from .checks import CHECKS, DEFAULT_CONCURRENCY, CheckInfo, run_checks, select
from .contract import Breach, Call, answer_contract
from .report import CheckOutcome, Report
from .rig import Rig, Target

__all__ = ["CHECKS", "DEFAULT_CONCURRENCY", "Breach", "Call", "CheckInfo", "CheckOutcome",
           "Report", "Rig", "Target", "answer_contract", "run_conformance", "select"]


def run_conformance(target: Target, *, checks: Sequence[str] = (), skip: Sequence[str] = (),
                    concurrency: int = DEFAULT_CONCURRENCY, cni_version: str | None = None,
                    prefix: str = "cnsk-cf",
                    progress: Callable[[str], None] | None = None) -> Report:
    """Run the checks matching ``checks`` (shell patterns over the names in
    `CHECKS`; all when empty) and none of ``skip`` against ``target``, in
    namespaces named ``<prefix>-node-...`` / ``<prefix>-pod-...`` that are
    removed afterwards, ``concurrency`` attachments at once for the
    concurrency checks. ``cni_version``: run the list at that version, or
    ``"auto"``: the highest all its plugins claim (VERSION). ``progress`` is
    told each scenario as it starts.

    Raises:
        ValueError: a pattern that matches no check.
        CNIError: code 6, ``cni_version`` is no version string.
        RuntimeError: the target's ``node_setup`` command failed.
        OSError: namespaces cannot be made (not root).
    """
    selected = select(checks, skip)
    with tempfile.TemporaryDirectory(prefix="cnsk-conformance-") as tmp, \
            Rig(target, tmp, prefix=prefix) as rig:
        return run_checks(rig, selected, concurrency=concurrency, cni_version=cni_version,
                          progress=progress)

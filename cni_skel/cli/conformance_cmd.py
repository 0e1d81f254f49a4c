"""``cni-skel conformance``: the click side of `cni_skel.conformance` (the
options, progress on stderr, the report's forms and the exit status)."""

from __future__ import annotations

import json
import os
import sys

import click

from ..conformance import CHECKS, DEFAULT_CONCURRENCY, Target, run_conformance, select
from ..errors import CNIError
from ..sysctl import sysctl_path
from .errors import EXIT_FAILURE, CNICommandError

__all__ = ["conformance"]

#: Exit status when every selected check passed (or did not apply).
EXIT_OK = 0
_PROTOCOL_VARS = frozenset({"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME",
                            "CNI_ARGS", "CNI_PATH"})


@click.command(epilog="\b\nExamples:\n"
               "  cni-skel conformance --conflist /etc/cni/net.d/10-mynet.conflist\n"
               "  cni-skel conformance --plugin-dir ./bin --config my-plugin.conf --json -\n"
               "  cni-skel conformance --conflist x.conflist --skip 'concurrency.*' "
               "--junit report.xml\n"
               "  cni-skel conformance --list\n\n"
               "Exit status: 0 every selected check passed or did not apply, 1 a check "
               "failed, 2 bad usage.")
@click.option("--plugin-dir", "plugin_dirs", multiple=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False),
              help="Where the plugin executables are (CNI_PATH; repeat for more). Default: "
                   "$CNI_PATH, else /opt/cni/bin.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              metavar="FILE", help="One plugin's network configuration (a .conf).")
@click.option("--conflist", "conflist_file", type=click.Path(exists=True, dir_okay=False),
              metavar="FILE", help="A network configuration list (a .conflist).")
@click.option("--cni-version", default=None, metavar="VERSION|auto",
              help="Run the list at this cniVersion instead of its own; auto: the highest "
                   "every plugin claims (VERSION), as a runtime negotiates it.")
@click.option("--ifname", default="eth0", show_default=True, help="CNI_IFNAME of the pods.")
@click.option("--state-dir", "state_dirs", multiple=True, metavar="DIR",
              help="A directory of the plugin's own state that must be as before once an "
                   "attachment is gone (repeat for more); the configs' dataDir keys and "
                   "host-local's default directory are watched anyway.")
@click.option("--capability-args", "cap_args", default="{}", metavar="JSON",
              help='Capability args a runtime would pass, e.g. \'{"portMappings": [...]}\'.')
@click.option("--node-setup", metavar="SHELL",
              help="A shell command run inside the node namespace before the checks (e.g. "
                   "make the device host-device takes). The node has lo and eth0 (a veth, "
                   "10.254.0.1/24) already.")
@click.option("--sysctl", "sysctl_pairs", multiple=True, metavar="KEY=VALUE",
              help="A sysctl set in the node and in each pod namespace before the plugins "
                   "run there (repeat for more); e.g. net.ipv6.conf.default.accept_dad=0: "
                   "no wait for IPv6 duplicate address detection.")
@click.option("--concurrency", type=click.IntRange(0, 64), default=DEFAULT_CONCURRENCY,
              show_default=True, help="Attachments added at once by the concurrency checks.")
@click.option("--checks", "patterns", multiple=True, metavar="PATTERN",
              help="Run only the checks matching PATTERN (shell pattern; repeat for more).")
@click.option("--skip", "skips", multiple=True, metavar="PATTERN",
              help="Leave out the checks matching PATTERN.")
@click.option("--env", "env_pairs", multiple=True, metavar="NAME=VALUE",
              help="More environment for every plugin call (repeat for more).")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds one plugin call may take.")
@click.option("--json", "json_out", metavar="FILE|-",
              help="Write the report as JSON to FILE (- for stdout, instead of the table).")
@click.option("--junit", "junit_out", metavar="FILE", help="Write the report as JUnit XML.")
@click.option("--list", "list_only", is_flag=True, help="List the checks and exit.")
@click.option("-v", "--verbose", is_flag=True, help="Show every failure in full.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def conformance(plugin_dirs: tuple[str, ...], config_file: str | None,
                conflist_file: str | None, cni_version: str | None, ifname: str,
                state_dirs: tuple[str, ...],
                cap_args: str, node_setup: str | None, sysctl_pairs: tuple[str, ...],
                concurrency: int,
                patterns: tuple[str, ...], skips: tuple[str, ...],
                env_pairs: tuple[str, ...], timeout: float,
                json_out: str | None, junit_out: str | None, list_only: bool, verbose: bool,
                quiet: bool) -> None:
    """Check a CNI plugin (or a list) against the CNI spec.

    Runs it as a runtime does, in throw-away network namespaces (a node and
    pods; never this machine's own), and reports each check: the answers
    and error codes, ADD/CHECK/DEL, DEL twice, with the netns gone and
    without prevResult, nothing left behind, rollback, STATUS and GC, ADDs
    at once, and per-verb timings. Needs root."""
    if list_only:
        for info in CHECKS.values():
            click.echo(f"{info.name:<34} spec {info.section}: {info.rule}")
        return
    if (config_file is None) == (conflist_file is None):
        raise click.UsageError("give one of --config FILE and --conflist FILE")
    try:
        selected = select(patterns, skips)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if not selected:
        raise click.UsageError("the patterns leave no check to run")
    try:
        caps = json.loads(cap_args)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--capability-args") from None
    if not isinstance(caps, dict):
        raise click.BadParameter("not a JSON object", param_hint="--capability-args")
    env = {}
    for pair in env_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or key in _PROTOCOL_VARS:
            raise click.BadParameter(f"{pair!r}: give NAME=VALUE, NAME not one of the "
                                     "protocol's CNI_* variables (the kit sets those)",
                                     param_hint="--env")
        env[key] = value
    sysctls = {}
    for pair in sysctl_pairs:
        key, sep, value = pair.partition("=")
        try:
            sysctl_path(key)
        except CNIError as exc:
            raise click.BadParameter(f"{pair!r}: {exc.msg}", param_hint="--sysctl") from None
        if not sep:
            raise click.BadParameter(f"{pair!r}: give KEY=VALUE", param_hint="--sysctl")
        sysctls[key] = value
    if os.geteuid() != 0:
        raise CNICommandError("conformance needs root: it makes network namespaces and runs "
                              "plugins in them, as a runtime does")
    dirs = list(plugin_dirs) or [d for d in os.environ.get("CNI_PATH", "").split(":") if d] \
        or ["/opt/cni/bin"]
    try:
        target = Target.from_file(str(config_file or conflist_file), dirs, ifname=ifname,
                                  state_dirs=list(state_dirs), capability_args=caps,
                                  node_setup=node_setup, sysctls=sysctls, timeout=timeout,
                                  env=env)
    except CNIError as exc:
        raise CNICommandError.of(exc, head="cannot load the configuration") from None
    missing = [t for t in target.types if not target.exe(t)]
    if missing:
        raise CNICommandError(f"no executable for {', '.join(missing)} in {':'.join(dirs)}")

    def progress(step: str) -> None:
        if not quiet:
            click.echo(f"conformance: {step}", err=True)

    try:
        report = run_conformance(target, checks=selected, concurrency=concurrency,
                                 cni_version=cni_version, progress=progress)
    except RuntimeError as exc:
        raise CNICommandError(str(exc)) from None
    except CNIError as exc:  # --cni-version no version of the spec
        raise click.BadParameter(exc.msg, param_hint="--cni-version") from None
    if json_out == "-":
        sys.stdout.write(report.to_json())
    else:
        click.echo(report.table(verbose=verbose), nl=False)
        if json_out:
            with open(json_out, "w", encoding="utf-8") as fp:
                fp.write(report.to_json())
    if junit_out:
        with open(junit_out, "w", encoding="utf-8") as fp:
            fp.write(report.junit())
    sys.exit(EXIT_OK if report.ok else EXIT_FAILURE)

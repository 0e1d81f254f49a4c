"""The runtime commands: ``add``, ``check``, ``del``, ``gc``, ``status`` as
cnitool runs them, and ``validate``.

Same environment variables as cnitool (NETCONFPATH, CNI_PATH, CNI_IFNAME,
CNI_ARGS, CAP_ARGS), same container ID derivation from the netns path, and
libcni's result cache, all through `cni_skel.runtime`. `pass_network` and
`pass_attachment` turn the shared options into the `Runtime` (``cni``), the
network's list and the `RuntimeConf` (``rt``) each command works on.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import click

from ..args import load_args
from ..env import CmdArgs
from ..errors import ERR_INTERNAL, CNIError
from ..runtime import (
    DEFAULT_CACHE_DIR,
    DEFAULT_CONF_DIR,
    GCAttachment,
    NetworkConfigList,
    PluginConfig,
    PluginError,
    Runtime,
    RuntimeConf,
    cnitool_container_id,
    derive_request_config,
    error_hint,
    load_file,
    resolve_netns,
)
from ..skel import Plugin, load_config, resolve_ref
from ..version import check_supported, config_version, version_at_least
from ..warm.install import MARKER, launcher_info, plugin_registry
from .errors import EXIT_UNKNOWN, CNICommandError, reporting

__all__ = ["add", "check", "del_", "gc", "pass_attachment", "pass_network", "status",
           "validate"]

#: CNI_CONTAINERID of the ADD whose config checks `validate` runs (nothing
#: is created for it).
VALIDATE_CONTAINER_ID = "cni-skel-validate"
#: Default of --cni-path when CNI_PATH is not set (libcni's).
DEFAULT_CNI_PATH = "/opt/cni/bin"

Command = Callable[..., None]


# --------------------------------------------------------------------------
# options and the pass decorators


def _options(*opts: Callable[[Command], Command]) -> Callable[[Command], Command]:
    """Apply click options so that ``--help`` lists them in the order given."""
    def decorate(f: Command) -> Command:
        for opt in reversed(opts):
            f = opt(f)
        return f
    return decorate


#: Options every runtime command shares (env fallbacks as cnitool).
runtime_options = _options(
    click.option("--conf-dir", envvar="NETCONFPATH", default=DEFAULT_CONF_DIR,
                 show_default=True, metavar="DIR",
                 help="Network config directory [env NETCONFPATH]."),
    click.option("--cni-path", envvar="CNI_PATH", default=DEFAULT_CNI_PATH,
                 show_default=True, metavar="DIRS",
                 help="Plugin directories, ':'-separated [env CNI_PATH]."),
    click.option("--cache-dir", envvar="CNI_SKEL_CACHE_DIR", default=DEFAULT_CACHE_DIR,
                 show_default=True, metavar="DIR",
                 help="Result cache root, shared with containerd and cnitool "
                      "[env CNI_SKEL_CACHE_DIR]."),
    click.option("--timeout", type=float, default=120.0, show_default=True,
                 metavar="SECONDS", help="Time each plugin may run before it is killed."),
    click.option("--plugin-netns", default=None, metavar="NETNS",
                 help="Run the plugins inside this network namespace (path or name) "
                      "instead of the current one, as if it were the node."),
    click.option("-v", "--verbose", is_flag=True, help="Log each plugin execution on stderr."),
)

#: Options of the commands that act on one attachment (ADD, CHECK, DEL).
attachment_options = _options(
    click.option("-i", "--ifname", envvar="CNI_IFNAME", default="eth0", show_default=True,
                 help="Interface name in the container [env CNI_IFNAME]."),
    click.option("--args", "cni_args", envvar="CNI_ARGS", default=None,
                 metavar="K=V;K2=V2", help="CNI_ARGS for the plugins [env CNI_ARGS]."),
    click.option("--cap-args", envvar="CAP_ARGS", default=None, metavar="JSON",
                 help="Capability args, a JSON object, e.g. "
                      "'{\"portMappings\": [...]}' [env CAP_ARGS]."),
    click.option("--container-id", default=None,
                 help="Container ID (default: derived from NETNS as cnitool does)."),
    click.option("--preflight", is_flag=True,
                 help="First ask each plugin VERSION and refuse a cniVersion one of "
                      "them does not support."),
)


def _log_line(line: str) -> None:
    click.echo(f"cni-skel: {line}", err=True)


def pass_network(f: Command) -> Command:
    """Decorator of a runtime command: adds the NETWORK argument and the
    runtime options, and calls ``f(cni, netlist, **rest)`` with the
    `Runtime` the options describe and NETWORK's list loaded from its
    config dir (a load error is the command's failure, exit 1)."""

    @functools.wraps(f)
    def command(network: str, conf_dir: str, cni_path: str, cache_dir: str, timeout: float,
                plugin_netns: str | None, verbose: bool, **rest: Any) -> None:
        cni = Runtime(conf_dir=conf_dir, bin_dirs=cni_path, cache_dir=cache_dir,
                      timeout=timeout, plugin_netns=plugin_netns, stderr=sys.stderr,
                      log=_log_line if verbose else None)
        with reporting(head=f"cannot load network \"{network}\""):
            netlist = cni.load_conflist(network)
        f(cni, netlist, **rest)

    return runtime_options(click.argument("network")(command))


def pass_attachment(*, cached_args: bool = False) -> Callable[[Command], Command]:
    """Decorator of ADD/CHECK/DEL: `pass_network`, plus the NETNS argument
    and the attachment options; calls ``f(cni, netlist, rt, **rest)`` with
    the `RuntimeConf` they describe. ``cached_args``: CNI_ARGS and CAP_ARGS
    not given are taken from the cache (CHECK and DEL must get the
    attachment's ADD parameters; cnitool sends none, and then e.g. portmap
    cannot find its rules)."""

    def decorate(f: Command) -> Command:
        @functools.wraps(f)
        def command(cni: Runtime, netlist: NetworkConfigList, netns: str, ifname: str,
                    cni_args: str | None, cap_args: str | None, container_id: str | None,
                    preflight: bool, **rest: Any) -> None:
            cni.preflight = preflight
            rt = _runtime_conf(netns, ifname, cni_args, cap_args, container_id)
            if cached_args and not (cni_args and cap_args):
                _take_cached_args(cni, netlist, rt, args=not cni_args,
                                  capability_args=not cap_args)
            f(cni, netlist, rt, **rest)

        return pass_network(attachment_options(click.argument("netns")(command)))

    return decorate


def _runtime_conf(netns: str, ifname: str, cni_args: str | None, cap_args: str | None,
                  container_id: str | None) -> RuntimeConf:
    path = resolve_netns(netns)
    capability_args: dict[str, Any] = {}
    if cap_args:
        try:
            capability_args = json.loads(cap_args)
        except ValueError as exc:
            raise click.UsageError(f"CAP_ARGS / --cap-args is not valid JSON: {exc}") from None
        if not isinstance(capability_args, dict):
            raise click.UsageError("CAP_ARGS / --cap-args must be a JSON object, e.g. "
                                   "'{\"portMappings\": [{\"hostPort\": 8080, "
                                   "\"containerPort\": 80, \"protocol\": \"tcp\"}]}'")
    try:
        return RuntimeConf(container_id or cnitool_container_id(path), path, ifname,
                           args=cni_args or "", capability_args=capability_args)
    except CNIError as exc:
        raise click.UsageError(f"CNI_ARGS / --args: {exc}") from None


def _take_cached_args(cni: Runtime, netlist: NetworkConfigList, rt: RuntimeConf, *,
                      args: bool, capability_args: bool) -> None:
    """Set ``rt``'s CNI_ARGS and/or capability args to those cached at ADD;
    left as they are when nothing (readable) is cached."""
    try:
        cached = cni.get_cached_config(netlist, rt)
    except CNIError:
        return
    if cached is None:
        return
    _, cached_rt = cached
    if args:
        rt.args = cached_rt.args
    if capability_args:
        rt.capability_args = cached_rt.capability_args


# --------------------------------------------------------------------------
# add, check, del


@click.command(epilog="\b\nExample:\n"
               "  ip netns add pod1\n"
               "  NETCONFPATH=/etc/cni/net.d CNI_PATH=/opt/cni/bin \\\n"
               "    CAP_ARGS='{\"portMappings\":[{\"hostPort\":8080,\"containerPort\":80,"
               "\"protocol\":\"tcp\"}]}' \\\n"
               "    cni-skel add mynet /run/netns/pod1")
@pass_attachment()
def add(cni: Runtime, netlist: NetworkConfigList, rt: RuntimeConf) -> None:
    """ADD the container in NETNS to NETWORK: run the network's plugins in
    order, print the final result JSON and cache it.

    NETWORK is the "name" in a config file of NETCONFPATH.

    NETNS is a network namespace path (or a name from `ip netns`); the
    container ID is derived from it as cnitool does, so both tools share the
    cache."""
    try:
        result = cni.add(netlist, rt)
    except CNIError as exc:
        hint = error_hint(exc)
        if not hint and isinstance(exc, PluginError):
            hint = ("the attachment may be partly set up: run `cni-skel del "
                    f"{netlist.name} {rt.netns}` with the same settings to clean up")
        raise CNICommandError.of(exc, operation="ADD", network=netlist.name, hint=hint) \
            from None
    click.echo(json.dumps(result.to_version(netlist.cni_version), indent=4))


@click.command(epilog="\b\nExample:\n  cni-skel check mynet /run/netns/pod1")
@pass_attachment(cached_args=True)
def check(cni: Runtime, netlist: NetworkConfigList, rt: RuntimeConf) -> None:
    """CHECK that the container in NETNS is still attached to NETWORK as ADD
    left it: each plugin in order, given the cached ADD result. Silent on
    success. Refused for configs older than cniVersion 0.4.0; does nothing
    when the network sets disableCheck.

    CNI_ARGS and CAP_ARGS default to those cached at ADD.

    NETNS is a network namespace path (or a name from `ip netns`); the
    container ID is derived from it as cnitool does, so both tools share the
    cache."""
    with reporting("CHECK", netlist.name):
        if not netlist.disable_check and version_at_least(netlist.cni_version, "0.4.0") \
                and cni.get_cached_result(netlist, rt) is None:
            click.echo(f"cni-skel: warning: no cached ADD result for this attachment "
                       f"({rt.container_id}, {rt.ifname}): plugins get no prevResult",
                       err=True)
        cni.check(netlist, rt)


@click.command("del", epilog="\b\nExample:\n  cni-skel del mynet /run/netns/pod1")
@pass_attachment(cached_args=True)
def del_(cni: Runtime, netlist: NetworkConfigList, rt: RuntimeConf) -> None:
    """DEL the container in NETNS from NETWORK: the plugins in reverse order,
    given the cached ADD result; the cache entry goes when all succeed.
    Repeating it is fine, and so is a NETNS that no longer exists.

    CNI_ARGS and CAP_ARGS default to those cached at ADD (portmap needs its
    portMappings to find its rules).

    NETNS is a network namespace path (or a name from `ip netns`); the
    container ID is derived from it as cnitool does, so both tools share the
    cache."""
    with reporting("DEL", netlist.name):
        cni.delete(netlist, rt)


# --------------------------------------------------------------------------
# gc


def _valid_attachments(ctx: click.Context, param: click.Parameter,
                       values: tuple[str, ...]) -> list[GCAttachment]:
    out = []
    for item in values:
        cid, sep, ifname = item.partition(":")
        if not sep or not cid or not ifname:
            raise click.BadParameter(f"{item!r}: expected CONTAINERID:IFNAME", ctx, param)
        out.append(GCAttachment(cid, ifname))
    return out


@click.command(epilog="\b\nExamples:\n"
               "  cni-skel gc mynet                      # dry run: what GC would remove\n"
               "  cni-skel gc mynet --valid cnitool-3f2a9c1e0b7d4a6c8e21:eth0 --valid c2:eth0\n"
               "  cni-skel gc mynet --yes                # no attachment is valid: remove all")
@pass_network
@click.option("--valid", "valid", multiple=True, metavar="CONTAINERID:IFNAME",
              callback=_valid_attachments,
              help="An attachment still in use (repeat for each); the others are stale. "
                   "Given, GC acts.")
@click.option("--yes", is_flag=True,
              help="Act without --valid: no attachment is valid, so the state of every "
                   "attachment of NETWORK goes, that of running pods included.")
@click.option("--dry-run", is_flag=True,
              help="Only show what GC would do (the default without --valid and --yes).")
@click.argument("netns", required=False)
def gc(cni: Runtime, netlist: NetworkConfigList, netns: str | None,
       valid: list[GCAttachment], yes: bool, dry_run: bool) -> None:
    """GC NETWORK: DEL every cached attachment of it that is not --valid, then
    (cniVersion 1.1.0 and later) send GC to each plugin with the valid
    attachments, so that it releases what it holds for NETWORK on behalf of
    any other attachment (addresses, firewall entries), attachments the
    cache does not know included. Best effort: goes on past errors and
    reports them all. Does nothing when the network sets disableGC.

    Nothing changes without --valid or --yes: a running pod left out of the
    valid list would lose its state (its address could be handed out
    again). Then, and with --dry-run, GC prints the cached attachments it
    would DEL (and whether their netns still exists) and what it would ask
    the plugins, and exits 0. cnitool's gc acts with no valid attachment:
    that is --yes here.

    NETNS is accepted for cnitool compatibility and ignored."""
    name = netlist.name
    if netlist.disable_gc:
        click.echo(f"cni-skel: network \"{name}\" sets disableGC: nothing done", err=True)
        return
    if dry_run or not (valid or yes):
        with reporting("GC (dry run)", name):
            _gc_plan(cni, netlist, valid, yes)
        return
    with reporting("GC", name):
        removed = cni.gc(netlist, valid)
    names = ", ".join(f"{a.container_id}:{a.ifname}" for a in removed) or "none"
    asked = "plugins asked to GC" if version_at_least(netlist.cni_version, "1.1.0") else \
        f"cniVersion {netlist.cni_version} has no plugin GC"
    click.echo(f"cni-skel: GC of network \"{name}\": stale attachments deleted: {names}; "
               f"{asked}", err=True)


def _gc_plan(cni: Runtime, netlist: NetworkConfigList, valid: list[GCAttachment],
             yes: bool) -> None:
    """Print what `Runtime.gc` would do with ``valid``, from the cache and the
    config only (nothing is run, nothing changes)."""
    echo = click.echo
    name, version = netlist.name, netlist.cni_version
    stale = cni.stale_attachments(netlist, valid)
    stale_paths = {a.path for a in stale}
    kept = [a for a in cni.get_cached_attachments()
            if a.network == name and a.path not in stale_paths]
    echo(f"GC of network \"{name}\" (cniVersion {version}): dry run, nothing changed")
    if valid:
        echo("valid attachments: " + ", ".join(f"{a.container_id}:{a.ifname}" for a in valid))
    else:
        echo("valid attachments: none" + (" (--yes)" if yes else " given")
             + ": every attachment of the network counts as stale")
    echo(f"1. DEL of each cached attachment not valid (cache {cni.cache.results_dir}):")
    for att in stale:
        echo(f"     {att.container_id}:{att.ifname}  {_netns_note(att.netns)}")
    if not stale:
        echo("     none")
    for att in kept:
        echo(f"     kept (valid): {att.container_id}:{att.ifname}")
    if version_at_least(version, "1.1.0"):
        listed = (f"the {len(valid)} valid attachment(s)" if valid else "no attachment")
        echo(f"2. GC to each plugin, with cni.dev/valid-attachments listing {listed}: "
             + ", ".join(_plugin_label(p) for p in netlist.plugins))
        echo(f"     each releases what it holds for network \"{name}\" for any attachment "
             "not listed (e.g. addresses, firewall entries), also of attachments this cache "
             "does not know")
    else:
        echo(f"2. no GC to the plugins: cniVersion {version} has none (GC exists from 1.1.0)")
    if valid or yes:
        echo("to act: the same command without --dry-run")
    else:
        echo(f"to act: cni-skel gc {name} --valid CONTAINERID:IFNAME ... (every attachment "
             "still in use), or --yes when none is")


def _netns_note(path: str) -> str:
    if not path:
        return "(no netns cached)"
    if os.path.exists(path):
        return f"netns {path} exists: its pod may still be running"
    return f"netns {path} is gone"


def _ipam_type(conf: dict[str, Any]) -> str:
    """The ``ipam.type`` of a plugin object (spec: the IPAM plugin it
    delegates to), "" when there is none."""
    ipam = conf.get("ipam")
    kind = ipam.get("type") if isinstance(ipam, dict) else None
    return kind if isinstance(kind, str) else ""


def _plugin_label(plugin: PluginConfig) -> str:
    ipam = _ipam_type(plugin.conf)
    return plugin.type + (f" (and its IPAM {ipam})" if ipam else "")


# --------------------------------------------------------------------------
# status


@click.command(epilog="\b\nExample:\n  cni-skel status mynet && echo ready")
@pass_network
@click.argument("netns", required=False)
def status(cni: Runtime, netlist: NetworkConfigList, netns: str | None) -> None:
    """STATUS of NETWORK: ask each plugin whether it can serve ADD now.

    Exit status: 0 when every plugin said it can; 1 when one cannot (its
    code: 50 cannot serve ADD, 51 existing containers may lose connectivity)
    or on any other error; 3 when the plugins were not asked: STATUS exists
    from cniVersion 1.1.0 on, so for an older network nobody can tell
    (libcni's GetStatusNetworkList answers success for it without asking).

    NETNS is accepted for cnitool compatibility and ignored."""
    name = netlist.name
    with reporting("STATUS", name):
        asked = cni.status(netlist)
    if not asked:
        click.echo(f"cni-skel: network \"{name}\" has cniVersion {netlist.cni_version}: its "
                   "plugins were not asked (STATUS exists from cniVersion 1.1.0), so whether it "
                   "can serve ADD is unknown (libcni answers success without asking)", err=True)
        sys.exit(EXIT_UNKNOWN)
    click.echo(f"cni-skel: network \"{name}\" is ready "
               f"({len(netlist.plugins)} plugin(s) asked)", err=True)


# --------------------------------------------------------------------------
# validate


@click.command(epilog="\b\nExamples:\n"
               "  cni-skel validate /etc/cni/net.d/10-mynet.conflist\n"
               "  NETCONFPATH=/etc/cni/net.d CNI_PATH=/opt/cni/bin cni-skel validate mynet")
@click.option("--conf-dir", envvar="NETCONFPATH", default=DEFAULT_CONF_DIR, show_default=True,
              metavar="DIR", help="Where to look up a network NAME [env NETCONFPATH].")
@click.option("--cni-path", envvar="CNI_PATH", default=DEFAULT_CNI_PATH, show_default=True,
              metavar="DIRS", help="Plugin directories for the pre-flight [env CNI_PATH].")
@click.option("--offline", is_flag=True,
              help="Do not look at CNI_PATH: no VERSION; configs are checked with the "
                   "registered cni-skel plugins of the same type.")
@click.argument("target", metavar="FILE|NAME")
def validate(target: str, conf_dir: str, cni_path: str, offline: bool) -> None:
    """Validate a network configuration: a config FILE, or the network NAME
    looked up in NETCONFPATH.

    Checks the format (name rule, plugin types, flags, cniVersion/cniVersions
    and the version chosen from them); unless --offline, asks each plugin
    VERSION and checks it supports the chosen version. Then each plugin's
    config gets the checks ADD makes, with ADD's messages: for a cni-skel
    plugin (its executable in CNI_PATH is a cni-skel launcher or script),
    its config model and config checks run here, and those of its ipam
    delegate when that is one too. What needs a pod, a prevResult or the
    node's state (free addresses, nftables, sysctls in the pod) is checked
    by ADD only. Other plugins' configs are listed as not checked: CNI has
    no verb that checks a config without acting on it.

    Exit status: 0 valid, every config checked; 1 a problem found; 3 no
    problem found, but some plugin's config could not be checked."""
    cni = Runtime(conf_dir=conf_dir, bin_dirs=cni_path, stderr=sys.stderr)
    with reporting(head=f"cannot load {target}"):
        netlist = load_file(target) if os.path.isfile(target) else cni.load_conflist(target)
    declared = []
    if netlist.declared_version:
        declared.append(f'cniVersion "{netlist.declared_version}"')
    if netlist.cni_versions:
        declared.append("cniVersions [" + ", ".join(f'"{v}"' for v in netlist.cni_versions)
                        + "]")
    click.echo(f"network \"{netlist.name}\" ({netlist.source})")
    click.echo(f"  cniVersion {netlist.cni_version} (declared: "
               f"{', '.join(declared) or 'none, which means 0.1.0'})")
    click.echo("  " + "  ".join(
        f"{key}={str(getattr(netlist, attr)).lower()}"
        for key, attr in (("disableCheck", "disable_check"), ("disableGC", "disable_gc"),
                          ("loadOnlyInlinedPlugins", "load_only_inlined_plugins"))))
    registry = plugin_registry()
    problems: list[str] = []
    unchecked: list[str] = []
    rt = RuntimeConf(VALIDATE_CONTAINER_ID, "", "eth0")
    for i, plugin in enumerate(netlist.plugins, 1):
        caps = ", ".join(plugin.capabilities) or "-"
        origin = "" if plugin.source == netlist.source else f"  (from {plugin.source})"
        line = f"  {i}. {plugin.type:<14} capabilities: {caps}{origin}"
        where = f"plugin {i} \"{plugin.type}\""
        found = True
        if not offline:
            try:
                info = cni.get_version_info(plugin.type)
            except CNIError as exc:
                found = False
                problems.append(f"{where}: {exc}")
                line += "\n       not usable: " + str(exc)
            else:
                supported = info.get("supportedVersions") or []
                ok = netlist.cni_version in supported
                line += (f"\n       {cni.find_plugin(plugin.type)} supports "
                         f"{', '.join(supported)}" + ("" if ok else
                                                      f"  <- not {netlist.cni_version}"))
                if not ok:
                    problems.append(f"{where} does not support "
                                    f"cniVersion {netlist.cni_version}")
        click.echo(line)
        stdin = json.dumps(derive_request_config(netlist, plugin, "ADD", rt=rt)).encode()
        subjects = [(plugin.type, where, "config")] if found else []
        if ipam := _ipam_type(plugin.conf):
            subjects.append((ipam, f"{where}, its IPAM \"{ipam}\"", f"ipam {ipam}"))
        for ptype, who, label in subjects:
            outcome, text, exc = _check_plugin_config(cni, registry, ptype, stdin, offline)
            if exc is not None:
                problems.append(f"{who}: code {exc.code}: {exc.msg}")
                click.echo(f"       {label}: invalid: code {exc.code}: {exc.msg}")
                if exc.details and exc.details not in exc.msg:
                    click.echo(f"         details: {exc.details}")
            elif outcome == "unchecked":
                unchecked.append(f"{who}: {text}")
                click.echo(f"       {label}: not checked: {text}")
            else:
                click.echo(f"       {label}: ok ({text})")
    tail = "".join(f"\n  - {u}" for u in unchecked)
    if problems:
        raise CNICommandError(f"network \"{netlist.name}\" is not valid here:\n"
                              + "\n".join(f"  - {p}" for p in problems)
                              + (f"\nalso not checked:{tail}" if unchecked else ""))
    if unchecked:
        click.echo(f"not fully checked: no problem found, but {len(unchecked)} config(s) "
                   f"could not be checked:{tail}\n(only cni-skel plugins' configs are checked "
                   "here: CNI has no verb that checks a config without acting on it)")
        sys.exit(EXIT_UNKNOWN)
    click.echo("  (what needs a pod, a prevResult or the node's state is checked by ADD only)")
    click.echo("valid" + (" (offline: VERSION not asked; configs checked with the registered "
                          "cni-skel plugins)" if offline else ""))


def _check_plugin_config(cni: Runtime, registry: dict[str, str], plugin_type: str,
                         stdin: bytes, offline: bool) -> tuple[str, str, CNIError | None]:
    """Run ``plugin_type``'s own ADD config checks on ``stdin`` in-process:
    what `cni_skel.skel.dispatch` does before the handler (version support,
    CNI_ARGS model, `load_config` with the plugin's config model), then
    `Plugin.validate_config`. Nothing is created or written.

    Returns ``("ok", ref, None)``, ``("invalid", "", CNIError)`` (the error
    ADD would answer, code 999 for a crash as the skel does) or
    ``("unchecked", why, None)`` when the plugin is not a cni-skel one (or
    cannot be imported here, or is not found).
    """
    if offline:
        ref, pythonpath = registry.get(plugin_type), []
        if ref is None:
            return ("unchecked", "not a registered cni-skel plugin (offline: CNI_PATH not "
                    "looked at)", None)
    else:
        try:
            path = cni.find_plugin(plugin_type)
        except CNIError as exc:
            # ADD's delegation looks it up in the same CNI_PATH and fails so.
            return "invalid", "", exc
        found = _plugin_ref(path)
        if found is None:
            return "unchecked", f"{path} is not a cni-skel plugin", None
        ref, pythonpath = found
    saved = list(sys.path)
    sys.path[:0] = pythonpath
    try:
        try:
            plugin = resolve_ref(ref)
        except Exception as exc:
            return "unchecked", f"cannot import {ref} here: {exc}", None
        cni_path = ":".join(cni.bin_dirs)
        env = {**os.environ, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": VALIDATE_CONTAINER_ID,
               "CNI_NETNS": "", "CNI_IFNAME": "eth0", "CNI_ARGS": "", "CNI_PATH": cni_path}
        args = CmdArgs("ADD", VALIDATE_CONTAINER_ID, "", "eth0", "", cni_path, stdin, env)
        try:
            _run_config_checks(plugin, args)
        except CNIError as exc:
            return "invalid", "", exc
        except Exception as exc:  # the skel answers a crash with 999 too
            return "invalid", "", CNIError(ERR_INTERNAL, str(exc) or type(exc).__name__)
    finally:
        sys.path[:] = saved
    return "ok", ref, None


def _run_config_checks(plugin: type[Plugin], args: CmdArgs) -> None:
    raw = json.loads(args.stdin_data)
    check_supported(config_version(raw), plugin.supported_versions)
    if plugin.args_model is not None:
        args = args.replace(typed_args=load_args(args.args, resolve_ref(plugin.args_model)))
    conf = load_config(plugin, raw)
    plugin().validate_config(args, conf)


def _plugin_ref(path: str) -> tuple[str, list[str]] | None:
    """``(module:Class, pythonpath)`` of a plugin executable `cni-skel
    install` wrote (a launcher, or a one-shot script); None for any other."""
    info = launcher_info(path)
    if info is not None:
        return info["ref"], [p for p in info["pythonpath"].split(os.pathsep) if p]
    try:
        with open(path, "rb") as fp:
            head = fp.read(8192).decode("utf-8", "replace")
    except OSError:
        return None
    ref = re.search(r"run_plugin_main\(\W*([A-Za-z_][\w.]*:[A-Za-z_][\w.]*)", head)
    if MARKER not in head or ref is None:
        return None
    pythonpath: list[str] = []
    if (pp := re.search(r"sys\.path\[:0\] = (\[[^\]\n]*\])", head)) is not None:
        try:
            pythonpath = [str(p) for p in ast.literal_eval(pp.group(1))]
        except (ValueError, SyntaxError):
            pythonpath = []
    return ref.group(1), pythonpath

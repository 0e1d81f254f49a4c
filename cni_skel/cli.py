"""``cni-skel``: the command line (click).

``install`` writes CNI plugin executables into a runtime's bin dir. Plugins
are found through the ``cni_skel.plugins`` entry-point group (name ->
``module:Class``), so third-party packages can register theirs the same way
ours are registered; the SDK itself imports no plugin.

``add``, ``check``, ``del``, ``gc`` and ``status`` run a network
configuration list like cnitool (same environment variables, same container
ID derivation, libcni's result cache) through `cni_skel.runtime`;
``validate`` checks a config; ``new-plugin`` writes a plugin project;
``demo`` runs a pod network in throw-away namespaces. Heavy modules are
imported inside the commands.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from typing import Any

import click

from .warm.install import (
    DEFAULT_WORKER_SOCKET,
    LAUNCHERS,
    launcher_info,
    plugin_registry,
    write_executable,
)

__all__ = ["CNICommandError", "describe_error", "main", "plugin_registry",
           "write_executable"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog="\b\nExamples:\n"
                    "  cni-skel install --bin-dir /opt/cni/bin\n"
                    "  NETCONFPATH=/etc/cni/net.d CNI_PATH=/opt/cni/bin "
                    "cni-skel add mynet /run/netns/pod1\n"
                    "  cni-skel demo\n\n"
                    "Run `cni-skel COMMAND --help` for each command's options.")
@click.version_option(package_name="cni-skel")
def main() -> None:
    """cni-skel: CNI plugins in Python, and the tools around them.

    A runtime in the libcni role (add, check, del, gc, status: cnitool's
    commands and environment), config validation, plugin installation and
    scaffolding, and a demo of a pod network in throw-away namespaces."""


@main.command(epilog="\b\nExamples:\n"
              "  cni-skel install --bin-dir /opt/cni/bin              # all registered plugins\n"
              "  cni-skel install --bin-dir /opt/cni/bin loopback host-local")
@click.option("--bin-dir", required=True, type=click.Path(file_okay=False),
              help="CNI bin dir the runtime searches (e.g. /opt/cni/bin).")
@click.option("--python", "python", default=None,
              help="Interpreter for the plugins (default: the one running cni-skel).")
@click.option("--force", is_flag=True, help="Replace files not written by cni-skel.")
@click.option("--worker-socket", default=DEFAULT_WORKER_SOCKET, show_default=True,
              metavar="PATH", help="Socket of `cni-skel worker` the launchers try first.")
@click.option("--one-shot", is_flag=True,
              help="Write plain one-shot scripts instead of worker launchers.")
@click.option("--launcher", type=click.Choice(LAUNCHERS), default="auto", show_default=True,
              help="native: compiled (needs cc; ~0.3 ms a call); python: an -IS script "
                   "(~9 ms); auto: native when it compiles, else python.")
@click.argument("names", nargs=-1)
def install(bin_dir: str, python: str | None, force: bool, worker_socket: str, one_shot: bool,
            launcher: str, names: tuple[str, ...]) -> None:
    """Write plugin executables NAMES (default: all registered) into BIN_DIR.

    Each is a small launcher: it hands every call to `cni-skel worker` on
    --worker-socket, answers VERSION itself, and runs the plugin in-process
    with this Python (absolute path, isolated mode) when no worker answers
    (--one-shot: plain in-process scripts). Files not written by cni-skel
    are left alone unless --force."""
    registry = plugin_registry()
    chosen = list(names) or sorted(registry)
    unknown = [n for n in chosen if n not in registry]
    if unknown:
        raise click.ClickException(
            f"unknown plugin(s) {', '.join(unknown)}; available: {', '.join(sorted(registry))}")
    for name in chosen:
        path = write_executable(bin_dir, name, registry[name], python=python, force=force,
                                worker_socket=None if one_shot else worker_socket,
                                launcher=launcher)
        info = launcher_info(path)
        click.echo(f"installed {path} ({info['kind'] + ' launcher' if info else 'one-shot'})")


@main.command(epilog="\b\nExamples:\n"
              "  cni-skel worker                       # serve on /run/cni-skel/worker.sock\n"
              "  cni-skel worker --check               # exit 0 when a worker answers\n"
              "  cni-skel worker --socket /tmp/w.sock --preload my_pkg.plugin:MyPlugin")
@click.option("--socket", "socket_path", envvar="CNI_SKEL_WORKER_SOCKET",
              default=DEFAULT_WORKER_SOCKET, show_default=True, metavar="PATH",
              help="Unix socket to listen on (mode 0600) [env CNI_SKEL_WORKER_SOCKET].")
@click.option("--check", is_flag=True, help="Only say whether a worker answers on the socket.")
@click.option("--preload", multiple=True, metavar="MODULE:CLASS",
              help="Also import this plugin class before serving (repeatable).")
@click.option("--drain-timeout", type=float, default=30.0, show_default=True, metavar="SECONDS",
              help="On SIGTERM, how long to wait for requests in flight.")
@click.option("--spares", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Idle pre-forked children kept ready.")
@click.option("--request-timeout", type=click.FloatRange(0.1), default=30.0, show_default=True,
              metavar="SECONDS", help="Time a client has to send its whole request.")
@click.option("--run-timeout", type=click.FloatRange(1), default=600.0, show_default=True,
              metavar="SECONDS", help="Time a request may run before its child is killed "
                                      "(answered code 11).")
def worker(socket_path: str, check: bool, preload: tuple[str, ...],
           drain_timeout: float, spares: int, request_timeout: float,
           run_timeout: float) -> None:
    """Serve plugin calls from the installed launchers (warm worker mode).

    Imports every registered plugin (and pyroute2, pydantic) once and keeps
    pre-forked children; each serves one call: it enters the caller's
    namespaces and runs the plugin as its executable would. Only root clients holding
    CAP_NET_ADMIN and CAP_SYS_ADMIN are served, and only the registered plugins and those
    given with --preload (import path: PYTHONPATH). Without a worker the launchers run
    the plugins themselves (one-shot)."""
    from .warm import server as worker_mod

    if check:
        ok, text = worker_mod.check(socket_path)
        click.echo(f"{socket_path}: {'ok' if ok else 'not answering'}: {text}")
        sys.exit(0 if ok else 1)
    if os.geteuid() != 0:
        raise click.ClickException("the worker enters other namespaces: run it as root")
    refs = sorted(set(plugin_registry().values())) + list(preload)
    sys.exit(worker_mod.serve(socket_path, refs, drain_timeout=drain_timeout, spares=spares,
                              request_timeout=request_timeout, run_timeout=run_timeout))


# --------------------------------------------------------------------------
# the runtime commands (cnitool-compatible)

_EXIT_FAILURE = 1


class CNICommandError(click.ClickException):
    """A CNI failure shown to a shell user: which operation and plugin, the
    plugin's code/msg/details, the tail of its stderr, and what to try."""

    exit_code = _EXIT_FAILURE

    def __init__(self, text: str) -> None:
        super().__init__(text)

    def format_message(self) -> str:
        return self.message


def describe_error(exc: Exception, *, operation: str = "", network: str = "",
                   hint: str = "", head: str = "") -> str:
    """A CNI error as lines a shell user can act on (no traceback): what
    failed (``head``, or built from ``operation`` and ``network``), which
    plugin, its code/msg/details, the tail of its stderr, and a hint."""
    from .errors import CNIError
    from .runtime import GCError, NetworkNotFound, PluginError

    if not head:
        head = f"{operation} of network \"{network}\" failed" if operation and network else \
            (f"{operation} failed" if operation else "failed")
    lines: list[str] = []
    if isinstance(exc, PluginError):
        lines.append(f"{head} in plugin \"{exc.plugin_type}\" "
                     f"({exc.index} of {exc.count} in the list)")
        lines.append(f"  code {exc.code}: {exc.msg}")
        if exc.details:
            lines.append(f"  details: {exc.details}")
        tail = [ln for ln in (exc.stderr or "").strip().splitlines() if ln.strip()][-8:]
        if tail:
            lines.append("  plugin stderr (last lines):")
            lines.extend(f"    | {ln}" for ln in tail)
    elif isinstance(exc, GCError):
        lines.append(f"{head}: {len(exc.errors)} error(s), the rest was done")
        for err in exc.errors:
            lines.append(f"  - code {err.code}: {err}")
    elif isinstance(exc, CNIError):
        lines.append(f"{head}")
        lines.append(f"  code {exc.code}: {exc.msg}")
        if exc.details:
            lines.append(f"  details: {exc.details}")
    else:
        lines.append(f"{head}: {exc}")
    if not hint and isinstance(exc, CNIError):
        hint = _hint(exc, isinstance(exc, NetworkNotFound))
    if hint:
        lines.append(f"  hint: {hint}")
    return "\n".join(lines)


def _hint(exc: Any, not_found: bool) -> str:
    text = f"{exc.msg} {exc.details}"
    if not_found:
        return "point NETCONFPATH (or --conf-dir) at the directory holding the network's config"
    if "failed to find plugin" in text or "CNI_PATH is empty" in text:
        return "point CNI_PATH (or --cni-path) at the directory holding the plugin executables"
    if exc.code == 1:
        return ("the plugins and the config disagree on cniVersion: `cni-skel validate NETWORK` "
                "shows what each plugin supports")
    if exc.code == 11:
        return "the plugin timed out or asked to retry: try again later (or raise --timeout)"
    if exc.code == 3 and "netns" in text:
        return "the network namespace does not exist: create it first (ip netns add NAME)"
    if exc.code in (50, 51):
        return "the plugin reports it cannot serve ADD right now (see its message)"
    return ""


def _runtime_options(f: Any) -> Any:
    """Options every runtime command shares (env fallbacks as cnitool)."""
    from .runtime import DEFAULT_CACHE_DIR, DEFAULT_CONF_DIR

    opts = [
        click.option("--conf-dir", envvar="NETCONFPATH", default=DEFAULT_CONF_DIR,
                     show_default=True, metavar="DIR",
                     help="Network config directory [env NETCONFPATH]."),
        click.option("--cni-path", envvar="CNI_PATH", default="/opt/cni/bin",
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
        click.option("-v", "--verbose", is_flag=True,
                     help="Log each plugin execution on stderr."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _attachment_options(f: Any) -> Any:
    opts = [
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
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _make_runtime(opts: dict[str, Any], *, preflight: bool = False) -> Any:
    from .runtime import Runtime

    log = (lambda line: click.echo(f"cni-skel: {line}", err=True)) if opts["verbose"] else None
    return Runtime(conf_dir=opts["conf_dir"], bin_dirs=opts["cni_path"],
                   cache_dir=opts["cache_dir"], timeout=opts["timeout"],
                   plugin_netns=opts["plugin_netns"], stderr=sys.stderr, preflight=preflight,
                   log=log)


def _runtime_conf(opts: dict[str, Any], netns: str) -> Any:
    from .errors import CNIError
    from .runtime import RuntimeConf, cnitool_container_id, resolve_netns

    path = resolve_netns(netns)
    cap_args: dict[str, Any] = {}
    if opts.get("cap_args"):
        try:
            cap_args = json.loads(opts["cap_args"])
        except ValueError as exc:
            raise click.UsageError(f"CAP_ARGS / --cap-args is not valid JSON: {exc}") from None
        if not isinstance(cap_args, dict):
            raise click.UsageError("CAP_ARGS / --cap-args must be a JSON object, e.g. "
                                   "'{\"portMappings\": [{\"hostPort\": 8080, "
                                   "\"containerPort\": 80, \"protocol\": \"tcp\"}]}'")
    try:
        return RuntimeConf(container_id=opts.get("container_id") or cnitool_container_id(path),
                           netns=path, ifname=opts["ifname"], args=opts.get("cni_args") or "",
                           capability_args=cap_args)
    except CNIError as exc:
        raise click.UsageError(f"CNI_ARGS / --args: {exc}") from None


def _load_network(runtime: Any, network: str) -> Any:
    from .errors import CNIError

    try:
        return runtime.load_conflist(network)
    except CNIError as exc:
        raise CNICommandError(describe_error(exc, head=f"cannot load network \"{network}\""))\
            from None


def _with_cached_args(runtime: Any, netlist: Any, rt: Any, opts: dict[str, Any]) -> Any:
    """DEL and CHECK must use the attachment's ADD parameters: when CNI_ARGS
    or CAP_ARGS are not given, take them from the cache (cnitool sends none,
    and then e.g. portmap cannot find its rules)."""
    from .errors import CNIError

    if opts.get("cni_args") and opts.get("cap_args"):
        return rt
    try:
        cached = runtime.get_cached_config(netlist, rt)
    except CNIError:
        return rt
    if cached is None:
        return rt
    _, cached_rt = cached
    if not opts.get("cni_args"):
        rt.args = cached_rt.args
    if not opts.get("cap_args"):
        rt.capability_args = cached_rt.capability_args
    return rt


@main.command(epilog="\b\nExample:\n"
              "  ip netns add pod1\n"
              "  NETCONFPATH=/etc/cni/net.d CNI_PATH=/opt/cni/bin \\\n"
              "    CAP_ARGS='{\"portMappings\":[{\"hostPort\":8080,\"containerPort\":80,"
              "\"protocol\":\"tcp\"}]}' \\\n"
              "    cni-skel add mynet /run/netns/pod1")
@_runtime_options
@_attachment_options
@click.argument("network")
@click.argument("netns")
def add(network: str, netns: str, **opts: Any) -> None:
    """ADD the container in NETNS to NETWORK: run the network's plugins in
    order, print the final result JSON and cache it.

    NETWORK is the "name" in a config file of NETCONFPATH.

    NETNS is a network namespace path (or a name from `ip netns`); the
    container ID is derived from it as cnitool does, so both tools share the
    cache."""
    from .errors import CNIError
    from .runtime import PluginError

    runtime = _make_runtime(opts, preflight=opts["preflight"])
    netlist = _load_network(runtime, network)
    rt = _runtime_conf(opts, netns)
    try:
        result = runtime.add(netlist, rt)
    except CNIError as exc:
        hint = _hint(exc, False)
        if not hint and isinstance(exc, PluginError):
            hint = ("the attachment may be partly set up: run `cni-skel del "
                    f"{network} {netns}` with the same settings to clean up")
        raise CNICommandError(describe_error(exc, operation="ADD", network=network,
                                             hint=hint)) from None
    click.echo(json.dumps(result.to_version(netlist.cni_version), indent=4))



@main.command(epilog="\b\nExample:\n  cni-skel check mynet /run/netns/pod1")
@_runtime_options
@_attachment_options
@click.argument("network")
@click.argument("netns")
def check(network: str, netns: str, **opts: Any) -> None:
    """CHECK that the container in NETNS is still attached to NETWORK as ADD
    left it: each plugin in order, given the cached ADD result. Silent on
    success. Refused for configs older than cniVersion 0.4.0; does nothing
    when the network sets disableCheck.

    CNI_ARGS and CAP_ARGS default to those cached at ADD.

    NETNS is a network namespace path (or a name from `ip netns`); the
    container ID is derived from it as cnitool does, so both tools share the
    cache."""
    from .errors import CNIError

    runtime = _make_runtime(opts, preflight=opts["preflight"])
    netlist = _load_network(runtime, network)
    rt = _with_cached_args(runtime, netlist, _runtime_conf(opts, netns), opts)
    try:
        if not netlist.disable_check and _at_least(netlist.cni_version, "0.4.0") \
                and runtime.get_cached_result(netlist, rt) is None:
            click.echo(f"cni-skel: warning: no cached ADD result for this attachment "
                       f"({rt.container_id}, {rt.ifname}): plugins get no prevResult",
                       err=True)
        runtime.check(netlist, rt)
    except CNIError as exc:
        raise CNICommandError(describe_error(exc, operation="CHECK", network=network)) \
            from None



@main.command("del", epilog="\b\nExample:\n  cni-skel del mynet /run/netns/pod1")
@_runtime_options
@_attachment_options
@click.argument("network")
@click.argument("netns")
def del_(network: str, netns: str, **opts: Any) -> None:
    """DEL the container in NETNS from NETWORK: the plugins in reverse order,
    given the cached ADD result; the cache entry goes when all succeed.
    Repeating it is fine, and so is a NETNS that no longer exists.

    CNI_ARGS and CAP_ARGS default to those cached at ADD (portmap needs its
    portMappings to find its rules).

    NETNS is a network namespace path (or a name from `ip netns`); the
    container ID is derived from it as cnitool does, so both tools share the
    cache."""
    from .errors import CNIError

    runtime = _make_runtime(opts, preflight=opts["preflight"])
    netlist = _load_network(runtime, network)
    rt = _with_cached_args(runtime, netlist, _runtime_conf(opts, netns), opts)
    try:
        runtime.delete(netlist, rt)
    except CNIError as exc:
        raise CNICommandError(describe_error(exc, operation="DEL", network=network)) from None



#: Exit status of `status` and `validate` when they cannot tell: the plugins
#: were not asked (STATUS below 1.1.0), or a plugin's config was not checked.
_EXIT_UNKNOWN = 3
#: CNI_CONTAINERID of the ADD whose config checks `validate` runs (nothing
#: is created for it).
_VALIDATE_CONTAINER_ID = "cni-skel-validate"


@main.command(epilog="\b\nExamples:\n"
              "  cni-skel gc mynet                      # dry run: what GC would remove\n"
              "  cni-skel gc mynet --valid cnitool-3f2a9c1e0b7d4a6c8e21:eth0 --valid c2:eth0\n"
              "  cni-skel gc mynet --yes                # no attachment is valid: remove all")
@_runtime_options
@click.option("--valid", "valid", multiple=True, metavar="CONTAINERID:IFNAME",
              help="An attachment still in use (repeat for each); the others are stale. "
                   "Given, GC acts.")
@click.option("--yes", is_flag=True,
              help="Act without --valid: no attachment is valid, so the state of every "
                   "attachment of NETWORK goes, that of running pods included.")
@click.option("--dry-run", is_flag=True,
              help="Only show what GC would do (the default without --valid and --yes).")
@click.argument("network")
@click.argument("netns", required=False)
def gc(network: str, netns: str | None, valid: tuple[str, ...], yes: bool, dry_run: bool,
       **opts: Any) -> None:
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
    from .errors import CNIError
    from .runtime import GCAttachment

    pairs = []
    for item in valid:
        cid, sep, ifname = item.partition(":")
        if not sep or not cid or not ifname:
            raise click.BadParameter(f"{item!r}: expected CONTAINERID:IFNAME", param_hint="--valid")
        pairs.append(GCAttachment(cid, ifname))
    runtime = _make_runtime(opts)
    netlist = _load_network(runtime, network)
    if netlist.disable_gc:
        click.echo(f"cni-skel: network \"{network}\" sets disableGC: nothing done", err=True)
        return
    if dry_run or not (pairs or yes):
        try:
            _gc_plan(runtime, netlist, pairs, yes)
        except CNIError as exc:
            raise CNICommandError(describe_error(exc, operation="GC (dry run)",
                                                 network=network)) from None
        return
    try:
        removed = runtime.gc(netlist, pairs)
    except CNIError as exc:
        raise CNICommandError(describe_error(exc, operation="GC", network=network)) from None
    names = ", ".join(f"{a.container_id}:{a.ifname}" for a in removed) or "none"
    asked = "plugins asked to GC" if _at_least(netlist.cni_version, "1.1.0") else \
        f"cniVersion {netlist.cni_version} has no plugin GC"
    click.echo(f"cni-skel: GC of network \"{network}\": stale attachments deleted: {names}; "
               f"{asked}", err=True)


def _gc_plan(runtime: Any, netlist: Any, valid: list[Any], yes: bool) -> None:
    """Print what `Runtime.gc` would do with ``valid``, from the cache and the
    config only (nothing is run, nothing changes)."""
    echo = click.echo
    name, version = netlist.name, netlist.cni_version
    stale = runtime.stale_attachments(netlist, valid)
    stale_paths = {a.path for a in stale}
    kept = [a for a in runtime.get_cached_attachments()
            if a.network == name and a.path not in stale_paths]
    echo(f"GC of network \"{name}\" (cniVersion {version}): dry run, nothing changed")
    if valid:
        echo("valid attachments: " + ", ".join(f"{a.container_id}:{a.ifname}" for a in valid))
    else:
        echo("valid attachments: none" + (" (--yes)" if yes else " given")
             + ": every attachment of the network counts as stale")
    echo(f"1. DEL of each cached attachment not valid "
         f"(cache {os.path.join(runtime.cache_dir, 'results')}):")
    for att in stale:
        echo(f"     {att.container_id}:{att.ifname}  {_netns_note(att.netns)}")
    if not stale:
        echo("     none")
    for att in kept:
        echo(f"     kept (valid): {att.container_id}:{att.ifname}")
    if _at_least(version, "1.1.0"):
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


def _plugin_label(plugin: Any) -> str:
    ipam = _ipam_type(plugin.conf)
    return plugin.type + (f" (and its IPAM {ipam})" if ipam else "")


@main.command(epilog="\b\nExample:\n  cni-skel status mynet && echo ready")
@_runtime_options
@click.argument("network")
@click.argument("netns", required=False)
def status(network: str, netns: str | None, **opts: Any) -> None:
    """STATUS of NETWORK: ask each plugin whether it can serve ADD now.

    Exit status: 0 when every plugin said it can; 1 when one cannot (its
    code: 50 cannot serve ADD, 51 existing containers may lose connectivity)
    or on any other error; 3 when the plugins were not asked: STATUS exists
    from cniVersion 1.1.0 on, so for an older network nobody can tell
    (libcni's GetStatusNetworkList answers success for it without asking).

    NETNS is accepted for cnitool compatibility and ignored."""
    from .errors import CNIError

    runtime = _make_runtime(opts)
    netlist = _load_network(runtime, network)
    try:
        asked = runtime.status(netlist)
    except CNIError as exc:
        raise CNICommandError(describe_error(exc, operation="STATUS", network=network)) \
            from None
    if not asked:
        click.echo(f"cni-skel: network \"{network}\" has cniVersion {netlist.cni_version}: its "
                   "plugins were not asked (STATUS exists from cniVersion 1.1.0), so whether it "
                   "can serve ADD is unknown (libcni answers success without asking)", err=True)
        sys.exit(_EXIT_UNKNOWN)
    click.echo(f"cni-skel: network \"{network}\" is ready "
               f"({len(netlist.plugins)} plugin(s) asked)", err=True)


def _at_least(version: str, minimum: str) -> bool:
    from .version import version_at_least

    return version_at_least(version, minimum)


@main.command(epilog="\b\nExamples:\n"
              "  cni-skel validate /etc/cni/net.d/10-mynet.conflist\n"
              "  NETCONFPATH=/etc/cni/net.d CNI_PATH=/opt/cni/bin cni-skel validate mynet")
@click.option("--conf-dir", envvar="NETCONFPATH", default="/etc/cni/net.d", show_default=True,
              metavar="DIR", help="Where to look up a network NAME [env NETCONFPATH].")
@click.option("--cni-path", envvar="CNI_PATH", default="/opt/cni/bin", show_default=True,
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
    from .errors import CNIError
    from .runtime import Runtime, RuntimeConf, derive_request_config, load_file

    runtime = Runtime(conf_dir=conf_dir, bin_dirs=cni_path, stderr=sys.stderr)
    try:
        netlist = load_file(target) if os.path.isfile(target) else runtime.load_conflist(target)
    except CNIError as exc:
        raise CNICommandError(describe_error(exc, head=f"cannot load {target}")) from None
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
    rt = RuntimeConf(_VALIDATE_CONTAINER_ID, "", "eth0")
    for i, plugin in enumerate(netlist.plugins, 1):
        caps = ", ".join(plugin.capabilities) or "-"
        origin = "" if plugin.source == netlist.source else f"  (from {plugin.source})"
        line = f"  {i}. {plugin.type:<14} capabilities: {caps}{origin}"
        where = f"plugin {i} \"{plugin.type}\""
        found = True
        if not offline:
            try:
                info = runtime.get_version_info(plugin.type)
            except CNIError as exc:
                found = False
                problems.append(f"{where}: {exc}")
                line += "\n       not usable: " + str(exc)
            else:
                supported = info.get("supportedVersions") or []
                ok = netlist.cni_version in supported
                line += (f"\n       {runtime.find_plugin(plugin.type)} supports "
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
            outcome, text, exc = _check_plugin_config(runtime, registry, ptype, stdin, offline)
            if outcome == "invalid":
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
        sys.exit(_EXIT_UNKNOWN)
    click.echo("  (what needs a pod, a prevResult or the node's state is checked by ADD only)")
    click.echo("valid" + (" (offline: VERSION not asked; configs checked with the registered "
                          "cni-skel plugins)" if offline else ""))


def _check_plugin_config(runtime: Any, registry: dict[str, str], plugin_type: str,
                         stdin: bytes, offline: bool) -> tuple[str, str, Any]:
    """Run ``plugin_type``'s own ADD config checks on ``stdin`` in-process:
    what `cni_skel.skel.dispatch` does before the handler (version support,
    CNI_ARGS model, `load_config` with the plugin's config model), then
    `Plugin.validate_config`. Nothing is created or written.

    Returns ``("ok", ref, None)``, ``("invalid", "", CNIError)`` (the error
    ADD would answer, code 999 for a crash as the skel does) or
    ``("unchecked", why, None)`` when the plugin is not a cni-skel one (or
    cannot be imported here, or is not found).
    """
    from .env import CmdArgs
    from .errors import ERR_INTERNAL, CNIError
    from .skel import resolve_ref

    if offline:
        ref, pythonpath = registry.get(plugin_type), []
        if ref is None:
            return ("unchecked", "not a registered cni-skel plugin (offline: CNI_PATH not "
                    "looked at)", None)
    else:
        try:
            path = runtime.find_plugin(plugin_type)
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
        env = {**os.environ, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": _VALIDATE_CONTAINER_ID,
               "CNI_NETNS": "", "CNI_IFNAME": "eth0", "CNI_ARGS": "",
               "CNI_PATH": ":".join(runtime.bin_dirs)}
        args = CmdArgs("ADD", _VALIDATE_CONTAINER_ID, "", "eth0", "", env["CNI_PATH"], stdin,
                       env)
        try:
            _run_config_checks(plugin, args)
        except CNIError as exc:
            return "invalid", "", exc
        except Exception as exc:  # the skel answers a crash with 999 too
            return "invalid", "", CNIError(ERR_INTERNAL, str(exc) or type(exc).__name__)
    finally:
        sys.path[:] = saved
    return "ok", ref, None


def _run_config_checks(plugin: Any, args: Any) -> None:
    from .args import load_args
    from .skel import load_config, resolve_ref
    from .version import check_supported, config_version

    raw = json.loads(args.stdin_data)
    check_supported(config_version(raw), plugin.supported_versions)
    if plugin.args_model is not None:
        args = args.replace(cni_args=load_args(args.args, resolve_ref(plugin.args_model)))
    conf = load_config(plugin, raw)
    plugin().validate_config(args, conf)


def _plugin_ref(path: str) -> tuple[str, list[str]] | None:
    """``(module:Class, pythonpath)`` of a plugin executable `cni-skel
    install` wrote (a launcher, or a one-shot script); None for any other."""
    import ast
    import re

    from .warm.install import MARKER

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


@main.command("new-plugin", epilog="\b\nExample:\n"
              "  cni-skel new-plugin mtu-setter && cd mtu-setter && sudo python -m pytest")
@click.argument("name")
@click.option("--dir", "parent", default=".", show_default=True,
              type=click.Path(file_okay=False), help="Where to create the NAME directory.")
@click.option("--force", is_flag=True, help="Write into an existing non-empty directory.")
def new_plugin(name: str, parent: str, force: bool) -> None:
    """Write a new plugin project NAME: a working chained plugin (it sets the
    MTU of the container's interface), a pyproject registering it under the
    cni_skel.plugins entry point (so `cni-skel install` finds it once it is
    pip-installed), and a pytest test that runs it in throw-away network
    namespaces and passes as written (run it as root)."""
    from .plugin_template import names_for, render

    try:
        module, cls = names_for(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    target = os.path.join(parent, name)
    if os.path.isdir(target) and os.listdir(target) and not force:
        raise click.ClickException(f"{target} exists and is not empty (use --force to write "
                                   "into it)")
    for rel, text in render(name).items():
        path = os.path.join(target, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fp:
            fp.write(text)
    click.echo(f"wrote plugin project {target}/ (package {module}, class {cls})\n"
               f"  cd {target} && python -m pytest       # as root\n"
               f"  pip install . && cni-skel install --bin-dir /opt/cni/bin {name}")


# --------------------------------------------------------------------------
# the demo: the project's main job on real namespaces

DEMO_SUBNET = "10.99.0.0/24"
DEMO_BRIDGE = "cnsk-demo0"
DEMO_HOST_PORT = 18080
DEMO_POD_PORT = 8080
_DEMO_TYPES = ("bridge", "host-local", "tuning", "portmap", "loopback")


def _demo_conflist(version: str, data_dir: str) -> dict[str, Any]:
    return {
        "cniVersion": version,
        "name": "demo-net",
        "plugins": [
            {"type": "bridge", "bridge": DEMO_BRIDGE, "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": DEMO_SUBNET}]],
                      "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": os.path.join(data_dir, "ipam")}},
            {"type": "tuning", "mtu": 1400,
             "sysctl": {"net.ipv4.conf.eth0.arp_notify": "1"},
             "dataDir": os.path.join(data_dir, "tuning")},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }


class _DemoFailure(Exception):
    pass


def _pick_demo_version(runtime: Any, wanted: str) -> tuple[str, dict[str, list[str]]]:
    from .errors import CNIError
    from .version import ALL_VERSIONS, parse_version

    supported: dict[str, list[str]] = {}
    for ptype in _DEMO_TYPES:
        try:
            supported[ptype] = list(runtime.get_version_info(ptype).get("supportedVersions")
                                    or [])
        except CNIError as exc:
            raise _DemoFailure(describe_error(exc, operation=f"pre-flight VERSION of {ptype}")) \
                from None
    common = [v for v in ALL_VERSIONS if all(v in s for s in supported.values())]
    if wanted != "auto":
        if wanted not in common:
            raise _DemoFailure(f"cniVersion {wanted} is not supported by every plugin "
                               f"(common: {', '.join(common) or 'none'})")
        return wanted, supported
    usable = [v for v in common if parse_version(v) >= (0, 4, 0)]  # the demo runs CHECK
    if not usable:
        raise _DemoFailure("the plugins share no cniVersion of 0.4.0 or later "
                           f"(common: {', '.join(common) or 'none'})")
    return max(usable, key=parse_version), supported


def _lo_state(pod_path: str) -> str:
    from . import netlink
    from .netns import NetNS

    with NetNS.open(pod_path) as ns, ns.iproute() as ipr:
        link = netlink.find_link(ipr, "lo")
    return "UP" if link and link["up"] else "DOWN"


def _pod_link(pod_path: str, name: str) -> dict | None:
    from . import netlink
    from .netns import NetNS

    with NetNS.open(pod_path) as ns, ns.iproute() as ipr:
        return netlink.find_link(ipr, name)


def _in_netns(path: str, fn: Any, *args: Any) -> Any:
    from .netns import NetNS

    with NetNS.open(path) as ns:
        return ns.run(fn, *args)


def _icmp_ping(src_netns: str, dst: str, count: int = 3, timeout: float = 1.0) -> list[float]:
    """ICMP echo from inside ``src_netns`` to ``dst`` (a raw socket: root);
    returns the round-trip times (ms) of the replies received."""
    import select
    import socket
    import struct

    def checksum(data: bytes) -> int:
        if len(data) % 2:
            data += b"\0"
        total = sum(struct.unpack(f"!{len(data) // 2}H", data))
        total = (total >> 16) + (total & 0xFFFF)
        total += total >> 16
        return ~total & 0xFFFF

    sock = _in_netns(src_netns, socket.socket, socket.AF_INET, socket.SOCK_RAW,
                     socket.IPPROTO_ICMP)
    ident = os.getpid() & 0xFFFF
    rtts = []
    with sock:
        for seq in range(1, count + 1):
            payload = b"cni-skel demo"
            header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
            packet = struct.pack("!BBHHH", 8, 0, checksum(header + payload), ident, seq) \
                + payload
            sent = time.monotonic()
            sock.sendto(packet, (dst, 0))
            deadline = sent + timeout
            while (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([sock], [], [], left)
                if not ready:
                    break
                data, addr = sock.recvfrom(2048)
                ihl = (data[0] & 0x0F) * 4
                rtype, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
                if addr[0] == dst and rtype == 0 and rid == ident and rseq == seq:
                    rtts.append((time.monotonic() - sent) * 1000)
                    break
            if seq < count:
                time.sleep(0.2)
    return rtts


class _EchoServer:
    """A TCP echo server listening inside a pod's netns (bounded: it stops
    with the demo; each connection has a timeout)."""

    def __init__(self, netns_path: str, port: int, label: str) -> None:
        import socket
        import threading

        self.label = label
        self.sock = _in_netns(netns_path, socket.create_server, ("0.0.0.0", port))
        self.sock.settimeout(0.5)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(3)
                try:
                    data = conn.recv(1024)
                    conn.sendall(f"{self.label} echoes: ".encode() + data)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=2)
        self.sock.close()


def _tcp_echo(src_netns: str, host: str, port: int, message: str) -> str:
    import socket

    def talk() -> str:
        with socket.create_connection((host, port), timeout=3) as conn:
            conn.sendall(message.encode())
            return conn.recv(1024).decode(errors="replace")

    return _in_netns(src_netns, talk)


@main.command(epilog="\b\nExamples:\n"
              "  make demo                                  # as root on Debian\n"
              "  sudo .venv/bin/cni-skel demo\n"
              "  sudo .venv/bin/cni-skel demo --plugin-dir /usr/lib/cni   # the Go plugins")
@click.option("--plugin-dir", type=click.Path(exists=True, file_okay=False), default=None,
              metavar="DIR",
              help="Run the plugin executables found in DIR instead of installing ours "
                   "(for testing and comparison, e.g. /usr/lib/cni holding Debian's Go "
                   "reference plugins).")
@click.option("--cni-version", default="auto", show_default=True, metavar="VERSION|auto",
              help="cniVersion of the demo's configs; auto: the highest that every plugin "
                   "supports (asked with VERSION).")
@click.option("-v", "--verbose", is_flag=True, help="Log each plugin execution.")
def demo(plugin_dir: str | None, cni_version: str, verbose: bool) -> None:
    """Run a real pod network in throw-away network namespaces: the project's
    main job, end to end, through the cni-skel runtime.

    A "node" namespace and two "pod" namespaces are created; our plugins are
    installed into a temporary bin dir; a conflist (bridge with host-local
    IPAM on 10.99.0.0/24, tuning, portmap) and a single-plugin loopback
    network are written to a temporary config dir. Both pods are ADDed (the
    plugins run inside the node namespace), the results are shown, pod-a
    pings pod-b, TCP goes pod-b -> pod-a and node -> hostPort (portmap) ->
    pod-a, then CHECK, DEL and a summary. Everything is removed at the end,
    also on failure or Ctrl-C; the machine's own network namespace is never
    touched. Needs root."""
    import signal

    if os.geteuid() != 0:
        raise click.ClickException("the demo creates network namespaces: run it as root")
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        ok = _run_demo(plugin_dir, cni_version, verbose)
    except KeyboardInterrupt:
        # Whatever was cut short (a netlink request, say) may complain while
        # being garbage-collected at exit; the user asked to stop, not for that.
        sys.unraisablehook = lambda unraisable: None
        click.echo("\ninterrupted: namespaces and temporary files removed", err=True)
        sys.exit(130)
    except _DemoFailure as exc:
        raise CNICommandError(str(exc)) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not ok:
        sys.exit(_EXIT_FAILURE)


def _run_demo(plugin_dir: str | None, cni_version: str, verbose: bool) -> bool:
    import signal

    from .errors import CNIError
    from .harness import create_netns, remove_netns
    from .runtime import Runtime, RuntimeConf

    echo = click.echo
    steps: list[tuple[str, bool, str]] = []
    made = []
    runtime = None
    interrupted = False
    added: list[tuple[Any, Any]] = []
    servers: list[_EchoServer] = []
    with tempfile.TemporaryDirectory(prefix="cni-skel-demo-") as tmp:
        try:
            node = create_netns("cnsk-demo-node")
            made.append(node)
            pods = {}
            for label in ("pod-a", "pod-b"):
                pods[label] = create_netns(f"cnsk-demo-{label}")
                made.append(pods[label])
            _in_netns(node.path, _set_lo_up)
            echo("cni-skel demo: a pod network in namespaces made for the demo "
                 "(the machine's own network is not touched)")
            echo(f"  node netns   {node.path}   (the plugins run here, as on a node)")
            for label, ns in pods.items():
                echo(f"  {label} netns  {ns.path}")

            if plugin_dir:
                bin_dir = os.path.abspath(plugin_dir)
                echo(f"  plugins      {bin_dir} (--plugin-dir)")
            else:
                bin_dir = os.path.join(tmp, "bin")
                registry = plugin_registry()
                missing = [t for t in _DEMO_TYPES if t not in registry]
                if missing:
                    raise _DemoFailure(f"plugin(s) not installed: {', '.join(missing)}")
                for ptype in _DEMO_TYPES:
                    write_executable(bin_dir, ptype, registry[ptype], force=True)
                echo(f"  plugins      ours, installed into {bin_dir}")
            conf_dir = os.path.join(tmp, "net.d")
            cache_dir = os.path.join(tmp, "cache")
            os.makedirs(conf_dir)
            log = (lambda line: echo(f"    [runtime] {line}")) if verbose else None
            runtime = Runtime(conf_dir=conf_dir, bin_dirs=[bin_dir], cache_dir=cache_dir,
                              plugin_netns=node.path, stderr=sys.stderr, timeout=60, log=log)

            version, supported = _pick_demo_version(runtime, cni_version)
            echo("\npre-flight (VERSION):")
            for ptype, versions in supported.items():
                echo(f"  {ptype:<11} {', '.join(versions)}")
            echo(f"  -> cniVersion {version}")
            conflist = _demo_conflist(version, tmp)
            with open(os.path.join(conf_dir, "10-demo-net.conflist"), "w") as fp:
                json.dump(conflist, fp, indent=2)
            with open(os.path.join(conf_dir, "99-demo-lo.conf"), "w") as fp:
                json.dump({"cniVersion": version, "name": "demo-lo", "type": "loopback"}, fp)
            net = runtime.load_conflist("demo-net")
            lo_net = runtime.load_conflist("demo-lo")
            echo(f"\nconfig dir {conf_dir}:")
            echo(f"  10-demo-net.conflist  {' + '.join(p.type for p in net.plugins)} "
                 f"(IPAM host-local {DEMO_SUBNET})")
            echo("  99-demo-lo.conf       loopback (a single-plugin .conf, run as a list of one)")
            echo(json.dumps(conflist, indent=2))

            results = {}
            for label, ns in pods.items():
                echo(f"\n{label}: before ADD, lo in the pod is {_lo_state(ns.path)}")
                lo_rt = RuntimeConf(f"demo-{label}", ns.path, "lo")
                added.append((lo_net, lo_rt))
                runtime.add(lo_net, lo_rt)
                echo(f"{label}: ADD demo-lo (lo): ok")
                caps = {}
                if label == "pod-a":
                    caps = {"portMappings": [{"hostPort": DEMO_HOST_PORT,
                                              "containerPort": DEMO_POD_PORT,
                                              "protocol": "tcp"}]}
                rt = RuntimeConf(f"demo-{label}", ns.path, "eth0",
                                 args="IgnoreUnknown=1;K8S_POD_NAME=" + label,
                                 capability_args=caps)
                added.append((net, rt))
                results[label] = runtime.add(net, rt)
                ip = results[label].ips[0]
                eth0 = _pod_link(ns.path, "eth0") or {}
                echo(f"{label}: ADD demo-net (eth0): ok -> {ip.address} gateway {ip.gateway}, "
                     f"mtu {eth0.get('mtu')} (tuning), mac {eth0.get('mac')}")
                echo(f"{label}: after ADD, lo in the pod is {_lo_state(ns.path)}")
            steps.append(("ADD", True, ", ".join(f"{k} {r.ips[0].address}"
                                                 for k, r in results.items())))
            echo("\nADD result of pod-a on demo-net (cached in "
                 f"{runtime.cache_path('demo-net', added[1][1])}):")
            echo(json.dumps(results["pod-a"].to_version(version), indent=4))

            addr = {k: str(r.ips[0].address.ip) for k, r in results.items()}
            gateway = str(results["pod-a"].ips[0].gateway)
            echo("\nconnectivity:")
            servers.append(_EchoServer(pods["pod-a"].path, DEMO_POD_PORT, "pod-a"))
            rtts = _icmp_ping(pods["pod-a"].path, addr["pod-b"])
            detail = f"pod-a -> pod-b {addr['pod-b']}: {len(rtts)}/3 replies" + \
                (f", rtt avg {sum(rtts) / len(rtts):.2f} ms" if rtts else "")
            steps.append(("ping", len(rtts) > 0, detail))
            echo(f"  ping     {detail}")
            for step, src, host, port in (
                    ("tcp", pods["pod-b"].path, addr["pod-a"], DEMO_POD_PORT),
                    ("portmap", node.path, gateway, DEMO_HOST_PORT)):
                who = "pod-b" if step == "tcp" else "node"
                what = f"{who} -> {host}:{port}" + \
                    (f" -> pod-a:{DEMO_POD_PORT}" if step == "portmap" else "")
                try:
                    answer = _tcp_echo(src, host, port, f"hello from {who}")
                    good = answer == f"pod-a echoes: hello from {who}"
                    detail = f"{what}: {answer!r}"
                except OSError as exc:
                    good, detail = False, f"{what}: {exc.strerror or exc}"
                steps.append((step, good, detail))
                echo(f"  {step:<8} {detail}")

            echo("")
            for netlist, rt in added:
                runtime.check(netlist, rt)
                echo(f"CHECK {netlist.name:<8} {rt.container_id} ({rt.ifname}): ok")
            steps.append(("CHECK", True, f"{len(added)} attachment(s) ok"))

            echo("")
            for netlist, rt in reversed(list(added)):
                runtime.delete(netlist, rt)
                added.remove((netlist, rt))
                echo(f"DEL   {netlist.name:<8} {rt.container_id} ({rt.ifname}): ok")
            gone = all(_pod_link(ns.path, "eth0") is None for ns in pods.values())
            cache_left = runtime.get_cached_attachments()
            for label, ns in pods.items():
                echo(f"{label}: after DEL, lo in the pod is {_lo_state(ns.path)}")
            steps.append(("DEL", gone and not cache_left,
                          "eth0 gone from both pods, cache empty" if gone and not cache_left
                          else f"eth0 gone: {gone}, cache left: {len(cache_left)}"))
        except CNIError as exc:
            echo("Error: " + describe_error(exc, operation="demo"), err=True)
            steps.append(("error", False, f"code {exc.code}: {exc}"))
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            # Cleaning up must not be cut short by a second Ctrl-C.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            for server in servers:
                server.close()
            if added and runtime is not None and not interrupted:
                _demo_cleanup_dels(runtime, added)
            for ns in reversed(made):
                remove_netns(ns)
    echo("\nsummary:")
    for name, good, detail in steps:
        echo(f"  {name:<8} {'ok' if good else 'FAILED':<7} {detail}")
    ok = bool(steps) and all(good for _, good, _ in steps)
    echo("demo passed: namespaces and temporary files removed" if ok else
         "demo FAILED: namespaces and temporary files removed")
    return ok


def _set_lo_up() -> None:
    from . import netlink
    from .netns import current_netns

    with current_netns() as ns, ns.iproute() as ipr:
        netlink.link_up(ipr, "lo")


def _demo_cleanup_dels(runtime: Any, added: list[tuple[Any, Any]]) -> None:
    """After a failure, DEL what was ADDed (a runtime always does), quietly."""
    import io

    from .errors import CNIError

    runtime.stderr = io.StringIO()
    for netlist, rt in reversed(added):
        with contextlib.suppress(CNIError):
            runtime.delete(netlist, rt)

if __name__ == "__main__":
    main()

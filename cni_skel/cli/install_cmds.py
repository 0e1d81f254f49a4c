"""The commands that put plugins on a node: ``install``, ``worker`` and
``new-plugin``.

Plugins are found through the ``cni_skel.plugins`` entry-point group (name ->
``module:Class``), so third-party packages register theirs the same way ours
are registered; the SDK itself imports no plugin. Writing the executables
is `cni_skel.warm.install`'s job, serving them `cni_skel.warm.server`'s.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from .. import gorules
from ..errors import CNIError
from ..plugin_template import names_for, render
from ..warm import server
from ..warm.doctor import diagnose
from ..warm.install import (
    DEFAULT_SYSTEMD_DIR,
    DEFAULT_WORKER_SOCKET,
    LAUNCHERS,
    SERVICE_UNIT,
    SOCKET_UNIT,
    InstallError,
    launcher_info,
    node_state,
    plugin_registry,
    remove_ours,
    systemctl,
    systemd_running,
    systemd_units,
    write_executable,
    write_units,
)
from ..warm.metrics import parse_address
from ..warm.protocol import FALLBACK_ONESHOT, FALLBACKS

__all__ = ["DEFAULT_BIN_DIR", "doctor", "install", "new_plugin", "uninstall", "worker"]

#: Where runtimes look for plugins by default (containerd, CRI-O, podman).
DEFAULT_BIN_DIR = "/opt/cni/bin"


def _bin_dir_option(text: str) -> Any:
    return click.option("--bin-dir", default=DEFAULT_BIN_DIR, show_default=True,
                        type=click.Path(file_okay=False), help=text)


def _systemd_dir_option(text: str) -> Any:
    return click.option("--systemd-dir", default=DEFAULT_SYSTEMD_DIR, show_default=True,
                        type=click.Path(file_okay=False), help=text)


@click.command(epilog="\b\nExamples:\n"
               "  cni-skel install                        # all plugins, warm, systemd units\n"
               "  cni-skel install --fallback none        # code 11 when the worker is down\n"
               "  cni-skel install --no-systemd --bin-dir /tmp/bin loopback host-local\n"
               "  cni-skel install --one-shot             # no worker: Python each call")
@_bin_dir_option("CNI bin dir the runtime searches.")
@click.option("--python", "python", default=None,
              help="Interpreter for the plugins and the worker (default: the one running "
                   "cni-skel).")
@click.option("--force", is_flag=True, help="Replace files not written by cni-skel.")
@click.option("--worker-socket", default=DEFAULT_WORKER_SOCKET, show_default=True,
              metavar="PATH", help="Socket of `cni-skel worker` the launchers use.")
@click.option("--fallback", type=click.Choice(FALLBACKS), default=FALLBACK_ONESHOT,
              show_default=True,
              help="When the worker cannot serve a call: oneshot runs the plugin in the "
                   "launcher's process (~10x slower) with a warning naming the socket; none "
                   "answers spec error 11 (try again later; STATUS: 50), and a native launcher "
                   "then never runs Python.")
@click.option("--systemd/--no-systemd", "systemd", default=True, show_default=True,
              help="Write the worker's socket-activated units and enable the socket when "
                   "systemd runs (else print the command).")
@_systemd_dir_option("Where the units go.")
@click.option("--idle-exit", type=click.FloatRange(0), default=600.0, show_default=True,
              metavar="SECONDS", help="The socket-activated worker exits after this long "
                                      "without a request (0: never).")
@click.option("--one-shot", is_flag=True,
              help="Write plain one-shot scripts instead of worker launchers (no units).")
@click.option("--launcher", type=click.Choice(LAUNCHERS), default="auto", show_default=True,
              help="native: compiled (needs cc; ~0.3 ms a call); python: a script "
                   "(~9 ms); auto: native when it compiles, else python.")
@click.argument("names", nargs=-1)
def install(bin_dir: str, python: str | None, force: bool, worker_socket: str, fallback: str,
            systemd: bool, systemd_dir: str, idle_exit: float, one_shot: bool, launcher: str,
            names: tuple[str, ...]) -> None:
    """Write plugin executables NAMES (default: all registered) into BIN_DIR,
    and the worker's systemd units.

    Each executable is a launcher: it hands every call to `cni-skel worker`
    on --worker-socket and answers VERSION itself. The units make systemd
    listen on that socket from boot and start the worker on the first call
    (socket activation); it exits after --idle-exit seconds idle. When the
    worker cannot serve a call the launcher does what --fallback says.
    --one-shot writes plain scripts instead (Python each call, no worker,
    no units). Files not written by cni-skel are left alone unless --force."""
    registry = plugin_registry()
    chosen = list(names) or sorted(registry)
    unknown = [n for n in chosen if n not in registry]
    if unknown:
        raise click.ClickException(
            f"unknown plugin(s) {', '.join(unknown)}; available: {', '.join(sorted(registry))}")
    interpreter = os.path.abspath(python or sys.executable)
    for name in chosen:
        try:
            path = write_executable(bin_dir, name, registry[name], python=interpreter,
                                    force=force,
                                    worker_socket=None if one_shot else worker_socket,
                                    launcher=launcher, fallback=fallback)
        except InstallError as exc:
            raise click.ClickException(str(exc)) from None
        info = launcher_info(path)
        kind = f"{info['kind']} launcher, fallback {info['fallback']}" if info else "one-shot"
        click.echo(f"installed {path} ({kind})")
    if one_shot or not systemd:
        return
    try:
        units = systemd_units(interpreter, os.path.abspath(worker_socket), idle_exit or None)
        paths = write_units(systemd_dir, units, force=force)
    except InstallError as exc:
        raise click.ClickException(str(exc)) from None
    for path in paths:
        click.echo(f"installed {path}")
    enable = ("systemctl daemon-reload && systemctl enable --now " + SOCKET_UNIT
              + " && systemctl try-restart " + SERVICE_UNIT)
    if not systemd_running(systemd_dir):
        where = ("systemd is not running here" if not systemd_running()
                 else f"systemd does not read units from {systemd_dir}")
        click.echo(f"{where}: enable the socket with `{enable}` where it does")
        return
    for args in (("daemon-reload",), ("enable", "--now", SOCKET_UNIT),
                 ("try-restart", SERVICE_UNIT)):
        ok, text = systemctl(*args)
        if not ok:
            raise click.ClickException(f"systemctl {' '.join(args)} failed: {text}")
    click.echo(f"enabled {SOCKET_UNIT}: the first plugin call starts the worker")


@click.command(epilog="\b\nExamples:\n"
               "  cni-skel uninstall                      # launchers and units\n"
               "  cni-skel uninstall --bin-dir /tmp/bin --no-systemd loopback")
@_bin_dir_option("CNI bin dir to remove launchers from.")
@click.option("--systemd/--no-systemd", "systemd", default=True, show_default=True,
              help="Also stop, disable and remove the worker's units.")
@_systemd_dir_option("Where the units are.")
@click.argument("names", nargs=-1)
def uninstall(bin_dir: str, systemd: bool, systemd_dir: str, names: tuple[str, ...]) -> None:
    """Remove the executables cni-skel wrote for NAMES (default: all
    registered) from BIN_DIR, and the worker's units; files of other
    programs are left alone. Says what state stays on the node: the
    plugins' files and nftables tables of pods still attached (their DEL or
    a GC removes them)."""
    registry = plugin_registry()
    chosen = list(names) or sorted(registry)
    if systemd:
        present = [u for u in (SOCKET_UNIT, SERVICE_UNIT)
                   if os.path.lexists(os.path.join(systemd_dir, u))]
        if present and systemd_running(systemd_dir):
            systemctl("disable", "--now", SOCKET_UNIT, SERVICE_UNIT)
        for unit in present:
            removed = remove_ours(systemd_dir, unit)
            click.echo(f"removed {removed}" if removed else
                       f"left {os.path.join(systemd_dir, unit)}: not written by cni-skel")
        if present and systemd_running(systemd_dir):
            systemctl("daemon-reload")
    for name in chosen:
        removed = remove_ours(bin_dir, name)
        if removed:
            click.echo(f"removed {removed}")
        elif os.path.lexists(os.path.join(bin_dir, name)):
            click.echo(f"left {os.path.join(bin_dir, name)}: not written by cni-skel")
    state = node_state([registry[n] for n in chosen if n in registry])
    if state:
        click.echo("state left on this node (removed by the pods' DEL or a GC):")
        for line in state:
            click.echo(f"  {line}")


@click.command(epilog="\b\nExamples:\n"
               "  cni-skel doctor\n"
               "  cni-skel doctor --bin-dir /tmp/bin loopback")
@_bin_dir_option("CNI bin dir the runtime searches.")
@_systemd_dir_option("Where the worker's units are.")
@click.argument("names", nargs=-1)
def doctor(bin_dir: str, systemd_dir: str, names: tuple[str, ...]) -> None:
    """Say how this node's plugins NAMES (default: all registered) run: mode
    (warm via systemd, warm in a DaemonSet, one-shot), the launchers (kind,
    fallback, versions, socket), the worker behind the socket (version,
    uptime, protocols) and the one-shot fallbacks launchers logged; then
    what the Go plugins left in this network namespace (`gorules.node_report`:
    pods Go made, which ours CHECK and DEL as Go would). Exits 1 when
    something needs a fix (each listed with what to do)."""
    found = diagnose(bin_dir, list(names) or sorted(plugin_registry()), systemd_dir)
    for line in found.lines:
        click.echo(line)
    try:
        go_state = gorules.node_report()
    except CNIError as exc:  # no nftables or iptables here: nothing of Go's to report
        go_state = [f"(not read: {exc.msg})"]
    if go_state:
        click.echo("the Go plugins' state in this network namespace:")
        for line in go_state:
            click.echo(f"  {line}")
    if found.problems:
        click.echo("problems:")
        for problem in found.problems:
            click.echo(f"  - {problem}")
        sys.exit(1)
    click.echo("ok")


@click.command(epilog="\b\nExamples:\n"
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
              help="Idle serving processes kept ready (more are forked as calls run in "
                   "parallel; those beyond this many exit after 30 s idle).")
@click.option("--max-requests", type=click.IntRange(1), default=server.MAX_REQUESTS,
              show_default=True, metavar="N",
              help="Calls a serving process answers before a fresh one replaces it (1: a "
                   "fresh process per call).")
@click.option("--linger", type=click.FloatRange(0), default=server.LINGER, show_default=True,
              metavar="SECONDS", help="How long an idle serving process beyond --spares "
                                      "stays before it exits.")
@click.option("--max-processes", type=click.IntRange(1, server.MAX_CHILDREN), default=None,
              metavar="N", help="Serving processes the pool grows to before calls wait for a "
                                "free one [default: three per CPU, at least 6].")
@click.option("--request-timeout", type=click.FloatRange(0.1), default=30.0, show_default=True,
              metavar="SECONDS", help="Time a client has to send its whole request.")
@click.option("--run-timeout", type=click.FloatRange(1), default=600.0, show_default=True,
              metavar="SECONDS", help="Time a request may run before its process is killed "
                                      "(answered code 11).")
@click.option("--idle-exit", type=click.FloatRange(0, min_open=True), default=None,
              metavar="SECONDS", help="Exit after this long without a request (with systemd "
                                      "socket activation the next call starts it again).")
@click.option("--mount-namespace", type=click.Choice(server.MOUNT_NAMESPACES), default="caller",
              show_default=True, help="caller: enter each launcher's mount namespace (a worker "
                                      "on the host); own: stay in the worker's (a container) "
                                      "and enter pods by the netns fd launchers pass.")
@click.option("--log-file", type=click.Path(dir_okay=False), default=None,
              help="Also append the log lines (one per request) to this file.")
@click.option("--metrics-address", default=None, metavar="HOST:PORT",
              help="Serve Prometheus metrics on http://HOST:PORT/metrics (e.g. "
                   "127.0.0.1:9743).")
def worker(socket_path: str, check: bool, preload: tuple[str, ...],
           drain_timeout: float, spares: int, max_requests: int, linger: float,
           max_processes: int | None, request_timeout: float, run_timeout: float,
           idle_exit: float | None, mount_namespace: str, log_file: str | None,
           metrics_address: str | None) -> None:
    """Serve plugin calls from the installed launchers (warm worker mode).

    Imports every registered plugin (and pyroute2, pydantic) once and keeps
    a pool of forked serving processes; each serves one call at a time: it
    enters the caller's namespaces, runs the plugin as its executable would,
    then puts its own state back (or is replaced when it cannot). Only root clients holding
    CAP_NET_ADMIN and CAP_SYS_ADMIN are served, and only the registered plugins and those
    given with --preload (import path: PYTHONPATH). Without a worker the launchers run
    the plugins themselves (one-shot)."""
    if check:
        ok, text = server.check(socket_path)
        click.echo(f"{socket_path}: {'ok' if ok else 'not answering'}: {text}")
        sys.exit(0 if ok else 1)
    if metrics_address:
        try:
            parse_address(metrics_address)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--metrics-address") from None
    if os.geteuid() != 0:
        raise click.ClickException("the worker enters other namespaces: run it as root")
    refs = sorted(set(plugin_registry().values())) + list(preload)
    try:
        sys.exit(server.serve(socket_path, refs, drain_timeout=drain_timeout, spares=spares,
                              max_requests=max_requests, linger=linger,
                              max_processes=max_processes,
                              request_timeout=request_timeout, run_timeout=run_timeout,
                              idle_exit=idle_exit, mount_namespace=mount_namespace,
                              log_file=log_file, metrics_address=metrics_address))
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {socket_path} or {metrics_address}: "
                                   f"{exc}") from None


@click.command("new-plugin", epilog="\b\nExample:\n"
               "  cni-skel new-plugin mtu-setter && cd mtu-setter && sudo python -m pytest")
@click.argument("name")
@click.option("--dir", "parent", default=".", show_default=True,
              type=click.Path(file_okay=False), help="Where to create the NAME directory.")
@click.option("--force", is_flag=True, help="Write into an existing non-empty directory.")
def new_plugin(name: str, parent: str, force: bool) -> None:
    """Write a new plugin project NAME: a working chained plugin (it sets the
    MTU of the container's interface), a pyproject registering it under the
    cni_skel.plugins entry point (so `cni-skel install` finds it once it is
    pip-installed), a pytest test that runs it in throw-away network
    namespaces and passes as written (run it as root), and a README (its
    "Add a second plugin" section: one more module and entry-point line,
    reinstall, `cni-skel install NAME`)."""
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
               f"  pip install . && cni-skel install --bin-dir /opt/cni/bin {name}\n"
               "  (in a fresh venv, pip needs a cni-skel wheel or checkout too: see its README;\n"
               "  more plugins in this project: its README, \"Add a second plugin\")")

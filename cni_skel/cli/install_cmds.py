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

import click

from ..plugin_template import names_for, render
from ..warm import server
from ..warm.install import (
    DEFAULT_WORKER_SOCKET,
    LAUNCHERS,
    InstallError,
    launcher_info,
    plugin_registry,
    write_executable,
)

__all__ = ["install", "new_plugin", "worker"]


@click.command(epilog="\b\nExamples:\n"
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
        try:
            path = write_executable(bin_dir, name, registry[name], python=python, force=force,
                                    worker_socket=None if one_shot else worker_socket,
                                    launcher=launcher)
        except InstallError as exc:
            raise click.ClickException(str(exc)) from None
        info = launcher_info(path)
        click.echo(f"installed {path} ({info['kind'] + ' launcher' if info else 'one-shot'})")


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
    if check:
        ok, text = server.check(socket_path)
        click.echo(f"{socket_path}: {'ok' if ok else 'not answering'}: {text}")
        sys.exit(0 if ok else 1)
    if os.geteuid() != 0:
        raise click.ClickException("the worker enters other namespaces: run it as root")
    refs = sorted(set(plugin_registry().values())) + list(preload)
    sys.exit(server.serve(socket_path, refs, drain_timeout=drain_timeout, spares=spares,
                          request_timeout=request_timeout, run_timeout=run_timeout))


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
    pip-installed), and a pytest test that runs it in throw-away network
    namespaces and passes as written (run it as root)."""
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

"""``cni-skel``: the command line (click).

``install`` writes CNI plugin executables into a runtime's bin dir. Plugins
are found through the ``cni_skel.plugins`` entry-point group (name ->
``module:Class``), so third-party packages can register theirs the same way
ours are registered; the SDK itself imports no plugin.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile

import click

__all__ = ["main", "plugin_registry", "write_executable"]

MARKER = "written by `cni-skel install`"


def plugin_registry() -> dict[str, str]:
    """Installed plugins: executable name -> ``"module:Class"``."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group="cni_skel.plugins")}


def _script(ref: str, name: str, python: str, pythonpath: list[str] | None = None) -> str:
    from . import __version__

    prefix = f"import sys; sys.path[:0] = {pythonpath!r}; " if pythonpath else ""
    body = (f"# CNI plugin {name!r}, {MARKER} (cni-skel {__version__}).\n"
            f"{prefix}from cni_skel.skel import run_plugin_main\n"
            f"run_plugin_main({ref!r})\n")
    if any(c.isspace() for c in python) or len(python) > 120:
        # A shebang cannot carry such a path; go through sh (one extra exec).
        code = f"{prefix}from cni_skel.skel import run_plugin_main; run_plugin_main({ref!r})"
        return (f"#!/bin/sh\n# CNI plugin {name!r}, {MARKER} (cni-skel {__version__}).\n"
                f"exec {shlex.quote(python)} -I -c {shlex.quote(code)} \"$@\"\n")
    # -I (isolated): the runtime's PYTHONPATH, PYTHONHOME, user site and the
    # script's directory never reach the plugin's imports.
    return f"#!{python} -I\n{body}"


def write_executable(bin_dir: str, name: str, ref: str, *, python: str | None = None,
                     force: bool = False, pythonpath: list[str] | None = None) -> str:
    """Write ``bin_dir/name`` running plugin ``ref`` with interpreter ``python``
    (default: this one, absolute, so no venv activation is needed). Atomic
    (temp file + rename), mode 0755. ``pythonpath``: directories put first on
    sys.path (for plugins that are not installed packages, e.g. in tests).

    Raises:
        click.ClickException: when a file that is not ours is in the way and
            ``force`` is false.
    """
    python = os.path.abspath(python or sys.executable)
    target = os.path.join(bin_dir, name)
    if os.path.lexists(target) and not force:
        try:
            with open(target, "rb") as fp:
                head = fp.read(512)
        except OSError:
            head = b""
        if MARKER.encode() not in head:
            raise click.ClickException(
                f"{target} exists and was not written by cni-skel (use --force to replace it)")
    os.makedirs(bin_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=bin_dir)
    try:
        with os.fdopen(fd, "w") as fp:
            fp.write(_script(ref, name, python, pythonpath))
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cni-skel")
def main() -> None:
    """cni-skel: CNI plugins in Python, and the tools around them."""


@main.command()
@click.option("--bin-dir", required=True, type=click.Path(file_okay=False),
              help="CNI bin dir the runtime searches (e.g. /opt/cni/bin).")
@click.option("--python", "python", default=None,
              help="Interpreter for the plugins (default: the one running cni-skel).")
@click.option("--force", is_flag=True, help="Replace files not written by cni-skel.")
@click.argument("names", nargs=-1)
def install(bin_dir: str, python: str | None, force: bool, names: tuple[str, ...]) -> None:
    """Write plugin executables NAMES (default: all registered) into BIN_DIR."""
    registry = plugin_registry()
    chosen = list(names) or sorted(registry)
    unknown = [n for n in chosen if n not in registry]
    if unknown:
        raise click.ClickException(
            f"unknown plugin(s) {', '.join(unknown)}; available: {', '.join(sorted(registry))}")
    for name in chosen:
        path = write_executable(bin_dir, name, registry[name], python=python, force=force)
        click.echo(f"installed {path}")


@main.command()
def demo() -> None:
    """Run our loopback plugin on a fresh pod namespace and show the result.

    Everything happens in two namespaces made for the demo (a "node" the
    plugin runs in and a "pod" it configures), removed at the end; the
    machine's own network namespace is not touched. Needs root.
    """
    import json

    from . import netlink
    from .harness import create_netns, install_plugin, remove_netns, run_plugin
    from .netns import NetNS

    if os.geteuid() != 0:
        raise click.ClickException("the demo creates network namespaces: run it as root")
    registry = plugin_registry()
    if "loopback" not in registry:
        raise click.ClickException("the loopback plugin is not installed")
    made = []
    with tempfile.TemporaryDirectory(prefix="cni-skel-demo-") as bin_dir:
        try:
            node = create_netns("cnsk-demo-node")
            made.append(node)
            pod = create_netns("cnsk-demo-pod")
            made.append(pod)
            exe = install_plugin(bin_dir, "loopback", registry["loopback"])
            conf = {"cniVersion": "1.1.0", "name": "demo-lo", "type": "loopback"}
            click.echo(f"node netns {node.name}, pod netns {pod.path}, plugin {exe}")

            def lo_state() -> str:
                with NetNS.open(pod.path) as ns, ns.iproute() as ipr:
                    link = netlink.find_link(ipr, "lo")
                return "UP" if link and link["up"] else "DOWN"

            click.echo(f"before ADD, lo in the pod is {lo_state()}")
            result = run_plugin(exe, "ADD", conf, netns=pod.path, ifname="lo",
                                container_id="demo", node=node)
            click.echo("ADD result:")
            click.echo(json.dumps(result, indent=2))
            click.echo(f"after ADD, lo in the pod is {lo_state()} (read back through netlink)")
            run_plugin(exe, "CHECK", {**conf, "prevResult": result}, netns=pod.path,
                       ifname="lo", container_id="demo", node=node)
            click.echo("CHECK: ok")
            run_plugin(exe, "DEL", conf, netns=pod.path, ifname="lo", container_id="demo",
                       node=node)
            click.echo(f"after DEL, lo in the pod is {lo_state()}")
        finally:
            for ns in reversed(made):
                remove_netns(ns)


if __name__ == "__main__":
    main()

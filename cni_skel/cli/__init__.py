"""``cni-skel``: the command line (click), one module per job.

* `cni_skel.cli.runtime_cmds`: ``add``, ``check``, ``del``, ``gc``,
  ``status`` (cnitool's commands and environment, through
  `cni_skel.runtime`) and ``validate``;
* `cni_skel.cli.install_cmds`: ``install``/``uninstall`` (plugin
  executables into a CNI bin dir, the worker's systemd units), ``doctor``
  (how a node's plugins run), ``worker`` (warm mode) and ``new-plugin`` (a
  plugin project);
* `cni_skel.cli.migrate_cmd`: ``migrate --to-go`` (hand a node's pods back
  to the Go plugins);
* `cni_skel.cli.conformance_cmd`: ``conformance`` (`cni_skel.conformance`:
  a plugin held to the spec in throw-away namespaces);
* `cni_skel.cli.demo_cmd`: ``demo`` (`cni_skel.demo`: a pod network in
  throw-away namespaces);
* `cni_skel.cli.errors`: how failures are shown (`CNICommandError`).

`main` is the group, the ``cni-skel`` console script.
"""

from __future__ import annotations

import click

from ..runtime import describe_error
from ..warm.install import plugin_registry, write_executable
from .conformance_cmd import conformance
from .demo_cmd import demo
from .errors import CNICommandError
from .install_cmds import doctor, install, new_plugin, uninstall, worker
from .migrate_cmd import migrate
from .runtime_cmds import add, check, del_, gc, status, validate

__all__ = ["CNICommandError", "describe_error", "main", "plugin_registry", "write_executable"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog="\b\nExamples:\n"
                    "  cni-skel install                 # launchers + socket-activated worker\n"
                    "  cni-skel doctor                  # how this node's plugins run\n"
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


for _command in (install, uninstall, doctor, worker, new_plugin, add, check, del_, gc, status,
                 validate, migrate, demo, conformance):
    main.add_command(_command)

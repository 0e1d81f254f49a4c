"""``cni-skel migrate --to-go``: hand a node's running pods back to the Go
reference plugins (the way back of the README's runbook).

The pods come from libcni's result cache (what containerd and cnitool
write: network, container ID, ifname, the list config and the result of
each ADD). For each one, every plugin of its list that is one of ours gets
`cni_skel.skel.Plugin.hand_over_to_go`: it makes what the Go plugin of the
same name needs for the pod (portmap: Go's own ADD run again with the
cached result; bridge: the masquerade rules Go's ADD makes, without which
Go's DEL fails) and then removes our entries of the pod. Then each plugin's
tables left empty go (`Plugin.release_node_state`). What it cannot do is
printed as what to do.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from ..errors import CNIError
from ..gorules import GoHandOver
from ..invoke import DEFAULT_EXEC
from ..runtime import (
    DEFAULT_CACHE_DIR,
    ResultCache,
    RuntimeConf,
    derive_request_config,
    network_config_list_from_bytes,
)
from ..skel import load_config, resolve_ref
from ..warm.install import plugin_registry
from .errors import CNICommandError

__all__ = ["DEFAULT_GO_PATH", "migrate"]

#: Where Debian's containernetworking-plugins installs the Go plugins.
DEFAULT_GO_PATH = "/usr/lib/cni"

_AFTER = """\
Next, for the Go plugins to serve the node:
  1. point the runtime at them: `cni-skel uninstall` (our launchers and worker units), then put
     the Go binaries in the CNI bin dir (Debian: cp {go}/* /opt/cni/bin/, or bin_dir = "{go}");
  2. the Go plugins need iptables (iptables-nft) and find their rules by container ID: pods
     handed over keep their host ports and masquerade; Go's CHECK, DEL and ADD then work as usual;
  3. host-local's store is shared as it is (same files): nothing to do for addresses;
  4. check: `nft list tables` shows no cni_skel_bridge / cni_portmap table (once the last pod
     of ours is handed over), and each pod's host ports still answer."""


def _go_runner(go_path: str, plugin_type: str, conf: dict[str, Any], info: Any,
               timeout: float) -> Any:
    """``run_go(verb)`` for `GoHandOver`: the Go plugin ``plugin_type`` from
    ``go_path`` run with ``conf`` for ``info``'s attachment."""
    def run(verb: str) -> Any:
        path = DEFAULT_EXEC.find(plugin_type, [go_path])
        env = dict(os.environ)
        rt = RuntimeConf(info.container_id, info.netns, info.ifname, info.args or [],
                         info.capability_args)
        env.update({"CNI_CONTAINERID": rt.container_id, "CNI_NETNS": rt.netns,
                    "CNI_IFNAME": rt.ifname, "CNI_ARGS": rt.args_string(), "CNI_PATH": go_path})
        out = DEFAULT_EXEC.run(path, verb, json.dumps(conf).encode(), env, timeout=timeout)
        return json.loads(out) if out.strip() else None
    return run


@click.command(epilog="\b\nExamples:\n"
               "  cni-skel migrate --to-go --dry-run   # what it would do, changes nothing\n"
               "  cni-skel migrate --to-go             # hand every cached pod over to Go")
@click.option("--to-go", "to_go", is_flag=True, required=True,
              help="Hand the node's running pods over to the Go reference plugins.")
@click.option("--cache-dir", envvar="CNI_SKEL_CACHE_DIR", default=DEFAULT_CACHE_DIR,
              show_default=True, help="libcni's cache (containerd's: /var/lib/cni).")
@click.option("--go-path", default=DEFAULT_GO_PATH, show_default=True,
              help="Directory of the Go plugins (Debian's containernetworking-plugins).")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds for each Go plugin call.")
@click.option("--dry-run", is_flag=True, help="Only show what would be done.")
def migrate(to_go: bool, cache_dir: str, go_path: str, timeout: float, dry_run: bool) -> None:
    """Hand the pods running on this node over to the Go plugins, keeping
    their connectivity: for each attachment in libcni's cache, each of our
    plugins in its list makes what the Go plugin will need (portmap: Go's
    portmap ADD again with the cached result, so Go makes its own DNAT rules;
    bridge: Go's masquerade chain and rules, which Go's DEL needs) and then
    removes our nftables entries of the pod; our tables left empty go. Run
    it in the node's network namespace, as root, before the runtime calls
    the Go plugins. It prints what it did and what is left to do by hand.
    Exit status 1 when an attachment could not be handed over (the others
    are)."""
    registry = plugin_registry()
    try:
        infos = ResultCache(cache_dir).entries()
    except CNIError as exc:
        raise CNICommandError.of(exc, operation="reading the result cache") from None
    failed = 0
    used: set[str] = set()
    for info in infos:
        name = f"{info.network} {info.container_id}:{info.ifname}"
        try:
            netlist = network_config_list_from_bytes(info.config())
        except CNIError as exc:
            click.echo(f"{name}: cached config unreadable ({exc.msg}); hand it over by hand: "
                       "DEL it with our plugins before the switch, ADD it again after", err=True)
            failed += 1
            continue
        rt = RuntimeConf(info.container_id, info.netns, info.ifname, info.args or [],
                         info.capability_args)
        result = info.result if isinstance(info.result, dict) else None
        for plugin in netlist.plugins:
            ref = registry.get(plugin.type)
            if ref is None:
                continue
            used.add(plugin.type)
            conf = derive_request_config(netlist, plugin, "ADD", rt=rt, prev_result=result)
            handover = GoHandOver(info.container_id, info.ifname, info.netns,
                                  _go_runner(go_path, plugin.type, conf, info, timeout))
            try:
                cls = resolve_ref(ref)
                lines = cls.hand_over_to_go(load_config(cls, conf), handover, dry_run=dry_run)
            except CNIError as exc:
                failed += 1
                click.echo(f"{name}: {plugin.type}: not handed over: {exc.msg}"
                           + (f" ({exc.details})" if exc.details else ""), err=True)
                continue
            for line in lines:
                click.echo(f"{name}: {plugin.type}: {line}")
    for plugin_type in sorted(used) if not failed else []:
        for line in resolve_ref(registry[plugin_type]).release_node_state(dry_run=dry_run):
            click.echo(f"{plugin_type}: {line}")
    if not infos:
        click.echo(f"no attachment in the cache {cache_dir}: nothing to hand over")
    click.echo(_AFTER.format(go=go_path))
    if failed:
        raise CNICommandError(f"{failed} plugin(s) of cached attachments were not handed over; "
                              "see above (the others were)")

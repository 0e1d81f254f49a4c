"""CNI meta plugin ``flannel`` (flannel-io/cni-plugin, v1.9.1-flannel1).

flannel's daemon writes the node's share of the cluster network to its
subnet file; this plugin turns that and its own config into a delegate
config (bridge + host-local unless ``delegate`` says otherwise), saves it
under ``dataDir`` by container ID, and runs the delegate. DEL runs the
delegate with the saved config, so it works after the subnet file changed
or went away, and with configs saved by flannel-io's Go plugin (the same
file, the same JSON).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from cni_skel import CmdArgs, CNIError, NetConf, Plugin, Result
from cni_skel.errors import (
    ERR_INTERNAL,
    ERR_INVALID_NETWORK_CONFIG,
    ERR_IO_FAILURE,
    ERR_PLUGIN_NOT_AVAILABLE,
    ERR_TRY_AGAIN_LATER,
)
from cni_skel.invoke import (
    delegate_add,
    delegate_check,
    delegate_del,
    delegate_gc,
    delegate_status,
)
from cni_skel.rollback import rollback
from cni_skel.state import StateDir

__all__ = ["DEFAULT_DATA_DIR", "DEFAULT_SUBNET_FILE", "Flannel", "FlannelConf", "SubnetEnv",
           "delegate_config", "load_subnet_env"]

DEFAULT_SUBNET_FILE = "/run/flannel/subnet.env"
DEFAULT_DATA_DIR = "/var/lib/cni/flannel"
DIR_MODE = 0o700  # flannel-io's MkdirAll mode
FILE_MODE = 0o600

Net = ipaddress.IPv4Network | ipaddress.IPv6Network


class FlannelConf(NetConf):
    """NetConf plus ``subnetFile`` (default /run/flannel/subnet.env),
    ``dataDir`` (default /var/lib/cni/flannel), ``delegate`` (the delegate
    config's own keys; it must not set ``name`` or ``ipam``) and ``ipam``
    (a free object here: its ``type`` defaults to host-local, its ranges
    come from the subnet file, its ``routes`` get the flannel networks).
    A bad value is code 7 naming it."""

    subnet_file: str = Field(DEFAULT_SUBNET_FILE, alias="subnetFile")
    data_dir: str = Field(DEFAULT_DATA_DIR, alias="dataDir")
    delegate: dict[str, Any] | None = None
    ipam: dict[str, Any] | None = None  # type: ignore[assignment]  # flannel's is free-form


@dataclass(frozen=True)
class SubnetEnv:
    """What flannel's subnet file says: the cluster networks
    (FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK: comma-separated, duplicates
    dropped), this node's subnets (FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, host
    bits kept as written), the MTU in bytes (FLANNEL_MTU) and whether
    flannel masquerades itself (FLANNEL_IPMASQ, "true" or anything else).
    Every CIDR is kept as its network (host bits cleared, as Go's
    ``net.ParseCIDR`` answers it)."""

    networks: tuple[Net, ...]
    subnet: ipaddress.IPv4Network | None
    ipv6_networks: tuple[Net, ...]
    ipv6_subnet: ipaddress.IPv6Network | None
    mtu: int
    ipmasq: bool


def _networks(path: str, key: str, text: str) -> tuple[Net, ...]:
    out: list[Net] = []
    for cidr in text.split(","):
        net = _cidr(path, key, cidr)
        if net not in out:
            out.append(net)
    return tuple(out)


def _cidr(path: str, key: str, text: str) -> Any:
    try:
        if "/" not in text:
            raise ValueError("no prefix length")
        return ipaddress.ip_interface(text).network
    except ValueError:
        raise CNIError(ERR_INTERNAL, f"failed to load flannel 'subnet.env' file: {path}: "
                                     f'{key}: invalid CIDR address: "{text}"') from None


def load_subnet_env(path: str) -> SubnetEnv:
    """Read flannel's subnet file (``KEY=value`` lines; unknown keys and
    lines without ``=`` are ignored, as flannel-io's reader does).

    Raises:
        CNIError: 11 (try again later) when the file is missing: flannel
            has not written it yet on this node; 5 when it cannot be read;
            999 naming the key when a value is malformed or a key is
            missing (a network, a subnet, FLANNEL_MTU, FLANNEL_IPMASQ).
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as fp:
            lines = fp.read().splitlines()
    except FileNotFoundError:
        raise CNIError(ERR_TRY_AGAIN_LATER, f"failed to load flannel 'subnet.env' file: "
                       f"open {path}: no such file or directory. Check the flannel pod log "
                       f"for this node.") from None
    except OSError as exc:
        raise CNIError(ERR_IO_FAILURE, f"failed to load flannel 'subnet.env' file: {path}: "
                                       f"{exc.strerror}") from None
    values: dict[str, Any] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key in ("FLANNEL_NETWORK", "FLANNEL_IPV6_NETWORK"):
            values[key] = _networks(path, key, value)
        elif key in ("FLANNEL_SUBNET", "FLANNEL_IPV6_SUBNET"):
            values[key] = _cidr(path, key, value)
        elif key == "FLANNEL_MTU":
            if not value.isdigit() or int(value) >= 2**32:
                raise CNIError(ERR_INTERNAL, f"failed to load flannel 'subnet.env' file: "
                                             f'{path}: FLANNEL_MTU: invalid value "{value}"')
            values[key] = int(value)
        elif key == "FLANNEL_IPMASQ":
            values[key] = value == "true"
    missing = []
    if not values.get("FLANNEL_NETWORK") and not values.get("FLANNEL_IPV6_NETWORK"):
        missing += ["FLANNEL_NETWORK", "FLANNEL_IPV6_NETWORK"]
    if "FLANNEL_SUBNET" not in values and "FLANNEL_IPV6_SUBNET" not in values:
        missing += ["FLANNEL_SUBNET", "FLANNEL_IPV6_SUBNET"]
    missing += [k for k in ("FLANNEL_MTU", "FLANNEL_IPMASQ") if k not in values]
    if missing:
        raise CNIError(ERR_INTERNAL, f"failed to load flannel 'subnet.env' file: {path} is "
                                     f"missing {', '.join(missing)}")
    return SubnetEnv(values.get("FLANNEL_NETWORK", ()), values.get("FLANNEL_SUBNET"),
                     values.get("FLANNEL_IPV6_NETWORK", ()), values.get("FLANNEL_IPV6_SUBNET"),
                     values["FLANNEL_MTU"], values["FLANNEL_IPMASQ"])


def _check_delegate(delegate: dict[str, Any]) -> None:
    if "type" in delegate and not isinstance(delegate["type"], str):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       "'delegate' dictionary, if present, must have (string) 'type' field")
    for key in ("name", "ipam"):
        if key in delegate:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, f"'delegate' dictionary must not have "
                                                       f"'{key}' field, it'll be set by flannel")


def delegate_config(conf: FlannelConf, env: SubnetEnv) -> dict[str, Any]:
    """The delegate's config, as flannel-io builds it: ``delegate``'s keys;
    ``name`` the network's; ``type`` bridge unless set; ``ipMasq`` (unless
    set) the opposite of FLANNEL_IPMASQ; ``mtu`` (unless set) FLANNEL_MTU;
    ``isGateway`` true for bridge unless set; ``cniVersion`` the config's;
    ``runtimeConfig`` the config's when it has one; ``ipam`` the config's
    ``ipam`` with ``type`` host-local unless set, ``ranges`` one range set
    per node subnet (IPv4 first), ``routes`` its own then one per cluster
    network.

    Raises:
        CNIError: 7 for a ``delegate`` with a non-string ``type``, a
            ``name`` or an ``ipam``, or ``ipam.routes`` that are no routes.
    """
    delegate = dict(conf.delegate or {})
    _check_delegate(delegate)
    if "runtime_config" in conf.model_fields_set:
        delegate["runtimeConfig"] = conf.runtime_config
    delegate["name"] = conf.name
    delegate.setdefault("type", "bridge")
    delegate.setdefault("ipMasq", not env.ipmasq)
    delegate.setdefault("mtu", env.mtu)
    if delegate["type"] == "bridge":
        delegate.setdefault("isGateway", True)
    if conf.cni_version:
        delegate["cniVersion"] = conf.cni_version
    ipam = dict(conf.ipam or {})
    ipam.setdefault("type", "host-local")
    ipam["ranges"] = [[{"subnet": str(sn)}] for sn in (env.subnet, env.ipv6_subnet)
                      if sn is not None]
    routes = ipam.get("routes")
    if routes is None:
        routes = []
    if not isinstance(routes, list) or not all(isinstance(r, dict) for r in routes):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       "failed to assemble Delegate IPAM: failed to read IPAM routes: "
                       "ipam.routes must be a list of route objects")
    ipam["routes"] = [*routes, *({"dst": str(n)} for n in (*env.networks, *env.ipv6_networks))]
    delegate["ipam"] = ipam
    return delegate


def _encode(doc: dict[str, Any]) -> bytes:
    # Go's json.Marshal of a map: keys sorted, no spaces, UTF-8 as is.
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _io(what: str, exc: OSError) -> CNIError:
    return CNIError(ERR_IO_FAILURE, f"flannel: {what}: {exc.strerror or exc}")


class Flannel(Plugin):
    """flannel: ADD, DEL as flannel-io's; CHECK passes the saved delegate
    config and prevResult to the delegate (flannel-io's passes without
    looking); GC runs the delegate's GC; STATUS is the delegate's (50
    while the subnet file is missing)."""

    name = "flannel"
    config_model = FlannelConf

    def add(self, args: CmdArgs, conf: FlannelConf) -> Result:
        """Build the delegate config (`delegate_config`), save it as
        ``<dataDir>/<containerID>`` (0600, directories 0700, written
        atomically) and run the delegate's ADD with it. A failed delegate
        ADD removes the saved file (the delegate has undone its own part).

        Returns:
            The delegate's result.

        Raises:
            CNIError: `load_subnet_env`'s, `delegate_config`'s, 5 when the
                config cannot be saved, the delegate's error.
        """
        env = load_subnet_env(conf.subnet_file)
        delegate = delegate_config(conf, env)
        data = _encode(delegate)
        try:
            store = StateDir.open(conf.data_dir, DIR_MODE)
        except OSError as exc:
            raise _io(f"cannot open dataDir {conf.data_dir}", exc) from None
        with store, rollback(self.name) as undo:
            try:
                store.write(args.container_id, data, FILE_MODE)
            except OSError as exc:
                raise _io(f"cannot save the delegate config in {conf.data_dir}", exc) from None
            undo.callback(f"removing {store.join(args.container_id)}", store.unlink,
                          args.container_id)
            return delegate_add(delegate["type"], data, args)

    def delete(self, args: CmdArgs, conf: FlannelConf) -> None:
        """Run the delegate's DEL with the config saved by ADD, then remove
        it, unless CNI_NETNS is empty: the delegate could not reach the
        pod's end then, and a later DEL naming the namespace needs the
        config (flannel-io removes it). No saved config: nothing to do
        (success); one that is not JSON is left in place and DEL succeeds
        (flannel-io's behaviour).

        Raises:
            CNIError: 5 when the saved config cannot be read; the
                delegate's error (the file stays for a retry).
        """
        saved = self._saved(conf, args.container_id)
        if saved is None:
            return
        store, data = saved
        with store:
            try:
                kind = json.loads(data).get("type")
            except (ValueError, AttributeError):
                kind = None
            if not isinstance(kind, str) or not kind:
                return
            delegate_del(kind, data, args)
            if args.netns:
                store.unlink(args.container_id)

    def check(self, args: CmdArgs, conf: FlannelConf) -> None:
        """The delegate's CHECK with the saved config and this config's
        prevResult.

        Raises:
            CNIError: 7 without prevResult; 3 (unknown container) when ADD
                saved nothing for it; the delegate's error.
        """
        if conf.prev_result is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "flannel: Required prevResult missing")
        saved = self._saved(conf, args.container_id)
        if saved is None:
            raise CNIError(3, f"flannel: no delegate config saved for container "
                              f"{args.container_id} in {conf.data_dir}")
        store, data = saved
        store.close()
        delegate = json.loads(data)
        raw = json.loads(args.stdin_data)
        prev = next((v for k, v in raw.items() if k.lower() == "prevresult"), None)
        delegate["prevResult"] = prev
        delegate_check(delegate["type"], _encode(delegate), args)

    def gc(self, args: CmdArgs, conf: FlannelConf) -> None:
        """The delegate's GC, its config built from the subnet file as ADD
        would, with this config's valid attachments (host-local releases the
        addresses of the others). Saved configs stay: the DEL a runtime still
        sends for such an attachment needs its own to remove the pod's link.
        Without a subnet file there is nothing to pass GC on to: success.

        Raises:
            CNIError: the delegate's error.
        """
        try:
            env = load_subnet_env(conf.subnet_file)
        except CNIError:
            return
        delegate = delegate_config(conf, env)
        delegate["cni.dev/valid-attachments"] = [
            {"containerID": a.container_id, "ifname": a.ifname}
            for a in conf.valid_attachments or []]
        delegate_gc(delegate["type"], _encode(delegate), args)

    def status(self, args: CmdArgs, conf: FlannelConf) -> None:
        """The delegate's STATUS with the config ADD would build.

        Raises:
            CNIError: 50 (plugin not available) while the subnet file is
                missing or unreadable; the delegate's error.
        """
        try:
            env = load_subnet_env(conf.subnet_file)
        except CNIError as exc:
            raise CNIError(ERR_PLUGIN_NOT_AVAILABLE, exc.msg) from None
        delegate = delegate_config(conf, env)
        delegate_status(delegate["type"], _encode(delegate), args)

    @staticmethod
    def _saved(conf: FlannelConf, container_id: str) -> tuple[StateDir, bytes] | None:
        """(dataDir, the saved delegate config) or None when there is none."""
        try:
            store = StateDir.open(conf.data_dir)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _io(f"cannot open dataDir {conf.data_dir}", exc) from None
        try:
            return store, store.read(container_id)
        except FileNotFoundError:
            store.close()
            return None
        except OSError as exc:
            store.close()
            raise _io(f"cannot read {store.join(container_id)}", exc) from None

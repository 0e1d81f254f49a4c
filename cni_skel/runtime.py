"""The runtime side of CNI: what containerd, CRI-O and kubelet do through libcni.

Load a network configuration list from a config directory, derive each
plugin's request config, run the plugins for ADD / CHECK / DEL / GC / STATUS,
and keep the final ADD result in libcni's on-disk cache so that a node's cache
is shared with containerd and cnitool::

    from cni_skel.runtime import Runtime, RuntimeConf

    rt = Runtime(conf_dir="/etc/cni/net.d", bin_dirs=["/opt/cni/bin"])
    net = rt.load_conflist("mynet")
    result = rt.add(net, RuntimeConf("ctr1", "/run/netns/pod1", "eth0",
                                     capability_args={"portMappings": [...]}))
    rt.check(net, RuntimeConf("ctr1", "/run/netns/pod1", "eth0"))
    rt.delete(net, RuntimeConf("ctr1", "/run/netns/pod1", "eth0"))

Sources: CNI spec 1.1.0 section 1 (configuration format, ``cniVersions``,
``loadOnlyInlinedPlugins``) and section 3 (execution of network
configurations, deriving request configurations); libcni (``api.go``,
``conf.go``) for what the spec leaves open: file discovery, the cache file
format and path, CHECK below 0.4.0, the prevResult of DEL, GC of cached
attachments. Plugins run through `cni_skel.invoke.exec_plugin` (bounded time,
"text file busy" retries, stderr captured, Error objects parsed).

Where we follow the spec rather than libcni, the docstring says so. Nothing
here is imported by a plugin executable.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from .config import GCAttachment
from .env import parse_cni_args, validate_container_id, validate_ifname, validate_network_name
from .errors import (
    ERR_DECODING_FAILURE,
    ERR_INCOMPATIBLE_CNI_VERSION,
    ERR_INVALID_NETWORK_CONFIG,
    ERR_IO_FAILURE,
    CNIError,
)
from .version import ALL_VERSIONS, CURRENT_VERSION, parse_version, version_at_least

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .types import Result

__all__ = [
    "CACHE_KIND",
    "CONF_EXTENSIONS",
    "DEFAULT_BIN_DIRS",
    "DEFAULT_CACHE_DIR",
    "DEFAULT_CONF_DIR",
    "CapabilityArgs",
    "GCAttachment",
    "GCError",
    "NetworkAttachment",
    "NetworkConfigList",
    "NetworkNotFound",
    "PluginConfig",
    "PluginError",
    "Runtime",
    "RuntimeConf",
    "cnitool_container_id",
    "conf_files",
    "derive_request_config",
    "load_conflist",
    "load_file",
    "network_config_list_from_bytes",
    "plugin_config_from_bytes",
    "resolve_netns",
    "select_version",
]

#: libcni's defaults: containerd's CRI plugin reads /etc/cni/net.d, runs from
#: /opt/cni/bin and caches results under /var/lib/cni.
DEFAULT_CONF_DIR = "/etc/cni/net.d"
DEFAULT_BIN_DIRS: tuple[str, ...] = ("/opt/cni/bin",)
DEFAULT_CACHE_DIR = "/var/lib/cni"
#: File name extensions of network configuration files, as containerd's go-cni.
CONF_EXTENSIONS: tuple[str, ...] = (".conf", ".conflist", ".json")
#: ``kind`` of libcni's cache files.
CACHE_KIND = "cniCacheV1"

#: Capability arguments: capability name -> any JSON value (``portMappings``,
#: ``ips``, ``mac``, ``bandwidth``, ...; see the CNI CONVENTIONS document).
CapabilityArgs = dict[str, Any]

_BOOL_KEYS = (("disableCheck", "disable_check"), ("disableGC", "disable_gc"),
              ("loadOnlyInlinedPlugins", "load_only_inlined_plugins"))


# --------------------------------------------------------------------------
# errors


class NetworkNotFound(CNIError):
    """No configuration file in the directory defines the network (code 7).

    Attributes:
        conf_dir: the directory searched.
        name: the network name asked for.
        found: network names that were found (for the message).
    """

    def __init__(self, conf_dir: str, name: str, found: Iterable[str] = (),
                 problems: Iterable[str] = ()) -> None:
        found = sorted(set(found))
        problems = list(problems)
        if not found and not problems:
            msg = f"no net configurations found in {conf_dir}"
        else:
            msg = f'no net configuration with name "{name}" in {conf_dir}'
        parts = []
        if found:
            parts.append("networks there: " + ", ".join(found))
        if problems:
            parts.append("files skipped: " + "; ".join(problems))
        super().__init__(ERR_INVALID_NETWORK_CONFIG, msg, "; ".join(parts))
        self.conf_dir = conf_dir
        self.name = name
        self.found = found


class PluginError(CNIError):
    """One plugin of a list failed. ``code``, ``msg``, ``details`` and
    ``stderr`` are the plugin's own (its Error object); the other attributes
    say which plugin it was.

    Attributes:
        network: the network (list) name.
        command: ``ADD``, ``CHECK``, ``DEL``, ``GC`` or ``STATUS``.
        plugin_type: the failing plugin's ``type``.
        index: its 1-based position in the list; ``count``: the list's length.
        cause: the `CNIError` as raised by the execution.
    """

    def __init__(self, cause: CNIError, *, network: str, command: str, plugin_type: str,
                 index: int, count: int) -> None:
        super().__init__(cause.code, cause.msg, cause.details, stderr=cause.stderr)
        self.cause = cause
        self.network = network
        self.command = command
        self.plugin_type = plugin_type
        self.index = index
        self.count = count

    def __str__(self) -> str:
        return (f'plugin type="{self.plugin_type}" ({self.index} of {self.count}) of network '
                f'"{self.network}" failed ({self.command}): {CNIError.__str__(self)}')


class GCError(CNIError):
    """GC went on past failures (spec: best effort) and some happened.

    ``code`` is the first failure's; ``errors`` holds them all (each a
    `PluginError` or a `CNIError` about a stale attachment's DEL).
    """

    def __init__(self, network: str, errors: list[CNIError]) -> None:
        super().__init__(errors[0].code, f'GC of network "{network}": {len(errors)} error(s)',
                         "; ".join(str(e) for e in errors))
        self.network = network
        self.errors = errors


# --------------------------------------------------------------------------
# configuration objects


@dataclass
class PluginConfig:
    """One plugin configuration object of a list (libcni ``PluginConfig``).

    Attributes:
        conf: the decoded JSON object as written (plugin-specific keys kept
            untouched).
        source: the file it came from (None when built in memory).
    """

    conf: dict[str, Any]
    source: str | None = None

    @property
    def type(self) -> str:
        """The ``type``: the plugin executable's name."""
        return self.conf.get("type", "")

    @property
    def capabilities(self) -> list[str]:
        """Capabilities the plugin declares ``true``, in config order."""
        caps = self.conf.get("capabilities") or {}
        return [name for name, on in caps.items() if on is True]


@dataclass
class NetworkConfigList:
    """A network configuration list (libcni ``NetworkConfigList``).

    Attributes:
        name: network name (the spec's name rule holds).
        cni_version: the protocol version selected for the list, see
            `select_version`; every plugin gets it as ``cniVersion``.
        plugins: the plugin objects, inlined first, then those loaded from
            ``<confdir>/<name>/*.conf`` unless ``load_only_inlined_plugins``.
        disable_check, disable_gc, load_only_inlined_plugins: the list's flags.
        cni_versions: ``cniVersions`` as declared (empty when absent).
        declared_version: ``cniVersion`` as declared ("" when absent).
        raw: the bytes of the list as loaded: what the result cache stores as
            ``config`` (for a single-plugin ``.conf``, the list it became).
        source: the file it came from (None when built from bytes).
    """

    name: str
    cni_version: str
    plugins: list[PluginConfig] = field(default_factory=list)
    disable_check: bool = False
    disable_gc: bool = False
    load_only_inlined_plugins: bool = False
    cni_versions: tuple[str, ...] = ()
    declared_version: str = ""
    raw: bytes = b""
    source: str | None = None

    def with_version(self, version: str) -> NetworkConfigList:
        """A copy with ``cni_version`` set to ``version`` (a spec version)."""
        parse_version(version)
        return dataclasses.replace(self, cni_version=version)

    @property
    def capabilities(self) -> list[str]:
        """Every capability some plugin of the list declares, sorted."""
        return sorted({c for p in self.plugins for c in p.capabilities})

    @property
    def candidate_versions(self) -> list[str]:
        """The versions the list declares (``cniVersions`` and ``cniVersion``)
        that this runtime knows, at most 1.1.0, highest first."""
        declared = list(self.cni_versions)
        if self.declared_version or not declared:
            declared.append(self.declared_version or "0.1.0")
        return sorted({v for v in declared if v in ALL_VERSIONS}, key=parse_version,
                      reverse=True)


@dataclass
class RuntimeConf:
    """The per-attachment parameters (libcni ``RuntimeConf``).

    Attributes:
        container_id: CNI_CONTAINERID (spec rule: alphanumeric first, then
            ``[a-zA-Z0-9_.-]``).
        netns: CNI_NETNS, a namespace path ("" when gone, for DEL).
        ifname: CNI_IFNAME (default ``eth0``).
        args: CNI_ARGS as ``(key, value)`` pairs; a ``"K=V;K2=V2"`` string is
            accepted and split.
        capability_args: `CapabilityArgs`; each plugin gets, in
            ``runtimeConfig``, those it declares in ``capabilities``.
    """

    container_id: str
    netns: str = ""
    ifname: str = "eth0"
    args: list[tuple[str, str]] | str = field(default_factory=list)
    capability_args: CapabilityArgs = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.args, str):
            self.args = parse_cni_args(self.args)
        else:
            self.args = [(str(k), str(v)) for k, v in self.args]
        if self.capability_args is None:
            self.capability_args = {}
        if not isinstance(self.capability_args, dict):
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "capability args must be a JSON object",
                           f"got {type(self.capability_args).__name__}")

    @property
    def cni_args(self) -> str:
        """``args`` as the CNI_ARGS string ``K1=V1;K2=V2``."""
        return ";".join(f"{k}={v}" for k, v in self.args)


@dataclass
class NetworkAttachment:
    """A cached attachment, as read back from the result cache (libcni
    ``NetworkAttachment``). ``config`` is the list config cached at ADD."""

    container_id: str
    network: str
    ifname: str
    config: bytes = b""
    netns: str = ""
    cni_args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: CapabilityArgs = field(default_factory=dict)
    path: str = ""


# --------------------------------------------------------------------------
# parsing and validation


def _err(code: int, source: str | None, msg: str, details: str = "") -> CNIError:
    where = f"{source}: " if source else ""
    return CNIError(code, f"{where}{msg}", details)


def _decode_object(data: bytes | str, source: str | None, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _err(ERR_DECODING_FAILURE, source, f"error parsing {what}: {exc}") from None
    if not isinstance(obj, dict):
        raise _err(ERR_DECODING_FAILURE, source,
                   f"error parsing {what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _check_plugin_object(obj: Any, source: str | None, where: str) -> PluginConfig:
    if not isinstance(obj, dict):
        raise _err(ERR_INVALID_NETWORK_CONFIG, source,
                   f"{where}: a plugin configuration must be a JSON object",
                   f"got {type(obj).__name__}")
    ptype = obj.get("type")
    if not isinstance(ptype, str) or not ptype:
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, f"{where}: missing 'type'",
                   "every plugin object names its executable in 'type'")
    if "/" in ptype or "\\" in ptype or ptype in (".", ".."):
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, f"{where}: invalid plugin type {ptype!r}",
                   "a plugin type is a file name without path separators")
    caps = obj.get("capabilities")
    if caps is not None and (not isinstance(caps, dict)
                             or not all(isinstance(v, bool) for v in caps.values())):
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, f"{where}: invalid 'capabilities'",
                   f"expected an object of capability name -> true/false, got {caps!r}")
    return PluginConfig(obj, source)


def plugin_config_from_bytes(data: bytes | str, *, source: str | None = None) -> PluginConfig:
    """Parse one plugin configuration object (libcni
    ``NetworkPluginConfFromBytes``).

    Raises:
        CNIError: code 6 for bad JSON; code 7 for a missing or invalid
            ``type`` (empty, or with a path separator) or malformed
            ``capabilities``.
    """
    return _check_plugin_object(_decode_object(data, source, "plugin configuration"), source,
                                "plugin")


def _read_bool(obj: dict[str, Any], key: str, source: str | None) -> bool:
    # libcni accepts true/false and the strings "true"/"false" in any case.
    value = obj.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _err(ERR_INVALID_NETWORK_CONFIG, source, f"invalid value {value!r} for {key}",
               "expected true or false")


def select_version(cni_version: str = "", cni_versions: Iterable[str] | None = None) -> str:
    """The protocol version a runtime uses for a list.

    Spec 1.1.0: with ``cniVersions``, the highest listed version the runtime
    supports (``cniVersion`` counts as one more entry); versions newer than
    1.1.0 are skipped, as libcni does. Without it, ``cniVersion``
    (``"0.1.0"`` when absent, as the spec's version rule says).

    Raises:
        CNIError: code 6 for a malformed version string; code 1 when no
            declared version is one this runtime speaks (`ALL_VERSIONS`).
    """
    versions = list(cni_versions or [])
    for v in [*versions, cni_version] if cni_version else versions:
        if not isinstance(v, str):
            raise CNIError(ERR_DECODING_FAILURE, f"invalid cniVersion entry {v!r}",
                           "versions are strings like \"1.1.0\"")
        parse_version(v)
    if not versions:
        chosen = cni_version or "0.1.0"
        if chosen not in ALL_VERSIONS:
            newer = parse_version(chosen) > parse_version(CURRENT_VERSION)
            raise CNIError(ERR_INCOMPATIBLE_CNI_VERSION, "incompatible CNI versions",
                           f'cniVersion "{chosen}" is '
                           + (f"newer than this runtime supports ({CURRENT_VERSION})" if newer
                              else "not a CNI spec version")
                           + f"; supported: {', '.join(ALL_VERSIONS)}")
        return chosen
    pool = [*versions, cni_version] if cni_version else versions
    known = [v for v in pool if v in ALL_VERSIONS]
    if not known:
        raise CNIError(ERR_INCOMPATIBLE_CNI_VERSION, "incompatible CNI versions",
                       f"none of the declared versions {pool} is supported by this runtime "
                       f"(it speaks {', '.join(ALL_VERSIONS)})")
    return max(known, key=parse_version)


def network_config_list_from_bytes(data: bytes | str, *,
                                   source: str | None = None) -> NetworkConfigList:
    """Parse a network configuration list (libcni ``NetworkConfFromBytes``).

    Only the inlined ``plugins`` are read here; `load_file` adds those from
    ``<confdir>/<name>/``. A list without ``plugins`` is accepted here (its
    plugins may all come from that directory).

    Raises:
        CNIError: code 6 for bad JSON or a malformed version string; code 7
            for a missing or invalid name (spec name rule), a non-boolean
            flag, ``loadOnlyInlinedPlugins`` without ``plugins``, an empty
            or malformed ``plugins``, a plugin without a valid ``type``;
            code 1 when no declared version is supported (`select_version`).
    """
    raw = data.encode() if isinstance(data, str) else bytes(data)
    obj = _decode_object(raw, source, "configuration list")
    name = obj.get("name")
    if name is None:
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, "missing network name",
                   "a network configuration needs a 'name'")
    if not isinstance(name, str):
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, f"invalid network name {name!r}",
                   "the name must be a string")
    try:
        validate_network_name(name)
    except CNIError as exc:
        raise _err(exc.code, source, exc.msg, exc.details or name) from None
    declared = obj.get("cniVersion", "")
    if declared is None:
        declared = ""
    if not isinstance(declared, str):
        raise _err(ERR_DECODING_FAILURE, source, f"invalid cniVersion {declared!r}",
                   "cniVersion must be a string")
    versions = obj.get("cniVersions")
    if versions is not None and (not isinstance(versions, list)
                                 or not all(isinstance(v, str) for v in versions)):
        raise _err(ERR_DECODING_FAILURE, source, f"invalid cniVersions {versions!r}",
                   "cniVersions must be a list of version strings")
    try:
        chosen = select_version(declared, versions)
    except CNIError as exc:
        raise _err(exc.code, source, exc.msg, exc.details) from None
    flags = {attr: _read_bool(obj, key, source) for key, attr in _BOOL_KEYS}
    netlist = NetworkConfigList(name=name, cni_version=chosen, raw=raw, source=source,
                                cni_versions=tuple(versions or ()), declared_version=declared,
                                **flags)
    if "plugins" not in obj:
        if netlist.load_only_inlined_plugins:
            raise _err(ERR_INVALID_NETWORK_CONFIG, source,
                       "loadOnlyInlinedPlugins is true and there is no 'plugins' key")
        return netlist
    plugins = obj["plugins"]
    if not isinstance(plugins, list):
        raise _err(ERR_INVALID_NETWORK_CONFIG, source,
                   f"invalid 'plugins': expected a list, got {type(plugins).__name__}")
    if not plugins:
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, "no plugins in list")
    netlist.plugins = [_check_plugin_object(p, source, f"plugin {i + 1}")
                       for i, p in enumerate(plugins)]
    return netlist


def _conf_to_list(plugin: PluginConfig, source: str | None) -> NetworkConfigList:
    # libcni ConfListFromConf: a list of one, named and versioned as the
    # plugin object; its bytes are the list it became (Go map order: sorted).
    conf = plugin.conf
    if "name" not in conf:
        raise _err(ERR_INVALID_NETWORK_CONFIG, source, "missing network name",
                   "a single-plugin configuration needs a 'name'")
    doc = {"cniVersion": conf.get("cniVersion", ""), "name": conf["name"], "plugins": [conf]}
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    netlist = network_config_list_from_bytes(raw, source=source)
    netlist.raw = raw
    return netlist


def conf_files(conf_dir: str, extensions: Iterable[str] = CONF_EXTENSIONS) -> list[str]:
    """Configuration files of ``conf_dir`` with one of ``extensions``, in
    lexical order of their names (directories skipped). A missing directory
    has none.

    Raises:
        CNIError: code 5 when the directory cannot be read.
    """
    exts = tuple(extensions)
    try:
        names = os.listdir(conf_dir)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CNIError(ERR_IO_FAILURE, f"cannot read config directory {conf_dir}: "
                       f"{exc.strerror}") from None
    out = []
    for name in sorted(names):
        path = os.path.join(conf_dir, name)
        if os.path.splitext(name)[1] in exts and not os.path.isdir(path):
            out.append(path)
    return out


def _dir_plugins(conf_dir: str, name: str) -> list[PluginConfig]:
    plugins = []
    for path in conf_files(os.path.join(conf_dir, name), (".conf",)):
        plugins.append(plugin_config_from_bytes(_read(path), source=path))
    return plugins


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fp:
            return fp.read()
    except OSError as exc:
        raise CNIError(ERR_IO_FAILURE, f"error reading {path}: {exc.strerror}") from None


def load_file(path: str) -> NetworkConfigList:
    """Load one configuration file as a list.

    ``.conflist``, and ``.conf``/``.json`` holding a ``plugins`` key, are
    lists; any other ``.conf``/``.json`` is a single plugin object (the
    pre-1.0 form) and becomes a list of one, named and versioned by it (libcni
    ``ConfListFromConf``). For a list file, unless ``loadOnlyInlinedPlugins``
    is true, the plugin objects of ``<dir>/<name>/*.conf`` (lexical order) are
    appended (spec 1.1.0).

    Raises:
        CNIError: code 5 when unreadable; otherwise as
            `network_config_list_from_bytes`, plus code 7 when the list ends
            up with no plugin at all.
    """
    data = _read(path)
    obj = _decode_object(data, path, "configuration")
    if path.endswith(".conflist") or "plugins" in obj:
        netlist = network_config_list_from_bytes(data, source=path)
        if not netlist.load_only_inlined_plugins:
            netlist.plugins.extend(_dir_plugins(os.path.dirname(path), netlist.name))
    else:
        netlist = _conf_to_list(_check_plugin_object(obj, path, "plugin"), path)
    if not netlist.plugins:
        raise _err(ERR_INVALID_NETWORK_CONFIG, path, f'no plugin configs found for network '
                   f'"{netlist.name}"', "give 'plugins' or put plugin objects in "
                   f"{os.path.join(os.path.dirname(path), netlist.name)}/*.conf")
    return netlist


def load_conflist(conf_dir: str, name: str) -> NetworkConfigList:
    """The network ``name`` from ``conf_dir``: the first file, in lexical
    order over ``.conf``, ``.conflist`` and ``.json``, that defines it (see
    `load_file` for the formats). This is containerd's order (go-cni);
    libcni's own ``LoadConfList`` tries every ``.conflist`` before the rest,
    which differs only when two files define the same network.

    Files that cannot be parsed are skipped while searching (libcni stops at
    the first broken ``.conflist``); if the network is not found, the error
    names them with their problem.

    Raises:
        NetworkNotFound: code 7, no file defines ``name``.
        CNIError: the matching file's own problem (see `load_file`).
    """
    found: list[str] = []
    problems: list[str] = []
    for path in conf_files(conf_dir):
        try:
            netlist = load_file(path)
        except CNIError as exc:
            # The file may still be the one asked for: report its problem
            # rather than "not found" when its name matches.
            if _declared_name(path) == name:
                raise
            problems.append(f"{os.path.basename(path)}: {exc}")
            continue
        if netlist.name == name:
            return netlist
        found.append(netlist.name)
    raise NetworkNotFound(conf_dir, name, found, problems)


def _declared_name(path: str) -> Any:
    try:
        with open(path, "rb") as fp:
            obj = json.load(fp)
        return obj.get("name") if isinstance(obj, dict) else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None


# --------------------------------------------------------------------------
# request configs


def derive_request_config(netlist: NetworkConfigList, plugin: PluginConfig, command: str, *,
                          rt: RuntimeConf | None = None, prev_result: Any = None,
                          valid_attachments: Iterable[GCAttachment] | None = None
                          ) -> dict[str, Any]:
    """The config a plugin gets on stdin for ``command`` (spec 1.1.0 section 3,
    "Deriving request configuration from plugin configuration").

    The plugin object, plugin-specific keys untouched, with ``cniVersion`` and
    ``name`` from the list. For ADD/CHECK/DEL also: ``runtimeConfig`` = the
    entries of ``rt.capability_args`` whose capability the plugin declares
    ``true`` (left as written when none applies, as libcni), ``prevResult``
    when given (a `cni_skel.types.Result`, written in the list's version, or a
    dict passed as is), and ``capabilities`` removed (the spec says "must not
    be set"; libcni leaves it). For GC: ``cni.dev/valid-attachments`` (and
    libcni's ``cni.dev/attachments``) when ``valid_attachments`` is not None.
    Keys starting with ``cni.dev/`` written in the file are never passed on.

    Raises:
        CNIError: code 1 when ``prev_result`` cannot be expressed in the
            list's version.
    """
    conf: dict[str, Any] = {"cniVersion": netlist.cni_version, "name": netlist.name}
    attachment = command in ("ADD", "CHECK", "DEL")
    for key, value in plugin.conf.items():
        if key in conf or key.startswith("cni.dev/"):
            continue
        if attachment and key == "capabilities":
            continue
        conf[key] = copy.deepcopy(value)
    if attachment:
        caps = rt.capability_args if rt is not None else {}
        runtime_config = {c: copy.deepcopy(caps[c]) for c in plugin.capabilities if c in caps}
        if runtime_config:
            conf["runtimeConfig"] = runtime_config
        if prev_result is not None:
            if isinstance(prev_result, dict):
                conf["prevResult"] = prev_result
            else:
                conf["prevResult"] = prev_result.to_version(netlist.cni_version)
    if command == "GC" and valid_attachments is not None:
        listed = [a.to_dict() for a in valid_attachments]
        conf["cni.dev/valid-attachments"] = listed
        conf["cni.dev/attachments"] = copy.deepcopy(listed)  # libcni sends both
    return conf


# --------------------------------------------------------------------------
# cnitool conventions


def resolve_netns(netns: str) -> str:
    """The absolute netns path cnitool would use for ``netns`` (Go
    ``filepath.Abs``: made absolute and cleaned, symlinks kept). As a
    convenience, a bare name that is not a file here but is one under
    /run/netns (``ip netns add NAME``) means that namespace."""
    if netns and "/" not in netns and not os.path.exists(netns) \
            and os.path.exists(os.path.join("/run/netns", netns)):
        netns = os.path.join("/run/netns", netns)
    return os.path.abspath(netns) if netns else ""


def cnitool_container_id(netns_path: str) -> str:
    """The container ID cnitool derives from a netns path: ``cnitool-`` and
    the hex of the first 10 bytes of the SHA-512 of the absolute path, so
    that our CLI and cnitool name the same attachment (and share its cache
    entry)."""
    import hashlib

    return "cnitool-" + hashlib.sha512(netns_path.encode()).digest()[:10].hex()


# --------------------------------------------------------------------------
# the runtime


class Runtime:
    """Runs network configuration lists like libcni's ``CNIConfig``.

    Args:
        conf_dir: where `load_conflist` looks (libcni: /etc/cni/net.d).
        bin_dirs: plugin directories (CNI_PATH), a list or a ``:``-joined
            string (default /opt/cni/bin).
        cache_dir: result cache root (libcni: /var/lib/cni); files go to
            ``<cache_dir>/results/<network>-<containerID>-<ifname>``.
        timeout: seconds each plugin execution may take before it is killed
            (code 11); default `cni_skel.invoke.DEFAULT_TIMEOUT` (120).
        plugin_netns: a network namespace (path, or a name under /run/netns)
            to run the plugins in, standing in for the node's; the calling
            thread enters it around each execution, so the plugin process
            starts there. Default: where the caller is.
        env: base environment of the plugins (default os.environ at each
            call); the CNI_* variables are set over it.
        stderr: where the plugins' stderr is copied (default sys.stderr);
            it is also attached to errors as ``.stderr``.
        preflight: before ADD/CHECK, ask each plugin VERSION and refuse
            (code 1) a list version some plugin does not support (`validate`).
        log: called with one line per plugin execution (for ``--verbose``).
    """

    def __init__(self, conf_dir: str = DEFAULT_CONF_DIR,
                 bin_dirs: Iterable[str] | str | None = None,
                 cache_dir: str = DEFAULT_CACHE_DIR, *, timeout: float | None = None,
                 plugin_netns: str | None = None, env: Mapping[str, str] | None = None,
                 stderr: IO[str] | None = None, preflight: bool = False,
                 log: Callable[[str], None] | None = None) -> None:
        if bin_dirs is None:
            bin_dirs = DEFAULT_BIN_DIRS
        if isinstance(bin_dirs, str):
            bin_dirs = bin_dirs.split(":")
        self.conf_dir = conf_dir
        self.bin_dirs = [os.fspath(d) for d in bin_dirs if d]
        self.cache_dir = cache_dir
        self.timeout = timeout
        if plugin_netns and "/" not in plugin_netns:
            plugin_netns = os.path.join("/run/netns", plugin_netns)
        self.plugin_netns = plugin_netns or None
        self.env = env
        self.stderr = stderr
        self.preflight = preflight
        self.log = log
        self._validated: set[tuple[str, str, tuple[str, ...]]] = set()

    def __repr__(self) -> str:
        return (f"Runtime(conf_dir={self.conf_dir!r}, bin_dirs={self.bin_dirs!r}, "
                f"cache_dir={self.cache_dir!r})")

    # -- configuration -----------------------------------------------------

    def load_conflist(self, name: str) -> NetworkConfigList:
        """`load_conflist` in this runtime's ``conf_dir``."""
        return load_conflist(self.conf_dir, name)

    def networks(self) -> list[tuple[str, NetworkConfigList | CNIError]]:
        """Every configuration file of ``conf_dir`` in lexical order, with the
        list it defines or the error loading it."""
        out: list[tuple[str, NetworkConfigList | CNIError]] = []
        for path in conf_files(self.conf_dir):
            try:
                out.append((path, load_file(path)))
            except CNIError as exc:
                out.append((path, exc))
        return out

    # -- plugins -----------------------------------------------------------

    def find_plugin(self, plugin_type: str) -> str:
        """Absolute path of ``plugin_type`` in ``bin_dirs``
        (`cni_skel.invoke.find_plugin`: code 7 when absent, code 4 when
        ``bin_dirs`` is empty)."""
        from .invoke import find_plugin

        return find_plugin(plugin_type, self.bin_dirs)

    def get_version_info(self, plugin_type: str) -> dict[str, Any]:
        """The plugin's VERSION answer ``{"cniVersion", "supportedVersions"}``.

        Raises:
            CNIError: code 7 when not found; the plugin's error; code 6 when
                the answer is not a VersionResult.
        """
        from .invoke import get_version_info

        path = self.find_plugin(plugin_type)
        with self._in_plugin_netns():
            return get_version_info(path, env=self._env("VERSION", None), timeout=self.timeout)

    def validate(self, netlist: NetworkConfigList) -> list[str]:
        """Pre-flight (libcni ``ValidateNetworkList``): every plugin exists
        and lists ``netlist.cni_version`` in its VERSION answer. Returns the
        capabilities the list declares.

        Raises:
            CNIError: with every problem in ``details``; code 1 when only
                versions are the problem, else the first problem's code.
        """
        problems: list[CNIError] = []
        for plugin_type in dict.fromkeys(p.type for p in netlist.plugins):
            try:
                info = self.get_version_info(plugin_type)
            except CNIError as exc:
                problems.append(CNIError(exc.code, f'plugin "{plugin_type}": {exc}'))
                continue
            supported = info.get("supportedVersions") or []
            if netlist.cni_version not in supported:
                problems.append(CNIError(
                    ERR_INCOMPATIBLE_CNI_VERSION,
                    f'plugin "{plugin_type}" does not support config version '
                    f'"{netlist.cni_version}" (it supports {", ".join(supported)})'))
        if problems:
            raise CNIError(problems[0].code,
                           f'network "{netlist.name}" cannot run with these plugins',
                           "; ".join(e.msg for e in problems))
        return netlist.capabilities

    def negotiate_version(self, netlist: NetworkConfigList,
                          candidates: Iterable[str] | None = None) -> NetworkConfigList:
        """A copy of ``netlist`` set to the highest version in ``candidates``
        (default: the versions the list declares, `candidate_versions`) that
        every plugin of the list lists in its VERSION answer.

        Raises:
            CNIError: code 1 when there is none; as `get_version_info`.
        """
        pool = list(candidates) if candidates is not None else netlist.candidate_versions
        common = [v for v in pool if v in ALL_VERSIONS]
        for plugin_type in dict.fromkeys(p.type for p in netlist.plugins):
            supported = set(self.get_version_info(plugin_type).get("supportedVersions") or [])
            common = [v for v in common if v in supported]
        if not common:
            raise CNIError(ERR_INCOMPATIBLE_CNI_VERSION, "incompatible CNI versions",
                           f'no version among {pool} is supported by every plugin of network '
                           f'"{netlist.name}"')
        return netlist.with_version(max(common, key=parse_version))

    # -- cache ---------------------------------------------------------------

    def cache_path(self, network: str, rt: RuntimeConf) -> str:
        """``<cache_dir>/results/<network>-<containerID>-<ifname>`` (libcni).

        Raises:
            CNIError: code 4 when the container ID or ifname breaks its rule
                (they become part of a file name), 7 for the network name.
        """
        validate_network_name(network)
        validate_container_id(rt.container_id)
        validate_ifname(rt.ifname)
        return os.path.join(self.cache_dir, "results",
                            f"{network}-{rt.container_id}-{rt.ifname}")

    def _cache_add(self, result: Result, netlist: NetworkConfigList, rt: RuntimeConf) -> None:
        from .state import atomic_write

        # Keys and order of libcni's cachedInfo; omitempty ones left out when empty.
        doc: dict[str, Any] = {
            "kind": CACHE_KIND,
            "containerId": rt.container_id,
            "config": base64.b64encode(netlist.raw).decode("ascii"),
            "ifName": rt.ifname,
            "networkName": netlist.name,
        }
        if rt.netns:
            doc["netns"] = rt.netns
        if rt.args:
            doc["cniArgs"] = [[k, v] for k, v in rt.args]
        if rt.capability_args:
            doc["capabilityArgs"] = rt.capability_args
        doc["result"] = result.to_version(netlist.cni_version)
        path = self.cache_path(netlist.name, rt)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        data = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
        try:
            atomic_write(path, data, 0o600)
        except OSError as exc:
            raise CNIError(ERR_IO_FAILURE, f'failed to set network "{netlist.name}" cached '
                           f"result: {exc.strerror}", path) from None

    def _cache_del(self, network: str, rt: RuntimeConf) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.cache_path(network, rt))

    def _read_cache(self, network: str, rt: RuntimeConf) -> tuple[dict | None, bytes] | None:
        path = self.cache_path(network, rt)
        try:
            with open(path, "rb") as fp:
                data = fp.read()
        except OSError:
            return None  # libcni: a missing or unreadable cache is no cache
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            doc = None
        if not isinstance(doc, dict) or doc.get("kind") != CACHE_KIND:
            return None, data
        return doc, data

    def get_cached_result(self, netlist: NetworkConfigList, rt: RuntimeConf) -> Result | None:
        """The final ADD result cached for this attachment, converted to the
        list's version (libcni ``GetNetworkListCachedResult``); None when there
        is none. A pre-cniCacheV1 file holding a bare result is read too.

        Raises:
            CNIError: code 6 when the cached result cannot be decoded; code 1
                when it cannot be expressed in the list's version.
        """
        from .types import parse_result

        cached = self._read_cache(netlist.name, rt)
        if cached is None:
            return None
        doc, data = cached
        raw_result: Any = data if doc is None else doc.get("result")
        if raw_result is None:
            return None
        try:
            result = parse_result(raw_result, netlist.cni_version)
            result.to_version(netlist.cni_version)
        except CNIError as exc:
            raise CNIError(exc.code, f'failed to get network "{netlist.name}" cached result: '
                           f"{exc.msg}", exc.details) from None
        result.cni_version = netlist.cni_version
        return result

    def get_cached_config(self, netlist: NetworkConfigList,
                          rt: RuntimeConf) -> tuple[bytes, RuntimeConf] | None:
        """The list config cached at ADD and ``rt`` with the cached CNI_ARGS
        and capability args (libcni ``GetNetworkListCachedConfig``); None when
        nothing is cached.

        Raises:
            CNIError: code 6 when the cache file is not libcni's format.
        """
        cached = self._read_cache(netlist.name, rt)
        if cached is None:
            return None
        doc, _ = cached
        if doc is None:
            raise CNIError(ERR_DECODING_FAILURE, f'cached network "{netlist.name}" config has '
                           f"the wrong kind (not {CACHE_KIND})")
        new_rt = dataclasses.replace(rt)
        if doc.get("cniArgs") is not None:
            new_rt.args = [(str(k), str(v)) for k, v in doc["cniArgs"]]
        new_rt.capability_args = dict(doc.get("capabilityArgs") or {})
        return _b64(doc.get("config")), new_rt

    def get_cached_attachments(self, container_id: str = "") -> list[NetworkAttachment]:
        """Every attachment in the cache, sorted by file name; only those of
        ``container_id`` when given (libcni ``GetCachedAttachments``). Files
        that are not cniCacheV1, or lack a network or ifname, are skipped."""
        results = os.path.join(self.cache_dir, "results")
        try:
            names = sorted(os.listdir(results))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CNIError(ERR_IO_FAILURE, f"cannot read cache directory {results}: "
                           f"{exc.strerror}") from None
        out = []
        for name in names:
            path = os.path.join(results, name)
            try:
                with open(path, "rb") as fp:
                    doc = json.load(fp)
            except (OSError, ValueError, UnicodeDecodeError):
                continue
            if not isinstance(doc, dict) or doc.get("kind") != CACHE_KIND:
                continue
            if container_id and doc.get("containerId") != container_id:
                continue
            if not doc.get("ifName") or not doc.get("networkName"):
                continue
            try:
                config = _b64(doc.get("config"))
            except CNIError:
                config = b""
            out.append(NetworkAttachment(
                container_id=str(doc.get("containerId", "")), network=str(doc["networkName"]),
                ifname=str(doc["ifName"]), config=config, netns=str(doc.get("netns") or ""),
                cni_args=[(str(k), str(v)) for k, v in doc.get("cniArgs") or []],
                capability_args=dict(doc.get("capabilityArgs") or {}), path=path))
        return out

    # -- execution -----------------------------------------------------------

    @contextlib.contextmanager
    def _in_plugin_netns(self) -> Iterator[None]:
        if not self.plugin_netns:
            yield
            return
        from .netns import NetNS

        with NetNS.open(self.plugin_netns) as ns, ns.enter():
            yield

    def _env(self, command: str, rt: RuntimeConf | None) -> dict[str, str]:
        env = dict(os.environ if self.env is None else self.env)
        env.update({
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": rt.container_id if rt else "",
            "CNI_NETNS": rt.netns if rt else "",
            "CNI_ARGS": rt.cni_args if rt else "",
            "CNI_IFNAME": rt.ifname if rt else "",
            "CNI_PATH": ":".join(self.bin_dirs),
        })
        return env

    def _run(self, netlist: NetworkConfigList, index: int, command: str,
             conf: dict[str, Any], rt: RuntimeConf | None) -> bytes:
        from .invoke import exec_plugin

        plugin = netlist.plugins[index]
        started = time.monotonic()
        stdin = json.dumps(conf).encode()
        env = self._env(command, rt)
        try:
            path = self.find_plugin(plugin.type)
        except CNIError as exc:
            raise self._failed(exc, netlist, index, command, rt, started) from None
        # Entering the node netns is the runtime's part, not the plugin's: its
        # failure is not reported as the plugin's.
        with self._in_plugin_netns():
            try:
                out = exec_plugin(path, command, stdin, env, timeout=self.timeout,
                                  stderr=self.stderr)
            except CNIError as exc:
                raise self._failed(exc, netlist, index, command, rt, started) from None
        self._log(command, netlist, index, rt, started, "ok")
        return out

    def _failed(self, exc: CNIError, netlist: NetworkConfigList, index: int, command: str,
                rt: RuntimeConf | None, started: float) -> PluginError:
        self._log(command, netlist, index, rt, started, f"failed: code {exc.code}")
        return PluginError(exc, network=netlist.name, command=command,
                           plugin_type=netlist.plugins[index].type, index=index + 1,
                           count=len(netlist.plugins))

    def _log(self, command: str, netlist: NetworkConfigList, index: int, rt: RuntimeConf | None,
             started: float, outcome: str) -> None:
        if self.log is None:
            return
        who = f" {rt.container_id} {rt.ifname}" if rt is not None else ""
        self.log(f"{command} {netlist.name}{who}: plugin {index + 1}/{len(netlist.plugins)} "
                 f"{netlist.plugins[index].type} {outcome} "
                 f"({(time.monotonic() - started) * 1000:.0f} ms)")

    def _check_attachment(self, netlist: NetworkConfigList, rt: RuntimeConf) -> None:
        validate_container_id(rt.container_id)
        validate_network_name(netlist.name)
        validate_ifname(rt.ifname)
        if not netlist.plugins:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f'network "{netlist.name}" has no plugins')

    def _preflight(self, netlist: NetworkConfigList) -> None:
        if not self.preflight:
            return
        key = (netlist.name, netlist.cni_version, tuple(p.type for p in netlist.plugins))
        if key not in self._validated:
            self.validate(netlist)
            self._validated.add(key)

    def add(self, netlist: NetworkConfigList, rt: RuntimeConf) -> Result:
        """ADD the attachment: each plugin in order, each given the previous
        one's result as ``prevResult`` (none for the first); the last result
        is cached (libcni ``AddNetworkList``) and returned, in the current
        model with ``cni_version`` = the list's version.

        A failed ADD is not undone here (as libcni): the caller must still
        DEL the attachment (spec: "A delete must still be executed even if
        the add fails").

        Raises:
            PluginError: a plugin's error (its code, msg, details) naming the
                plugin; code 6 when it printed no or an undecodable result.
            CNIError: code 4 (container ID, ifname), 7 (network name),
                1 (pre-flight), 5 (cache not writable).
        """
        from .types import parse_result

        self._check_attachment(netlist, rt)
        self._preflight(netlist)
        result = None
        for i, plugin in enumerate(netlist.plugins):
            conf = derive_request_config(netlist, plugin, "ADD", rt=rt, prev_result=result)
            out = self._run(netlist, i, "ADD", conf, rt)
            try:
                if not out.strip():
                    raise CNIError(ERR_DECODING_FAILURE, "plugin printed no result for ADD")
                result = parse_result(out, netlist.cni_version)
            except CNIError as exc:
                raise PluginError(exc, network=netlist.name, command="ADD",
                                  plugin_type=plugin.type, index=i + 1,
                                  count=len(netlist.plugins)) from None
        assert result is not None
        result.cni_version = netlist.cni_version
        self._cache_add(result, netlist, rt)
        return result

    def check(self, netlist: NetworkConfigList, rt: RuntimeConf) -> None:
        """CHECK the attachment: each plugin in order with the cached ADD
        result as ``prevResult`` (libcni ``CheckNetworkList``). Nothing is run
        when the list sets ``disableCheck``.

        Raises:
            CNIError: code 1 when the list's version is below 0.4.0 (CHECK did
                not exist), also with ``disableCheck``, as libcni; code 6 when
                the cached result is unreadable.
            PluginError: the first failing plugin's error.
        """
        if not version_at_least(netlist.cni_version, "0.4.0"):
            raise CNIError(ERR_INCOMPATIBLE_CNI_VERSION,
                           f'configuration version "{netlist.cni_version}" does not support '
                           "the CHECK command", "CHECK exists from cniVersion 0.4.0 on")
        if netlist.disable_check:
            return
        self._check_attachment(netlist, rt)
        self._preflight(netlist)
        cached = self.get_cached_result(netlist, rt)
        for i, plugin in enumerate(netlist.plugins):
            conf = derive_request_config(netlist, plugin, "CHECK", rt=rt, prev_result=cached)
            self._run(netlist, i, "CHECK", conf, rt)

    def delete(self, netlist: NetworkConfigList, rt: RuntimeConf) -> None:
        """DEL the attachment: each plugin in reverse order; from 0.4.0 on,
        with the cached ADD result as ``prevResult`` (an unreadable cache is
        dropped and DEL goes on without it). The cache entry is removed when
        every plugin succeeded (libcni ``DelNetworkList``). Repeating DEL is
        fine: plugins must succeed when things are gone.

        Raises:
            PluginError: the first failing plugin's error (later plugins in
                the reverse order are not run, as libcni).
            CNIError: code 4 / 7 for a bad container ID, ifname or name.
        """
        self._check_attachment(netlist, rt)
        cached = None
        if version_at_least(netlist.cni_version, "0.4.0"):
            try:
                cached = self.get_cached_result(netlist, rt)
            except CNIError:
                self._cache_del(netlist.name, rt)
        for i in reversed(range(len(netlist.plugins))):
            conf = derive_request_config(netlist, netlist.plugins[i], "DEL", rt=rt,
                                         prev_result=cached)
            self._run(netlist, i, "DEL", conf, rt)
        self._cache_del(netlist.name, rt)

    def gc(self, netlist: NetworkConfigList,
           valid_attachments: Iterable[GCAttachment | tuple[str, str] | Mapping] | None = None
           ) -> list[NetworkAttachment]:
        """Garbage-collect the network (libcni ``GCNetworkList``).

        1. Every cached attachment of this network not in
           ``valid_attachments`` gets a DEL (with the netns, CNI_ARGS and
           capability args cached at its ADD).
        2. If the list's version is at least 1.1.0, every plugin gets GC with
           ``cni.dev/valid-attachments`` (omitted when ``valid_attachments``
           is None, as libcni; an empty list means "none is valid").

        Best effort (spec): goes on past failures and raises them together.
        Nothing happens when the list sets ``disableGC``. Do not run it while
        ADD or DEL run for the network (spec).

        ``valid_attachments``: `GCAttachment`, ``(container_id, ifname)``
        pairs or ``{"containerID", "ifname"}`` dicts.

        Returns:
            the stale attachments that were deleted.

        Raises:
            GCError: every failure (``.errors``), code of the first.
        """
        if netlist.disable_gc:
            return []
        valid = None if valid_attachments is None else \
            [GCAttachment.from_value(a) for a in valid_attachments]
        errors: list[CNIError] = []
        removed = []
        for att in self.stale_attachments(netlist, valid or ()):
            rt = RuntimeConf(att.container_id, att.netns, att.ifname, list(att.cni_args),
                             dict(att.capability_args))
            try:
                self.delete(netlist, rt)
                removed.append(att)
            except CNIError as exc:
                errors.append(CNIError(exc.code, f"failed to delete stale attachment "
                                       f"{att.container_id} {att.ifname}: {exc}"))
        if version_at_least(netlist.cni_version, "1.1.0"):
            for i, plugin in enumerate(netlist.plugins):
                conf = derive_request_config(netlist, plugin, "GC", valid_attachments=valid)
                try:
                    self._run(netlist, i, "GC", conf, None)
                except CNIError as exc:
                    errors.append(exc)
        if errors:
            raise GCError(netlist.name, errors)
        return removed

    def stale_attachments(self, netlist: NetworkConfigList,
                          valid_attachments: Iterable[GCAttachment | tuple[str, str] | Mapping]
                          = ()) -> list[NetworkAttachment]:
        """The cached attachments of ``netlist`` that `gc` would DEL with
        these ``valid_attachments``: every one of the network not listed, in
        cache file order. Reads the cache only (for a dry run); empty when the
        list sets ``disableGC``."""
        if netlist.disable_gc:
            return []
        keep = {GCAttachment.from_value(a) for a in valid_attachments}
        return [att for att in self.get_cached_attachments()
                if att.network == netlist.name
                and GCAttachment(att.container_id, att.ifname) not in keep]

    def status(self, netlist: NetworkConfigList) -> bool:
        """STATUS: ask each plugin in order whether it can serve ADD (libcni
        ``GetStatusNetworkList``). Lists below 1.1.0 are not asked (STATUS
        did not exist; libcni reports them ready without asking).

        Returns:
            True when the plugins were asked, False when the version is
            below 1.1.0.

        Raises:
            PluginError: the first plugin that is not ready (code 50: cannot
                serve ADD; 51: existing containers may lose connectivity).
        """
        if not version_at_least(netlist.cni_version, "1.1.0"):
            return False
        for i, plugin in enumerate(netlist.plugins):
            self._run(netlist, i, "STATUS", derive_request_config(netlist, plugin, "STATUS"),
                      None)
        return True


def _b64(value: Any) -> bytes:
    if not value:
        return b""
    try:
        return base64.b64decode(value, validate=True)
    except (ValueError, TypeError) as exc:
        raise CNIError(ERR_DECODING_FAILURE, f"cached config is not base64: {exc}") from None


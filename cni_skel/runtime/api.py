"""Running network configuration lists, as libcni's ``api.go`` does.

`Runtime` (libcni ``CNIConfig``) runs a `NetworkConfigList` for one
attachment described by a `RuntimeConf` (libcni ``RuntimeConf``): ADD, CHECK,
DEL, and per network GC and STATUS. Each plugin gets the config
`derive_request_config` builds; plugins are found and run through an
`cni_skel.invoke.Exec` (default: one process each, bounded in time,
"text file busy" retried, stderr passed on, Error objects parsed). ADD
results go to libcni's cache (`cni_skel.runtime.cache`).

By convention, as in libcni's Go code, ``rt`` is always a `RuntimeConf`;
the runtime object is ``cni``::

    cni = Runtime(conf_dir="/etc/cni/net.d", bin_dirs=["/opt/cni/bin"])
    net = cni.load_conflist("mynet")
    rt = RuntimeConf("ctr1", "/run/netns/pod1", "eth0")
    result = cni.add(net, rt)

`resolve_netns` and `cnitool_container_id` are cnitool's conventions, so
that a command line built on this names attachments as cnitool does.

Sources: CNI spec 1.1.0 section 3 (execution of network configurations,
deriving request configurations); libcni ``api.go`` for what the spec
leaves open: CHECK below 0.4.0, the prevResult of DEL, GC of cached
attachments, STATUS below 1.1.0.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from .. import compat
from ..config import GCAttachment
from ..env import parse_cni_args, validate_container_id, validate_ifname, validate_network_name
from ..errors import (
    ERR_DECODING_FAILURE,
    ERR_INCOMPATIBLE_CNI_VERSION,
    ERR_INVALID_NETWORK_CONFIG,
    CNIError,
)
from ..invoke import DEFAULT_EXEC, Exec, get_version_info
from ..netns import NetNS
from ..types import Result, parse_result
from ..version import ALL_VERSIONS, CURRENT_VERSION, parse_version, version_at_least
from .cache import CACHE_KIND, DEFAULT_CACHE_DIR, CachedInfo, ResultCache
from .conf import (
    DEFAULT_CONF_DIR,
    NetworkConfigList,
    PluginConfig,
    conf_files,
    load_conflist,
    load_file,
)
from .errors import GCError, PluginError

__all__ = [
    "DEFAULT_BIN_DIRS",
    "CapabilityArgs",
    "NetworkAttachment",
    "Runtime",
    "RuntimeConf",
    "ValidAttachment",
    "cnitool_container_id",
    "derive_request_config",
    "resolve_netns",
]

#: libcni's default plugin directory (containerd's CRI plugin runs from it).
DEFAULT_BIN_DIRS: tuple[str, ...] = ("/opt/cni/bin",)

#: Capability arguments: capability name -> any JSON value (``portMappings``,
#: ``ips``, ``mac``, ``bandwidth``, ...; see the CNI CONVENTIONS document).
CapabilityArgs = dict[str, Any]

#: What `Runtime.gc` accepts as a valid attachment: a `GCAttachment`, a
#: ``(container_id, ifname)`` pair or a ``{"containerID", "ifname"}`` dict.
ValidAttachment = GCAttachment | tuple[str, str] | Mapping[str, str]


@dataclass(init=False)
class RuntimeConf:
    """The per-attachment parameters (libcni ``RuntimeConf``).

    Attributes:
        container_id: CNI_CONTAINERID (spec rule: alphanumeric first, then
            ``[a-zA-Z0-9_.-]``).
        netns: CNI_NETNS, a namespace path ("" when gone, for DEL).
        ifname: CNI_IFNAME (default ``eth0``).
        args: CNI_ARGS as ``(key, value)`` pairs (libcni ``Args``); a
            ``"K=V;K2=V2"`` string is accepted and split (code 4 when a
            pair has no ``=``). `args_string` gives the variable's value.
        capability_args: `CapabilityArgs`; each plugin gets, in
            ``runtimeConfig``, those it declares in ``capabilities``.
    """

    container_id: str
    netns: str = ""
    ifname: str = "eth0"
    args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: CapabilityArgs = field(default_factory=dict)

    def __init__(self, container_id: str, netns: str = "", ifname: str = "eth0",
                 args: Iterable[tuple[str, str]] | str = (),
                 capability_args: CapabilityArgs | None = None) -> None:
        self.container_id = container_id
        self.netns = netns
        self.ifname = ifname
        self.args = parse_cni_args(args) if isinstance(args, str) else \
            [(str(k), str(v)) for k, v in args]
        if capability_args is None:
            capability_args = {}
        if not isinstance(capability_args, dict):
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "capability args must be a JSON object",
                           f"got {type(capability_args).__name__}")
        self.capability_args = capability_args

    def args_string(self) -> str:
        """``args`` as the CNI_ARGS value ``K1=V1;K2=V2``."""
        return ";".join(f"{k}={v}" for k, v in self.args)

    @property
    def cni_args(self) -> str:
        """Deprecated since 0.2.0 (gone in 0.3.0): `args_string`; warns."""
        compat.warn("cni_skel.runtime.RuntimeConf.cni_args")
        return self.args_string()


@dataclass
class NetworkAttachment:
    """A cached attachment, as read back from the result cache (libcni
    ``NetworkAttachment``). ``config`` is the list config cached at ADD;
    ``args`` and ``capability_args`` those ADD ran with; ``path`` the cache
    file."""

    container_id: str
    network: str
    ifname: str
    config: bytes = b""
    netns: str = ""
    args: list[tuple[str, str]] = field(default_factory=list)
    capability_args: CapabilityArgs = field(default_factory=dict)
    path: str = ""

    @classmethod
    def from_cache(cls, info: CachedInfo) -> NetworkAttachment:
        """From a cache file; a ``config`` that is not base64 reads as empty."""
        try:
            config = info.config()
        except CNIError:
            config = b""
        return cls(container_id=info.container_id, network=info.network, ifname=info.ifname,
                   config=config, netns=info.netns, args=info.args or [],
                   capability_args=info.capability_args, path=info.path)

    @property
    def cni_args(self) -> list[tuple[str, str]]:
        """Deprecated since 0.2.0 (gone in 0.3.0): the old name of ``args``;
        warns."""
        compat.warn("cni_skel.runtime.NetworkAttachment.cni_args")
        return self.args

    def runtime_conf(self) -> RuntimeConf:
        """The `RuntimeConf` its ADD ran with (what its DEL must get)."""
        return RuntimeConf(self.container_id, self.netns, self.ifname, list(self.args),
                           dict(self.capability_args))


def derive_request_config(netlist: NetworkConfigList, plugin: PluginConfig, command: str, *,
                          rt: RuntimeConf | None = None,
                          prev_result: Result | dict[str, Any] | None = None,
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
    return "cnitool-" + hashlib.sha512(netns_path.encode()).digest()[:10].hex()


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
        exec: how plugins are found and run (libcni ``CNIConfig{exec}``);
            every lookup and execution goes through it, the VERSION
            pre-flight included. Default `cni_skel.invoke.DEFAULT_EXEC`
            (one process each). A test may pass a fake.
    """

    def __init__(self, conf_dir: str = DEFAULT_CONF_DIR,
                 bin_dirs: Iterable[str] | str | None = None,
                 cache_dir: str = DEFAULT_CACHE_DIR, *, timeout: float | None = None,
                 plugin_netns: str | None = None, env: Mapping[str, str] | None = None,
                 stderr: IO[str] | None = None, preflight: bool = False,
                 log: Callable[[str], None] | None = None, exec: Exec | None = None) -> None:
        if bin_dirs is None:
            bin_dirs = DEFAULT_BIN_DIRS
        if isinstance(bin_dirs, str):
            bin_dirs = bin_dirs.split(":")
        self.conf_dir = conf_dir
        self.bin_dirs = [os.fspath(d) for d in bin_dirs if d]
        self.cache = ResultCache(cache_dir)
        self.timeout = timeout
        if plugin_netns and "/" not in plugin_netns:
            plugin_netns = os.path.join("/run/netns", plugin_netns)
        self.plugin_netns = plugin_netns or None
        self.env = env
        self.stderr = stderr
        self.preflight = preflight
        self.log = log
        self.exec = exec if exec is not None else DEFAULT_EXEC
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
        """Absolute path of ``plugin_type`` in ``bin_dirs``, as ``exec``
        finds it (`cni_skel.invoke.find_plugin`: code 7 when absent, code 4
        when ``bin_dirs`` is empty)."""
        return self.exec.find(plugin_type, self.bin_dirs)

    def get_version_info(self, plugin_type: str) -> dict[str, Any]:
        """The plugin's VERSION answer ``{"cniVersion", "supportedVersions"}``,
        asked through ``exec`` with this runtime's newest version (libcni
        ``GetVersionInfo``).

        Raises:
            CNIError: code 7 when not found; the plugin's error; code 6 when
                the answer is not a VersionResult.
        """
        path = self.find_plugin(plugin_type)
        with self._in_plugin_netns():
            return get_version_info(path, cni_version=CURRENT_VERSION,
                                    env=self._env("VERSION", None), timeout=self.timeout,
                                    exec=self.exec, stderr=self.stderr)

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

    @property
    def cache_dir(self) -> str:
        """The result cache root (``cache.cache_dir``)."""
        return self.cache.cache_dir

    def cache_path(self, network: str, rt: RuntimeConf) -> str:
        """``<cache_dir>/results/<network>-<containerID>-<ifname>`` (libcni).

        Raises:
            CNIError: code 4 when the container ID or ifname breaks its rule
                (they become part of a file name), 7 for the network name.
        """
        return self.cache.path(network, rt.container_id, rt.ifname)

    def _cache_add(self, result: Result, netlist: NetworkConfigList, rt: RuntimeConf) -> None:
        self.cache.write(netlist.name, rt.container_id, rt.ifname, config=netlist.raw,
                         netns=rt.netns, args=rt.args, capability_args=rt.capability_args,
                         result=result.to_version(netlist.cni_version))

    def _cache_del(self, network: str, rt: RuntimeConf) -> None:
        self.cache.remove(network, rt.container_id, rt.ifname)

    def get_cached_result(self, netlist: NetworkConfigList, rt: RuntimeConf) -> Result | None:
        """The final ADD result cached for this attachment, converted to the
        list's version (libcni ``GetNetworkListCachedResult``); None when there
        is none. A pre-cniCacheV1 file holding a bare result is read too.

        Raises:
            CNIError: code 6 when the cached result cannot be decoded; code 1
                when it cannot be expressed in the list's version.
        """
        cached = self.cache.read(netlist.name, rt.container_id, rt.ifname)
        if cached is None or cached.result is None:
            return None
        try:
            result = parse_result(cached.result, netlist.cni_version)
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
        cached = self.cache.read(netlist.name, rt.container_id, rt.ifname)
        if cached is None:
            return None
        if cached.doc is None:
            raise CNIError(ERR_DECODING_FAILURE, f'cached network "{netlist.name}" config has '
                           f"the wrong kind (not {CACHE_KIND})")
        new_rt = dataclasses.replace(rt)
        if cached.args is not None:
            new_rt.args = cached.args
        new_rt.capability_args = cached.capability_args
        return cached.config(), new_rt

    def get_cached_attachments(self, container_id: str = "") -> list[NetworkAttachment]:
        """Every attachment in the cache, sorted by file name; only those of
        ``container_id`` when given (libcni ``GetCachedAttachments``). Files
        that are not cniCacheV1, or lack a network or ifname, are skipped.

        Raises:
            CNIError: code 5 when the cache directory cannot be listed.
        """
        return [NetworkAttachment.from_cache(info) for info in self.cache.entries(container_id)]

    # -- execution -----------------------------------------------------------

    @contextlib.contextmanager
    def _in_plugin_netns(self) -> Iterator[None]:
        if not self.plugin_netns:
            yield
            return
        with NetNS.open(self.plugin_netns) as ns, ns.enter():
            yield

    def _env(self, command: str, rt: RuntimeConf | None) -> dict[str, str]:
        env = dict(os.environ if self.env is None else self.env)
        env.update({
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": rt.container_id if rt else "",
            "CNI_NETNS": rt.netns if rt else "",
            "CNI_ARGS": rt.args_string() if rt else "",
            "CNI_IFNAME": rt.ifname if rt else "",
            "CNI_PATH": ":".join(self.bin_dirs),
        })
        return env

    def _run(self, netlist: NetworkConfigList, index: int, command: str,
             conf: dict[str, Any], rt: RuntimeConf | None) -> bytes:
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
                out = self.exec.run(path, command, stdin, env, timeout=self.timeout,
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
           valid_attachments: Iterable[ValidAttachment] | None = None) -> list[NetworkAttachment]:
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
            rt = att.runtime_conf()
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
                          valid_attachments: Iterable[ValidAttachment] = ()
                          ) -> list[NetworkAttachment]:
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

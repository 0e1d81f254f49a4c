"""The kit's rig: throw-away namespaces and plugin calls made as a runtime
makes them.

A `Target` names what is tested: a network configuration list (a single
plugin ``.conf`` is a list of one, as runtimes load it) and the directories
its plugins are found in (CNI_PATH). A `Rig` holds a *node* namespace, which
the plugins run in (``ip netns exec``, so they also see its own /sys), the
*pod* namespaces it makes for the attachments, and every call's answer:

* `Rig.call` runs one plugin executable with an environment and a stdin;
* `Rig.add`, `Rig.check`, `Rig.delete`, `Rig.gc` and `Rig.status` run the
  whole list as libcni does (spec 1.1.0 section 3: each plugin's config
  derived by `cni_skel.runtime.derive_request_config`, ADD and CHECK in
  order, DEL in reverse, the previous result passed on);
* `Rig.observer` watches the node, a pod and the state directories
  (`cni_skel.conformance.snapshot`).

Every answer is held to `answer_contract` as it comes, the breaches kept
for the checks (`cni_skel.conformance.checks`). Nothing here touches the
machine's own network namespace: the node is one the rig made.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from ..config import GCAttachment
from ..errors import CNIError
from ..harness import TestNetNS, create_netns, remove_netns
from ..invoke import find_plugin
from ..netns import NetNS
from ..runtime.api import RuntimeConf, derive_request_config
from ..runtime.conf import NetworkConfigList, PluginConfig, load_file
from ..sysctl import write_sysctl
from . import snapshot
from .contract import Breach, Call, answer_contract

__all__ = ["NODE_SYSCTLS", "NODE_UPLINK", "ChainRun", "Rig", "Step", "Target"]

IP = shutil.which("ip") or "/usr/sbin/ip"
#: The node's uplink: a veth end named as a node's first NIC usually is, up,
#: with an address (macvlan, ipvlan and vlan take it as ``master``).
NODE_UPLINK = "eth0"
NODE_UPLINK_PEER = "cnsk-uplink"
NODE_UPLINK_ADDRESS = ("10.254.0.1", 24)
#: Node sysctls compared with the baseline (those a plugin may switch on for
#: good are infrastructure: `snapshot.is_infra`).
NODE_SYSCTLS = ("net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding",
                "net/ipv4/conf/all/route_localnet")
HOST_LOCAL_DEFAULT_DIR = "/var/lib/cni/networks"


@dataclass
class Target:
    """What the kit tests.

    Attributes:
        netlist: the network configuration list (`cni_skel.runtime.conf`).
        plugin_dirs: where the plugins' executables are (CNI_PATH, in order).
        ifname: CNI_IFNAME of the attachments (default ``eth0``).
        state_dirs: directories whose files must be as before once an
            attachment is gone (the plugins' own state); the ``dataDir`` keys
            of each plugin and its ``ipam`` section, and host-local's
            default ``/var/lib/cni/networks/<name>``, are added by `state_roots`.
        capability_args: what a runtime passes as capability args
            (``portMappings``, ...), given to the plugins that declare them.
        node_setup: a shell command run inside the node namespace once it
            exists (to make a device host-device takes, say).
        sysctls: sysctls (key -> value, `cni_skel.sysctl` keys) set in the
            node and in each pod namespace before any plugin runs there:
            ``net.ipv6.conf.default.accept_dad=0`` spares the wait for IPv6
            duplicate address detection plugins do (Go's ptp, bridge...).
        timeout: seconds one plugin call may take (default 60).
        env: more environment for every call (a runtime passes its own on);
            the CNI_* variables are the rig's.
    """

    netlist: NetworkConfigList
    plugin_dirs: list[str]
    ifname: str = "eth0"
    state_dirs: list[str] = field(default_factory=list)
    capability_args: dict[str, Any] = field(default_factory=dict)
    node_setup: str | None = None
    sysctls: dict[str, str] = field(default_factory=dict)
    timeout: float = 60.0
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_file(cls, path: str, plugin_dirs: Sequence[str], **kwargs: Any) -> Target:
        """From a ``.conf``/``.json`` (one plugin) or ``.conflist`` file.

        Raises:
            CNIError: as `cni_skel.runtime.conf.load_file` (code 5 when
                unreadable, 6 or 7 when it is no valid configuration).
        """
        return cls(load_file(path), list(plugin_dirs), **kwargs)

    @property
    def types(self) -> list[str]:
        """The plugin types of the list, in order, each once."""
        return list(dict.fromkeys(p.type for p in self.netlist.plugins))

    def exe(self, plugin_type: str) -> str:
        """The executable of ``plugin_type``: the first in `plugin_dirs`
        (``""`` when none holds it)."""
        try:
            return find_plugin(plugin_type, self.plugin_dirs)
        except CNIError:
            return ""

    def state_roots(self) -> list[str]:
        """`state_dirs` and the state directories the configs name."""
        roots = list(self.state_dirs)
        for plugin in self.netlist.plugins:
            for section in (plugin.conf, plugin.conf.get("ipam")):
                if not isinstance(section, dict):
                    continue
                data_dir = section.get("dataDir")
                if isinstance(data_dir, str) and data_dir:
                    roots.append(data_dir)
                elif section.get("type") == "host-local" and section is plugin.conf.get("ipam"):
                    roots.append(os.path.join(HOST_LOCAL_DEFAULT_DIR, self.netlist.name))
        out: list[str] = []
        for root in (os.path.abspath(r) for r in roots):
            if root not in out:
                out.append(root)
        return out


@dataclass
class Step:
    """One plugin call of a chain: the plugin's type, the verb, the config it
    got and what it answered."""

    plugin: str
    verb: str
    stdin: bytes
    call: Call


@dataclass
class ChainRun:
    """A verb run over the list: ``ok`` when every plugin succeeded,
    ``result`` the last ADD result, ``steps`` the calls made (a failing
    plugin's last)."""

    ok: bool
    result: dict[str, Any] | None = None
    steps: list[Step] = field(default_factory=list)

    @property
    def failed(self) -> Step | None:
        """The step that failed, or None."""
        return None if self.ok or not self.steps else self.steps[-1]

    def brief(self) -> str:
        step = self.failed
        if step is None:
            return "ok"
        return f"{step.plugin} {step.verb}: {step.call.brief()}"


class Rig:
    """The node and pod namespaces of one conformance run, and its calls.

    ``prefix`` starts the namespaces' names (``<prefix>-node-...``); the
    rig's own files (the kit's failing IPAM) go under ``workdir``.
    Breaches of the answer contract are collected in ``breaches`` as
    (scenario, plugin, verb, `Breach`); ``timings`` holds every call's
    seconds by verb. Use it as a context manager: `close` removes every
    namespace it made.
    """

    def __init__(self, target: Target, workdir: str, *, prefix: str = "cnsk-cf") -> None:
        self.target = target
        self.workdir = workdir
        self.prefix = prefix
        self.scenario = ""
        self.breaches: list[tuple[str, str, str, Breach]] = []
        self.timings: dict[str, list[float]] = {}
        self.kit_bin = os.path.join(workdir, "bin")
        self.node: TestNetNS | None = None
        self._pods: list[TestNetNS] = []
        self._ids = itertools.count(1)
        os.makedirs(self.kit_bin, exist_ok=True)
        self.node = create_netns(f"{prefix}-node")
        try:
            self._setup_node()
        except BaseException:
            self.close()
            raise

    # -- namespaces ---------------------------------------------------------------------

    def _setup_node(self) -> None:
        assert self.node is not None
        with NetNS.open(self.node.path) as ns, ns.iproute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            ipr.link("add", ifname=NODE_UPLINK, kind="veth", peer=NODE_UPLINK_PEER)
            index = ipr.link_lookup(ifname=NODE_UPLINK)[0]
            ipr.addr("add", index=index, address=NODE_UPLINK_ADDRESS[0],
                     prefixlen=NODE_UPLINK_ADDRESS[1])
            for name in (NODE_UPLINK, NODE_UPLINK_PEER):
                ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
        self._set_sysctls(self.node)
        if self.target.node_setup:
            proc = subprocess.run([IP, "netns", "exec", self.node.name, "sh", "-ec",
                                   self.target.node_setup], capture_output=True, text=True,
                                  timeout=120, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"--node-setup failed (exit {proc.returncode}): "
                                   f"{proc.stderr.strip()[-500:]}")

    def pod(self) -> TestNetNS:
        """A fresh pod namespace (``lo`` down, as a runtime makes one)."""
        pod = create_netns(f"{self.prefix}-pod")
        self._pods.append(pod)
        self._set_sysctls(pod)
        return pod

    def _set_sysctls(self, ns: TestNetNS) -> None:
        if not self.target.sysctls:
            return
        with NetNS.open(ns.path) as handle, handle.enter():
            for key, value in self.target.sysctls.items():
                try:
                    write_sysctl(key, value)
                except CNIError as exc:
                    raise RuntimeError(f"--sysctl {key}={value}: {exc.msg}") from None

    def drop(self, pod: TestNetNS) -> None:
        """Remove ``pod`` (a sandbox destroyed; already gone is fine). Its
        links go first, as the kernel takes them when the namespace goes, but
        at once: the kernel's own cleanup runs later, and a veth end it takes
        from the node then would show up in the next scenario's picture."""
        if os.path.exists(pod.path):
            with NetNS.open(pod.path) as ns, ns.iproute() as ipr:
                for link in ipr.get_links():
                    if link.get_attr("IFLA_IFNAME") != "lo":
                        with contextlib.suppress(NetlinkError):
                            ipr.link("del", index=link["index"])
        remove_netns(pod)
        if pod in self._pods:
            self._pods.remove(pod)

    def close(self) -> None:
        for pod in reversed(self._pods):
            remove_netns(pod)
        self._pods = []
        if self.node is not None:
            remove_netns(self.node)
            self.node = None

    def __enter__(self) -> Rig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def observer(self, pod: TestNetNS | None) -> Iterator[snapshot.Observer]:
        """An observer of the node, ``pod`` (when given) and the state roots."""
        assert self.node is not None
        namespaces = {"node": self.node.path, **({"pod": pod.path} if pod is not None else {})}
        with snapshot.Observer(namespaces, self.target.state_roots(),
                               {"node": NODE_SYSCTLS}) as obs:
            yield obs

    # -- one call -----------------------------------------------------------------------

    def container_id(self, tag: str) -> str:
        """A container ID for one attachment: ``cnsk-<tag>-<n>``."""
        return f"cnsk-{tag}-{next(self._ids)}"

    def env(self, verb: str, *, container_id: str = "", netns: str = "",
            ifname: str | None = None, cni_path: str | None = None,
            extra: Mapping[str, str] | None = None, drop: Iterable[str] = ()) -> dict[str, str]:
        """The environment a runtime gives a plugin for ``verb``."""
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               **self.target.env,
               "CNI_COMMAND": verb, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
               "CNI_IFNAME": self.target.ifname if ifname is None else ifname,
               "CNI_ARGS": "",
               "CNI_PATH": cni_path if cni_path is not None
               else ":".join(self.target.plugin_dirs)}
        env.update(extra or {})
        for key in drop:
            env.pop(key, None)
        return env

    def call(self, plugin_type: str, verb: str, env: Mapping[str, str], stdin: bytes, *,
             contract_verb: str | None = None) -> Call:
        """Run ``plugin_type``'s executable in the node with ``env`` and
        ``stdin``; its answer is held to the contract (as ``contract_verb``,
        default ``verb``) and timed under ``verb``."""
        assert self.node is not None
        exe = self.target.exe(plugin_type)
        if not exe:
            call = Call(127, b"", f"no executable {plugin_type!r} in "
                        f"{':'.join(self.target.plugin_dirs)}", 0.0)
            self.breaches.append((self.scenario, plugin_type, verb,
                                  Breach("plugin-not-found", call.stderr)))
            return call
        start = time.monotonic()
        try:
            proc = subprocess.run([IP, "netns", "exec", self.node.name, exe], input=stdin,
                                  env=dict(env), capture_output=True,
                                  timeout=self.target.timeout, check=False)
            call = Call(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"),
                        time.monotonic() - start)
        except subprocess.TimeoutExpired as exc:
            call = Call(None, exc.stdout or b"", (exc.stderr or b"").decode("utf-8", "replace"),
                        time.monotonic() - start)
        self.timings.setdefault(verb, []).append(call.seconds)
        for breach in answer_contract(call, contract_verb or verb, stdin,
                                      timeout=self.target.timeout):
            self.breaches.append((self.scenario, plugin_type, verb, breach))
        return call

    # -- the list, as a runtime runs it -----------------------------------------------

    def request(self, plugin: PluginConfig, verb: str, *, netlist: NetworkConfigList | None = None,
                prev: dict[str, Any] | None = None,
                valid: Iterable[GCAttachment] | None = None) -> bytes:
        """The stdin ``plugin`` gets for ``verb`` (`derive_request_config`)."""
        rt = RuntimeConf("", capability_args=copy.deepcopy(self.target.capability_args))
        conf = derive_request_config(netlist or self.target.netlist, plugin, verb, rt=rt,
                                     prev_result=prev, valid_attachments=valid)
        return json.dumps(conf).encode()

    def add(self, container_id: str, netns: str, *, netlist: NetworkConfigList | None = None,
            env_extra: Mapping[str, str] | None = None,
            cni_path: str | None = None) -> ChainRun:
        """ADD over the list, each plugin given the previous one's result."""
        netlist = netlist or self.target.netlist
        run = ChainRun(True)
        prev: dict[str, Any] | None = None
        for plugin in netlist.plugins:
            stdin = self.request(plugin, "ADD", netlist=netlist, prev=prev)
            env = self.env("ADD", container_id=container_id, netns=netns, cni_path=cni_path,
                           extra=env_extra)
            call = self.call(plugin.type, "ADD", env, stdin)
            run.steps.append(Step(plugin.type, "ADD", stdin, call))
            doc = call.doc
            if call.exit_code != 0 or not isinstance(doc, dict) or "code" in doc:
                run.ok = False
                return run
            prev = doc
        run.result = prev
        return run

    def check(self, container_id: str, netns: str, result: dict[str, Any] | None) -> ChainRun:
        """CHECK over the list, each plugin given the final ADD result."""
        run = ChainRun(True)
        for plugin in self.target.netlist.plugins:
            stdin = self.request(plugin, "CHECK", prev=result)
            call = self.call(plugin.type, "CHECK",
                             self.env("CHECK", container_id=container_id, netns=netns), stdin)
            run.steps.append(Step(plugin.type, "CHECK", stdin, call))
            if call.exit_code != 0:
                run.ok = False
                return run
        return run

    def delete(self, container_id: str, netns: str, result: dict[str, Any] | None, *,
               netlist: NetworkConfigList | None = None,
               cni_path: str | None = None) -> ChainRun:
        """DEL over the list in reverse, each plugin given ``result`` (None:
        no prevResult, as after a lost cache). Goes on past a failure, as
        libcni does not, so that one DEL cleans what it can; ``ok`` tells."""
        netlist = netlist or self.target.netlist
        run = ChainRun(True)
        for plugin in reversed(netlist.plugins):
            stdin = self.request(plugin, "DEL", netlist=netlist, prev=result)
            call = self.call(plugin.type, "DEL", self.env("DEL", container_id=container_id,
                                                          netns=netns, cni_path=cni_path), stdin)
            run.steps.append(Step(plugin.type, "DEL", stdin, call))
            if call.exit_code != 0:
                run.ok = False
                return run
        return run

    def gc(self, valid: Iterable[GCAttachment]) -> ChainRun:
        """GC over the list with ``valid`` as ``cni.dev/valid-attachments``."""
        run = ChainRun(True)
        valid = list(valid)
        for plugin in self.target.netlist.plugins:
            stdin = self.request(plugin, "GC", valid=valid)
            call = self.call(plugin.type, "GC", self.env("GC"), stdin)
            run.steps.append(Step(plugin.type, "GC", stdin, call))
            if call.exit_code != 0:
                run.ok = False
        return run

    def status(self) -> ChainRun:
        """STATUS of each plugin of the list."""
        run = ChainRun(True)
        for plugin in self.target.netlist.plugins:
            stdin = self.request(plugin, "STATUS")
            call = self.call(plugin.type, "STATUS", self.env("STATUS"), stdin)
            run.steps.append(Step(plugin.type, "STATUS", stdin, call))
            if call.exit_code != 0:
                run.ok = False
        return run

"""tuning through the real executable, run inside a node namespace the way a
runtime runs it, on a veth whose container end (eth0) is in a pod namespace
made by the test: each setting applied and read back, restore on DEL,
allowlist on and off, path escapes, MAC precedence, errors leaving nothing
applied, CHECK, GC, interop with the Go tuning, and the spec's dbnet chain.

Every tuning run goes through a wrapper that gives it a private /etc
(overlayfs in its own mount namespace, the upper layer in tmp_path), so the
allowlist at /etc/cni/tuning/allowlist.conf is whatever the test says and
the machine's /etc is never written. ``dataDir`` is always in tmp_path.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import stat
from dataclasses import dataclass

import pytest
from cni_skel_plugins.tuning import Tuning, plugin
from yardsticks import printed, yardsticks

from cni_skel import netlink
from cni_skel.errors import CNIError
from cni_skel.harness import TestNetNS, remove_netns, run_plugin, run_plugin_raw
from cni_skel.netns import NetNS

CID = "ctr1"
NET = "tunet"
ORIG_MAC = "02:00:00:00:00:0a"
MAC = "02:00:00:00:00:0b"

WRAPPER = """#!/bin/sh
# Run tuning with a private /etc: an overlay over /etc in a new mount
# namespace, whose upper layer is a scratch dir of the test.
exec /usr/bin/unshare --mount --propagation private /bin/sh -ec '
scratch=$(mktemp -d -p "$1")
mkdir "$scratch/upper" "$scratch/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
rm -rf /etc/cni/tuning
if [ -n "$2" ]; then mkdir -p /etc/cni/tuning; cp "$2" /etc/cni/tuning/allowlist.conf; fi
exec "$3"
' tuning-etc {scratch} {allowlist} {exe}
"""


# --- fixtures and helpers --------------------------------------------------------


@pytest.fixture
def tuning_with(tmp_path, cni_bin):
    """``make(allowlist=None)``: path of a tuning executable that sees
    ``allowlist`` (text) as /etc/cni/tuning/allowlist.conf, or no such file."""
    made = []

    def make(allowlist: str | None = None, exe: str | None = None) -> str:
        d = tmp_path / f"bin{len(made)}"
        d.mkdir()
        (d / "scratch").mkdir()
        allow = ""
        if allowlist is not None:
            (d / "allowlist.conf").write_text(allowlist)
            allow = str(d / "allowlist.conf")
        wrapper = d / "tuning"
        wrapper.write_text(WRAPPER.format(
            scratch=shlex.quote(str(d / "scratch")), allowlist=shlex.quote(allow) or "''",
            exe=shlex.quote(exe or os.path.join(cni_bin, "tuning"))))
        wrapper.chmod(0o755)
        made.append(wrapper)
        return str(wrapper)

    return make


@pytest.fixture
def tuning(tuning_with):
    return tuning_with()


@pytest.fixture(params=["ours", *yardsticks()], ids=lambda p: getattr(p, "id", p))
def bridge_plugin(request, cni_bin):
    """(executable, CNI_PATH, cniVersion) of the bridge the dbnet chain uses:
    ours at the spec's 1.1.0, and each Go yardstick's (at 1.0.0, the most
    Go 1.1.1 speaks) for interop."""
    if request.param == "ours":
        return os.path.join(cni_bin, "bridge"), cni_bin, "1.1.0"
    y = request.param
    return y.exe("bridge"), y.dir, "1.0.0"


@dataclass
class Env:
    node: TestNetNS
    pod: TestNetNS
    data_dir: str
    ifname: str = "eth0"

    @property
    def state_file(self) -> str:
        return os.path.join(self.data_dir, f"{CID}_{self.ifname}.json")


def _veth(node: TestNetNS, pod: TestNetNS, ifname: str) -> None:
    with NetNS.open(node.path) as n, NetNS.open(pod.path) as p, n.iproute() as ipr:
        netlink.create_veth_pair(ipr, "vh0", ifname, p, peer_mac=ORIG_MAC)
        netlink.link_up(ipr, "vh0")
        with p.iproute() as pipr:
            netlink.link_up(pipr, ifname)


@pytest.fixture
def env(node_netns, pod_netns, tmp_path) -> Env:
    """eth0 (MAC ORIG_MAC, MTU 1500, txqlen 1000) in the pod, vh0 in the node."""
    _veth(node_netns, pod_netns, "eth0")
    return Env(node_netns, pod_netns, str(tmp_path / "tuning-data"))


def link(ns: TestNetNS, ifname: str = "eth0") -> dict:
    """What the kernel says about the link, read with pyroute2 directly."""
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        msg = ipr.link("get", ifname=ifname)[0]
    return {"mac": msg.get("IFLA_ADDRESS"), "mtu": msg.get("IFLA_MTU"),
            "promisc": bool(msg["flags"] & 0x100), "allmulti": bool(msg["flags"] & 0x200),
            "txqlen": msg.get("IFLA_TXQLEN")}


def sysctl(ns: TestNetNS, rel: str) -> str:
    """/proc/sys/<rel> as seen inside ``ns``."""
    def read() -> str:
        with open(f"/proc/sys/{rel}") as fp:
            return fp.read().strip()

    with NetNS.open(ns.path) as n:
        return n.run(read)


def set_sysctl(ns: TestNetNS, rel: str, value: str) -> None:
    def write() -> None:
        with open(f"/proc/sys/{rel}", "w") as fp:
            fp.write(value)

    with NetNS.open(ns.path) as n:
        n.run(write)


def set_link(ns: TestNetNS, ifname: str = "eth0", **attrs) -> None:
    with NetNS.open(ns.path) as n, n.iproute() as ipr:
        netlink.link_set(ipr, ifname, **attrs)


WATCHED = ("net/core/somaxconn", "net/ipv4/conf/eth0/rp_filter", "net/ipv4/conf/eth0/arp_ignore")


def snapshot(e: Env) -> tuple[dict, dict]:
    """Everything a test config may change, to compare before and after."""
    return link(e.pod, e.ifname), {rel: sysctl(e.pod, rel) for rel in WATCHED
                                    if e.ifname == "eth0" or "eth0" not in rel}


def prev(e: Env, version: str = "1.1.0", mac: str = ORIG_MAC) -> dict:
    ip = {"address": "10.99.0.5/24", "gateway": "10.99.0.1", "interface": 1}
    if version < "1.0.0":
        ip["version"] = "4"
    return {"cniVersion": version,
            "interfaces": [{"name": "vh0", "mac": "02:00:00:00:00:99"},
                           {"name": e.ifname, "mac": mac, "sandbox": e.pod.path}],
            "ips": [ip]}


def conf(e: Env, version: str = "1.1.0", with_prev: bool = True, **keys) -> dict:
    c = {"cniVersion": version, "name": NET, "type": "tuning", "dataDir": e.data_dir}
    if with_prev:
        c["prevResult"] = prev(e, version)
    c.update(keys)
    return c


def run(exe: str, cmd: str, c, e: Env, **kw):
    kw.setdefault("container_id", CID)
    kw.setdefault("netns", e.pod.path)
    kw.setdefault("ifname", e.ifname)
    return run_plugin(exe, cmd, c, node=e.node, **kw)


def fails(exe: str, cmd: str, c, e: Env, **kw) -> CNIError:
    with pytest.raises(CNIError) as ei:
        run(exe, cmd, c, e, **kw)
    return ei.value


def saved(e: Env) -> dict:
    with open(e.state_file) as fp:
        return json.load(fp)


def result_mac(result: dict, ifname: str = "eth0") -> str:
    return next(i["mac"] for i in result["interfaces"] if i["name"] == ifname and "sandbox" in i)


# --- ADD, read back, CHECK, DEL restores ---------------------------------------------


def test_add_applies_everything_check_passes_del_restores(tuning, env):
    before = snapshot(env)
    assert before[0] == {"mac": ORIG_MAC, "mtu": 1500, "promisc": False, "allmulti": False,
                         "txqlen": 1000}
    c = conf(env, sysctl={"net.core.somaxconn": "500",
                          "net/ipv4/conf/IFNAME/rp_filter": "2",
                          "net.ipv4.conf.IFNAME.arp_ignore": "1"},
             mac=MAC, mtu=1400, promisc=True, allmulti=True, txQLen=77)
    result = run(tuning, "ADD", c, env)

    assert link(env.pod) == {"mac": MAC, "mtu": 1400, "promisc": True, "allmulti": True,
                             "txqlen": 77}
    assert sysctl(env.pod, "net/core/somaxconn") == "500"
    assert sysctl(env.pod, "net/ipv4/conf/eth0/rp_filter") == "2"
    assert sysctl(env.pod, "net/ipv4/conf/eth0/arp_ignore") == "1"
    expected = prev(env)
    expected["interfaces"][1]["mac"] = MAC
    assert result == printed(expected), "prevResult with the new MAC, nothing else"

    # the originals, Go's keys plus ours, file 0600 in a 0700 directory
    assert saved(env) == {
        "mac": ORIG_MAC, "promisc": False, "mtu": 1500, "allmulti": False, "txQLen": 1000,
        "sysctl": {"net/core/somaxconn": before[1]["net/core/somaxconn"],
                   "net/ipv4/conf/eth0/rp_filter": before[1]["net/ipv4/conf/eth0/rp_filter"],
                   "net/ipv4/conf/eth0/arp_ignore": before[1]["net/ipv4/conf/eth0/arp_ignore"]},
        "network": NET, "containerID": CID, "ifname": "eth0"}
    assert stat.S_IMODE(os.stat(env.state_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(env.data_dir).st_mode) == 0o700

    assert run(tuning, "CHECK", c, env) is None
    assert run(tuning, "DEL", c, env) is None
    assert snapshot(env) == before
    assert not os.path.exists(env.state_file)
    assert run(tuning, "DEL", c, env) is None, "a repeated DEL succeeds"


@pytest.mark.parametrize("keys, want", [
    ({"mac": MAC}, {"mac": MAC}),
    ({"mac": "02-00-00-00-00-0B"}, {"mac": MAC}),
    ({"mtu": 9000}, {"mtu": 9000}),
    ({"mtu": 0}, {}),
    ({"promisc": True}, {"promisc": True}),
    ({"allmulti": True}, {"allmulti": True}),
    ({"txQLen": 0}, {"txqlen": 0}),
    ({"txQLen": 5000}, {"txqlen": 5000}),
], ids=lambda v: json.dumps(v))
def test_each_link_setting_alone(tuning, env, keys, want):
    before = link(env.pod)
    run(tuning, "ADD", conf(env, **keys), env)
    assert link(env.pod) == {**before, **want}
    assert run(tuning, "CHECK", conf(env, **keys), env) is None
    run(tuning, "DEL", conf(env, **keys), env)
    assert link(env.pod) == before


@pytest.mark.parametrize("key", ["promisc", "allmulti"])
def test_false_turns_a_flag_off_and_del_turns_it_back_on(tuning, env, key):
    set_link(env.pod, **{key: True})
    run(tuning, "ADD", conf(env, **{key: False}), env)
    assert link(env.pod)[key] is False
    assert saved(env)[key] is True
    run(tuning, "DEL", conf(env), env)
    assert link(env.pod)[key] is True


def test_sysctls_only(tuning, env):
    before = snapshot(env)
    c = conf(env, sysctl={"net.ipv4.tcp_rmem": "4096 65536 1048576",
                          "net/core/somaxconn": "321"})
    orig_rmem = sysctl(env.pod, "net/ipv4/tcp_rmem")
    result = run(tuning, "ADD", c, env)
    assert result_mac(result) == ORIG_MAC
    assert sysctl(env.pod, "net/ipv4/tcp_rmem").split() == ["4096", "65536", "1048576"]
    assert sysctl(env.pod, "net/core/somaxconn") == "321"
    assert run(tuning, "CHECK", c, env) is None, "vector values compare field by field"
    assert set(saved(env)) == {"sysctl", "network", "containerID", "ifname"}
    run(tuning, "DEL", c, env)
    assert sysctl(env.pod, "net/ipv4/tcp_rmem") == orig_rmem
    assert snapshot(env) == before


def test_sysctls_are_per_namespace(tuning, env, netns_factory):
    other = netns_factory("cnsk-other")
    run(tuning, "ADD", conf(env, sysctl={"net.core.somaxconn": "611"}), env)
    assert sysctl(env.pod, "net/core/somaxconn") == "611"
    assert sysctl(other, "net/core/somaxconn") != "611"
    assert sysctl(env.node, "net/core/somaxconn") != "611"


def test_ifname_with_a_dot(tuning_with, node_netns, pod_netns, tmp_path):
    e = Env(node_netns, pod_netns, str(tmp_path / "d"), ifname="eth0.7")
    _veth(node_netns, pod_netns, "eth0.7")
    exe = tuning_with()
    c = conf(e, sysctl={"net.ipv4.conf.IFNAME.rp_filter": "2",
                        "net/ipv4/conf/eth0.7/arp_ignore": "1"}, mtu=1300)
    run(exe, "ADD", c, e)
    assert sysctl(e.pod, "net/ipv4/conf/eth0.7/rp_filter") == "2"
    assert sysctl(e.pod, "net/ipv4/conf/eth0.7/arp_ignore") == "1"
    assert link(e.pod, "eth0.7")["mtu"] == 1300
    run(exe, "CHECK", c, e)
    run(exe, "DEL", c, e)
    assert sysctl(e.pod, "net/ipv4/conf/eth0.7/rp_filter") == "0"
    assert link(e.pod, "eth0.7")["mtu"] == 1500


def test_nothing_to_do_returns_prev_result_and_saves_nothing(tuning, env):
    result = run(tuning, "ADD", conf(env), env)
    assert result == printed(prev(env))
    assert not os.path.exists(env.data_dir)
    assert run(tuning, "DEL", conf(env), env) is None


def test_only_the_container_side_gets_the_new_mac(tuning, env):
    c = conf(env, mac=MAC)
    c["prevResult"]["interfaces"].insert(0, {"name": "eth0", "mac": "02:00:00:00:00:98"})
    result = run(tuning, "ADD", c, env)
    assert [i["mac"] for i in result["interfaces"]] == ["02:00:00:00:00:98",
                                                         "02:00:00:00:00:99", MAC]


def test_keys_match_case_insensitively(tuning, env):
    c = conf(env, SysCtl={"net.core.somaxconn": "444"}, MTU=1450, TXQLEN=12,
             RuntimeConfig={"Mac": MAC})
    run(tuning, "ADD", c, env)
    assert sysctl(env.pod, "net/core/somaxconn") == "444"
    assert link(env.pod) == {"mac": MAC, "mtu": 1450, "promisc": False, "allmulti": False,
                                  "txqlen": 12}


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_result_in_every_chained_version(tuning, env, version):
    result = run(tuning, "ADD", conf(env, version, mac=MAC), env)
    assert result["cniVersion"] == version
    assert result_mac(result) == MAC
    assert result["ips"][0]["address"] == "10.99.0.5/24"
    run(tuning, "DEL", conf(env, version), env)
    assert link(env.pod)["mac"] == ORIG_MAC


def test_repeated_add_keeps_the_first_originals(tuning, env):
    run(tuning, "ADD", conf(env, mtu=1400, sysctl={"net.core.somaxconn": "500"}), env)
    orig = saved(env)
    run(tuning, "ADD", conf(env, mtu=1300, sysctl={"net.core.somaxconn": "600"}, mac=MAC), env)
    assert saved(env) == {**orig, "mac": ORIG_MAC}
    run(tuning, "DEL", conf(env), env)
    assert link(env.pod)["mtu"] == 1500 and link(env.pod)["mac"] == ORIG_MAC
    assert sysctl(env.pod, "net/core/somaxconn") == orig["sysctl"]["net/core/somaxconn"]


# --- MAC precedence and args.cni overrides ---------------------------------------------

M_CONF, M_ENV, M_RT, M_ARGS = ("02:00:00:00:01:01", "02:00:00:00:01:02", "02:00:00:00:01:03",
                               "02:00:00:00:01:04")


@pytest.mark.parametrize("config, cni_args, runtime, args_cni, want", [
    (M_CONF, None, None, None, M_CONF),
    (None, M_ENV, None, None, M_ENV),
    (M_CONF, M_ENV, None, None, M_ENV),
    (None, None, M_RT, None, M_RT),
    (M_CONF, None, M_RT, None, M_RT),
    (M_CONF, M_ENV, M_RT, None, M_RT),
    (None, None, None, M_ARGS, M_ARGS),
    (M_CONF, M_ENV, None, M_ARGS, M_ARGS),
    (M_CONF, None, M_RT, M_ARGS, M_ARGS),
    (M_CONF, M_ENV, M_RT, M_ARGS, M_ARGS),
    (None, None, None, None, ORIG_MAC),
], ids=lambda v: {M_CONF: "conf", M_ENV: "CNI_ARGS", M_RT: "runtimeConfig",
                  M_ARGS: "args.cni", ORIG_MAC: "unchanged"}.get(v, "-"))
def test_mac_precedence(tuning, env, config, cni_args, runtime, args_cni, want):
    keys = {}
    if config:
        keys["mac"] = config
    if runtime:
        keys["runtimeConfig"] = {"mac": runtime}
    if args_cni:
        keys["args"] = {"cni": {"mac": args_cni}}
    env_args = f"IgnoreUnknown=1;K8S_POD_NAME=p;MAC={cni_args}" if cni_args else ""
    result = run(tuning, "ADD", conf(env, **keys), env, cni_args=env_args)
    assert link(env.pod)["mac"] == want
    assert result_mac(result) == want
    assert run(tuning, "CHECK", conf(env, **keys), env, cni_args=env_args) is None


def test_args_cni_overrides_the_other_settings(tuning, env):
    c = conf(env, sysctl={"net.core.somaxconn": "500", "net.ipv4.conf.IFNAME.rp_filter": "1"},
             promisc=True, mtu=1400, allmulti=False, txQLen=50,
             args={"cni": {"sysctl": {"net/core/somaxconn": "600"}, "promisc": False,
                           "mtu": 1300, "allmulti": True, "txQLen": 0, "labels": []}})
    run(tuning, "ADD", c, env)
    assert sysctl(env.pod, "net/core/somaxconn") == "600", "overridden, though spelled otherwise"
    assert sysctl(env.pod, "net/ipv4/conf/eth0/rp_filter") == "1"
    assert link(env.pod) == {"mac": ORIG_MAC, "mtu": 1300, "promisc": False, "allmulti": True,
                             "txqlen": 0}
    assert run(tuning, "CHECK", c, env) is None


# --- allowlist -------------------------------------------------------------------------

ALLOWLIST = """# the example upstream documents
^net\\.ipv4\\.conf\\.IFNAME\\.[a-z_]*$
^net\\.core\\.somaxconn$
"""


def test_allowlist_allows_listed_sysctls_in_either_spelling(tuning_with, env):
    exe = tuning_with(ALLOWLIST)
    c = conf(env, sysctl={"net/core/somaxconn": "500", "net.ipv4.conf.IFNAME.rp_filter": "2",
                          "net/ipv4/conf/IFNAME/arp_ignore": "1"})
    run(exe, "ADD", c, env)
    assert sysctl(env.pod, "net/core/somaxconn") == "500"
    assert sysctl(env.pod, "net/ipv4/conf/eth0/rp_filter") == "2"
    assert sysctl(env.pod, "net/ipv4/conf/eth0/arp_ignore") == "1"


@pytest.mark.parametrize("keys, bad", [
    ({"sysctl": {"net.core.somaxconn": "500", "net.ipv4.ip_forward": "1"}},
     "net.ipv4.ip_forward"),
    ({"sysctl": {"net.ipv4.conf.eth0.rp_filter": "2"}}, "net.ipv4.conf.eth0.rp_filter"),
    ({"sysctl": {"net.core.somaxconn": "500"},
      "args": {"cni": {"sysctl": {"net.ipv4.tcp_syncookies": "0"}}}}, "net.ipv4.tcp_syncookies"),
])
def test_allowlist_refuses_the_rest_and_applies_nothing(tuning_with, env, keys, bad):
    exe = tuning_with(ALLOWLIST)
    before = snapshot(env)
    err = fails(exe, "ADD", conf(env, mac=MAC, mtu=1400, **keys), env)
    assert err.code == 7
    assert f'sysctl "{bad}" is not allowed by /etc/cni/tuning/allowlist.conf' in err.msg
    assert snapshot(env) == before
    assert not os.path.exists(env.state_file)


def test_empty_allowlist_allows_no_sysctl_but_link_settings_still_work(tuning_with, env):
    exe = tuning_with("")
    err = fails(exe, "ADD", conf(env, sysctl={"net.core.somaxconn": "500"}), env)
    assert err.code == 7 and "net.core.somaxconn" in err.msg
    run(exe, "ADD", conf(env, mac=MAC), env)
    assert link(env.pod)["mac"] == MAC


def test_invalid_allowlist_regex_fails_closed(tuning_with, env):
    err = fails(tuning_with("^net\\.core\\.(somaxconn\n"), "ADD",
                conf(env, sysctl={"net.core.somaxconn": "500"}), env)
    assert err.code == 7 and "line 1" in err.msg


def test_without_allowlist_any_per_namespace_net_sysctl_goes(tuning, env):
    run(tuning, "ADD", conf(env, sysctl={"net.ipv4.ip_forward": "1",
                                         "net.ipv4.tcp_syncookies": "0"}), env)
    assert sysctl(env.pod, "net/ipv4/ip_forward") == "1"
    assert sysctl(env.pod, "net/ipv4/tcp_syncookies") == "0"


# --- refused keys and values: nothing left applied --------------------------------------


@pytest.mark.parametrize("bad", [
    "../kernel/hostname",
    "net/../kernel/hostname",
    "net/ipv4/../../kernel/hostname",
    "net/ipv4/conf/IFNAME/../../../../kernel/hostname",
    "net/./core/somaxconn",
    "net..core.somaxconn",
    "kernel.hostname",
    "kernel/hostname",
    "fs.file-max",
    "vm/swappiness",
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/kernel/hostname",
    "/net/core/somaxconn",
    "net",
    "",
])
def test_path_escapes_are_refused_with_nothing_applied(tuning, env, bad):
    before = snapshot(env)
    hostname = pathlib.Path("/proc/sys/kernel/hostname").read_text()
    c = conf(env, sysctl={"net.core.somaxconn": "777", bad: "x"}, mac=MAC, mtu=1400)
    err = fails(tuning, "ADD", c, env)
    assert err.code == 7
    assert f'"{bad}"' in err.msg, err.msg
    assert snapshot(env) == before
    assert pathlib.Path("/proc/sys/kernel/hostname").read_text() == hostname
    assert not os.path.exists(env.data_dir)


@pytest.mark.parametrize("keys, named", [
    ({"sysctl": {"net.core.somaxconn": "1", "net/core/somaxconn": "2"}}, "net/core/somaxconn"),
    ({"sysctl": {"net.ipv4.conf.IFNAME.rp_filter": "1", "net.ipv4.conf.eth0.rp_filter": "1"}},
     "net.ipv4.conf.eth0.rp_filter"),
    ({"args": {"cni": {"sysctl": {"net.core.somaxconn": "1", "net/core/somaxconn": "2"}}}},
     "args.cni.sysctl"),
    ({"sysctl": {"net.core.somaxconn": 500}}, "sysctl.net.core.somaxconn"),
    ({"mtu": -1}, "mtu"),
    ({"mtu": "1400"}, "mtu"),
    ({"txQLen": -5}, "txQLen"),
    ({"promisc": "yes"}, "promisc"),
    ({"allmulti": 1}, "allmulti"),
    ({"mac": "zz:00:00:00:00:01"}, "mac"),
    ({"mac": "01:00:5e:00:00:01"}, "multicast"),
    ({"mac": "00:00:00:00:00:00"}, "all-zero"),
    ({"runtimeConfig": {"mac": "02:00:00:00:00"}}, "runtimeConfig.mac"),
    ({"args": {"cni": {"mtu": "x"}}}, "args.cni.mtu"),
    ({"sysctl": {"net.core.no_such_sysctl": "1"}}, "net.core.no_such_sysctl"),
    ({"sysctl": {"net.core.rmem_max": "4096"}}, "net.core.rmem_max"),
    ({"sysctl": {"net.ipv4.conf": "1"}}, "net.ipv4.conf"),
], ids=lambda v: json.dumps(v) if isinstance(v, dict) else None)
def test_invalid_config_is_code_7_with_nothing_applied(tuning, env, keys, named):
    before = snapshot(env)
    c = conf(env, **{"sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"}, "mac": MAC, **keys})
    err = fails(tuning, "ADD", c, env)
    assert err.code == 7, err
    assert named in err.msg + err.details, err
    assert snapshot(env) == before
    assert not os.path.exists(env.state_file)


def test_duplicate_key_in_the_json_text_is_refused(tuning, env):
    c = json.dumps(conf(env, mac=MAC))[:-1] + \
        ', "sysctl": {"net.core.somaxconn": "1", "net.core.somaxconn": "2"}}'
    before = snapshot(env)
    err = fails(tuning, "ADD", c, env)
    assert err.code == 7 and 'duplicate sysctl key "net.core.somaxconn"' in err.msg
    assert snapshot(env) == before


def test_kernel_rejecting_a_sysctl_value_undoes_the_others(tuning, env):
    before = snapshot(env)
    c = conf(env, sysctl={"net.core.somaxconn": "777", "net.ipv4.conf.IFNAME.rp_filter": "abc"},
             mac=MAC)
    err = fails(tuning, "ADD", c, env)
    assert err.code == 7
    assert 'sysctl "net.ipv4.conf.IFNAME.rp_filter" to "abc"' in err.msg
    assert snapshot(env) == before, "somaxconn was set, then put back"
    assert not os.path.exists(env.state_file)


def test_kernel_rejecting_a_link_value_undoes_everything(tuning, env):
    before = snapshot(env)
    # veth's maximum MTU is 65535: MAC, promisc and sysctls are set before it fails
    c = conf(env, sysctl={"net.core.somaxconn": "777", "net.ipv4.conf.IFNAME.rp_filter": "2"},
             mac=MAC, promisc=True, mtu=70000, txQLen=5)
    err = fails(tuning, "ADD", c, env)
    assert err.code == 7 and "mtu 70000" in err.msg and '"eth0"' in err.msg
    assert snapshot(env) == before
    assert not os.path.exists(env.state_file)


def test_failed_add_puts_the_earlier_saved_file_back(tuning, env):
    run(tuning, "ADD", conf(env, mtu=1400), env)
    first = saved(env)
    after_first = snapshot(env)
    err = fails(tuning, "ADD", conf(env, mac=MAC, sysctl={"net.core.somaxconn": "77"},
                                    txQLen=2**32 - 1, mtu=70000), env)
    assert err.code == 7
    assert saved(env) == first
    assert snapshot(env) == after_first
    run(tuning, "DEL", conf(env), env)
    assert link(env.pod)["mtu"] == 1500


def test_prev_result_is_required(tuning, env):
    before = snapshot(env)
    err = fails(tuning, "ADD", conf(env, with_prev=False, mac=MAC), env)
    assert (err.code, err.msg) == (7, "tuning: required prevResult missing")
    assert snapshot(env) == before
    err = fails(tuning, "CHECK", conf(env, with_prev=False, mac=MAC), env)
    assert (err.code, err.msg) == (7, "tuning: required prevResult missing")


def test_missing_interface_is_an_error_with_nothing_applied(tuning, env):
    before = snapshot(env)
    err = fails(tuning, "ADD", conf(env, sysctl={"net.core.somaxconn": "777"}, mtu=1400), env,
                ifname="nope0")
    assert err.code == 999 and '"nope0"' in err.msg
    assert snapshot(env) == before
    assert not os.path.exists(env.data_dir) or not os.listdir(env.data_dir)


def test_missing_netns_is_code_3(tuning, env):
    err = fails(tuning, "ADD", conf(env, mac=MAC), env, netns="/run/netns/cnsk-no-such-ns")
    assert err.code == 3


@pytest.mark.parametrize("cni_args, code", [("MAC=zz", 4), ("FOO=bar", 4)])
def test_bad_cni_args_are_code_4(tuning, env, cni_args, code):
    err = fails(tuning, "ADD", conf(env), env, cni_args=cni_args)
    assert err.code == code


def test_never_sets_sysctls_in_the_host_namespace(env, monkeypatch):
    """In-process: PID 1's namespace is played by the pod, so the guard, not
    luck, keeps the value out."""
    monkeypatch.setattr(plugin, "HOST_NETNS", env.pod.path)
    before = snapshot(env)
    environ = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": CID, "CNI_NETNS": env.pod.path,
               "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent"}
    out, code = Tuning.dispatch(environ, json.dumps(
        conf(env, sysctl={"net.core.somaxconn": "901"}, mac=MAC)).encode())
    doc = json.loads(out)
    assert code == 1 and doc["code"] == 7
    assert "host's network namespace" in doc["msg"]
    assert snapshot(env) == before


# --- CHECK -----------------------------------------------------------------------------


@pytest.mark.parametrize("what, change, words", [
    ("sysctl", lambda e: set_sysctl(e.pod, "net/core/somaxconn", "123"),
     'sysctl "net.core.somaxconn" is "123", configured "500"'),
    ("ifsysctl", lambda e: set_sysctl(e.pod, "net/ipv4/conf/eth0/rp_filter", "0"),
     'sysctl "net.ipv4.conf.IFNAME.rp_filter" is "0", configured "2"'),
    ("mac", lambda e: set_link(e.pod, mac="02:00:00:00:00:0c"),
     f'mac of "eth0" is 02:00:00:00:00:0c, configured {MAC}'),
    ("mtu", lambda e: set_link(e.pod, mtu=1280), 'mtu of "eth0" is 1280, configured 1400'),
    ("promisc", lambda e: set_link(e.pod, promisc=False),
     'promisc of "eth0" is false, configured true'),
    ("allmulti", lambda e: set_link(e.pod, allmulti=True),
     'allmulti of "eth0" is true, configured false'),
    ("txQLen", lambda e: set_link(e.pod, txqlen=3), 'txQLen of "eth0" is 3, configured 77'),
])
def test_check_fails_after_a_change_behind_its_back(tuning, env, what, change, words):
    c = conf(env, sysctl={"net.core.somaxconn": "500", "net.ipv4.conf.IFNAME.rp_filter": "2"},
             mac=MAC, mtu=1400, promisc=True, allmulti=False, txQLen=77)
    run(tuning, "ADD", c, env)
    assert run(tuning, "CHECK", c, env) is None
    change(env)
    err = fails(tuning, "CHECK", c, env)
    assert err.code == 999
    assert words in err.msg, err.msg


def test_check_missing_link(tuning, env):
    err = fails(tuning, "CHECK", conf(env), env, ifname="nope0")
    assert err.code == 999 and '"nope0"' in err.msg


# --- DEL when things are gone ------------------------------------------------------------


def test_del_when_the_netns_is_gone(tuning, env):
    c = conf(env, mac=MAC, sysctl={"net.core.somaxconn": "500"})
    run(tuning, "ADD", c, env)
    remove_netns(env.pod)
    assert run(tuning, "DEL", c, env) is None
    assert not os.path.exists(env.state_file)
    assert run(tuning, "DEL", c, env, netns="") is None


def test_del_when_the_netns_path_is_no_longer_a_namespace(tuning, env, tmp_path):
    c = conf(env, mac=MAC)
    run(tuning, "ADD", c, env)
    stale = tmp_path / "stale-netns"
    stale.write_text("")
    assert run(tuning, "DEL", c, env, netns=str(stale)) is None
    assert not os.path.exists(env.state_file)


def test_del_when_the_interface_is_gone_still_restores_namespace_sysctls(tuning, env):
    orig = sysctl(env.pod, "net/core/somaxconn")
    c = conf(env, mac=MAC, mtu=1400,
             sysctl={"net.core.somaxconn": "500", "net.ipv4.conf.IFNAME.rp_filter": "2"})
    run(tuning, "ADD", c, env)
    with NetNS.open(env.pod.path) as n, n.iproute() as ipr:
        netlink.delete_link(ipr, "eth0")
    assert run(tuning, "DEL", c, env) is None
    assert sysctl(env.pod, "net/core/somaxconn") == orig
    assert not os.path.exists(env.state_file)


def test_del_without_a_saved_file(tuning, env):
    assert run(tuning, "DEL", conf(env, with_prev=False, mac=MAC), env) is None
    assert link(env.pod)["mac"] == ORIG_MAC, "nothing saved, nothing to restore"


# --- GC --------------------------------------------------------------------------------


def _write_state(data_dir: str, cid: str, ifname: str, network: str | None) -> str:
    os.makedirs(data_dir, exist_ok=True)
    doc = {"mtu": 1500}
    if network is not None:
        doc.update(network=network, containerID=cid, ifname=ifname)
    p = os.path.join(data_dir, f"{cid}_{ifname}.json")
    with open(p, "w") as fp:
        json.dump(doc, fp)
    return os.path.basename(p)


def test_gc_removes_files_of_attachments_not_listed(tuning, env):
    keep = _write_state(env.data_dir, "a", "eth0", NET)
    gone = [_write_state(env.data_dir, "b", "eth0", NET),
            _write_state(env.data_dir, "a", "net1", NET)]
    other = _write_state(env.data_dir, "c", "eth0", "othernet")
    go_made = _write_state(env.data_dir, "d", "eth0", None)
    c = {"cniVersion": "1.1.0", "name": NET, "type": "tuning", "dataDir": env.data_dir,
         "cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}]}
    assert run_plugin(tuning, "GC", c, container_id="", netns="", ifname="",
                      node=env.node) is None
    assert sorted(os.listdir(env.data_dir)) == sorted([keep, other, go_made])
    assert not set(gone) & set(os.listdir(env.data_dir))


def test_gc_needs_the_list_and_a_null_list_means_none(tuning, env):
    _write_state(env.data_dir, "a", "eth0", NET)
    c = {"cniVersion": "1.1.0", "name": NET, "type": "tuning", "dataDir": env.data_dir}
    run1 = run_plugin_raw(tuning, "GC", c, container_id="", netns="", ifname="", node=env.node)
    assert run1.exit_code == 1 and run1.doc["code"] == 7
    assert os.listdir(env.data_dir)
    c["cni.dev/valid-attachments"] = None
    run_plugin(tuning, "GC", c, container_id="", netns="", ifname="", node=env.node)
    assert os.listdir(env.data_dir) == []


def test_gc_after_a_real_add(tuning, env):
    run(tuning, "ADD", conf(env, mac=MAC), env)
    c = {"cniVersion": "1.1.0", "name": NET, "type": "tuning", "dataDir": env.data_dir,
         "cni.dev/valid-attachments": [{"containerID": CID, "ifname": "eth0"}]}
    run_plugin(tuning, "GC", c, container_id="", netns="", ifname="", node=env.node)
    assert os.path.exists(env.state_file)
    c["cni.dev/valid-attachments"] = []
    run_plugin(tuning, "GC", c, container_id="", netns="", ifname="", node=env.node)
    assert not os.path.exists(env.state_file)


# --- interop with the Go tuning (1.1.1: no txQLen, no allowlist) --------------------------


def test_go_saves_we_restore(go_yardstick, tuning, env):
    go = go_yardstick.exe("tuning")
    c = conf(env, "1.0.0", mac=MAC, mtu=1400, promisc=True, allmulti=True)
    result = run(go, "ADD", c, env)
    assert result_mac(result) == MAC
    assert link(env.pod)["mtu"] == 1400
    assert run(tuning, "CHECK", c, env) is None
    run(tuning, "DEL", c, env)
    assert link(env.pod) == {"mac": ORIG_MAC, "mtu": 1500, "promisc": False, "allmulti": False,
                             "txqlen": 1000}
    assert not os.path.exists(env.state_file)


def test_we_save_go_restores(go_yardstick, tuning, env):
    go = go_yardstick.exe("tuning")
    c = conf(env, "1.0.0", mac=MAC, mtu=1400, promisc=True, sysctl={"net.core.somaxconn": "500"})
    run(tuning, "ADD", c, env)
    assert run(go, "CHECK", c, env) is None
    run(go, "DEL", c, env)
    assert link(env.pod)["mac"] == ORIG_MAC and link(env.pod)["mtu"] == 1500
    assert not link(env.pod)["promisc"]
    assert not os.path.exists(env.state_file)


# --- the spec's dbnet example: bridge -> tuning --------------------------------------------


def test_dbnet_chain_bridge_then_tuning(bridge_plugin, tuning, node_netns, pod_netns, tmp_path):
    bridge, bridge_path, version = bridge_plugin
    ipam_dir = tmp_path / "ipam"
    env = Env(node_netns, pod_netns, str(tmp_path / "tuning-data"))
    common = {"container_id": CID, "netns": pod_netns.path, "ifname": "eth0",
              "node": node_netns}
    bridge_conf = {"cniVersion": version, "name": "dbnet", "type": "bridge", "bridge": "cni0",
                   "keyA": ["some more", "plugin specific", "configuration"],
                   "ipam": {"type": "host-local", "subnet": "10.1.0.0/16",
                            "gateway": "10.1.0.1", "dataDir": str(ipam_dir)},
                   "dns": {"nameservers": ["10.1.0.1"]}}
    bridge_result = run_plugin(bridge, "ADD", bridge_conf, cni_path=bridge_path, **common)
    container = next(i for i in bridge_result["interfaces"] if i.get("sandbox"))
    assert container["name"] == "eth0"
    bridge_mac = container["mac"]
    somaxconn = sysctl(pod_netns, "net/core/somaxconn")

    tuning_conf = {"cniVersion": version, "name": "dbnet", "type": "tuning",
                   "sysctl": {"net.core.somaxconn": "500"},
                   "runtimeConfig": {"mac": "00:11:22:33:44:66"},
                   "dataDir": env.data_dir, "prevResult": bridge_result}
    result = run_plugin(tuning, "ADD", tuning_conf, **common)
    expected = json.loads(json.dumps(bridge_result))
    for iface in expected["interfaces"]:
        if iface.get("sandbox"):
            iface["mac"] = "00:11:22:33:44:66"
    assert result == expected, "the bridge's result, only the container MAC changed"
    assert link(pod_netns)["mac"] == "00:11:22:33:44:66"
    assert sysctl(pod_netns, "net/core/somaxconn") == "500"

    # CHECK and DEL as a runtime runs them: the final result as prevResult, DEL in reverse.
    check_bridge = {**bridge_conf, "prevResult": result}
    assert run_plugin(bridge, "CHECK", check_bridge, cni_path=bridge_path, **common) is None
    assert run_plugin(tuning, "CHECK", {**tuning_conf, "prevResult": result}, **common) is None
    run_plugin(tuning, "DEL", {**tuning_conf, "prevResult": result}, **common)
    assert link(pod_netns)["mac"] == bridge_mac
    assert sysctl(pod_netns, "net/core/somaxconn") == somaxconn
    run_plugin(bridge, "DEL", check_bridge, cni_path=bridge_path, **common)
    with NetNS.open(pod_netns.path) as n, n.iproute() as ipr:
        assert netlink.find_link(ipr, "eth0") is None


def test_the_config_version_in_any_case_is_the_result_version(tuning, env):
    """Go reads ``CNIVERSION`` as ``cniVersion`` (keys match case-insensitively,
    the last one wins), and so do the config model, the checks before the first
    side effect and the result writer: with a prevResult that has no IPs, a
    1.0.0 config is answered at 1.0.0. It was checked at 1.0.0 and written at
    0.1.0 ("cannot convert"), after the sysctl was set and the saved-values
    file written (issue 33, item 3; found by fuzzing)."""
    before = snapshot(env)
    c = conf(env, with_prev=False, sysctl={"net.core.somaxconn": "500"})
    del c["cniVersion"]
    c["CNIVERSION"] = "1.0.0"
    c["prevResult"] = {**prev(env, "1.0.0"), "ips": []}
    result = run(tuning, "ADD", c, env)
    assert result["cniVersion"] == "1.0.0" and "ips" not in result, result
    assert sysctl(env.pod, "net/core/somaxconn") == "500"
    assert run(tuning, "DEL", c, env) is None
    assert snapshot(env) == before and not os.path.exists(env.state_file)

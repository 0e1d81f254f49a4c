"""The CLI is safe by default (issue 17, point 10), through the real
`cni-skel` executable with our real plugins (bridge + host-local, tuning,
portmap) run inside a node namespace made by the test, pods in namespaces
beside it:

* ``gc`` without ``--valid`` or ``--yes`` is a dry run: host-local's address
  files, tuning's saved files, the nftables entries of bridge and portmap
  and the result cache are left exactly as they were; ``--valid`` and
  ``--yes`` act.
* ``validate`` runs each plugin's own config checks (and its IPAM's), so a
  config ADD rejects is invalid, with the code and message ADD gives; a
  plugin that is not ours is "not checked" (exit 3), never "valid".
* ``status`` of a list below cniVersion 1.1.0 says the plugins were not
  asked (exit 3), and host-local was indeed not asked (STATUS creates its
  store directory).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from cni_skel.harness import nft_table

CLI = os.path.join(os.path.dirname(sys.executable), "cni-skel")
NET = "safenet"
SUBNET = "10.77.0.0/24"
BRIDGE = "cnsksafe0"
NFT_TABLES = (("inet", "cni_skel_bridge"), ("inet", "cni_portmap"))


@pytest.fixture
def cli(tmp_path, cni_bin, node_netns):
    class C:
        pass

    c = C()
    c.tmp = tmp_path
    c.conf = tmp_path / "net.d"
    c.conf.mkdir()
    c.cache = tmp_path / "cache"
    c.ipam = tmp_path / "ipam"
    c.tuning = tmp_path / "tuning"
    c.node = node_netns
    c.bin = cni_bin
    # os.environ carries the warm mode's "worker required" to the launchers.
    c.env = {**os.environ, "NETCONFPATH": str(c.conf), "CNI_PATH": cni_bin,
             "CNI_SKEL_CACHE_DIR": str(c.cache)}

    def write(version="1.1.0", bridge=None, ipam=None, tuning=None, portmap=None):
        ipam_conf = {"type": "host-local", "ranges": [[{"subnet": SUBNET}]],
                     "dataDir": str(c.ipam), **(ipam or {})}
        doc = {"cniVersion": version, "name": NET, "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
             "ipam": ipam_conf, **(bridge or {})},
            {"type": "tuning", "mtu": 1400, "dataDir": str(c.tuning), **(tuning or {})},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True,
             **(portmap or {})},
        ]}
        (c.conf / f"10-{NET}.conflist").write_text(json.dumps(doc))

    def run(*args, env=None):
        argv = [CLI, *args]
        if args[0] in ("add", "del", "gc", "status"):
            argv[2:2] = ["--plugin-netns", c.node.path]
        proc = subprocess.run(argv, capture_output=True, text=True, env={**c.env, **(env or {})},
                              timeout=120, check=False)
        assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
        return proc

    def add(cid, pod, port):
        caps = {"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]}
        proc = run("add", "--container-id", cid, "--cap-args", json.dumps(caps), NET, pod.path)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    c.write, c.run, c.add = write, run, add
    return c


def addresses(c) -> dict[str, str]:
    """host-local's allocations of the network: address -> owner (ID/ifname)."""
    d = c.ipam / NET
    if not d.is_dir():
        return {}
    return {p.name: "/".join(p.read_bytes().decode().split("\r\n")) for p in d.glob("10.77.0.*")}


def nft_entries(c) -> set[tuple[str, str, str]]:
    """(table, set or map, comment) of every element of bridge's and portmap's
    tables in the node namespace: each comment is an attachment's tag."""
    out = set()
    for family, name in NFT_TABLES:
        table = nft_table(c.node, family, name)
        if table is None:
            continue
        for obj in [*table.sets, *table.maps]:
            for _, _, comment in table.entries(obj):
                out.add((name, obj, comment or ""))
    return out


def files(d) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def snapshot(c) -> dict:
    return {"addresses": addresses(c), "nft": nft_entries(c),
            "cache": files(c.cache / "results"), "tuning": files(c.tuning)}


def tags(c) -> dict[str, set[str]]:
    """Attachment tags (``<containerID>/<ifname>``) per table."""
    out: dict[str, set[str]] = {name: set() for _, name in NFT_TABLES}
    for table, _, comment in nft_entries(c):
        if comment.endswith("/eth0"):
            out[table].add(comment)
    return out


def mapped_ports(c) -> set[int]:
    """Host ports named by portmap's per-attachment records."""
    return {int(port) for _, _, comment in nft_entries(c)
            for port in re.findall(r"tcp/(\d+)", comment)}


# --- gc ------------------------------------------------------------------------------


def test_gc_is_a_dry_run_without_valid_or_yes(cli, netns_factory):
    c = cli
    c.write()
    pods = {cid: netns_factory("cnsk-pod") for cid in ("pod-a", "pod-b", "pod-c")}
    for port, (cid, pod) in enumerate(pods.items(), 18080):
        c.add(cid, pod, port)
    before = snapshot(c)
    assert sorted(before["addresses"].values()) == ["pod-a/eth0", "pod-b/eth0", "pod-c/eth0"]
    assert tags(c) == {name: {"pod-a/eth0", "pod-b/eth0", "pod-c/eth0"}
                       for _, name in NFT_TABLES}
    assert mapped_ports(c) == {18080, 18081, 18082}
    assert before["cache"] == [f"{NET}-{cid}-eth0" for cid in pods]
    assert before["tuning"] == [f"{cid}_eth0.json" for cid in pods]

    for args in (["gc", NET], ["gc", NET, pods["pod-a"].path]):      # the cnitool form too
        proc = c.run(*args)
        assert proc.returncode == 0, proc.stderr
        assert "dry run, nothing changed" in proc.stdout
        for cid, pod in pods.items():
            assert f"{cid}:eth0  netns {pod.path} exists" in proc.stdout
        assert "--yes" in proc.stdout and "--valid" in proc.stdout
        assert snapshot(c) == before

    # The runtime forgot pod-c: only the plugins' GC can release its state.
    os.unlink(c.cache / "results" / f"{NET}-pod-c-eth0")
    before["cache"].remove(f"{NET}-pod-c-eth0")
    proc = c.run("gc", "--dry-run", "--valid", "pod-a:eth0", NET)
    assert proc.returncode == 0 and "dry run" in proc.stdout, proc.stderr
    assert "pod-b:eth0" in proc.stdout and "kept (valid): pod-a:eth0" in proc.stdout
    assert snapshot(c) == before

    proc = c.run("gc", "--valid", "pod-a:eth0", NET)
    assert proc.returncode == 0, proc.stderr
    assert "stale attachments deleted: pod-b:eth0" in proc.stderr
    after = snapshot(c)
    assert list(after["addresses"].values()) == ["pod-a/eth0"]          # pod-c by plugin GC
    assert tags(c) == {name: {"pod-a/eth0"} for _, name in NFT_TABLES}
    assert mapped_ports(c) == {18080}
    assert after["cache"] == [f"{NET}-pod-a-eth0"]
    assert after["tuning"] == ["pod-a_eth0.json"]

    proc = c.run("gc", "--yes", NET)
    assert proc.returncode == 0, proc.stderr
    assert "stale attachments deleted: pod-a:eth0" in proc.stderr
    assert snapshot(c) == {"addresses": {}, "nft": set(), "cache": [], "tuning": []}


def test_gc_dry_run_below_110_says_no_plugin_gc(cli, pod_netns):
    c = cli
    c.write(version="1.0.0")
    c.add("pod-a", pod_netns, 18080)
    before = snapshot(c)
    proc = c.run("gc", NET)
    assert proc.returncode == 0, proc.stderr
    assert "no GC to the plugins: cniVersion 1.0.0" in proc.stdout
    assert "pod-a:eth0" in proc.stdout
    assert snapshot(c) == before and before["addresses"]


# --- validate ------------------------------------------------------------------------

ADD_ERROR = re.compile(r"^  code (\d+): (.*)$", re.M)

BAD = {
    "bridge-mtu-type": ({"bridge": {"mtu": "big"}}, "bridge", 7),
    "bridge-hairpin-and-promisc": ({"bridge": {"hairpinMode": True, "promiscMode": True}},
                                   "bridge", 7),
    "bridge-masq-backend": ({"bridge": {"ipMasqBackend": "bogus"}}, "bridge", 7),
    "ipam-subnet-type": ({"ipam": {"ranges": [[{"subnet": 10}]]}}, "bridge", 7),
    "ipam-range-start-outside": ({"ipam": {"ranges": [[{"subnet": SUBNET,
                                                         "rangeStart": "10.78.0.5"}]]}},
                                 "bridge", 7),
    "ipam-range-sets-overlap": ({"ipam": {"ranges": [[{"subnet": SUBNET}],
                                                     [{"subnet": "10.77.0.128/25"}]]}},
                                "bridge", 7),
    "ipam-route-type": ({"ipam": {"routes": [{"dst": "default"}]}}, "bridge", 7),
    "tuning-mtu-type": ({"tuning": {"mtu": "big"}}, "tuning", 7),
    "tuning-sysctl-outside-net": ({"tuning": {"sysctl": {"kernel.panic": "1"}}}, "tuning", 7),
    "portmap-snat-type": ({"portmap": {"snat": "yes"}}, "portmap", 7),
    "portmap-backend": ({"portmap": {"backend": "bogus"}}, "portmap", 7),
}
INDEX = {"bridge": 1, "tuning": 2, "portmap": 3}


@pytest.mark.parametrize("case", list(BAD))
def test_validate_rejects_what_add_rejects_with_the_same_message(cli, pod_netns, case):
    c = cli
    overrides, plugin, code = BAD[case]
    c.write(**overrides)
    proc = c.run("validate", NET)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not c.ipam.exists() and not c.cache.exists()              # validate wrote nothing
    checked = proc.stderr

    proc = c.run("add", "--container-id", "ctr1", NET, pod_netns.path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f'in plugin "{plugin}" ({INDEX[plugin]} of 3' in proc.stderr
    add_code, add_msg = ADD_ERROR.search(proc.stderr).groups()
    assert int(add_code) == code
    lines = [ln for ln in checked.splitlines()
             if ln.startswith(f'  - plugin {INDEX[plugin]} "{plugin}"')]
    assert any(ln.endswith(f": code {add_code}: {add_msg}") for ln in lines), (lines, add_msg)
    # The plugins reject DEL of that config too: clean up with a good one.
    c.write()
    assert c.run("del", "--container-id", "ctr1", NET, pod_netns.path).returncode == 0
    assert addresses(c) == {} and nft_entries(c) == set()


def test_validate_of_a_good_config_agrees_with_add(cli, pod_netns):
    c = cli
    c.write()
    proc = c.run("validate", NET)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("valid")
    assert "ipam host-local: ok (cni_skel_plugins.host_local:HostLocal)" in proc.stdout
    assert not c.ipam.exists()
    c.add("ctr1", pod_netns, 18080)
    assert list(addresses(c).values()) == ["ctr1/eth0"]


def test_validate_does_not_call_other_plugins_configs_valid(cli, go_cni_dir):
    c = cli
    c.write(version="1.0.0")
    # bridge and host-local are Go's here; tuning and portmap ours.
    mixed = c.tmp / "bin"
    mixed.mkdir()
    for name, where in (("bridge", go_cni_dir), ("host-local", go_cni_dir),
                        ("tuning", c.bin), ("portmap", c.bin)):
        (mixed / name).symlink_to(os.path.join(where, name))
    path = str(mixed)
    proc = c.run("validate", NET, env={"CNI_PATH": path})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"config: not checked: {mixed}/bridge is not a cni-skel plugin" in out
    assert f"ipam host-local: not checked: {mixed}/host-local" in out
    assert "config: ok (cni_skel_plugins.tuning:Tuning)" in out
    assert out.strip().splitlines()[-1].startswith("(only cni-skel plugins' configs")
    assert not any(ln.strip().startswith("valid") for ln in out.splitlines())
    # A problem in one of ours still makes it invalid (exit 1).
    c.write(version="1.0.0", portmap={"snat": "yes"})
    proc = c.run("validate", NET, env={"CNI_PATH": path})
    assert proc.returncode == 1
    assert 'plugin 3 "portmap": code 7: invalid network config: snat' in proc.stderr
    assert "also not checked:" in proc.stderr


# --- status --------------------------------------------------------------------------


def test_status_below_110_says_the_plugins_were_not_asked(cli):
    c = cli
    c.write(version="1.0.0")
    proc = c.run("status", NET)
    assert proc.returncode == 3, proc.stderr
    assert "plugins were not asked" in proc.stderr and "is ready" not in proc.stderr
    assert not c.ipam.exists()              # host-local's STATUS makes its store: not run
    c.write(version="1.1.0")
    proc = c.run("status", NET)
    assert proc.returncode == 0 and "is ready" in proc.stderr, proc.stderr
    assert (c.ipam / NET).is_dir()

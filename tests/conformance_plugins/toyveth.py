"""toyveth: a small veth plugin written without cni-skel's SDK (pyroute2 and
the standard library only) that keeps every rule the conformance kit
checks, or breaks exactly one of them when ``CNSK_TOY_BREAK`` names it:

  leak-veth       DEL leaves the node's veth end behind
  del-twice       a second DEL of an attachment fails
  traceback       a config that is not JSON gets a traceback on stdout
  wrong-code      an unknown CNI_COMMAND is answered code 7, not 4
  no-rollback     ADD leaves its veth when the IPAM plugin fails
  dup-addresses   addresses picked without a lock: ADDs at once share one
  invalid-result  ADD results give an address without its prefix length
  exit0-error     STATUS prints an Error object and exits 0

Config: ``dataDir`` (its attachments, one file each) and ``ipam`` (an IPAM
plugin found in CNI_PATH, called with the same config). Speaks 0.3.0 to
1.1.0. tests/test_conformance_kit.py runs the kit against each variant.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
import traceback

from pyroute2 import IPRoute

VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
BREAK = os.environ.get("CNSK_TOY_BREAK", "")
_ID = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")


class Failure(Exception):
    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code, self.msg, self.details = code, msg, details


def answer_error(exc: Failure, version: str, *, status: int = 1) -> None:
    sys.stdout.write(json.dumps({"cniVersion": version, "code": exc.code, "msg": exc.msg,
                                 "details": exc.details}) + "\n")
    sys.exit(status)


def names(cid: str, ifname: str) -> tuple[str, str]:
    digest = hashlib.sha1(f"{cid}/{ifname}".encode()).hexdigest()
    return "tv" + digest[:10], "tp" + digest[:10]


def delegate(conf: dict, verb: str) -> dict | None:
    """Run the IPAM plugin with our config (less prevResult: an IPAM plugin
    has no use for it) and environment, ``verb`` instead."""
    ipam_type = conf["ipam"]["type"]
    for d in os.environ.get("CNI_PATH", "").split(":"):
        exe = os.path.join(d, ipam_type)
        if d and os.access(exe, os.X_OK):
            break
    else:
        raise Failure(7, f"no IPAM plugin {ipam_type!r} in CNI_PATH")
    conf = {k: v for k, v in conf.items() if k != "prevResult"}
    proc = subprocess.run([exe], input=json.dumps(conf).encode(),
                          env={**os.environ, "CNI_COMMAND": verb}, capture_output=True,
                          timeout=30, check=False)
    doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    if proc.returncode != 0:
        err = doc if isinstance(doc, dict) else {}
        raise Failure(int(err.get("code", 999)), f"IPAM {verb}: {err.get('msg', 'failed')}",
                      str(err.get("details", "")))
    return doc


def state_path(conf: dict, cid: str, ifname: str) -> str:
    return os.path.join(conf["dataDir"], f"{cid}-{ifname}")


def tombstone(conf: dict, cid: str, ifname: str) -> str:
    # Outside dataDir: the kit watches that one for leftovers.
    return os.path.join(conf["dataDir"].rstrip("/") + ".deleted", f"{cid}-{ifname}")


def racy_address(conf: dict) -> str:
    """The lowest address of ipam.subnet no attachment holds, looked up
    without a lock and taken a moment later."""
    net = ipaddress.ip_network(conf["ipam"]["subnet"])
    held = set()
    for name in os.listdir(conf["dataDir"]):
        with open(os.path.join(conf["dataDir"], name)) as fp:
            held.add(json.load(fp)["address"])
    time.sleep(0.3)
    for host in list(net.hosts())[1:]:
        cidr = f"{host}/{net.prefixlen}"
        if cidr not in held:
            return cidr
    raise Failure(11, "no address left")


def cmd_add(conf: dict, version: str, cid: str, netns: str, ifname: str) -> dict:
    host, tmp = names(cid, ifname)
    os.makedirs(conf["dataDir"], exist_ok=True)
    with IPRoute() as ipr:
        ipr.link("add", ifname=host, kind="veth", peer=tmp)
        try:
            fd = os.open(netns, os.O_RDONLY)
            try:
                ipr.link("set", index=ipr.link_lookup(ifname=tmp)[0], net_ns_fd=fd)
            finally:
                os.close(fd)
            with IPRoute(netns=netns) as pod:
                index = pod.link_lookup(ifname=tmp)[0]
                try:
                    pod.link("set", index=index, ifname=ifname)
                except Exception as exc:
                    raise Failure(100, f"cannot name the interface {ifname}: {exc}") from None
            try:
                ipam = delegate(conf, "ADD")
            except Failure:
                if BREAK == "no-rollback":
                    raise
                ipr.link("del", index=ipr.link_lookup(ifname=host)[0])
                raise
            try:
                address = racy_address(conf) if BREAK == "dup-addresses" \
                    else ipam["ips"][0]["address"]
                ip = ipaddress.ip_interface(address)
                with IPRoute(netns=netns) as pod:
                    index = pod.link_lookup(ifname=ifname)[0]
                    pod.addr("add", index=index, address=str(ip.ip), prefixlen=ip.network.prefixlen)
                    pod.link("set", index=index, state="up")
                    pod_mac = pod.get_links(index)[0].get_attr("IFLA_ADDRESS")
                ipr.link("set", index=ipr.link_lookup(ifname=host)[0], state="up")
                host_mac = ipr.get_links(ipr.link_lookup(ifname=host)[0])[0] \
                    .get_attr("IFLA_ADDRESS")
                with open(state_path(conf, cid, ifname), "w") as fp:
                    json.dump({"address": address, "host": host}, fp)
            except Exception:
                delegate(conf, "DEL")
                raise
        except Exception:
            if BREAK != "no-rollback":
                for index in ipr.link_lookup(ifname=host):
                    ipr.link("del", index=index)
            raise
    entry = {"address": str(ip.ip) if BREAK == "invalid-result" else address, "interface": 1}
    if version != "1.0.0" and version != "1.1.0":
        entry["version"] = "4" if ip.version == 4 else "6"
    return {"cniVersion": version,
            "interfaces": [{"name": host, "mac": host_mac},
                           {"name": ifname, "mac": pod_mac, "sandbox": netns}],
            "ips": [entry], "dns": {}}


def cmd_del(conf: dict, cid: str, ifname: str) -> None:
    path = state_path(conf, cid, ifname)
    if BREAK == "del-twice" and os.path.exists(tombstone(conf, cid, ifname)):
        raise Failure(100, f"no attachment {cid}/{ifname}: deleted already")
    host, _ = names(cid, ifname)
    if BREAK != "leak-veth":
        with IPRoute() as ipr:
            for index in ipr.link_lookup(ifname=host):
                ipr.link("del", index=index)
    delegate(conf, "DEL")
    if os.path.exists(path):
        os.unlink(path)
    if BREAK == "del-twice":
        os.makedirs(os.path.dirname(tombstone(conf, cid, ifname)), exist_ok=True)
        open(tombstone(conf, cid, ifname), "w").close()


def cmd_check(conf: dict, cid: str, netns: str, ifname: str) -> None:
    path = state_path(conf, cid, ifname)
    if not os.path.exists(path):
        raise Failure(100, f"no attachment {cid}/{ifname}")
    with open(path) as fp:
        want = ipaddress.ip_interface(json.load(fp)["address"])
    with IPRoute(netns=netns) as pod:
        found = pod.link_lookup(ifname=ifname)
        if not found:
            raise Failure(100, f"{ifname} is gone from the pod")
        have = {(a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in pod.get_addr(index=found[0])}
    if (str(want.ip), want.network.prefixlen) not in have:
        raise Failure(100, f"{ifname} lacks {want}")


def cmd_gc(conf: dict) -> None:
    valid = {f"{a.get('containerID')}-{a.get('ifname')}"
             for a in conf.get("cni.dev/valid-attachments") or [] if isinstance(a, dict)}
    for name in os.listdir(conf["dataDir"]) if os.path.isdir(conf["dataDir"]) else []:
        if name not in valid:
            os.unlink(os.path.join(conf["dataDir"], name))
    delegate(conf, "GC")


def main() -> None:
    verb = os.environ.get("CNI_COMMAND", "")
    if not verb:
        sys.stderr.write("toyveth: a CNI plugin for the conformance kit's tests\n")
        return
    raw = sys.stdin.buffer.read()
    if verb == "VERSION":
        print(json.dumps({"cniVersion": "1.1.0", "supportedVersions": VERSIONS}))
        return
    version = "1.1.0"
    try:
        try:
            conf = json.loads(raw)
        except ValueError:
            if BREAK == "traceback":
                print(traceback.format_exc())
                sys.exit(1)
            raise Failure(6, "the config is not JSON") from None
        if not isinstance(conf, dict) or not isinstance(conf.get("name"), str):
            raise Failure(6, "the config is no object with a string name")
        version = conf.get("cniVersion") if isinstance(conf.get("cniVersion"), str) else "1.1.0"
        if version not in VERSIONS:
            raise Failure(1, "incompatible CNI versions", f'config is "{version}"')
        if verb not in ("ADD", "DEL", "CHECK", "STATUS", "GC"):
            raise Failure(7 if BREAK == "wrong-code" else 4, f"unknown CNI_COMMAND: {verb}")
        cid = os.environ.get("CNI_CONTAINERID", "")
        netns = os.environ.get("CNI_NETNS", "")
        ifname = os.environ.get("CNI_IFNAME", "")
        need = {"ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
                "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
                "DEL": ("CNI_CONTAINERID", "CNI_IFNAME")}.get(verb, ())
        for var in need:
            if not os.environ.get(var):
                raise Failure(4, f"required env variables [{var}] missing")
        if need and not _ID.match(cid):
            raise Failure(4, "invalid characters in containerID", cid)
        if need and (len(ifname) > 15 or ifname in (".", "..") or "/" in ifname):
            raise Failure(4, "invalid interface name", ifname)
        if verb == "ADD":
            print(json.dumps(cmd_add(conf, version, cid, netns, ifname)))
        elif verb == "DEL":
            cmd_del(conf, cid, ifname)
        elif verb == "CHECK":
            cmd_check(conf, cid, netns, ifname)
        elif verb == "GC":
            cmd_gc(conf)
        elif verb == "STATUS" and BREAK == "exit0-error":
            answer_error(Failure(50, "not ready"), version, status=0)
    except Failure as exc:
        answer_error(exc, version)
    except Exception as exc:  # any other failure is still an Error object
        answer_error(Failure(999, f"{type(exc).__name__}: {exc}"), version)


if __name__ == "__main__":
    main()

"""The Go reference plugins our plugins are compared with (issue 49).

Two sets, one place:

* ``1.1.1``: Debian's ``containernetworking-plugins`` in /usr/lib/cni
  (`make deps` installs it), always there;
* ``1.9.1``: upstream containernetworking/plugins v1.9.1, the newest
  release, which `make go-latest` builds from ``../shared/yardstick`` into
  a cache outside the repository, `GO_LATEST_DIR` (the env variable
  ``CNI_SKEL_GO_LATEST`` names another). A clone without ``../shared``
  has no such build: the suite compares with 1.1.1 alone and its header
  says so.

Tests take the ``go_yardstick`` fixture (tests/conftest.py), parametrized
over the sets present, or call `yardsticks` themselves.

Not a test module (tests/ is on sys.path through conftest.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: Debian's Go plugins (1.1.1 in bookworm).
GO_DEBIAN_DIR = "/usr/lib/cni"
#: Where `make go-latest` builds upstream v1.9.1 (its VERSION file names the build).
LATEST_ENV = "CNI_SKEL_GO_LATEST"
GO_LATEST_DIR = os.environ.get(LATEST_ENV, "/var/cache/cni-skel/go-plugins-v1.9.1")


@dataclass(frozen=True)
class Yardstick:
    """One set of Go plugins: ``version`` (``"1.1.1"``, ``"1.9.1"``) and
    the directory holding its executables."""

    version: str
    dir: str

    def exe(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def has(self, name: str) -> bool:
        return os.access(self.exe(name), os.X_OK)

    @property
    def id(self) -> str:
        return f"go{self.version}"


DEBIAN = Yardstick("1.1.1", GO_DEBIAN_DIR)
LATEST = Yardstick("1.9.1", GO_LATEST_DIR)


def yardsticks() -> list[Yardstick]:
    """The sets present: Debian's always (its absence is the caller's
    failure to report), 1.9.1 when built."""
    return [DEBIAN, *([LATEST] if LATEST.has("loopback") else [])]


def header() -> str:
    """One line for pytest's header: which sets the run compares with."""
    if LATEST.has("loopback"):
        return f"Go yardsticks: 1.1.1 ({DEBIAN.dir}) and 1.9.1 ({LATEST.dir})"
    return (f"Go yardsticks: 1.1.1 ({DEBIAN.dir}) only; no 1.9.1 build in {LATEST.dir} "
            "(`make go-latest` builds it from ../shared/yardstick)")


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


@dataclass(frozen=True)
class Difference:
    """One way a later Go answers other than 1.1.1 (and, so far, we):
    ``since`` is the first upstream release that does, ``why`` says what
    and where it comes from."""

    since: str
    why: str


#: Every difference between the yardsticks that a comparison accepts, keyed
#: by (plugin, what); a test applies one by name (`differs`, `as_go`), so
#: none is hidden and a 1.1.1 run stays exactly as strict as before.
KNOWN_DIFFERENCES: dict[tuple[str, str], Difference] = {
    **{(plugin, "empty dns"): Difference(
        "1.6.0", "a 1.0.0+ result without DNS leaves out `\"dns\": {}` (containernetworking/cni "
                 "v1.2.0, PR #1039: types100.Result.MarshalJSON drops an empty DNS; plugins "
                 "vendor cni >= 1.2 from v1.6.0); 0.x results still print it. Ours do as "
                 "1.6+; 1.1.1 prints it")
       for plugin in ("static", "ptp", "macvlan", "ipvlan", "vlan", "host-device", "loopback",
                      "bridge", "host-local", "dhcp", "tap")},
    **{(plugin, "empty dns"): Difference(
        "1.6.0", "passes a 1.0.0+ prevResult through re-encoded, the same MarshalJSON dropping "
                 "its empty `\"dns\": {}`; ours pass prevResult on as received")
       for plugin in ("firewall", "sbr", "bandwidth", "vrf")},
    **{(plugin, "key order"): Difference(
        "1.6.0", "a 1.0.0+ result is printed with its keys sorted at every level (the same "
                 "MarshalJSON round trips it through a map), not in the struct's order")
       for plugin in ("static", "ptp")},
    ("bridge", "vlanTrunk"): Difference(
        "1.3.0", "reads vlanTrunk (090af7db): the pod's port gets the trunk's VLANs tagged and "
                 "the bridge filters VLANs, as ours; 1.1.1 predates the key and ignores it"),
    ("vrf", "routes copied to the table"): Difference(
        "1.4.0", "ADD copies the interface's universe-scope routes into the VRF's table "
                 "(ca12d49b) but not ptp's scope-link gateway /32, so a route via that gateway "
                 "fails: 'could not add route ... network is unreachable', ADD refused; 1.1.1 "
                 "copies nothing, ours copies all (the /32 first)"),
    ("vrf", "CHECK looks"): Difference(
        "1.3.0", "CHECK fails (999) when the interface is not in the VRF, 'failed to find "
                 "<if> associated to vrf <name>' (177e0bf2 returns the error 1.1.1 dropped); "
                 "1.1.1 passes whatever it finds; ours fails with 1.1.1's text, 'Failed ...'"),
    ("host-device", "DEL clears the alias"): Difference(
        "1.6.0", "DEL (moveLinkOut through a temporary netns, a4b80cc6) unsets the alias the "
                 "ADD set; 1.1.1 left the node name in it. Ours clears it too"),
    ("host-device", "second DEL"): Difference(
        "1.6.0", "a second DEL still fails (999; nothing in the pod to move out), in other "
                 "words: 'failed to find \"eth0\" in containerNS: Link not found' (moveLinkOut, "
                 "a4b80cc6); 1.1.1: 'failed to find \"eth0\": Link not found'. Ours succeeds, "
                 "as the spec asks of a DEL"),
    ("host-device", "ifname taken"): Difference(
        "1.6.0", "CNI_IFNAME taken in the pod: renamed in a temporary netns (a4b80cc6), the "
                 "move into the pod fails ('failed to move \"eth0\" (host: \"hdev0\") to "
                 "container NS: file exists') and the device goes back to the node; 1.1.1 "
                 "(and ours, in words) 'failed to rename device', 1.1.1 leaving it in the pod"),
    ("host-device", "kernelpath without net"): Difference(
        "1.5.0", "kernelpath with no net directory: 'failed to read directory <p>/net: "
                 "\"open ...: no such file or directory\"' (linkFromPath, d34720b5); 1.1.1 "
                 "and ours: 'failed to find network devices at \"<p>/net\"'"),
    ("host-device", "pciBusID without a netdev"): Difference(
        "1.5.0", "a PCI device whose net directory is empty here: 'failed to find network "
                 "device in path <netDir>' (linkFromPath, d34720b5); 1.1.1 and ours: 'failed "
                 "to find device name for pci address <addr>'"),
    ("host-device", "deviceID not found"): Difference(
        "1.5.0", "runtimeConfig.deviceID neither a PCI nor an auxiliary-bus device: 'runtime "
                 "config DeviceID <id> not found or unsupported' (handleDeviceID, d34720b5); "
                 "1.1.1 and ours: 'error with host device: lstat /sys/bus/pci/devices/<id>: ...'"),
    ("portmap", "masqAll"): Difference(
        "1.2.0", "reads masqAll (#772): hairpin marks match any source (0.0.0.0/0, ::/0) and "
                 "the localhost mark goes; 1.1.1 predates the key and ignores it"),
    ("static", "cniVersion 1.1.0"): Difference(
        "1.6.0", "speaks CNI 1.1.0 (cni v1.2.x's version.All) and answers the 1.0.0 document "
                 "for it; 1.1.1 refuses it with code 1"),
    ("static", "GC and STATUS"): Difference(
        "1.6.0", "answers GC and STATUS (skel.CNIFuncs, cni v1.2.3), exit 0; 1.1.1's skel "
                 "knows neither verb and fails them"),
}


def differs(y: Yardstick, plugin: str, what: str) -> bool:
    """Whether ``y`` shows the known difference ``(plugin, what)`` (its
    version is ``since`` or later); a pair not in `KNOWN_DIFFERENCES` is a
    KeyError, so each difference a test accepts is named there."""
    return _release(y.version) >= _release(KNOWN_DIFFERENCES[(plugin, what)].since)


def printed(doc: dict) -> dict:
    """A result ``doc`` as ours (and Go >= 1.6) print it: ``dns`` (``{}``
    when missing) in the 0.x shapes; in 1.x only when not empty."""
    out = {k: v for k, v in doc.items() if k != "dns"}
    dns = doc.get("dns") or {}
    if dns or not str(doc.get("cniVersion", "")).startswith("1."):
        out["dns"] = dns
    return out


def as_go(y: Yardstick, plugin: str, doc: dict | None) -> dict | None:
    """Our result ``doc`` of ``plugin`` as ``y``'s Go prints it: each known
    result difference of ``plugin`` that ``y`` shows applied (for 1.1.1,
    none: ``doc`` itself)."""
    if doc is None or not isinstance(doc, dict):
        return doc
    out = dict(doc)
    if str(out.get("cniVersion", "")).startswith("1.") \
            and (plugin, "empty dns") in KNOWN_DIFFERENCES:
        if differs(y, plugin, "empty dns"):
            if out.get("dns") == {}:  # a prevResult ours passed on as received
                del out["dns"]
        elif "dns" not in out:  # before 1.6 Go printed it, last
            out["dns"] = {}
    return out


def key_order(y: Yardstick, plugin: str, doc: dict) -> list[str]:
    """The top-level keys of ``doc`` (ours, `as_go` applied) in the order
    ``y``'s Go prints them: ours, or sorted where ``y`` shows the known
    ``(plugin, "key order")`` difference (1.0.0+ results)."""
    if str(doc.get("cniVersion", "")).startswith("1.") and differs(y, plugin, "key order"):
        return sorted(doc)
    return list(doc)

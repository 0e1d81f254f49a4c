"""The ``tuning`` meta plugin: sysctls and link settings of the container's
interface, restored on DEL.

A drop-in for the Go reference tuning (containernetworking/plugins,
plugins/meta/tuning): same executable name, same config keys, the same
saved-values file. The module is light on purpose (the skel and this class);
pydantic models, pyroute2 and the verbs load when a verb runs.
"""

from __future__ import annotations

from cni_skel.skel import Plugin

__all__ = ["Tuning", "main"]


class Tuning(Plugin):
    """tuning, chained after an interface plugin (prevResult is required).

    Config (see `cni_skel_plugins.tuning.config`): ``sysctl`` {key: value},
    ``mac``, ``mtu`` (bytes), ``promisc``, ``allmulti``, ``txQLen``
    (packets), ``dataDir`` (default /run/cni/tuning). MAC precedence:
    ``mac`` < CNI_ARGS ``MAC`` < ``runtimeConfig.mac`` < ``args.cni.mac``;
    ``args.cni`` may override ``sysctl`` (key by key), ``promisc``, ``mtu``,
    ``allmulti`` and ``txQLen``.

    Sysctl keys: ``.`` or ``/`` separated (a key with ``/`` is split on
    ``/`` only, so ``net/ipv4/conf/eth0.100/rp_filter`` works); a component
    ``IFNAME`` becomes CNI_IFNAME. Only ``net.*`` keys, only files under
    /proc/sys/net of CNI_NETNS, never in PID 1's namespace: a namespace
    other than the host's shows only per-namespace net sysctls. When
    /etc/cni/tuning/allowlist.conf exists, each key must match one of its
    regexes (one a line, Python ``re.search``; the key as written or its
    dotted spelling).

    ADD: checks every key, reads every original value, saves them to
    ``<dataDir>/<containerID>_<ifname>.json`` (see `.backup`), then sets the
    sysctls and the link settings in Go's order (MAC, promisc, MTU,
    allmulti, txQLen). If one fails, what was already changed is put back
    and the file restored to its earlier state before the error goes out.
    Returns prevResult with CNI_IFNAME's MAC updated when a MAC was set.
    CHECK: every configured sysctl (compared field by field) and link
    setting has its value. DEL: restores link settings and sysctls from the
    file, best effort as Go (problems go to stderr), and removes it; a gone
    netns, link or file is success. GC (1.1.0): removes this network's
    files of attachments not in ``cni.dev/valid-attachments``.

    Errors:

    * 1 prevResult has no IP and cniVersion is 0.1.0/0.2.0, whose results
      cannot carry that: answered before anything is touched. (Go echoes
      an IP-less prevResult labelled 0.x as ``{"cniVersion", "dns"}``, and
      fails to parse, 999, one labelled 0.3.0 or later.)
    * 7 invalid config, naming the key: wrong types, a bad MAC (multicast
      or zero too), a key outside net.* or /proc/sys/net (``..``, absolute,
      ``kernel.*``), two spellings of one sysctl, a key the allowlist does
      not allow (or a bad regex in it), a sysctl that does not exist or is
      read-only in the container's namespace, a value the kernel refuses
      (sysctl write: EINVAL, ERANGE, EACCES, EPERM; netlink: EINVAL, ERANGE,
      EADDRNOTAVAIL, EOPNOTSUPP); also a missing prevResult (ADD, CHECK).
      Go answers 999 for all but decoding errors.
    * 3 CNI_NETNS does not exist (ADD, CHECK); 4 bad CNI_ARGS (``MAC``);
      5 saved-values file or allowlist I/O.
    * 999 CNI_IFNAME missing, a CHECK mismatch (naming the setting, the
      configured and the current value), other kernel errors.

    Deviations from Go, on purpose: ``promisc: false`` turns promiscuous
    mode off (Go ignores it) and CHECK compares promisc only when it is set
    (Go fails CHECK of an unset promisc on a promiscuous link); sysctls are
    restored on DEL too (Go restores link settings only); DEL also removes
    the file when the netns or link is gone (Go leaves it); a repeated ADD
    keeps the first saved originals; keys with ``/`` are not split on dots;
    MACs are compared normalised; GC exists.
    """

    name = "tuning"
    about = "CNI tuning plugin (cni-skel)"
    config_model = "cni_skel_plugins.tuning.config:TuningConf"
    args_model = "cni_skel_plugins.tuning.config:TuningArgs"
    verbs = "cni_skel_plugins.tuning.verbs"


def main() -> None:
    """Executable entry point (``cni-skel install`` writes a script calling it)."""
    Tuning.main()


if __name__ == "__main__":
    main()

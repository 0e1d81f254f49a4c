"""The ``host-local`` IPAM plugin: addresses from configured ranges, recorded
in files on the node.

A drop-in for the Go reference host-local (containernetworking/plugins,
plugins/ipam/host-local): same config keys, same store layout and bytes, the
same lock file, so both implementations can share one ``dataDir``. The
module is light on purpose (the skel and this class); the config models,
allocator and store load in the verbs. It never imports pyroute2: an IPAM
plugin does no netlink.
"""

from __future__ import annotations

from cni_skel.skel import Plugin

__all__ = ["HostLocal", "main"]


class HostLocal(Plugin):
    """host-local: one address per range set, round-robin, stored on disk.

    Config: see `cni_skel_plugins.host_local.config` (``ranges``, the legacy
    ``subnet``/``rangeStart``/``rangeEnd``/``gateway``, ``routes``,
    ``dataDir``, ``resolvConf``; ``runtimeConfig.ips``/``ipRanges``,
    ``args.cni.ips``, CNI_ARGS ``IP``). Store: `.store`.

    ADD: for each range set, the requested address it contains, else the
    first free one after ``last_reserved_ip.N`` (Go's round-robin; the
    gateway, and for IPv4 the network and broadcast addresses, are never
    handed out). All sets and requests are decided under the lock before
    anything is written: a refused ADD allocates nothing. Result: ``ips``
    (address/prefix, gateway), ``routes``, ``dns``, in the config's version.
    Errors:

    * 50 ``failed to allocate for range N: no IP addresses available in
      range set: A-B`` (Go's text; Go answers 999). The spec defines 50 as
      "the plugin is not available (cannot service ADD requests)", which is
      exactly an exhausted set; it is what STATUS answers for the same state,
      so a runtime learns the same thing either way. Not 7: the config is
      valid (the same one served the previous ADD). Not 11: nothing clears
      up by waiting, only a DEL or GC frees an address.
    * 4 a second ADD for the same (CNI_CONTAINERID, CNI_IFNAME) holding an
      address in a set (Go's text, Go 999): the spec forbids it, and these
      two variables are what is wrong. Checked with or without a requested
      address (Go checks only without).
    * a requested address outside every set, two in one set, the gateway,
      an IPv4 network/broadcast address, or one another container holds
      (Go's texts, Go 999): 4 when it came from CNI_ARGS, 7 from the config.
    * 7 invalid config (``invalid range set N: ...``, ``range set N overlaps
      with M``, ``no IP ranges specified``...); 5 store I/O errors.

    DEL: release (ID, ifname)'s addresses in the network's directory (Go:
    new-format files, else old ID-only ones). Idempotent; a missing
    ``dataDir`` is fine; ranges are not validated (only the store matters).
    CHECK: the container holds an address in every set (3 when it holds
    none, 999 when a set is missing; Go only asks for one, with 999).
    GC (1.1.0): release allocations not in ``cni.dev/valid-attachments``.
    STATUS (1.1.0): 50 when the store is not writable or a set is exhausted.
    """

    name = "host-local"
    about = "CNI host-local IPAM plugin (cni-skel)"
    config_model = "cni_skel_plugins.host_local.config:HostLocalConf"
    args_model = "cni_skel_plugins.host_local.config:HostLocalArgs"
    verbs = "cni_skel_plugins.host_local.verbs"


def main() -> None:
    """Executable entry point (``cni-skel install`` writes a script calling it)."""
    HostLocal.main()


if __name__ == "__main__":
    main()

"""The tuning plugin: `Tuning` and the sysctl and link helpers it uses.

Sysctls under /proc/sys/net belong to the network namespace of the thread
that opens them, so every sysctl is read and written inside CNI_NETNS
(`NetNS.enter`); link settings go through a netlink socket bound there.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from cni_skel import netlink
from cni_skel.env import CmdArgs
from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, ERR_IO_FAILURE, CNIError
from cni_skel.netns import NetNS, open_netns
from cni_skel.rollback import rollback
from cni_skel.skel import Plugin
from cni_skel.sysctl import sysctl_path
from cni_skel.types import Result, check_expressible

from . import backup
from .config import (
    ALLOWLIST_FILE,
    DEFAULT_DATA_DIR,
    Sysctl,
    TuningArgs,
    TuningConf,
    check_allowed,
    load_allowlist,
    load_settings,
    split_sysctl_key,
)

__all__ = ["Tuning"]

NET_ROOT = "/proc/sys/net"
#: The namespace we never write sysctls into (see `_refuse_host_netns`).
HOST_NETNS = "/proc/1/ns/net"
# Errnos meaning "the kernel refuses this value / this key", not "it broke":
# code 7. A sysctl that is read-only here answers EACCES (root included).
_SYSCTL_REJECTED = (errno.EINVAL, errno.ERANGE, errno.EACCES, errno.EPERM)
_LINK_REJECTED = (errno.EINVAL, errno.ERANGE, errno.EADDRNOTAVAIL, errno.EOPNOTSUPP)
# Backup key -> netlink.link_set keyword.
_LINK_KW = {"mac": "mac", "promisc": "promisc", "mtu": "mtu", "allmulti": "allmulti",
            "txQLen": "txqlen"}


def _strerror(exc: OSError) -> str:
    msg = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    return msg[:1].lower() + msg[1:]


def _warn(msg: str) -> None:
    print(f"tuning: {msg}", file=sys.stderr)


# --- sysctls -------------------------------------------------------------------


def _sysctl_file(key: str, rel: str) -> str:
    """The /proc/sys/net file for ``rel``; code 7 naming ``key`` if it
    would leave /proc/sys/net (symlinks included)."""
    try:
        path = sysctl_path(rel)
    except CNIError as exc:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, f'tuning: sysctl "{key}": {exc.msg}') from None
    if not os.path.realpath(path).startswith(NET_ROOT + "/"):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       f'tuning: sysctl "{key}": resolves outside {NET_ROOT}')
    return path


def _read_sysctl(key: str, path: str) -> str:
    """Current value, trailing newline dropped. Code 7 naming ``key`` when
    there is no such sysctl here, 999 for other read errors."""
    try:
        with open(path, "rb") as fp:
            return fp.read().decode(errors="replace").rstrip("\n")
    except (FileNotFoundError, NotADirectoryError):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       f'tuning: sysctl "{key}" does not exist in the container\'s network '
                       "namespace",
                       f"{path}: net.* sysctls that are not per network namespace exist "
                       "only in the host's") from None
    except IsADirectoryError:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       f'tuning: sysctl "{key}" is a directory, not a sysctl', path) from None
    except OSError as exc:
        raise CNIError(ERR_INTERNAL, f'tuning: cannot read sysctl "{key}": {_strerror(exc)}',
                       path) from None


def _write_sysctl(key: str, path: str, value: str) -> None:
    """One write(2) of ``value``. Code 7 naming ``key`` when the kernel
    refuses it (EINVAL, ERANGE, EACCES, EPERM), 999 otherwise."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        code = ERR_INVALID_NETWORK_CONFIG if exc.errno in _SYSCTL_REJECTED else ERR_INTERNAL
        raise CNIError(code, f'tuning: cannot set sysctl "{key}" to "{value}": '
                       f"{_strerror(exc)}", path) from None


def _refuse_host_netns(ns: NetNS, first: Sysctl) -> None:
    """In the host's namespace /proc/sys/net also shows the node-wide net.*
    sysctls; never set any there (per-namespace keys only)."""
    try:
        st = os.stat(HOST_NETNS)
    except OSError:
        return  # /proc/1 hidden from us: nothing to compare with
    if ns.identity() == (st.st_dev, st.st_ino):
        raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                       f'tuning: sysctl "{first.key}": refusing to set sysctls in the host\'s '
                       "network namespace", f"CNI_NETNS {ns.path} is the namespace of PID 1")


# --- link ----------------------------------------------------------------------


def _link_state(ipr: Any, ifname: str) -> dict[str, Any] | None:
    """``{mac, promisc, mtu, allmulti, txQLen}`` of the link (and ``link``,
    its `netlink.Link`), None if absent."""
    link = netlink.find_link(ipr, ifname)
    if link is None:
        return None
    return {
        "link": link,
        "mac": link.mac,
        # dev_get_flags reports the flags set by users, not the refcounted
        # promiscuity (tcpdump), which is what we set and restore.
        "promisc": bool(link.flags & netlink.IFF_PROMISC),
        "mtu": link.mtu,
        "allmulti": bool(link.flags & netlink.IFF_ALLMULTI),
        "txQLen": link.txqlen,
    }


def _require_link(ipr: Any, ifname: str) -> dict[str, Any]:
    state = _link_state(ipr, ifname)
    if state is None:
        raise CNIError(ERR_INTERNAL, f'tuning: failed to get link "{ifname}": not found in the '
                       "container's network namespace")
    return state


def _set_link(ipr: Any, link: netlink.Link | str, key: str, value: Any) -> None:
    """Set one attribute of ``link`` (its `netlink.Link`, or name). Code 7
    naming the key when the kernel refuses the value (EINVAL, ERANGE,
    EADDRNOTAVAIL, EOPNOTSUPP), 999 otherwise."""
    ifname = link if isinstance(link, str) else link.name
    try:
        netlink.link_set(ipr, link, **{_LINK_KW[key]: value})
    except CNIError as exc:
        err = getattr(exc.__cause__, "code", None)
        code = ERR_INVALID_NETWORK_CONFIG if err in _LINK_REJECTED else exc.code
        raise CNIError(code, f'tuning: cannot set {key} {_show(value)} on "{ifname}": '
                       f"{exc.msg}") from exc.__cause__


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# --- settings and results ------------------------------------------------------


def _settings(args: CmdArgs, conf: TuningConf) -> Any:
    s = load_settings(args, conf)
    if s.sysctls:
        patterns = load_allowlist(ALLOWLIST_FILE)
        if patterns is not None:
            check_allowed(s.sysctls, patterns, ALLOWLIST_FILE)
    return s


def _update_mac(result: Result, args: CmdArgs, mac: str) -> None:
    """Set the MAC of CNI_IFNAME in the result. Go matches by name only; we
    prefer the entries that name a sandbox (the container side), so a
    host-side link of the same name keeps its MAC."""
    named = [i for i in result.interfaces if i.name == args.ifname]
    in_sandbox = [i for i in named if i.sandbox]
    for iface in in_sandbox or named:
        iface.mac = mac


def _restore(ipr: Any, ifname: str, doc: dict[str, Any]) -> None:
    """Best effort (as Go's DEL): link settings, then sysctls in reverse;
    failures go to stderr, a vanished link or sysctl is skipped."""
    link = netlink.find_link(ipr, ifname)
    if link is not None:
        # Go's restore order: MTU first, so a MAC is set on a sane link.
        for key in ("mtu", "mac", "promisc", "allmulti", "txQLen"):
            value = backup.link_value(doc, key)
            if value is None:
                continue
            try:
                _set_link(ipr, link, key, value)
            except CNIError as exc:
                _warn(f"restoring {key}: {exc}")
    for rel, value in reversed(list(backup.sysctls(doc).items())):
        try:
            split_sysctl_key(rel)  # the file is ours, but never write outside net.*
            file = _sysctl_file(rel, rel)
            if os.path.exists(file):
                _write_sysctl(rel, file, value)
        except CNIError as exc:
            _warn(f"restoring sysctl {rel}: {exc}")


# --- the plugin ----------------------------------------------------------------


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
    config_model = TuningConf
    args_model = TuningArgs

    @classmethod
    def node_state(cls) -> list[str]:
        """Saved link settings in the default data dir (/run/cni/tuning)
        (`cni_skel.skel.Plugin.node_state`)."""
        try:
            n = len(os.listdir(DEFAULT_DATA_DIR))
        except OSError:
            return []
        return [f"{n} saved link setting file(s) in {DEFAULT_DATA_DIR}"] if n else []

    def validate_config(self, args: CmdArgs, conf: TuningConf) -> None:
        """ADD's checks of the config before it enters CNI_NETNS: every
        sysctl key (form, net.* only, duplicates) and this node's allowlist.
        Whether a key exists and is writable in the pod is known at ADD only.

        Raises:
            CNIError: as ADD: code 7 naming the key, 5 for an unreadable
                allowlist.
        """
        _settings(args, conf)

    def add(self, args: CmdArgs, conf: TuningConf) -> Result:
        """Save the original values, then apply the sysctls and MAC, promisc,
        MTU, allmulti, txQLen (Go's order) inside CNI_NETNS on CNI_IFNAME.
        Every key is checked and every original read before the first write;
        a failure puts back what this ADD changed and the saved file as it
        was (Go's cmdAdd has no roll-back).

        Returns prevResult with the MAC of CNI_IFNAME updated when it was
        set. Raises: see the class docstring (1 before anything is touched
        when prevResult cannot be written in the config's cniVersion).
        """
        if conf.prev_result is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "tuning: required prevResult missing")
        check_expressible(conf.cni_version, conf.prev_result)
        s = _settings(args, conf)
        changes = s.link_changes()
        result = conf.prev_result
        with NetNS.open(args.netns) as ns, ns.rtnl() as ipr, ns.enter():
            if not s.sysctls and not changes:
                return result
            if s.sysctls:
                _refuse_host_netns(ns, s.sysctls[0])
            files = [(item, _sysctl_file(item.key, item.rel)) for item in s.sysctls]
            sys_orig = {item.rel: _read_sysctl(item.key, path) for item, path in files}
            for item, path in files:
                if not os.access(path, os.W_OK):
                    raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                                   f'tuning: sysctl "{item.key}" is read-only in the '
                                   "container's network namespace", path)
            link_orig: dict[str, Any] = {}
            link: netlink.Link | str = args.ifname
            if changes:
                state = _require_link(ipr, args.ifname)
                link = state["link"]
                link_orig = {key: state[key] for key, _ in changes}

            path = backup.path(s.data_dir, args.container_id, args.ifname)
            previous = backup.read_raw(path)
            with rollback(self.name) as undo:
                backup.save(path, backup.merge(backup.parse(previous), conf.name, args,
                                               sys_orig, link_orig))
                undo.callback(f"putting back {path}", backup.put_back, path, previous)
                for item, file in files:
                    undo.callback(f"restoring sysctl {item.key}", _write_sysctl, item.key, file,
                                  sys_orig[item.rel])
                    _write_sysctl(item.key, file, item.value)
                for key, value in changes:
                    undo.callback(f"restoring {key}", _set_link, ipr, link, key,
                                  link_orig[key])
                    _set_link(ipr, link, key, value)
        if s.mac is not None:
            # set as given, normalised as the kernel reports it: no read-back
            _update_mac(result, args, s.mac)
        return result

    def check(self, args: CmdArgs, conf: TuningConf) -> None:
        """Every configured sysctl (compared field by field: vector sysctls
        read back tab-separated) and link setting has its value (Go's
        cmdCheck).

        Raises:
            CNIError: 999 naming the setting, configured and current value;
                7 without prevResult or for a sysctl that does not exist.
        """
        if conf.prev_result is None:
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, "tuning: required prevResult missing")
        s = load_settings(args, conf)
        with NetNS.open(args.netns) as ns, ns.rtnl() as ipr, ns.enter():
            for item in s.sysctls:
                current = _read_sysctl(item.key, _sysctl_file(item.key, item.rel))
                if current.split() != item.value.split():
                    raise CNIError(ERR_INTERNAL, f'tuning: sysctl "{item.key}" is "{current}", '
                                   f'configured "{item.value}"')
            state = _link_state(ipr, args.ifname)
            if state is None:
                raise CNIError(ERR_INTERNAL,
                               f'tuning: cannot find container link "{args.ifname}"')
            for key, want in s.link_changes():
                if state[key] != want:
                    raise CNIError(ERR_INTERNAL, f'tuning: {key} of "{args.ifname}" is '
                                   f"{_show(state[key])}, configured {_show(want)}")

    def delete(self, args: CmdArgs, conf: TuningConf) -> None:
        """Restore what the saved file holds (link settings, then sysctls),
        best effort as Go's cmdDel (problems go to stderr), and remove it. A
        gone netns, link or file is success."""
        data_dir = conf.data_dir or DEFAULT_DATA_DIR
        path = backup.path(data_dir, args.container_id, args.ifname)
        raw = backup.read_raw(path)
        if raw is None:
            return
        try:
            ns = open_netns(args.netns, missing_ok=True)
        except CNIError as exc:
            # e.g. the bind mount is gone but its empty file remains: nothing
            # left to restore in.
            _warn(f"not restoring: {exc}")
            ns = None
        if ns is not None:
            with ns, ns.rtnl() as ipr, ns.enter():
                _restore(ipr, args.ifname, backup.parse(raw))
        backup.remove(path)

    def gc(self, args: CmdArgs, conf: TuningConf) -> None:
        """Remove this network's saved files whose attachment is not in
        `NetConf.gc_keep` (Go's tuning has no GC).

        Raises:
            CNIError: 7 without a list of valid attachments; 5 naming the
                files that could not be read or removed (after the rest).
        """
        valid = {(a.container_id, a.ifname) for a in conf.gc_keep()}
        data_dir = conf.data_dir or DEFAULT_DATA_DIR
        problems = backup.collect(data_dir, conf.name, valid)
        if problems:
            raise CNIError(ERR_IO_FAILURE, f"tuning: GC left {len(problems)} file(s) it could "
                           "not handle", "; ".join(problems))

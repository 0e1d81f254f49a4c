"""The verbs of tuning: ADD, CHECK, DEL, GC.

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
from cni_skel.sysctl import sysctl_path
from cni_skel.types import Result, check_expressible

from . import backup
from .config import (
    ALLOWLIST_FILE,
    DEFAULT_DATA_DIR,
    Sysctl,
    TuningConf,
    check_allowed,
    load_allowlist,
    load_settings,
    split_sysctl_key,
)

__all__ = ["add", "check", "delete", "gc", "validate_config"]

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
    """``{mac, promisc, mtu, allmulti, txQLen}`` of the link, None if absent."""
    link = netlink.find_link(ipr, ifname)
    if link is None:
        return None
    try:
        msg = ipr.link("get", index=link["index"])[0]
    except Exception as exc:  # the link went away between the two requests
        raise CNIError(ERR_INTERNAL, f'tuning: cannot read link "{ifname}": {exc}') from None
    return {
        "mac": link["mac"],
        # dev_get_flags reports the flags set by users, not the refcounted
        # promiscuity (tcpdump), which is what we set and restore.
        "promisc": bool(link["flags"] & netlink.IFF_PROMISC),
        "mtu": link["mtu"],
        "allmulti": bool(link["flags"] & netlink.IFF_ALLMULTI),
        "txQLen": msg.get("IFLA_TXQLEN"),
    }


def _require_link(ipr: Any, ifname: str) -> dict[str, Any]:
    state = _link_state(ipr, ifname)
    if state is None:
        raise CNIError(ERR_INTERNAL, f'tuning: failed to get link "{ifname}": not found in the '
                       "container's network namespace")
    return state


def _set_link(ipr: Any, ifname: str, key: str, value: Any) -> None:
    """Set one attribute. Code 7 naming the key when the kernel refuses the
    value (EINVAL, ERANGE, EADDRNOTAVAIL, EOPNOTSUPP), 999 otherwise."""
    try:
        netlink.link_set(ipr, ifname, **{_LINK_KW[key]: value})
    except CNIError as exc:
        err = getattr(exc.__cause__, "code", None)
        code = ERR_INVALID_NETWORK_CONFIG if err in _LINK_REJECTED else exc.code
        raise CNIError(code, f'tuning: cannot set {key} {_show(value)} on "{ifname}": '
                       f"{exc.msg}") from exc.__cause__


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# --- ADD -----------------------------------------------------------------------


def _settings(args: CmdArgs, conf: TuningConf) -> Any:
    s = load_settings(args, conf)
    if s.sysctls:
        patterns = load_allowlist(ALLOWLIST_FILE)
        if patterns is not None:
            check_allowed(s.sysctls, patterns, ALLOWLIST_FILE)
    return s


def validate_config(args: CmdArgs, conf: TuningConf) -> None:
    """ADD's checks of the config before it enters CNI_NETNS: every sysctl
    key (form, net.* only, duplicates) and this node's allowlist. Whether a
    key exists and is writable in the pod is known at ADD only.

    Raises:
        CNIError: as ADD: code 7 naming the key, 5 for an unreadable allowlist.
    """
    _settings(args, conf)


def add(args: CmdArgs, conf: TuningConf) -> Result:
    """Apply the sysctls, then MAC, promisc, MTU, allmulti, txQLen (Go's
    order) inside CNI_NETNS on CNI_IFNAME; see `Tuning` for the rules.

    Returns prevResult with the MAC of CNI_IFNAME updated when it was set.
    Code 1 before anything is touched when prevResult (the result) cannot
    be written in the config's cniVersion (`check_expressible`).
    """
    if conf.prev_result is None:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "tuning: required prevResult missing")
    check_expressible(conf.cni_version, conf.prev_result)
    s = _settings(args, conf)
    changes = s.link_changes()
    result = conf.prev_result
    with NetNS.open(args.netns) as ns, ns.iproute() as ipr, ns.enter():
        if not s.sysctls and not changes:
            return result
        if s.sysctls:
            _refuse_host_netns(ns, s.sysctls[0])
        # Everything is read (and every key checked) before the first write.
        files = [(item, _sysctl_file(item.key, item.rel)) for item in s.sysctls]
        sys_orig = {item.rel: _read_sysctl(item.key, path) for item, path in files}
        for item, path in files:
            if not os.access(path, os.W_OK):
                raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                               f'tuning: sysctl "{item.key}" is read-only in the container\'s '
                               "network namespace", path)
        link_orig: dict[str, Any] = {}
        if changes:
            state = _require_link(ipr, args.ifname)
            link_orig = {key: state[key] for key, _ in changes}

        path = backup.path(s.data_dir, args.container_id, args.ifname)
        previous = backup.read_raw(path)
        backup.save(path, backup.merge(backup.parse(previous), conf.name, args, sys_orig,
                                       link_orig))
        undo: list[tuple[str, str, str, Any]] = []  # (kind, key, path or "", original)
        try:
            for item, file in files:
                undo.append(("sysctl", item.key, file, sys_orig[item.rel]))
                _write_sysctl(item.key, file, item.value)
            for key, value in changes:
                undo.append(("link", key, "", link_orig[key]))
                _set_link(ipr, args.ifname, key, value)
            new_mac = _require_link(ipr, args.ifname)["mac"] if s.mac is not None else None
        except BaseException:
            # Nothing half-applied: put back what this ADD changed, and the
            # saved file as it was before.
            _undo(ipr, args.ifname, undo)
            backup.put_back(path, previous)
            raise
    if new_mac is not None:
        _update_mac(result, args, new_mac)
    return result


def _undo(ipr: Any, ifname: str, undo: list[tuple[str, str, str, Any]]) -> None:
    for kind, key, file, original in reversed(undo):
        try:
            if kind == "sysctl":
                _write_sysctl(key, file, original)
            else:
                _set_link(ipr, ifname, key, original)
        except CNIError as exc:
            _warn(f"rolling back {key}: {exc}")


def _update_mac(result: Result, args: CmdArgs, mac: str) -> None:
    """Set the MAC of CNI_IFNAME in the result. Go matches by name only; we
    prefer the entries that name a sandbox (the container side), so a
    host-side link of the same name keeps its MAC."""
    named = [i for i in result.interfaces if i.name == args.ifname]
    in_sandbox = [i for i in named if i.sandbox]
    for iface in in_sandbox or named:
        iface.mac = mac


# --- CHECK ---------------------------------------------------------------------


def check(args: CmdArgs, conf: TuningConf) -> None:
    """Compare sysctls and link settings with the config; see `Tuning`."""
    if conf.prev_result is None:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "tuning: required prevResult missing")
    s = load_settings(args, conf)
    with NetNS.open(args.netns) as ns, ns.iproute() as ipr, ns.enter():
        for item in s.sysctls:
            current = _read_sysctl(item.key, _sysctl_file(item.key, item.rel))
            # Vector sysctls read back tab-separated (tcp_rmem): compare fields.
            if current.split() != item.value.split():
                raise CNIError(ERR_INTERNAL, f'tuning: sysctl "{item.key}" is "{current}", '
                               f'configured "{item.value}"')
        state = _link_state(ipr, args.ifname)
        if state is None:
            raise CNIError(ERR_INTERNAL, f'tuning: cannot find container link "{args.ifname}"')
        for key, want in s.link_changes():
            if state[key] != want:
                raise CNIError(ERR_INTERNAL, f'tuning: {key} of "{args.ifname}" is '
                               f"{_show(state[key])}, configured {_show(want)}")


# --- DEL -----------------------------------------------------------------------


def delete(args: CmdArgs, conf: TuningConf) -> None:
    """Restore what the saved file holds, then remove it; see `Tuning`."""
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
        with ns, ns.iproute() as ipr, ns.enter():
            _restore(ipr, args.ifname, backup.parse(raw))
    backup.remove(path)


def _restore(ipr: Any, ifname: str, doc: dict[str, Any]) -> None:
    """Best effort (as Go's DEL): link settings, then sysctls in reverse;
    failures go to stderr, a vanished link or sysctl is skipped."""
    if netlink.find_link(ipr, ifname) is not None:
        # Go's restore order: MTU first, so a MAC is set on a sane link.
        for key in ("mtu", "mac", "promisc", "allmulti", "txQLen"):
            value = backup.link_value(doc, key)
            if value is None:
                continue
            try:
                _set_link(ipr, ifname, key, value)
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


# --- GC ------------------------------------------------------------------------


def gc(args: CmdArgs, conf: TuningConf) -> None:
    """Remove saved files of this network whose attachment is not listed."""
    valid_list = conf.attachment_list()
    if valid_list is None:
        raise CNIError(ERR_INVALID_NETWORK_CONFIG, "tuning: GC needs cni.dev/valid-attachments",
                       "without the list of valid attachments nothing is removed")
    valid = {(a.container_id, a.ifname) for a in valid_list}
    data_dir = conf.data_dir or DEFAULT_DATA_DIR
    problems = backup.collect(data_dir, conf.name, valid)
    if problems:
        raise CNIError(ERR_IO_FAILURE, f"tuning: GC left {len(problems)} file(s) it could not "
                       "handle", "; ".join(problems))

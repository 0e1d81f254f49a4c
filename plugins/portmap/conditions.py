"""``conditionsV4`` / ``conditionsV6``: nft match expressions (text, as Go's
portmap takes them) turned into libnftables JSON expressions.

libnftables' JSON input has no way to embed rule text, so each condition is
parsed by libnftables itself inside a scratch network namespace made for the
purpose (``unshare(CLONE_NEWNET)`` in a thread of its own; the namespace dies
with the thread): ``add rule inet <scratch> cN <condition> accept`` in a chain
reachable from nat prerouting and output hooks (so the kernel validates it
where it will run), then the chain is listed as JSON and the expressions
before ``accept`` are kept. Nothing touches the node's namespace, text that
tries to be more than one expression (``;``, sets that do not exist, a
statement or verdict) is refused. Only run when a network's DNAT chain is
first created (a few ms).
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from cni_skel.errors import ERR_INTERNAL, ERR_INVALID_NETWORK_CONFIG, CNIError
from cni_skel.nft import Nft

__all__ = ["to_json"]

_CLONE_NEWNET = 0x40000000
_T = {"family": "inet", "table": "scratch"}


def _unshare_net() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise CNIError(ERR_INTERNAL, f"portmap: unshare(CLONE_NEWNET): {os.strerror(err)}")


def _convert(conditions: dict[str, list[str]]) -> dict[str, list[dict]]:
    _unshare_net()
    nft = Nft(keep=False)  # a kept context would keep the scratch namespace alive
    setup: list[dict] = [{"add": {"table": {"family": "inet", "name": "scratch"}}}]
    for hook in ("prerouting", "output"):
        setup.append({"add": {"chain": {**_T, "name": hook, "type": "nat", "hook": hook,
                                        "prio": -100, "policy": "accept"}}})
    chains: list[tuple[str, int, str]] = []
    for key, conds in conditions.items():
        for i in range(len(conds)):
            name = f"c{len(chains)}"
            chains.append((key, i, name))
            setup.append({"add": {"chain": {**_T, "name": name}}})
            for hook in ("prerouting", "output"):
                setup.append({"add": {"rule": {**_T, "chain": hook,
                                               "expr": [{"jump": {"target": name}}]}}})
    nft.run(setup, what="portmap: scratch table")
    for key, i, name in chains:
        cond = conditions[key][i]
        rc, _out, err = nft.text_cmd(f"add rule inet scratch {name} {cond} accept")
        if rc != 0:
            text = " ".join(str(err).split())
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f"invalid network config: {key}.{i}: not an nftables match "
                           f"expression (got {cond!r})", text)
    table = nft.table("inet", "scratch")
    out: dict[str, list[dict]] = {key: [] for key in conditions}
    for key, i, name in chains:
        rules = table.chain_rules(name) if table is not None else []
        exprs = rules[0].get("expr", []) if len(rules) == 1 else []
        body = exprs[:-1]
        if (len(rules) != 1 or not exprs or exprs[-1] != {"accept": None}
                or not body or any(set(e) != {"match"} for e in body)):
            raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                           f"invalid network config: {key}.{i}: only match expressions "
                           f"are allowed (got {conditions[key][i]!r})")
        out[key].extend(body)
    return out


def to_json(conditions: dict[str, list[str]]) -> dict[str, list[dict]]:
    """``{"conditionsV4": [text, ...], ...}`` -> the same keys mapped to the
    concatenated libnftables JSON match expressions of their conditions.

    Raises:
        CNIError: 7 naming ``<key>.<index>`` for text libnftables does not
            accept, or that is not purely match expressions (a statement,
            verdict, or several rules); 999/50 when the scratch namespace or
            libnftables can not be had.
    """
    if not any(conditions.values()):
        return {key: [] for key in conditions}
    for key, conds in conditions.items():
        for i, cond in enumerate(conds):
            if any(ord(ch) < 32 or ch == ";" for ch in cond):
                raise CNIError(ERR_INVALID_NETWORK_CONFIG,
                               f"invalid network config: {key}.{i}: one match expression "
                               f"per entry, no ';' or control characters (got {cond!r})")
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["ok"] = _convert(conditions)
        except BaseException as exc:  # re-raised in the caller's thread
            result["error"] = exc

    # A thread of its own: unshare(CLONE_NEWNET) moves only the calling
    # thread, and this one ends (taking the namespace with it) right after.
    worker = threading.Thread(target=work, name="portmap-conditions")
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["ok"]

"""The benchmark's agent inside one node namespace.

Started by `bench.run` as ``ip netns exec <node> python -m bench.node``, so it
(and every plugin it starts) sees the node namespace's own /sys, exactly like
a runtime-run plugin. Requests and answers are JSON lines on stdin / fd 1;
fd 1 is then pointed at stderr so nothing a plugin or library prints can
corrupt the protocol.

Ops:
  exec      run ``argv`` once; wall, CPU (user+sys) and peak RSS of the plugin
            process tree from wait4 (through the small C spawner when built,
            see spawn.c), exit code, stdout, stderr.
  dispatch  call `cni_skel.skel.dispatch` in this process (no start-up): wall
            and CPU of this thread plus the children it reaped (a bridge's
            host-local delegate); no RSS.
  chain     one pod's chain in the calling thread: ``steps``, each a request
            (exec/dispatch) and its config; a step with ``chain`` gets the
            last such step's result as prevResult, and its result is the
            next one's; stops at the first failure (with ``all``: runs
            every step, as for DEL). Answers every step's result (``steps``).
  batch     run many exec/dispatch/chain requests on N worker threads (churn).
  inspect   what a leak check needs: veths and bridge ports on the node, IP
            files in a host-local store, files under ``files`` (a plugin's
            dataDir), and with ``nft``: every nftables set/map element and
            Go portmap's per-pod chains (CNI-DN-*) in the node's ruleset.
  exit
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cni_skel.skel import dispatch, resolve_ref

_plugins: dict[str, Any] = {}


def _memfd(name: str) -> int:
    return os.memfd_create(name, os.MFD_CLOEXEC)


def _read_fd(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _stdin_fd(data: bytes) -> int:
    """A pipe already holding ``data`` (configs are far below the pipe size)
    with its write end closed: the plugin reads to EOF, no thread needed."""
    if len(data) > 60000:
        fd = _memfd("stdin")
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    return r


def do_exec(req: dict, spawn: str | None) -> dict:
    argv = req["argv"]
    stdin = _stdin_fd(req.get("stdin", "").encode())
    out, err = _memfd("out"), _memfd("err")
    try:
        if spawn:
            r, w = os.pipe()
            try:
                proc = subprocess.Popen([spawn, str(w), *argv], pass_fds=(w,), env=req["env"],
                                        stdin=stdin, stdout=out, stderr=err)
            finally:
                os.close(w)
            proc.wait()
            with os.fdopen(r, "rb") as fp:
                fields = fp.read().split()
            if proc.returncode != 0 or len(fields) != 5:
                raise RuntimeError(f"spawner failed ({proc.returncode}) for {argv[0]}")
            wall = int(fields[0]) / 1e9
            cpu = (int(fields[1]) + int(fields[2])) / 1e6
            rss: int | None = int(fields[3])
            code = os.waitstatus_to_exitcode(int(fields[4]))
        else:
            # No spawner: peak RSS would be this process's own (the kernel
            # carries the parent's high-water mark across fork/exec): omit it.
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, env=req["env"], stdin=stdin, stdout=out, stderr=err)
            _, status, ru = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            cpu = ru.ru_utime + ru.ru_stime
            rss = None
    finally:
        os.close(stdin)
    return {"wall": wall, "cpu": cpu, "rss": rss, "code": code,
            "out": _read_fd(out), "err": _read_fd(err)[-(10**7 if req.get("full_err") else 4000):]}


def do_dispatch(req: dict) -> dict:
    ref = req["ref"]
    cls = _plugins.get(ref)
    if cls is None:
        cls = _plugins[ref] = resolve_ref(ref)
    err = io.StringIO()
    data = req.get("stdin", "").encode()
    th0 = resource.getrusage(resource.RUSAGE_THREAD)
    ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out, code = dispatch(cls, req["env"], data, err)
    wall = time.perf_counter() - t0
    th1 = resource.getrusage(resource.RUSAGE_THREAD)
    ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (th1.ru_utime - th0.ru_utime + th1.ru_stime - th0.ru_stime
           + ch1.ru_utime - ch0.ru_utime + ch1.ru_stime - ch0.ru_stime)
    return {"wall": wall, "cpu": cpu, "rss": None, "code": code,
            "out": out.decode("utf-8", "replace"), "err": err.getvalue()[-4000:]}


def do_chain(req: dict, spawn: str | None) -> dict:
    results = []
    prev = None
    for step in req["steps"]:
        conf = dict(step["conf"])
        if step.get("chain") and prev is not None:
            conf["prevResult"] = prev
        r = handle({**step["req"], "stdin": json.dumps(conf)}, spawn)
        results.append(r)
        if r["code"] != 0:
            if req.get("all"):
                continue
            break
        if step.get("chain") and r["out"].strip():
            prev = json.loads(r["out"])
    return {"steps": results}


def nft_entries() -> list[str] | None:
    """One line per element of every nftables set and map, and per chain
    named CNI-DN-* (Go 1.1.1 portmap's per-pod chain, iptables-nft), in this
    namespace; None without a working ``nft``."""
    try:
        out = subprocess.run(["nft", "-j", "list", "ruleset"], capture_output=True, text=True,
                             check=False)
        doc = json.loads(out.stdout) if out.returncode == 0 else None
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    entries = []
    for obj in doc.get("nftables", []):
        for kind in ("set", "map"):
            o = obj.get(kind)
            if o:
                for e in o.get("elem", ()):
                    if isinstance(e, dict) and isinstance(e.get("elem"), dict):
                        e = {"elem": {k: v for k, v in e["elem"].items()
                                      if k not in ("expires", "counter")}}
                    entries.append(f"{o.get('family')} {o.get('table')} {o.get('name')} "
                                   + json.dumps(e, sort_keys=True))
        c = obj.get("chain")
        if c and c.get("name", "").startswith("CNI-DN-"):
            entries.append(f"{c.get('family')} {c.get('table')} chain {c['name']}")
    return entries


def do_inspect(req: dict) -> dict:
    links = sorted(os.listdir("/sys/class/net"))
    bridge = req.get("bridge")
    ports: list[str] = []
    if bridge and os.path.isdir(f"/sys/class/net/{bridge}/brif"):
        ports = sorted(os.listdir(f"/sys/class/net/{bridge}/brif"))
    ips: list[str] = []
    store = req.get("store")
    if store and os.path.isdir(store):
        ips = sorted(n for n in os.listdir(store)
                     if n != "lock" and not n.startswith(("last_reserved_ip", ".")))
    files: list[str] = []
    top = req.get("files")
    if top and os.path.isdir(top):
        files = sorted(os.path.relpath(os.path.join(d, n), top)
                       for d, _, names in os.walk(top) for n in names
                       if n != "lock" and not n.startswith("."))
    return {"veths": [n for n in links if n.startswith("veth")], "ports": ports, "ips": ips,
            "files": files, "nft": nft_entries() if req.get("nft") else None}


def handle(req: dict, spawn: str | None) -> Any:
    op = req["op"]
    if op == "exec":
        return do_exec(req, spawn)
    if op == "dispatch":
        return do_dispatch(req)
    if op == "chain":
        return do_chain(req, spawn)
    if op == "inspect":
        return do_inspect(req)
    if op == "batch":
        calls = req["calls"]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, req.get("workers", 1))) as pool:
            results = list(pool.map(lambda r: handle(r, spawn), calls))
        return {"wall": time.perf_counter() - t0, "results": results}
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    spawn = None
    if len(sys.argv) > 2 and sys.argv[1] == "--spawn" and sys.argv[2]:
        spawn = sys.argv[2]
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    proto.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "exit":
            break
        try:
            answer = {"ok": handle(req, spawn)}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        proto.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()

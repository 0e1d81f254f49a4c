"""host-local under contention: 400 addresses allocated and released in one
small range by 10 plugin processes at a time, 8 streams of ours and 2 of
Debian's Go host-local on the same store (so the shared flock is exercised
across implementations too). No address may be handed to two live
containers, and nothing may leak. Then parallel ADDs of both, each
implementation checking and releasing the other's: our owner index must
agree with the files throughout.

Sizing: a run of ours costs ~150 ms of CPU, nearly all interpreter and SDK
import start-up, so 280 ADD + 280 DEL of ours take ~50 s on 2 cores; Go's
streams (~3 ms a run) make up the 400."""

from __future__ import annotations

import collections
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from test_host_local import NET, NETNS, allocated, conf
from test_host_local_index import assert_index_right

from cni_skel.harness import run_plugin

OURS_WORKERS = 8
GO_WORKERS = 2
OURS_EACH, GO_EACH = 35, 60  # 8 x 35 + 2 x 60 = 400 allocations, each released
HOLD = 3                   # containers a worker keeps alive (4 files at most)
RANGE = ("10.90.0.10", "10.90.0.57")  # 48 addresses for at most 40 held: heavy reuse


def test_parallel_allocate_release(cni_bin, go_yardstick, tmp_path, node_netns):
    data_dir = tmp_path / "ipam"
    # 1.0.0: Debian's Go host-local speaks up to that.
    c = conf(data_dir, "1.0.0", subnet="10.90.0.0/24", rangeStart=RANGE[0], rangeEnd=RANGE[1])
    ours = os.path.join(cni_bin, "host-local")
    go = os.path.join(go_yardstick.dir, "host-local")
    live: dict[str, str] = {}   # address -> container holding it (ADD returned, DEL not begun)
    seen: set[str] = set()
    guard = threading.Lock()

    def call(exe: str, cmd: str, cid: str):
        return run_plugin(exe, cmd, c, container_id=cid, netns=NETNS, node=node_netns,
                          timeout=120)

    def release(exe: str, cid: str, ip: str) -> None:
        with guard:
            assert live.pop(ip) == cid
        call(exe, "DEL", cid)

    def worker(w: int, exe: str, count: int) -> int:
        held: collections.deque[tuple[str, str]] = collections.deque()
        for k in range(count):
            cid = f"w{w}-{k}"
            ip = call(exe, "ADD", cid)["ips"][0]["address"].split("/")[0]
            with guard:
                assert ip not in live, f"{ip} handed to {cid} while {live.get(ip)} holds it"
                live[ip] = cid
                seen.add(ip)
            held.append((cid, ip))
            if len(held) > HOLD:
                release(exe, *held.popleft())
        while held:
            release(exe, *held.popleft())
        return count

    jobs = [(w, ours, OURS_EACH) for w in range(OURS_WORKERS)]
    jobs += [(OURS_WORKERS + g, go, GO_EACH) for g in range(GO_WORKERS)]
    start = time.monotonic()
    with ThreadPoolExecutor(len(jobs)) as pool:
        done = [f.result() for f in [pool.submit(worker, *job) for job in jobs]]
    elapsed = time.monotonic() - start
    assert sum(done) == 400
    assert live == {}
    assert allocated(data_dir) == {}, "every address released"
    assert len(seen) == 48, "the whole range was used (and so reused)"
    leftovers = sorted(p.name for p in (data_dir / NET).iterdir())
    assert leftovers == [".cni-skel-index", "last_reserved_ip.0", "lock"], leftovers
    print(f"400 allocations and releases in {elapsed:.1f} s")


def test_parallel_adds_then_each_releases_the_others(cni_bin, go_yardstick, tmp_path,
                                                     node_netns):
    data_dir = tmp_path / "ipam"
    c = conf(data_dir, "1.0.0", subnet="10.91.0.0/24")
    exe = {"ours": os.path.join(cni_bin, "host-local"),
           "go": os.path.join(go_yardstick.dir, "host-local")}

    def call(impl: str, cmd: str, cid: str):
        return run_plugin(exe[impl], cmd, c, container_id=cid, netns=NETNS, node=node_netns,
                          timeout=120)

    def adds(impl: str, w: int, count: int) -> dict[str, str]:
        return {f"{impl}{w}-{k}": call(impl, "ADD", f"{impl}{w}-{k}")["ips"][0]["address"]
                for k in range(count)}

    jobs = [("ours", w, 6) for w in range(6)] + [("go", w, 12) for w in range(2)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        got: dict[str, str] = {}
        for part in [f.result() for f in [pool.submit(adds, *job) for job in jobs]]:
            got.update(part)
    assert len(got) == 60 and len(set(got.values())) == 60, "no address twice"
    assert allocated(data_dir) == {a.split("/")[0]: f"{cid}\r\neth0".encode()
                                   for cid, a in got.items()}
    other = {"ours": "go", "go": "ours"}
    owner = {cid: ("ours" if cid.startswith("ours") else "go") for cid in got}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda cid: call(other[owner[cid]], "CHECK", cid), got))
    call("ours", "DEL", "nobody")
    assert_index_right(data_dir, NET)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda cid: call(other[owner[cid]], "DEL", cid), got))
    assert allocated(data_dir) == {}
    call("ours", "DEL", "nobody")
    assert_index_right(data_dir, NET)

"""``worker-holder``: a plugin whose `cni_skel.keeper.Service` holds one item
per attachment, for tests/test_keeper.py.

ADD asks the service to hold the attachment (written to its state
directory too), DEL to let it go; CHECK with ``"die": true`` makes the
keeper process end (SIGKILL of itself), STATUS answers the keeper's pid.
The service reloads its items from disk when a keeper starts and writes
``stopped`` in its state directory when the worker stops.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

from cni_skel import NetConf, Plugin, Result, keeper
from cni_skel.errors import ERR_UNKNOWN_CONTAINER, CNIError


class Holder(keeper.Service):
    name = "holder"

    def __init__(self, log: Any, state_dir: str) -> None:
        super().__init__(log, state_dir)
        self.lock = threading.Lock()
        self.items: dict[str, dict[str, Any]] = {}

    def _path(self, key: str) -> str:
        return os.path.join(self.state_dir, key + ".json")

    def start(self) -> None:
        if not os.path.isdir(self.state_dir):
            return
        for name in os.listdir(self.state_dir):
            if name.endswith(".json"):
                with open(os.path.join(self.state_dir, name)) as fp:
                    item = json.load(fp)
                item["reloaded"] = True
                self.items[name[:-5]] = item
        self.log(f"{len(self.items)} items reloaded")

    def handle(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        for fd in fds:
            os.close(fd)
        key = request.get("key", "")
        op = request.get("op")
        if op == "hold":
            os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
            item = {"key": key, "pid": os.getpid()}
            with open(self._path(key), "w") as fp:
                json.dump(item, fp)
            with self.lock:
                self.items[key] = item
            return {"held": len(self.items)}
        if op == "release":
            with self.lock:
                self.items.pop(key, None)
            if os.path.exists(self._path(key)):
                os.unlink(self._path(key))
            return {}
        if op == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if op == "pid":
            return {"pid": os.getpid()}
        raise CNIError(ERR_UNKNOWN_CONTAINER, f"holder: unknown op {op!r}")

    def held(self) -> int:
        with self.lock:
            return len(self.items)

    def listing(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(item) for item in self.items.values()]

    def events(self) -> dict[str, int]:
        return {"held": self.held()}

    def stop(self) -> None:
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        with open(os.path.join(self.state_dir, "stopped"), "w") as fp:
            fp.write(str(os.getpid()))


class HolderConf(NetConf):
    die: bool = False


class WorkerHolder(Plugin):
    name = "worker-holder"
    config_model = HolderConf
    service = "worker_plugins.holder:Holder"

    def add(self, args: Any, conf: HolderConf) -> Result:
        keeper.call("holder", {"op": "hold", "key": args.container_id})
        return Result(cni_version=conf.cni_version)

    def delete(self, args: Any, conf: HolderConf) -> None:
        keeper.call("holder", {"op": "release", "key": args.container_id})

    def check(self, args: Any, conf: HolderConf) -> None:
        keeper.call("holder", {"op": "die" if conf.die else "pid"}, timeout=5.0)

    def status(self, args: Any, conf: HolderConf) -> None:
        keeper.call("holder", {"op": "pid"})

"""A test IPAM plugin written against the public SDK: hands out one fixed
address and records every call (verb, container ID, ifname) in a file, so
tests can see what the delegating plugin really ran. ``ipam.fail`` makes ADD
answer that Error object."""

from __future__ import annotations

from pydantic import Field

from cni_skel import CNIError, IPAMConf, NetConf, Plugin, Result


class FakeIPAM(IPAMConf):
    log_file: str = Field(alias="logFile")
    address: str = "10.99.0.5/24"
    gateway: str | None = "10.99.0.1"
    fail: dict | None = None


class FakeConf(NetConf):
    ipam: FakeIPAM


class FakeIPAMPlugin(Plugin):
    name = "fake-ipam"
    config_model = FakeConf

    def _log(self, args, conf):
        with open(conf.ipam.log_file, "a") as fp:
            fp.write(f"{args.command} {args.container_id} {args.ifname}\n")

    def add(self, args, conf):
        self._log(args, conf)
        if conf.ipam.fail:
            raise CNIError(conf.ipam.fail["code"], conf.ipam.fail["msg"],
                           conf.ipam.fail.get("details", ""))
        return Result.model_validate({"ips": [{"address": conf.ipam.address,
                                               "gateway": conf.ipam.gateway}],
                                      "routes": [{"dst": "0.0.0.0/0"}]})

    def delete(self, args, conf):
        self._log(args, conf)

    def check(self, args, conf):
        self._log(args, conf)

    def status(self, args, conf):
        self._log(args, conf)

"""A plugin written only against the public SDK that declares typed CNI_ARGS
(the keys the Go host-local understands) and echoes them in its result."""

from __future__ import annotations

from pydantic import Field

from cni_skel import CNIArgs, Plugin, Result
from cni_skel.args import IPList, MacAddress


class EchoArgs(CNIArgs):
    ip: IPList = Field(default_factory=list, alias="IP")
    mac: MacAddress | None = Field(None, alias="MAC")


class ArgsEcho(Plugin):
    name = "args-echo"
    args_model = EchoArgs

    def add(self, args, conf):
        ips = [{"address": f"{ip}/{32 if ip.version == 4 else 128}"} for ip in args.typed_args.ip]
        return Result.model_validate({"cniVersion": conf.cni_version, "ips": ips})

    def delete(self, args, conf):
        return None

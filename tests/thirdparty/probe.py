"""A plugin that exposes what the skel hands it: ADD answers a result whose
DNS options carry the parsed config (JSON), so tests can see the model the
plugin got. ``mode`` misbehaves on purpose (prints to stdout, crashes)."""

from __future__ import annotations

import json
import os
import sys
from typing import Literal

from pydantic import Field, field_validator

from cni_skel import NetConf, Plugin, Result
from cni_skel.config import unsupported
from cni_skel.model import CNIModel


class PortMapping(CNIModel):
    host_port: int = Field(alias="hostPort", ge=1, le=65535)
    container_port: int = Field(alias="containerPort", ge=1, le=65535)
    protocol: Literal["tcp", "udp", "sctp"] = "tcp"
    host_ip: str = Field("", alias="hostIP")


class RuntimeConfig(CNIModel):
    port_mappings: list[PortMapping] = Field(default_factory=list, alias="portMappings")


class ProbeConf(NetConf):
    mode: str = "echo"
    backend: str = "nftables"
    mtu: int = Field(1500, ge=68, le=65535)
    runtime_config: RuntimeConfig = Field(default_factory=RuntimeConfig, alias="runtimeConfig")

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v != "nftables":
            raise unsupported("backend", v, "only nftables is implemented")
        return v


class Probe(Plugin):
    name = "probe"
    config_model = ProbeConf

    def add(self, args, conf):
        if conf.mode == "print-stdout":
            print("chatty plugin output on stdout")
            os.system("echo child process output on stdout")
            sys.stdout.flush()
        if conf.mode == "crash":
            return {}["no such key"]
        seen = conf.model_dump(mode="json", by_alias=True, exclude={"prev_result"})
        if conf.prev_result is not None:
            return conf.prev_result
        return Result.model_validate({"ips": [{"address": "10.0.0.9/24"}],
                                      "dns": {"options": [json.dumps(seen)]}})

    def check(self, args, conf):
        return None

    def delete(self, args, conf):
        return None

"""A main plugin that fills in its IPAM plugin's config, as flannel fills in
host-local's subnet from the node's lease: the range it hands its IPAM
(``ipam.ranges``) comes from its own key ``pool``, which the IPAM plugin is
not shown. It makes no link (what a main plugin does with the addresses is
beside the point here): ADD returns the IPAM result as it is.

Written against the public SDK only. Every verb rebuilds the same delegate
config with `delegate_config`, so DEL, CHECK, STATUS and GC reach the IPAM
plugin with the config its ADD got (the default STATUS/GC would pass the
received config on unchanged: without ranges)."""

from __future__ import annotations

import json

from cni_skel import NetConf, Plugin, ipam_add, rollback
from cni_skel.invoke import (
    delegate_check,
    delegate_config,
    delegate_del,
    delegate_gc,
    delegate_status,
)


class PoolConf(NetConf):
    pool: str  # a CIDR: the one range the IPAM plugin allocates from


class PoolPicker(Plugin):
    name = "pool-picker"
    config_model = PoolConf

    def ipam_config(self, args, conf) -> bytes:
        ipam = {**json.loads(args.stdin_data)["ipam"], "ranges": [[{"subnet": conf.pool}]]}
        return delegate_config(args.stdin_data, {"ipam": ipam}, drop=["pool"])

    def add(self, args, conf):
        with rollback(self.name) as undo:  # the IPAM DEL runs if a later step raises
            return ipam_add(undo, conf.ipam.type, self.ipam_config(args, conf), args)

    def delete(self, args, conf):
        delegate_del(conf.ipam.type, self.ipam_config(args, conf), args)

    def check(self, args, conf):
        delegate_check(conf.ipam.type, self.ipam_config(args, conf), args)

    def status(self, args, conf):
        delegate_status(conf.ipam.type, self.ipam_config(args, conf), args)

    def gc(self, args, conf):
        delegate_gc(conf.ipam.type, self.ipam_config(args, conf), args)

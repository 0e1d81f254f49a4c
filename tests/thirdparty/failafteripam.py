"""A delegating plugin that fails after a successful IPAM ADD: the SDK's
guard must run IPAM DEL before the error goes out."""

from __future__ import annotations

from cni_skel import CNIError, Plugin
from cni_skel.invoke import delegate_status, ipam_add_guard


class FailAfterIPAM(Plugin):
    name = "fail-after-ipam"

    def add(self, args, conf):
        with ipam_add_guard(conf.ipam.type, args.stdin_data, args, version=conf.cni_version):
            raise CNIError(107, "bridge exploded", "injected failure after IPAM ADD")

    def delete(self, args, conf):
        return None

    def status(self, args, conf):
        delegate_status(conf.ipam.type, args.stdin_data, args)

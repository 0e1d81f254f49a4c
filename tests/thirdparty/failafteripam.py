"""A delegating plugin that fails after a successful IPAM ADD: the IPAM DEL
`ipam_add` registers on the ADD's rollback must run before the error goes
out."""

from __future__ import annotations

from cni_skel import CNIError, Plugin, ipam_add, rollback
from cni_skel.invoke import delegate_status


class FailAfterIPAM(Plugin):
    name = "fail-after-ipam"

    def add(self, args, conf):
        with rollback(self.name) as undo:
            ipam_add(undo, conf.ipam.type, args.stdin_data, args, version=conf.cni_version)
            raise CNIError(107, "bridge exploded", "injected failure after IPAM ADD")

    def delete(self, args, conf):
        return None

    def status(self, args, conf):
        delegate_status(conf.ipam.type, args.stdin_data, args)

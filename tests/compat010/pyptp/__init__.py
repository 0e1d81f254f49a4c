# 0.1.0-style fixture: never edit (tests/test_compat_010.py pins its hash)
"""pyptp: a ptp-like plugin written against cni-skel 0.1.0's documented API.

Its verbs are module-level functions in `pyptp.verbs` (``Plugin.verbs``), its
IPAM goes through ``ipam_add_guard``, its netlink sockets are ``NetNS.iproute()``
and it reads links as dicts (``link["mac"]``). tests/test_compat_010.py runs it
on the current tree to prove that such a plugin still works.
"""

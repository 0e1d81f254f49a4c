# 0.1.0-style fixture: never edit (tests/test_compat_010.py pins its hash)
"""The plugin class: a name, a config model given as a string, and the verbs
given as a module (cni-skel 0.1.0's ``Plugin.verbs``)."""

from cni_skel import NetConf, Plugin


class PtpConf(NetConf):
    mtu: int = 1500                                   # our own key; the rest comes from NetConf


class PyPtp(Plugin):
    name = "pyptp"
    config_model = "pyptp.plugin:PtpConf"
    verbs = "pyptp.verbs"                             # add/check/delete/gc/status below


if __name__ == "__main__":
    PyPtp.main()

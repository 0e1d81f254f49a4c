"""The ``flannel`` meta plugin: builds the delegate config from flannel's
subnet file and hands the attachment to it (flannel-io/cni-plugin).

Same executable name, config keys and saved delegate configs as
flannel-io's; the plugin is `Flannel` (in `.plugin`).
"""

from __future__ import annotations

from .plugin import Flannel, FlannelConf, SubnetEnv, delegate_config, load_subnet_env

__all__ = ["Flannel", "FlannelConf", "SubnetEnv", "delegate_config", "load_subnet_env"]

"""The ``host-device`` plugin: moves a device of the node (a NIC, a VF, any
link) into the pod, and back on DEL.

A drop-in for the Go reference host-device (containernetworking/plugins,
plugins/main/host-device): same executable name, config keys, result shape
and error texts; DEL also restores the device's MTU and up state. The
plugin is `HostDevice` (in `.plugin`); its config is in `.config`, the /sys
look-ups in `.sysfs`, the saved device state in `.saved`.
"""

from __future__ import annotations

from .plugin import HostDevice

__all__ = ["HostDevice"]

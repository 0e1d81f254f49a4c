"""host-device's configuration: Go's keys (plugins/main/host-device 1.1.1,
``NetConf`` and ``loadConf``) and our ``dataDir``.

Keys (matched case-insensitively, as every CNI key)::

    device                  a link name on the node ("eth1")
    hwaddr                  the node link's MAC ("aa:bb:cc:dd:ee:ff", "-" or
                            "aabb.ccdd.eeff" forms, EUI-64 and 20-byte too)
    kernelpath              "/sys/devices/..." of the device (the directory
                            holding its net/)
    pciBusID                PCI address "0000:03:00.0"
    runtimeConfig.deviceID  capability "deviceID": a PCI address (overrides
                            pciBusID) or an auxiliary-bus device name
                            (/sys/bus/auxiliary/devices/<name>, Go >= 1.5)
    ipam                    optional: without it the device is moved, L2 only
    dns                     the result's dns when there is IPAM (Go's)
    dataDir                 ours: where DEL finds what to restore, default
                            /run/cni/host-device (see `.saved`)

Several of the four naming keys may be given: the first in the order above
wins, as in Go. None is code 7 with Go's text (Go: 999).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from cni_skel.config import NetConf
from cni_skel.env import ifname_problem
from cni_skel.errors import ERR_INVALID_NETWORK_CONFIG, CNIError
from cni_skel.model import CNIModel

__all__ = ["DEFAULT_DATA_DIR", "HostDeviceConf", "HostDeviceRuntimeConfig"]

DEFAULT_DATA_DIR = "/run/cni/host-device"
NO_DEVICE = 'specify either "device", "hwaddr", "kernelpath" or "pciBusID"'


class HostDeviceRuntimeConfig(CNIModel):
    """``runtimeConfig``: the ``deviceID`` capability (a PCI address or an
    auxiliary-bus device, as a device plugin hands it over)."""

    device_id: str = Field("", alias="deviceID")


class HostDeviceConf(NetConf):
    """Network config of ``host-device`` (keys: see the module docstring).

    ``pci_addr`` is the PCI address in use: ``runtimeConfig.deviceID`` when
    set, else ``pciBusID`` (Go's ``loadConf``).

    Errors (code 7 naming the key): a key of the wrong type; a ``device``
    that can not be an interface name (Go looks it up and answers 999 "Link
    not found").
    """

    device: str = ""
    hwaddr: str = ""
    kernelpath: str = ""
    pci_bus_id: str = Field("", alias="pciBusID")
    runtime_config: HostDeviceRuntimeConfig = Field(  # type: ignore[assignment]
        default_factory=HostDeviceRuntimeConfig, alias="runtimeConfig")
    data_dir: str = Field("", alias="dataDir")

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        problem = ifname_problem(value) if value else None
        if problem is not None:
            msg, details = problem
            raise ValueError(f"{msg}: {details}" if details else msg)
        return value

    @field_validator("runtime_config", mode="before")
    @classmethod
    def _null_runtime_config(cls, value: Any) -> Any:
        return {} if value is None else value  # Go: null is the zero struct

    @property
    def pci_addr(self) -> str:
        """The PCI address in use (``runtimeConfig.deviceID`` wins)."""
        return self.runtime_config.device_id or self.pci_bus_id

    @property
    def ipam_type(self) -> str:
        """``ipam.type``, ``""`` without IPAM (an L2-only attachment)."""
        return self.ipam.type if self.ipam is not None else ""

    def require_device(self) -> None:
        """Go's check that the config names the device one way or another.

        Raises:
            CNIError: 7 with Go's text (Go: 999).
        """
        if not (self.device or self.hwaddr or self.kernelpath or self.pci_addr):
            raise CNIError(ERR_INVALID_NETWORK_CONFIG, NO_DEVICE)

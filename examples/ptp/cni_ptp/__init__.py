"""The ``ptp`` CNI plugin."""

from .plugin import Ptp, PtpConf

__all__ = ["Ptp", "PtpConf"]

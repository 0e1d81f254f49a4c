"""The ``village`` CNI plugin."""

from .plugin import Village, VillageConf

__all__ = ["Village", "VillageConf"]

"""The ``sbr`` meta plugin: source-based routing for the interface an
earlier plugin made (containernetworking/plugins, plugins/meta/sbr).

Same executable name and config keys as Go's; the plugin is `Sbr` (in
`.plugin`).
"""

from __future__ import annotations

from .plugin import ROUTE_PROTO, Sbr, SbrConf

__all__ = ["ROUTE_PROTO", "Sbr", "SbrConf"]

"""Names that mark what a plugin put in shared kernel state: nftables
comments per attachment (`attachment_tag`) and per-network object names
(`network_tag`). Stdlib only: `cni_skel.config` computes GC keep-lists with
it in every plugin, nftables or not; `cni_skel.nft` re-exports both.

Source: the CNI spec 1.1.0 section "GC" (a plugin removes what belongs to
attachments not in ``cni.dev/valid-attachments``); the tag format is ours.
"""

from __future__ import annotations

import hashlib

__all__ = ["COMMENT_MAX", "attachment_tag", "network_tag"]

# The kernel keeps comments as NFTA_*_USERDATA (NFT_USERDATA_MAXLEN 256, with
# a type/length header and the trailing NUL inside it).
COMMENT_MAX = 250


def attachment_tag(container_id: str, ifname: str) -> str:
    """The comment that marks nftables entries of one attachment.

    ``"<containerID>/<ifname>"``, or, when that would not fit an nftables
    comment (`COMMENT_MAX`), ``"sha256:<hex>"`` of it. Compare tags, not
    parsed IDs: GC computes the tags of the valid attachments and removes the
    entries whose tag is not among them.

    Any string gets a tag, never an exception: a GC list may name what no
    ADD accepted (lone surrogates from JSON ``\\udcff`` escapes, which are
    not UTF-8); such a tag is hashed, and matches no entry.
    """
    tag = f"{container_id}/{ifname}"
    try:
        raw = tag.encode()
    except UnicodeEncodeError:
        raw = b""
    if raw and len(raw) <= COMMENT_MAX:
        return tag
    return "sha256:" + hashlib.sha256(tag.encode("utf-8", "surrogatepass")).hexdigest()


def network_tag(network: str, *, prefix: str = "n", width: int = 12) -> str:
    """A short, stable, nftables-safe name for network ``network`` (its
    ``name``), to prefix its chains, sets and maps: ``prefix`` + the first
    ``width`` hex digits of SHA-256 of the name.

    These names are in the kernel of live nodes, so each plugin keeps the
    format it started with (a node upgraded in place must find its objects):
    portmap uses the defaults (``"n" + 12 hex``), bridge ``prefix="n_",
    width=16`` (``"n_" + 16 hex``).
    """
    return prefix + hashlib.sha256(network.encode()).hexdigest()[:width]

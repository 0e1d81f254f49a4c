"""Reference plugin `bridge` (not implemented yet; see the open issues)."""

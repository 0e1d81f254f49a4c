"""Reference plugin `portmap` (not implemented yet; see the open issues)."""

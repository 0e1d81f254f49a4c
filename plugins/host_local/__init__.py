"""Reference plugin `host_local` (not implemented yet; see the open issues)."""

"""Reference plugin `tuning` (not implemented yet; see the open issues)."""

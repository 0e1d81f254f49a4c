"""Benchmarks of the cni-skel plugins against the Go reference plugins (see run.py)."""

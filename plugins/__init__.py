"""The reference plugins, installed under the import name ``cni_skel_plugins``."""

"""``python -m cni_skel.cli``: the ``cni-skel`` command."""

from . import main

main()

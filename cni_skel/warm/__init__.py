"""The warm path: plugin calls served by a long-lived ``cni-skel worker``.

* `cni_skel.warm.protocol`: the one definition of the wire format, limits,
  socket path and environment names (the C launcher's header is generated
  from it).
* `cni_skel.warm.server`: the worker (``cni-skel worker``), split by job:
  `cni_skel.warm.pool` (its parent, which keeps the pool of processes),
  `cni_skel.warm.serving` (a serving process) and `cni_skel.warm.caller`
  (who is served).
* `cni_skel.warm.client`: the Python launcher an installed executable runs.
* ``launcher.c``: the native launcher; `cni_skel.warm.install` compiles it
  and writes every kind of executable (``cni-skel install``).

Nothing is imported here: the skel reads `cni_skel.warm.protocol` on every
call, VERSION included.
"""

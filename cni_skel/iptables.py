"""iptables and ip6tables, for plugins that must write into the node's
iptables filter (a FORWARD policy of DROP can only be overridden there).

Rules go in through the node's own ``iptables``/``ip6tables`` commands,
whichever variant the node's alternatives pick (iptables-nft writes the
``ip filter`` nftables table, iptables-legacy the x_tables), so the node's
other users (Docker, kube-proxy, firewalld) keep reading them with their
own tools: libnftables could write native expressions there, but
iptables-nft can not list a table that holds rules it does not know.
Nothing parses the commands' output: a question is an exit status
(``-C``, ``-S <chain>``). Each call waits for the xtables lock (``-w``).

Rules are argv lists after the chain, as Go's go-iptables takes them
(``["-s", "10.1.0.5/32", "-j", "ACCEPT"]``).

Source: coreos/go-iptables as used by containernetworking/plugins 1.1.1
(``Exists``, ``Insert``, ``AppendUnique``, ``Delete``, ``utils.EnsureChain``,
``utils.InsertUnique``).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Sequence

from .errors import ERR_INTERNAL, CNIError

__all__ = ["IPTables", "restore_line", "variant"]

_TOOLS = {4: "iptables", 6: "ip6tables"}
_NO = (1,)  # iptables' exit status for "no such rule / chain"
# -C also exits 2 (a parameter problem) when the rule's jump target does not
# exist: for a question that is "no"; a rule that is really malformed fails
# loudly when it is then inserted.
_NO_RULE = (1, 2)


_BARE = frozenset("-_./:!,[]")  # what iptables-restore reads unquoted as one word


def restore_line(argv: Sequence[str]) -> str:
    """``argv`` (``["-A", "POSTROUTING", "-s", ...]``) as one line of
    ``iptables-restore`` input (`IPTables.restore`): an argument with a blank
    or a quote goes in double quotes, ``\\`` and ``"`` escaped, as the
    tool's tokenizer reads them (a comment such as ``name: "n" id: "c"``)."""
    def quote(arg: str) -> str:
        if arg and all(c.isalnum() or c in _BARE for c in arg):
            return arg
        return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return " ".join(quote(a) for a in argv)


@functools.lru_cache(maxsize=4)
def variant(version: int = 4) -> str | None:
    """Which iptables the node's ``iptables`` (``ip6tables``) command is:
    ``"nft"`` (iptables-nft: its tables are nftables tables, readable by
    netlink point reads), ``"legacy"`` (x_tables), or None when the command
    is not on PATH. Read from the command's link target (Debian's
    alternatives: ``xtables-nft-multi`` / ``xtables-legacy-multi``), so no
    command is run; a target naming neither counts as ``"legacy"`` (ask the
    command itself). Read once per process (a worker's serving processes
    are replaced after a number of calls, so a switch of alternatives
    reaches them soon)."""
    path = shutil.which(_TOOLS[version])
    if path is None:
        return None
    target = os.path.basename(os.path.realpath(path))
    if "nft" in target:
        return "nft"
    return "legacy"


class IPTables:
    """One IP version's iptables command (``version`` 4 or 6), acting on
    ``table`` (``filter`` unless named) of the calling process's network
    namespace. ``wait``: seconds to wait for the xtables lock;
    ``timeout``: seconds a command may take before it is killed.

    Every method raises `CNIError` 999 naming the command and its stderr
    when the command is missing, times out or fails for another reason
    than the rule or chain being absent.
    """

    def __init__(self, version: int, *, table: str = "filter", wait: int = 10,
                 timeout: float = 30.0) -> None:
        self.version = version
        self.tool = _TOOLS[version]
        self.table = table
        self.wait = wait
        self.timeout = timeout

    def _run(self, args: Sequence[str], *, absent: tuple[int, ...] = ()) -> bool:
        argv = [self.tool, "-w", str(self.wait), "-t", self.table, *args]
        proc = self._exec(argv)
        if proc.returncode == 0:
            return True
        if proc.returncode in absent:
            return False
        raise CNIError(ERR_INTERNAL, f"{' '.join(argv)} exited {proc.returncode}",
                       proc.stderr.decode(errors="replace").strip())

    def _exec(self, argv: list[str], stdin: bytes | None = None
              ) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(argv, input=stdin, capture_output=True, timeout=self.timeout,
                                  check=False)
        except FileNotFoundError:  # not on PATH (exec tells; no look-up per command)
            raise CNIError(ERR_INTERNAL, f"{self.tool} not found",
                           "the iptables package (iptables-nft or -legacy) is needed") from None
        except subprocess.TimeoutExpired:
            raise CNIError(ERR_INTERNAL, f"{' '.join(argv)} did not finish in "
                                         f"{self.timeout:g} s") from None
        except OSError as exc:  # E2BIG for a huge rule, EACCES, ...
            raise CNIError(ERR_INTERNAL, f"{self.tool} could not be run: {exc.strerror or exc}",
                           " ".join(argv)[:500]) from None

    def list_rules(self, chain: str | None = None) -> list[str]:
        """``chain``'s rules as ``iptables -S`` prints them (``-A <chain>
        ...`` lines, its ``-N`` line first); [] when the chain is missing.
        One command however long the chain: reading it once beats a ``-C``
        per rule, each of which reads the whole chain (iptables-nft).
        Without ``chain``, the whole table (``-P``/``-N`` lines, then the
        rules): for a report, not a per-pod verb (kube-proxy's nat is large)."""
        argv = [self.tool, "-w", str(self.wait), "-t", self.table, "-S",
                *([chain] if chain is not None else [])]
        proc = self._exec(argv)
        if proc.returncode in _NO:
            return []
        if proc.returncode != 0:
            raise CNIError(ERR_INTERNAL, f"{' '.join(argv)} exited {proc.returncode}",
                           proc.stderr.decode(errors="replace").strip())
        return proc.stdout.decode(errors="replace").splitlines()

    def restore(self, commands: Sequence[str]) -> None:
        """Apply ``commands`` (``-A``/``-D``/``-I`` lines of this table,
        without the table's name) in one ``iptables-restore --noflush``
        transaction: all of them, or none (CNIError 999 naming the tool and
        its stderr)."""
        text = "\n".join([f"*{self.table}", *commands, "COMMIT", ""]).encode()
        argv = [f"{self.tool}-restore", "-w", str(self.wait), "--noflush"]
        proc = self._exec(argv, text)
        if proc.returncode != 0:
            raise CNIError(ERR_INTERNAL, f"{' '.join(argv)} exited {proc.returncode}",
                           proc.stderr.decode(errors="replace").strip())

    def remove_chain(self, chain: str, referrers: Sequence[str]) -> bool:
        """Delete ``chain`` and every rule of the chains ``referrers`` that
        jumps to it (``... -j <chain>`` as ``-S`` prints it), in one
        ``iptables-restore``: what go ``chain.teardown`` of
        containernetworking/plugins does rule by rule. False (nothing run)
        when the chain is missing; the ``-S`` lines are replayed as ``-D``
        lines, so nothing of them is parsed."""
        if not self.list_rules(chain):
            return False
        jumps = [line for ref in referrers for line in self.list_rules(ref)
                 if line.startswith("-A ") and line.endswith(f" -j {chain}")]
        self.restore([f"-D{line[2:]}" for line in jumps] + [f"-F {chain}", f"-X {chain}"])
        return True

    def chain_exists(self, chain: str) -> bool:
        """Whether ``chain`` exists (``-S <chain>``, its listing unread)."""
        return self._run(["-S", chain], absent=_NO)

    def ensure_chain(self, chain: str) -> None:
        """Create ``chain`` unless it exists (go ``utils.EnsureChain``); a
        concurrent creator is no error."""
        if not self.chain_exists(chain) and not self._run(["-N", chain], absent=_NO) \
                and not self.chain_exists(chain):
            raise CNIError(ERR_INTERNAL, f"{self.tool}: could not create chain {chain}")

    def exists(self, chain: str, rule: Sequence[str]) -> bool:
        """Whether ``chain`` holds ``rule`` (``-C``); False when the chain,
        or the chain the rule jumps to, is missing."""
        return self._run(["-C", chain, *rule], absent=_NO_RULE)

    def insert_unique(self, chain: str, rule: Sequence[str], position: int = 1) -> bool:
        """Insert ``rule`` at ``position`` (1: first) unless ``chain``
        holds it anywhere (go ``utils.InsertUnique``). True when inserted."""
        if self.exists(chain, rule):
            return False
        self._run(["-I", chain, str(position), *rule])
        return True

    def append_unique(self, chain: str, rule: Sequence[str]) -> bool:
        """Append ``rule`` unless ``chain`` holds it (go-iptables
        ``AppendUnique``). True when appended."""
        if self.exists(chain, rule):
            return False
        self._run(["-A", chain, *rule])
        return True

    def delete(self, chain: str, rule: Sequence[str]) -> bool:
        """Delete one ``rule`` from ``chain``: False when it (or the chain)
        is not there, which is no error."""
        return self._run(["-D", chain, *rule], absent=_NO_RULE)

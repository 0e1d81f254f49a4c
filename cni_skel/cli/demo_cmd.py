"""``cni-skel demo``: the click side of `cni_skel.demo` (root check,
signals, exit status); the demo itself lives there."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

import click

from ..demo import DemoFailure, run_demo
from .errors import EXIT_FAILURE, CNICommandError

__all__ = ["demo"]

#: Exit status after Ctrl-C or SIGTERM (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130


@click.command(epilog="\b\nExamples:\n"
               "  make demo                                  # as root on Debian\n"
               "  sudo .venv/bin/cni-skel demo\n"
               "  sudo .venv/bin/cni-skel demo --plugin-dir /usr/lib/cni   # the Go plugins")
@click.option("--plugin-dir", type=click.Path(exists=True, file_okay=False), default=None,
              metavar="DIR",
              help="Run the plugin executables found in DIR instead of installing ours "
                   "(for testing and comparison, e.g. /usr/lib/cni holding Debian's Go "
                   "reference plugins).")
@click.option("--cni-version", default="auto", show_default=True, metavar="VERSION|auto",
              help="cniVersion of the demo's configs; auto: the highest that every plugin "
                   "supports (asked with VERSION).")
@click.option("--one-shot", is_flag=True,
              help="Run our plugins one Python process per call (the fallback), not warm.")
@click.option("-v", "--verbose", is_flag=True, help="Log each plugin execution.")
@click.option("--pause", is_flag=True,
              help="Wait for Enter once both pods are up, to look at them (ip netns exec, nft).")
def demo(plugin_dir: str | None, cni_version: str, one_shot: bool, verbose: bool,
         pause: bool) -> None:
    """Run a real pod network in throw-away network namespaces: the project's
    main job, end to end, through the cni-skel runtime.

    A "node" namespace and two "pod" namespaces are created; our plugins are
    installed into a temporary bin dir the way `cni-skel install` sets up a
    node (launchers and a socket-activated worker; --one-shot: plain
    scripts); a conflist (bridge with host-local
    IPAM on 10.99.0.0/24, tuning, portmap) and a single-plugin loopback
    network are written to a temporary config dir. Both pods are ADDed (the
    plugins run inside the node namespace), the results are shown, pod-a
    pings pod-b, TCP goes pod-b -> pod-a and node -> hostPort (portmap) ->
    pod-a, then CHECK, DEL and a summary. Everything is removed at the end,
    also on failure or Ctrl-C; the machine's own network namespace is never
    touched. Needs root."""
    if os.geteuid() != 0:
        raise click.ClickException("the demo creates network namespaces: run it as root")
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        ok = run_demo(plugin_dir, cni_version, verbose, mode="oneshot" if one_shot else "warm",
                      pause=sys.stdin if pause else None)
    except KeyboardInterrupt:
        # Whatever was cut short (a netlink request, say) may complain while
        # being garbage-collected at exit; the user asked to stop, not for that.
        sys.unraisablehook = lambda unraisable: None
        click.echo("\ninterrupted: namespaces and temporary files removed", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except DemoFailure as exc:
        raise CNICommandError(str(exc)) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not ok:
        sys.exit(EXIT_FAILURE)

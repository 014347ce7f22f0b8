"""Execute one artifact's parameterized notebook with papermill, its kernel on Unix sockets.

    python -m common.harness.execute notebooks/<artifact>.ipynb OUT.ipynb -p artifact_id <artifact> \
        -p results_root results -p package <package> -p profile embedded -y '{"inputs": [...]}'

Why not ``python -m papermill``: its kernels listen on TCP ports that jupyter_client picks by
binding port 0, closing the socket and writing the number into the connection file; the kernel
binds it a moment later. Two kernels started at once by parallel render jobs (``snakemake -j4``)
can draw the same port in that window, and one of them dies at start ("Address already in use",
papermill issue 511). Each kernel here gets its own private folder of socket files instead:
nothing to draw, nothing to collide on.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile

import yaml
from jupyter_client import AsyncKernelManager


class IPCKernelManager(AsyncKernelManager):
    """nbclient's default kernel manager with ``transport='ipc'`` and the sockets in a fresh
    temporary folder of this process (removed at exit)."""

    def __init__(self, **kwargs):
        folder = tempfile.mkdtemp(prefix="kernel-")
        atexit.register(shutil.rmtree, folder, True)
        kwargs.setdefault("transport", "ipc")
        kwargs.setdefault("ip", os.path.join(folder, "k"))  # sockets k-<n>; a path well under 108 bytes
        super().__init__(**kwargs)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook", help="the parameterized notebook (notebooks/<id>.ipynb)")
    ap.add_argument("out", help="the executed notebook to write")
    ap.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="a string parameter (repeatable)")
    ap.add_argument("-y", default=None, metavar="YAML", help="more parameters as one YAML mapping")
    return ap.parse_args(argv)


def parameters(args: argparse.Namespace) -> dict:
    """``-p`` pairs (strings) and the ``-y`` mapping as one dict; a ``-y`` that is not a mapping
    is a ValueError."""
    params = dict(args.p)
    if args.y is not None:
        extra = yaml.safe_load(args.y)
        if not isinstance(extra, dict):
            raise ValueError(f"-y {args.y!r} is not a YAML mapping; valid: e.g. '{{\"inputs\": [...]}}'")
        params.update(extra)
    return params


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        params = parameters(args)
    except (ValueError, yaml.YAMLError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if not os.path.isfile(args.notebook):
        print(f"error: no notebook {args.notebook}; valid: notebooks/<artifact id>.ipynb", file=sys.stderr)
        return 2
    import papermill

    try:
        papermill.execute_notebook(args.notebook, args.out, parameters=params, kernel_name="python3",
                                   language="python", kernel_manager_class=IPCKernelManager)
    except papermill.PapermillExecutionError as e:  # the traceback is in the executed notebook too
        print(e, file=sys.stderr)
        print(f"error: {args.notebook} failed in cell {e.cell_index + 1} of {args.out}: {e.ename}: {e.evalue}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

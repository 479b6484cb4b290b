"""`lsp-dscoder bench --protocol` (this tree's raw client) against the server of another tree.

    mkdir /tmp/old && git archive REV | tar -x -C /tmp/old
    ln -s ../engine /tmp/old/lsp_dscoder/engine && ln -s ../kernels /tmp/old/lsp_dscoder/kernels
    cd /tmp/empty && SERVER_TREE=/tmp/old PYTHONPATH=$REPO python $REPO/tests/lsp/protocol_ab.py --sizes 1k,8k

Run it from a folder without a `lsp_dscoder` package: `python -m` puts the working directory first on the
server's path. SERVER_TREE goes first on the server's PYTHONPATH; the client is the tree this file is in.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import lsp_dscoder.bench_protocol as bench_protocol
from lsp_dscoder.__main__ import main

_server_argv = bench_protocol.server_argv


def _other_server(*args: Any) -> list[str]:
    return ["env", f"PYTHONPATH={os.environ['SERVER_TREE']}", *_server_argv(*args)]


if __name__ == "__main__":
    bench_protocol.server_argv = _other_server
    sys.exit(main(["bench", "--protocol", *sys.argv[1:]]))

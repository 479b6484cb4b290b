"""Where each kernel waits for its predecessor and releases its successor under PDL (kernels/pdl.py), read
from the PTX that Triton emits for sm_90 (tests/kernels/pdl_ptx.py, compiled on this machine in a process
without the interpreter; no GPU needed).

The wait must come before the first load of anything another kernel writes; a kernel with a main loop
releases after its loop (after the last MMA), a small kernel at entry. Each mistake is silent on the GPU:
a missing wait reads stale activations, a release at entry made the H200's steps slower (docs/kernels.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

WAIT, RELEASE = r"griddepcontrol\.wait", r"griddepcontrol\.launch_dependents"
LOAD = r"(@%p\d+ )?(ld\.global|cp\.async\.(ca|cg))"
MMA = r"mma\.sync"
STORE = r"(@%p\d+ )?st\.global"


@pytest.fixture(scope="module")
def ptx() -> dict[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "tests.kernels.pdl_ptx"], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    cases: dict[str, list[str]] = json.loads(run.stdout)
    if "skip" in cases:
        pytest.skip(str(cases["skip"]))
    return cases


def first(lines: list[str], pattern: str) -> int:
    hits = [i for i, line in enumerate(lines) if re.match(pattern, line)]
    assert hits, f"no {pattern!r} in the PTX"
    return hits[0]


def last(lines: list[str], pattern: str) -> int:
    hits = [i for i, line in enumerate(lines) if re.match(pattern, line)]
    assert hits, f"no {pattern!r} in the PTX"
    return hits[-1]


def count(lines: list[str], pattern: str) -> int:
    return sum(bool(re.match(pattern, line)) for line in lines)


@pytest.mark.parametrize(
    "case",
    [
        "skinny split 1",
        "skinny split 4",
        "skinny residual",
        "skinny rms",
        "skinny glu rms",
        "skinny rope rms",
    ],
)
def test_skinny_gemm_waits_before_loading_and_releases_after_its_loop(ptx: dict, case: str) -> None:
    lines = ptx[case]
    assert first(lines, WAIT) < first(lines, LOAD)
    assert last(lines, MMA) < first(lines, RELEASE)
    assert (count(lines, WAIT), count(lines, RELEASE)) == (1, 1)


def test_skinny_gemm_without_pdl_has_neither(ptx: dict) -> None:
    assert not [line for line in ptx["skinny no pdl"] if "griddepcontrol" in line]


def test_decode_attention_releases_after_its_kv_loop(ptx: dict) -> None:
    lines = ptx["decode attention"]
    assert first(lines, WAIT) < first(lines, LOAD)  # seq_len and q come from the kernels before
    assert last(lines, MMA) < first(lines, RELEASE)


@pytest.mark.parametrize("case", ["awq mma", "awq mma sums"])
def test_awq_mma_releases_after_its_weight_stream(ptx: dict, case: str) -> None:
    lines = ptx[case]
    # Weights are written by no kernel, so the first weight load may go out before the wait; x may not.
    assert first(lines, WAIT) < last(lines, LOAD)
    assert last(lines, MMA) < first(lines, RELEASE)


@pytest.mark.parametrize("case", ["rms norm", "rms norm sums"])
def test_small_kernels_release_at_entry(ptx: dict, case: str) -> None:
    lines = ptx[case]
    assert first(lines, RELEASE) < first(lines, WAIT) < first(lines, LOAD)


def test_sums_are_zeroed_after_a_barrier(ptx: dict) -> None:
    # Every thread holds its totals before any thread zeroes them (kernels/split_sums.py's take).
    lines = ptx["rms norm sums"]
    assert first(lines, LOAD) < first(lines, r"bar\.sync") < first(lines, STORE)
    assert count(ptx["awq mma sums"], STORE) == 0  # the GEMM only adds

"""The distributed op (ringattn.torch.shard / ring_attention / unshard) on CPU ranks under torchrun
with gloo: each test launches python/tests/ring_worker.py on 1-4 processes with a fresh seed and
asserts that every rank passed (the worker asserts each case against the float64 reference)."""

import os
import random
import subprocess
import sys

import pytest

from conftest import DEVICE

WORKER = os.path.join(os.path.dirname(__file__), "ring_worker.py")

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="the distributed op runs CPU tensors over gloo")


def launch(mode, ranks, timeout=600):
    seed = random.randrange(1 << 30)
    env = dict(os.environ, RINGATTN_TEST_SEED=str(seed), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", WORKER, mode]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p, seed


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_per_token_parity_with_the_single_process_op(ranks):
    p, seed = launch("parity", ranks)
    assert p.returncode == 0, f"seed {seed}:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    assert f"cases passed on {ranks} ranks" in p.stdout, p.stdout


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_disagreeing_ranks_all_raise_naming_the_rank(ranks):
    p, seed = launch("refusals", ranks)
    assert p.returncode == 0, f"seed {seed}:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    assert f"ring refusals: 6 cases passed on {ranks} ranks" in p.stdout, p.stdout


def test_a_rank_that_leaves_ends_the_call_on_the_others():
    p, seed = launch("dies", 3, timeout=120)
    assert p.returncode == 0, f"seed {seed}:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    for r in (0, 2):
        assert f"rank {r}: the call ended with an error after rank 1 left: ringattn: rank {r}: the caller's " \
               "communicator failed" in p.stdout, p.stdout

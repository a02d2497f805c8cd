"""The shim's worker threads: they take part in products, a product's numbers do not depend
on how many threads computed it, and two callers at once both get exact answers."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from entropix_mlx.accel import blas

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not any(Path(p).exists() for p in blas.OPENBLAS_CANDIDATES),
    reason="the shim runs in front of a system OpenBLAS (Debian: libopenblas0-pthread)",
)

# Products of the few-row kernel (2-64 rows x a weight) and big ones split into shares, through
# MLX; then the shim's cblas_sgemm called from two Python threads at once (ctypes lets go of the
# GIL), each checked against float64 NumPy.
_PRODUCTS = """
import ctypes, hashlib, json, threading
import numpy as np, mlx.core as mx
from entropix_mlx.accel import blas
mx.set_default_device(mx.cpu)
rng = np.random.default_rng(0)
digest = hashlib.sha256()
for m, n, k in [(1, 1536, 576), (3, 577, 576), (8, 4099, 136), (33, 1536, 576), (64, 130, 1003), (300, 700, 200)]:
    a, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
    for _ in range(20):
        out = np.array(mx.array(a) @ mx.array(w).T)
    digest.update(out.tobytes())
shim = blas._shim_library
errors = []
def caller(seed):
    r = np.random.default_rng(seed)
    w = r.standard_normal((1536, 576)).astype(np.float32)  # a weight per caller, as a model's layer
    w64 = w.astype(np.float64).T
    p = lambda x: x.ctypes.data_as(ctypes.c_void_p)
    for _ in range(200):
        a = r.standard_normal((4, 576)).astype(np.float32)
        c = np.zeros((4, 1536), np.float32)
        shim.cblas_sgemm(101, 111, 112, 4, 1536, 576, ctypes.c_float(1.0), p(a), 576, p(w), 576,
                         ctypes.c_float(0.0), p(c), 1536)
        errors.append(float(np.abs(c - a.astype(np.float64) @ w64).max()))
threads = [threading.Thread(target=caller, args=(s,)) for s in (1, 2)]
[t.start() for t in threads]
[t.join() for t in threads]
# On a busy machine a worker may not get a core in time to help with any one product: keep
# going until one has helped (a single-threaded run has no worker to wait for).
a, w = mx.array(rng.standard_normal((4, 576)).astype(np.float32)), mx.array(rng.standard_normal((4096, 576)).astype(np.float32))
for _ in range(2000 if blas.thread_stats()["threads"] > 1 else 0):
    if blas.thread_stats()["worker_chunks"] > 0:
        break
    mx.eval(a @ w.T)
stats = blas.thread_stats()
print(json.dumps({"digest": digest.hexdigest(), "worst": max(errors), "calls": len(errors),
                  "threads": stats["threads"], "worker_chunks": stats["worker_chunks"], "thin": blas.blas_info()["thin_gemm"]}))
"""


def _products(threads: str) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("ENTROPIX_BLAS", "ENTROPIX_BLAS_SHIM", "OMP_NUM_THREADS")}
    env["ENTROPIX_THREADS"] = threads
    code = "import entropix_mlx.accel as accel; accel.enable()\n" + _PRODUCTS
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_workers_share_products_without_changing_a_number():
    one, three = _products("1"), _products("3")
    if not three["thin"]:
        pytest.skip("the shim's few-row kernel does not run here (no compiler, or no AVX2)")
    assert (one["threads"], three["threads"]) == (1, 3)
    assert one["worker_chunks"] == 0 and three["worker_chunks"] > 0
    assert one["digest"] == three["digest"]  # bit for bit, whichever threads computed the chunks
    assert three["calls"] == 400 and three["worst"] < 1e-3  # two callers at once: both exact


def test_the_thread_count_follows_the_settings(monkeypatch):
    monkeypatch.delenv("ENTROPIX_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3,2")
    assert blas.shim_threads() == 3
    monkeypatch.setenv("ENTROPIX_THREADS", "1")
    assert blas.shim_threads() == 1
    monkeypatch.setenv("ENTROPIX_THREADS", "many")
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert blas.shim_threads() == len(__import__("os").sched_getaffinity(0))

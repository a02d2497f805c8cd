"""Which compute path runs: the BLAS MLX's CPU backend calls, and the weight format.

On Linux, MLX runs on its CPU backend. There its quantized matmul is the
bottleneck (a 4-bit matmul costs the same per row whatever the batch), while a
float32 matmul goes to `cblas_sgemm`. The `mlx[cpu]` wheel links a slow
reference BLAS; a system OpenBLAS is 5-10x faster. Loading it with
`RTLD_GLOBAL` *before* `mlx.core` is first imported puts its `cblas_sgemm` first
in the process's global symbol scope, so MLX's calls resolve to it: no
`LD_PRELOAD`, no rebuild. So this module must not import MLX at module level,
and `entropix_mlx/__init__.py` calls `load_blas()` before anything else.

Weights: `native` keeps the file's format (quantized stays quantized);
`float32` dequantizes once at load, so every matmul is a BLAS GEMM (one GEMM
for all rows of a batch); `auto` picks float32 on the CPU device when the
float32 weights fit `FLOAT32_BUDGET_BYTES` and a real BLAS runs them (a system
OpenBLAS; Accelerate on macOS), native otherwise, and always native on a GPU
(Metal), where quantized matmuls are fast and memory bandwidth rules.

Thin products: MLX calls only `cblas_sgemm`, also for a decode step's products
of one or a few rows of activations with each weight matrix, and OpenBLAS 0.3.21
(Debian 12) runs those far below the memory bandwidth (an M=1 GEMM at about half
its GEMV's speed, the GEMV itself at under half the bandwidth). `blas_shim.c` is
a `cblas_sgemm` that sends products of 1-64 rows with a weight matrix to a
kernel of its own (each weight row read once for every row, prefetched, split
over the cores with OpenMP), the attention's tiny products of a decode step to
small kernels on the calling thread, other single-row and single-column products
to `cblas_sgemv`, and everything else to OpenBLAS's own. It is compiled once with
the system C compiler (which MLX's CPU backend already uses for its own
kernels), cached, and put in the global scope ahead of OpenBLAS. Without OpenMP
it is built single-threaded and keeps only the GEMV part; without a compiler,
or if anything fails, plain OpenBLAS runs.

Environment: `ENTROPIX_BLAS` = a library path to load, or `none` to load
nothing; `ENTROPIX_BLAS_SHIM=off` = plain OpenBLAS for every product;
`ENTROPIX_WEIGHTS` = the default for `--weights`.
"""

import ctypes
import ctypes.util
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WEIGHT_FORMATS = ("auto", "native", "float32")

# float32 weights of up to 4 GB (a ~1B model): on CPU they decode faster than
# quantized ones, and a laptop has room for them. Larger models stay native.
FLOAT32_BUDGET_BYTES = 4 * 1024**3

# Where distributions put OpenBLAS (the pthread build first: it uses every core).
_ARCH = platform.machine()
OPENBLAS_CANDIDATES = (
    f"/usr/lib/{_ARCH}-linux-gnu/openblas-pthread/libopenblas.so.0",   # Debian, Ubuntu
    f"/usr/lib/{_ARCH}-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",                                      # Fedora (pthread)
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",                                         # Arch
    "/usr/lib/libopenblas.so",
)

_blas: dict = {"name": None, "path": None, "reason": "not loaded yet", "shim": None, "shim_reason": "",
               "thin_gemm": False}
_shim_library = None   # the loaded shim (its call counter, for tests)

SHIM_SOURCE = Path(__file__).with_name("blas_shim.c")
_OFF = ("none", "off", "0", "false")


def load_blas() -> dict:
    """Load a system OpenBLAS into the global symbol scope, once, before MLX.
    Never fails: without one, MLX keeps its own BLAS. Returns `blas_info()`."""
    if _blas["reason"] != "not loaded yet":
        return blas_info()
    if sys.platform != "linux":
        _blas.update(reason="not Linux: MLX uses the platform's BLAS (Accelerate on macOS)")
        return blas_info()
    if "mlx.core" in sys.modules:
        _blas.update(reason="mlx.core was imported before entropix_mlx; its BLAS is already bound")
        return blas_info()
    wanted = os.environ.get("ENTROPIX_BLAS", "").strip()
    if wanted.lower() in _OFF:
        _blas.update(reason="ENTROPIX_BLAS=none")
        return blas_info()
    candidates = [wanted] if wanted else [*OPENBLAS_CANDIDATES, ctypes.util.find_library("openblas")]
    for path in candidates:
        if not path or (os.sep in path and not Path(path).exists()):
            continue
        try:
            # Local first: the shim's cblas_sgemm must come before OpenBLAS's in the global scope.
            library = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
            library.cblas_sgemm   # noqa: B018  (an OpenBLAS without CBLAS would not help)
        except (OSError, AttributeError):
            continue
        shim, shim_reason = _load_shim(library)
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)   # now global: MLX's other BLAS calls resolve to it
        thin = bool(shim and _shim_library.entropix_thin_gemm_active())
        _blas.update(name="OpenBLAS", path=path, reason="", shim=shim, shim_reason=shim_reason, thin_gemm=thin)
        return blas_info()
    _blas.update(reason=f"ENTROPIX_BLAS={wanted} could not be loaded" if wanted
                 else "no system OpenBLAS found (Debian/Ubuntu: apt install libopenblas0-pthread)")
    return blas_info()


def _build_shim() -> tuple[str | None, str]:
    """blas_shim.c compiled to a shared library, once: cached by its content under
    ~/.cache/entropix-mlx (else the temp folder). Returns (path, "") or (None, why not)."""
    source = SHIM_SOURCE.read_bytes()
    name = f"blas_shim-{hashlib.sha256(source + platform.machine().encode()).hexdigest()[:16]}.so"
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folders = (Path(cache_home) / "entropix-mlx", Path(tempfile.gettempdir()) / f"entropix-mlx-{os.getuid()}")
    for folder in folders:
        if (folder / name).exists():
            return str(folder / name), ""
    compiler = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc") or ""]
    if not compiler[0]:
        return None, "no C compiler (cc) to build it"
    why = "no writable cache folder"
    for folder in folders:
        partial = folder / f".{name}.{os.getpid()}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for flags in (["-fopenmp"], ["-DENTROPIX_NO_THREADS"]):   # without OpenMP: the GEMV part only
                done = subprocess.run([*compiler, "-O3", *flags, "-shared", "-fPIC", "-o", str(partial),
                                       str(SHIM_SOURCE)], capture_output=True, text=True, timeout=120)
                if done.returncode == 0:
                    break
            if done.returncode != 0:
                partial.unlink(missing_ok=True)
                return None, f"{compiler[0]} could not build it: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
            os.replace(partial, folder / name)   # whole or not at all, also with two processes at once
            return str(folder / name), ""
        except (OSError, subprocess.SubprocessError) as e:
            why = f"cannot build it in {folder}: {e}"
    return None, why


def _load_shim(openblas) -> tuple[str | None, str]:
    """Build and load the shim in front of `openblas` (loaded, not yet global).
    Returns (its path, "") or (None, why plain OpenBLAS runs)."""
    if os.environ.get("ENTROPIX_BLAS_SHIM", "").strip().lower() in _OFF:
        return None, "ENTROPIX_BLAS_SHIM=off"
    try:
        sgemm, sgemv = openblas.cblas_sgemm, openblas.cblas_sgemv
    except AttributeError:
        return None, "this OpenBLAS has no cblas_sgemv"
    path, why = _build_shim()
    if path is None:
        return None, why
    set_threads = getattr(openblas, "openblas_set_num_threads", None)   # the shim's OpenMP threads replace them
    global _shim_library
    try:
        shim = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        if not shim.entropix_blas_shim_init(ctypes.cast(sgemm, ctypes.c_void_p), ctypes.cast(sgemv, ctypes.c_void_p),
                                            ctypes.cast(set_threads, ctypes.c_void_p) if set_threads else None):
            return None, "the shim did not get OpenBLAS's functions"
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)   # first in the global scope: MLX's cblas_sgemm is the shim's
    except (OSError, AttributeError) as e:
        return None, f"cannot load {path}: {e}"
    _shim_library = shim
    return path, ""


def blas_info() -> dict:
    """{"name": "OpenBLAS" or None, "path": ..., "reason": why none, "",
    "shim": the shim's path or None, "shim_reason": why none, "",
    "thin_gemm": whether the shim's few-row kernel runs}."""
    return dict(_blas)


def blas_name() -> str:
    """What MLX's float32 matmul calls: 'OpenBLAS + thin kernels' (the shim's
    GEMV and few-row kernel), 'OpenBLAS + GEMV' (the shim without its kernel:
    no OpenMP, or a CPU without AVX2), 'OpenBLAS', 'MLX's BLAS' or 'Accelerate'."""
    if _blas["name"]:
        if not _blas["shim"]:
            return _blas["name"]
        return _blas["name"] + (" + thin kernels" if _blas["thin_gemm"] else " + GEMV")
    return "Accelerate" if sys.platform == "darwin" else "MLX's BLAS"


def thin_gemm_calls() -> int:
    """How many products the shim's few-row kernel has run in this process."""
    return _shim_library.entropix_thin_gemm_calls() if _shim_library is not None else 0


def wide_thin_tiles(on: bool) -> tuple[bool, int]:
    """Tests: let the shim's few-row kernel use its AVX-512VL tiles (on) or only its
    AVX2 ones (off). Returns (whether the AVX-512VL tiles run now, how many products
    they have taken in this process)."""
    if _shim_library is None:
        return False, 0
    return bool(_shim_library.entropix_thin_gemm_wide(int(on))), _shim_library.entropix_thin_gemm_wide_calls()


def default_weights() -> str:
    value = os.environ.get("ENTROPIX_WEIGHTS", "auto").strip().lower() or "auto"
    return value


def check_weights(value: str) -> str:
    from .errors import ConfigError

    if value not in WEIGHT_FORMATS:
        raise ConfigError(f"'{value}' is not a weight format; use one of: {', '.join(WEIGHT_FORMATS)}")
    return value


def float32_bytes(model) -> int:
    """What the model's weights take once dequantized to float32."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    quantized = {name: m.bits for name, m in model.named_modules()
                 if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    total = 0
    for name, value in tree_flatten(model.parameters()):
        owner, _, leaf = name.rpartition(".")
        if owner in quantized:
            if leaf == "weight":   # packed: 32 // bits values per uint32
                total += value.size * (32 // quantized[owner]) * 4
            elif leaf == "bias":
                total += value.size * 4
            continue               # scales and biases of the quantization go away
        total += value.size * 4
    return total


def choose_weights(requested: str, model) -> str:
    """`native` or `float32` for this model on this device."""
    import mlx.core as mx

    requested = check_weights(requested)
    if requested != "auto":
        return requested
    if mx.default_device() != mx.cpu:
        return "native"
    if not _blas["name"] and sys.platform != "darwin":
        # MLX's own reference BLAS runs a float32 matmul at about what its quantized kernel
        # costs, at 4.7x the memory (bench without OpenBLAS on a 2-core Zen 3 VM: greedy
        # 0.94x mlx-lm against native's 0.95x, full Entropix 0.77x against 0.80x, prefill
        # 0.88x against 0.97x): float32 pays only with a real BLAS.
        return "native"
    return "float32" if float32_bytes(model) <= FLOAT32_BUDGET_BYTES else "native"


def to_float32(model):
    """Dequantize every quantized layer once and cast all weights to float32, in
    place: each matmul then runs as a BLAS GEMM. Returns the model."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_unflatten

    replacements = []
    for name, module in model.named_modules():
        if not isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            continue
        # float32 scales and biases: dequantizing in their float16 would round
        # every weight to float16 (~1e-2 on a logit).
        biases = module.get("biases")
        weight = mx.dequantize(module.weight, module.scales.astype(mx.float32),
                               None if biases is None else biases.astype(mx.float32),
                               module.group_size, module.bits, mode=getattr(module, "mode", "affine"))
        if isinstance(module, nn.QuantizedLinear):
            has_bias = "bias" in module
            layer = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias)
            if has_bias:
                layer.bias = module.bias
        else:
            layer = nn.Embedding(*weight.shape)
        layer.weight = weight
        replacements.append((name, layer))
    if replacements:
        model.update_modules(tree_unflatten(replacements))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def weights_format(model) -> str:
    """What the loaded model holds: 'float32', or the native format (e.g. '4-bit')."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    bits = sorted({m.bits for _, m in model.named_modules()
                   if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))})
    if bits:
        return "native " + "/".join(f"{b}-bit" for b in bits)
    dtypes = sorted({str(v.dtype).replace("mlx.core.", "") for _, v in tree_flatten(model.parameters())})
    return "/".join(dtypes)


def gemm_uses_all_cores(model) -> bool:
    """Float32 weights with OpenBLAS: every matmul is a multi-threaded GEMM."""
    return blas_info()["name"] == "OpenBLAS" and weights_format(model).startswith("float32")


def describe(model) -> str:
    """One line for headers: e.g. 'cpu · float32 weights · OpenBLAS'."""
    import mlx.core as mx

    device = "cpu" if mx.default_device() == mx.cpu else "gpu"
    fmt = weights_format(model)
    text = f"{device} · {fmt} weights"
    if device == "cpu" and fmt.startswith("float32"):
        text += f" · {blas_name()}"
    return text

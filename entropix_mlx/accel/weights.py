"""Which compute path runs: the BLAS MLX's CPU backend calls, and the weight format.

On Linux, MLX runs on its CPU backend. There its quantized matmul is the
bottleneck (a 4-bit matmul costs the same per row whatever the batch), while a
float32 matmul goes to `cblas_sgemm`. The `mlx[cpu]` wheel links a slow
reference BLAS; a system OpenBLAS is much faster. `entropix_mlx.accel.enable()`
(blas.py) loads it before `mlx.core` is first imported, so MLX's calls resolve
to it.

Weights: `native` keeps the file's format (quantized stays quantized);
`float32` dequantizes once at load, so every matmul is a BLAS GEMM (one GEMM
for all rows of a batch); `auto` picks float32 on the CPU device when the
float32 weights fit in half of this machine's memory and a real BLAS runs them
(a system OpenBLAS; Accelerate on macOS), native otherwise, and always native
on a GPU (Metal), where quantized matmuls are fast and memory bandwidth rules.

Thin products: MLX calls only `cblas_sgemm`, also for a decode step's products
of one or a few rows of activations with each weight matrix, and OpenBLAS 0.3.21
(Debian 12) runs those far below the memory bandwidth (an M=1 GEMM packs the whole
weight matrix on every call; even its GEMV streams the weights below the memory's
speed). `blas_shim.c` is
a `cblas_sgemm` that sends products of 1-64 rows with a weight matrix to a
kernel of its own (each weight row read once for every row, prefetched, split
over the cores by the shim's own worker threads), the attention's tiny products of a decode step to
small kernels on the calling thread, other single-row and single-column products
to `cblas_sgemv`, and everything else to OpenBLAS's own. It is compiled once with
the system C compiler (which MLX's CPU backend already uses for its own
kernels) into the user's cache folder (build.py), and put in the global scope
ahead of OpenBLAS. Without threads it is built single-threaded and keeps only the
GEMV part; without a compiler, with an unsafe cache folder, or if anything
fails, plain OpenBLAS runs.

Environment: `ENTROPIX_BLAS` = a library path to load, or `none` to load
nothing; `ENTROPIX_BLAS_SHIM=off` = plain OpenBLAS for every product;
`ENTROPIX_WEIGHTS` = the default weight format.
"""

import os
import sys

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import ConfigError
from .blas import blas_info, blas_name, blas_refused

WEIGHT_FORMATS = ("auto", "native", "float32")


# On the CPU float32 weights decode several times faster than quantized ones (a
# quantized matmul costs the same per row at any batch; float32 reads 4x the bytes
# but runs as a GEMM): worth the memory while they leave the machine half of it.
FLOAT32_SHARE_OF_MEMORY = 0.5
FALLBACK_MEMORY_BYTES = 8 * 1024**3  # where the system does not say


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return FALLBACK_MEMORY_BYTES


def float32_budget_bytes() -> int:
    """The most float32 weights `auto` takes on: half of this machine's memory."""
    return int(FLOAT32_SHARE_OF_MEMORY * physical_memory())


def default_weights() -> str:
    value = os.environ.get("ENTROPIX_WEIGHTS", "auto").strip().lower() or "auto"
    return value


def check_weights(value: str) -> str:
    if value not in WEIGHT_FORMATS:
        raise ConfigError(f"'{value}' is not a weight format; use one of: {', '.join(WEIGHT_FORMATS)}")
    return value


def float32_bytes(model) -> int:
    """What the model's weights take once dequantized to float32."""
    quantized = {
        name: m.bits for name, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
    }
    total = 0
    for name, value in tree_flatten(model.parameters()):
        owner, _, leaf = name.rpartition(".")
        if owner in quantized:
            if leaf == "weight":  # packed: 32 // bits values per uint32
                total += value.size * (32 // quantized[owner]) * 4
            elif leaf == "bias":
                total += value.size * 4
            continue  # scales and biases of the quantization go away
        total += value.size * 4
    return total


def choose_weights(requested: str, model=None, float32_nbytes: int | None = None) -> str:
    """`native` or `float32` for this model (or a model of `float32_nbytes` once
    dequantized) on this device."""
    requested = check_weights(requested)
    if requested != "auto":
        return requested
    if mx.default_device() != mx.cpu or not _real_blas():
        return "native"
    nbytes = float32_bytes(model) if float32_nbytes is None else float32_nbytes
    return "float32" if nbytes <= float32_budget_bytes() else "native"


def _real_blas() -> bool:
    # MLX's own reference BLAS runs a float32 matmul no faster than its quantized kernel,
    # on several times the memory: float32 pays only with a real BLAS.
    return bool(blas_info()["name"]) or sys.platform == "darwin"


def auto_rule() -> str:
    """What the `auto` weight format picks on this device, and why (for `doctor`)."""
    if mx.default_device() != mx.cpu:
        return "native: on a GPU quantized matmuls are fast"
    if not _real_blas():
        return "native: float32 gains nothing without a real BLAS"
    budget = float32_budget_bytes() / 1024**3
    return f"float32 for models up to {budget:.1f} GB of float32 weights (half this machine's memory), native above"


def to_float32(model):
    """Dequantize every quantized layer once and cast all weights to float32, in
    place: each matmul then runs as a BLAS GEMM. Returns the model."""
    replacements = []
    for name, module in model.named_modules():
        if not isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            continue
        # float32 scales and biases: dequantizing in their float16 would round
        # every weight to float16 (~1e-2 on a logit).
        biases = module.get("biases")
        weight = mx.dequantize(
            module.weight,
            module.scales.astype(mx.float32),
            None if biases is None else biases.astype(mx.float32),
            module.group_size,
            module.bits,
            mode=getattr(module, "mode", "affine"),
        )
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
    bits = sorted(
        {m.bits for _, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    )
    if bits:
        return "native " + "/".join(f"{b}-bit" for b in bits)
    dtypes = sorted({str(v.dtype).replace("mlx.core.", "") for _, v in tree_flatten(model.parameters())})
    return "/".join(dtypes)


def gemm_uses_all_cores(model) -> bool:
    """Float32 weights with OpenBLAS: every matmul is a multi-threaded GEMM."""
    return blas_info()["name"] == "OpenBLAS" and weights_format(model).startswith("float32")


def describe(model) -> str:
    """One line for headers: e.g. 'cpu · float32 weights · OpenBLAS'."""
    device = "cpu" if mx.default_device() == mx.cpu else "gpu"
    fmt = weights_format(model)
    text = f"{device} · {fmt} weights"
    if device == "cpu" and fmt.startswith("float32"):
        text += f" · {blas_name()}"
    if device == "cpu" and blas_refused():  # asked for and not running: never silently
        text += f" · {blas_refused()}"
    return text

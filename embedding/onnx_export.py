"""Export a sentence-transformers encoder to ONNX once, quantise it, cache both on disk.

Cache layout (``cache_dir/onnx/<model>-<sha256 of the weights, 16 hex>-<EXPORT_VERSION>/``)::

    model.fp32.onnx          the Hugging Face encoder (input_ids, attention_mask[, token_type_ids]
                             -> last_hidden_state), dynamic batch and sequence axes, opset 17
    model.int8-<recipe>.onnx the same, weights int8 per output channel (dynamic quantisation);
                             ``<recipe>`` is ``dot`` or ``sat`` (see :func:`int8_recipe`)
    export.lock              held while a process exports, so concurrent processes export once
                             (the others wait on it, then open the file the first one wrote)

The first use prints one line on stderr when the export starts and one when it ends. The
packaged MiniLM, fp32 + int8 on the shared 2-core machine (load average ~3): 11 s in
scripts/smoke_core.sh's fresh venv, 17 s for three processes started together on one empty cache
(one exported, two waited); the int8 quantisation alone, from a cached fp32 file, ~2 s.

Pooling and normalisation stay outside the graph (numpy, in :mod:`embedding.onnx`).

Choices measured on SciFact (cosine to the torch model): the encoder is exported with eager
attention (the SDPA path exports ``Where``/``IsNaN`` mask ops that cost ~17 % of the int8 run
time); per-tensor int8 weights give cosine 0.90 (min, 256 documents), per-channel 0.9887 (min,
all 5,183 documents). The FFN down-projections (1536 -> 384) carry the activation outliers, and
an error in an early layer is amplified by the rest, so the first ones stay fp32:

* ``dot`` recipe (the CPU has an int8 dot product that accumulates in int32: x86 AVX512-VNNI or
  AVX-VNNI, Arm ``asimddp``): layer 0's down-projection stays fp32. Min cosine 0.9911 on all
  documents and on the 1,109 queries; model CPU time per query 2.31 ms vs 2.66 ms with three
  fp32 layers (AMD EPYC with AVX512-VNNI, queries in batches of 32).
* ``sat`` recipe (other CPUs): ONNX Runtime's u8s8 kernels on SSE4.1/AVX2/AVX512 without VNNI
  sum pairs of products in saturating int16 (``VPMADDUBSW``; onnxruntime PR #12088, oneDNN's
  "Nuances of int8 computations"), so the first half of the layers keep their down-projection
  in fp32 (min cosine 0.9948 on a VNNI CPU; not measured here on a CPU without VNNI).
"""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from embedding.st_layout import StLayout
from quarry.errors import EmbeddingError

Quantize = Literal["int8", "none"]
Int8Recipe = Literal["dot", "sat"]
EXPORT_VERSION = "v1"  # bump when the fp32 export changes (the int8 recipe is in the file name)
OPSET = 17
log = logging.getLogger(__name__)


def cache_folder(layout: StLayout, cache_dir: Path, model_id: str) -> Path:
    """Where the ONNX files of ``layout`` live: keyed by model id and a hash of its weights."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_id)
    return cache_dir / "onnx" / f"{safe}-{layout.weights_digest()[:16]}-{EXPORT_VERSION}"


def ensure_onnx(layout: StLayout, cache_dir: Path, model_id: str, quantize: Quantize) -> Path:
    """Return the cached ONNX model, exporting (and quantising) it first if needed.

    Args:
        layout: The sentence-transformers folder to export.
        cache_dir: Root of the model cache (``Settings.model_cache_dir``).
        model_id: Name used in the cache folder.
        quantize: ``"none"`` (fp32) or ``"int8"`` (dynamic, per-channel weights).

    Returns:
        Path of the ``.onnx`` file.

    Raises:
        EmbeddingError: The export or the quantisation failed.
    """
    folder = cache_folder(layout, cache_dir, model_id)
    fp32 = folder / "model.fp32.onnx"
    recipe = int8_recipe()
    target = fp32 if quantize == "none" else folder / f"model.int8-{recipe}.onnx"
    if target.is_file():
        return target
    with contextlib.ExitStack() as held:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            held.enter_context(_locked(folder / "export.lock"))
        except OSError as exc:
            raise EmbeddingError(
                f"cannot use the model cache {folder} (QUARRY_EMBEDDING__CACHE_DIR): {exc.strerror or exc}"
            ) from exc
        if target.is_file():  # another process exported it while this one waited for the lock
            return target
        started = time.monotonic()
        progress(f"exporting {model_id} to ONNX ({'fp32' if quantize == 'none' else 'int8-' + recipe}), once "
                 f"for this model cache: {folder} ...")
        try:
            with _quiet_root_logger():
                if not fp32.is_file():
                    _atomic(fp32, lambda tmp: export_fp32(layout, tmp))
                if quantize == "int8" and not target.is_file():
                    _atomic(target, lambda tmp: quantize_int8(fp32, tmp, recipe))
        except EmbeddingError:
            raise
        except Exception as exc:  # torch / onnx / onnxruntime raise many types
            raise EmbeddingError(f"ONNX export of {layout.root} failed: {exc}") from exc
    progress(f"exported {model_id} to {target.name} in {time.monotonic() - started:.0f} s")
    return target


def progress(line: str) -> None:
    """One line on stderr (and the ``embedding.onnx_export`` log): the export is slow enough to say so."""
    log.info(line)
    print(f"quarry: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _atomic(target: Path, write: Callable[[Path], None]) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def export_fp32(layout: StLayout, out: Path) -> None:
    """Trace the encoder of ``layout`` to ONNX at ``out`` (dynamic batch and sequence axes).

    Raises:
        Exception: Whatever torch's exporter raises (wrapped by :func:`ensure_onnx`).
    """
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(layout.transformer_dir), attn_implementation="eager")
    model.eval()
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in inspect.signature(model.forward).parameters:
        names.append("token_type_ids")

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            hidden: torch.Tensor = self.model(**dict(zip(names, inputs, strict=True))).last_hidden_state
            return hidden

    ids = torch.full((2, 16), 100, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # trace with padding so no mask branch is folded away
    example = (ids, mask, torch.zeros_like(ids))[: len(names)]
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, "last_hidden_state"]}
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # TracerWarning / legacy-exporter deprecation notes
        torch.onnx.export(
            Encoder(), example, str(out), input_names=names, output_names=["last_hidden_state"],
            dynamic_axes=axes, opset_version=OPSET, dynamo=False, do_constant_folding=True,
        )


def down_projections(model_path: Path) -> list[str]:
    """Names of the FFN down-projection MatMuls (weight ``(k, n)`` with ``k > n``), in graph order."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    names = []
    for node in graph.node:
        dims = shapes.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) > 1 else None
        if dims is not None and len(dims) == 2 and dims[0] > dims[1]:
            names.append(node.name)
    return names


def int8_recipe(cpu_flags: frozenset[str] | None = None) -> Int8Recipe:
    """``"dot"`` where int8 dot products accumulate exactly in int32, else ``"sat"``.

    Args:
        cpu_flags: The CPU's feature flags; default those of ``/proc/cpuinfo`` (none elsewhere,
            which picks the conservative ``"sat"``).
    """
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    return "dot" if flags & {"avx512_vnni", "avx_vnni", "asimddp"} else "sat"


def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 / Arm
            return frozenset(value.split())
    return frozenset()


def quantize_int8(fp32: Path, out: Path, recipe: Int8Recipe) -> None:
    """Dynamic int8 quantisation of the MatMul weights (per output channel), ``fp32`` -> ``out``.

    The FFN down-projections of the first layer (``dot``) or of the first half of the layers
    (``sat``) stay fp32 (see the module docstring).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    downs = down_projections(fp32)
    keep = 1 if recipe == "dot" else (len(downs) + 1) // 2
    with _quiet_root_logger():  # it logs "consider pre-processing": symbolic shape inference fails here
        quantize_dynamic(
            str(fp32), str(out),
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul"],
            nodes_to_exclude=downs[:keep],
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """Silence the root logger, and undo what the export libraries do to it.

    onnxruntime's quantiser calls ``logging.basicConfig``, which left a stderr handler on the
    root logger: afterwards other libraries' records (``DEBUG:bm25s:...``) reached the terminal.
    """
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)

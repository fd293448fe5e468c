"""A model to one GGUF file, for llama.cpp and what runs on it (Ollama, LM Studio).

The source is a training job's output folder (its merged model first, then its full model, else its adapter on
its base), a transformers model folder, or a peft adapter folder whose base is a local folder. Tensors are read one
at a time from the safetensors files (an adapter's merge holds the model once, in fp32), renamed through gguf's
tensor-name map, changed where llama.cpp's architecture computes differently (families.py), converted and streamed
into the file: the GGUF is never held whole in memory. The file is written aside and renamed into place.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tunebench.errors import UserError, invalid
from tunebench.export.families import Family, family_of, rope_freqs, transform, write_keys
from tunebench.export.vocab import add_vocab
from tunebench.files import written_aside

QUANTS = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16,
          "q8_0": gguf.GGMLQuantizationType.Q8_0}
FILE_TYPES = {"f16": gguf.LlamaFileType.MOSTLY_F16, "bf16": gguf.LlamaFileType.MOSTLY_BF16,
              "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
OUTPUTS = ("merged", "model", "adapter")  # a job's output folders, in the order they are exported
SKIPPED = ("rotary_emb.inv_freq",)  # recomputed by llama.cpp from the rope keys


@dataclass
class Source:
    folder: Path  # the model or adapter folder read
    adapter: bool  # `folder` is a peft adapter, merged onto its base before export
    job: Path | None  # the training job's output folder it came from, if any


@dataclass
class Weights:
    hp: dict[str, Any]  # the model's config.json
    shapes: dict[str, tuple[int, ...]]  # HF tensor name -> shape, in the checkpoint's order
    load: Callable[[str], Any]  # HF tensor name -> the torch tensor


def export_gguf(source: str | Path, out: str | Path | None = None, quant: str = "f16",
                progress: Callable[[str], None] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Write `source` as one GGUF file (`quant`: f16, bf16 or q8_0; norms and biases stay f32) at `out` (by default
    model.gguf in a job's output folder, else `<folder>-<quant>.gguf` beside the folder). An existing `out` is
    refused unless `overwrite`. Returns the path, architecture, quant, tensor count, size and the folder read."""
    if quant not in QUANTS:
        raise invalid("quant", quant, "one of f16, bf16, q8_0")
    say = progress or (lambda _line: None)
    src = resolve(Path(source))
    family_of(json.loads(((_base_of(src.folder) if src.adapter else src.folder) / "config.json").read_text()))
    dest = _destination(src, out, quant, overwrite)  # both refused before a weight is read
    with _weights(src, say) as weights:
        name, fam = family_of(weights.hp)
        plan = _plan(weights, fam, quant)
        with written_aside(dest) as tmp:
            _write(tmp, weights, fam, plan, quant, _tokenizer_folder(src), (src.job or src.folder).name, say)
    say(f"wrote {dest} ({len(plan)} tensors)")
    return {"path": str(dest), "arch": gguf.MODEL_ARCH_NAMES[fam.arch], "architecture": name, "quant": quant,
            "tensors": len(plan), "bytes": dest.stat().st_size, "source": str(src.folder)}


def resolve(path: Path) -> Source:
    """The folder to export: a job's merged/, model/ or adapter/ (in that order), or `path` itself."""
    if not path.is_dir():
        raise UserError(f"invalid source={path}: not a folder; give a training job's output folder, a model folder "
                        "or an adapter folder")
    own = (path / "config.json").is_file() or (path / "adapter_config.json").is_file()
    if (path / "run.json").is_file() or (not own and any((path / o).is_dir() for o in OUTPUTS)):
        for name in OUTPUTS:
            sub = path / name
            if (sub / "config.json").is_file() or (sub / "adapter_config.json").is_file():
                return Source(sub, (sub / "adapter_config.json").is_file(), path)
        raise UserError(f"invalid source={path}: the job's output folder holds no merged/, model/ or adapter/ "
                        "folder; export after the job has finished")
    if (path / "adapter_config.json").is_file():
        return Source(path, True, None)
    if (path / "config.json").is_file():
        return Source(path, False, None)
    raise UserError(f"invalid source={path}: holds no config.json or adapter_config.json; give a training job's "
                    "output folder, a transformers model folder or a peft adapter folder")


def _destination(src: Source, out: str | Path | None, quant: str, overwrite: bool) -> Path:
    if out is not None:
        dest = Path(out)
    elif src.job is not None:
        dest = src.job / "model.gguf"
    else:
        dest = src.folder.parent / f"{src.folder.name}-{quant}.gguf"
    if dest.is_dir():
        raise UserError(f"invalid out={dest}: is a folder; give the path of the .gguf file to write")
    if dest.exists() and not overwrite:
        raise UserError(f"invalid out={dest}: the file exists; give another path, or overwrite it (--overwrite)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest


def _base_of(adapter: Path) -> Path:
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    base = cfg.get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise UserError(f"cannot export the adapter in {adapter}: its base {base!r} is not a local model folder; "
                        "train with --merge and export the job's merged/ model")
    return Path(base)


def _tokenizer_folder(src: Source) -> Path:
    """The adapter's own tokenizer (the one it was trained with, saved beside it), else its base's."""
    if src.adapter and not (src.folder / "tokenizer.json").is_file():
        return _base_of(src.folder)
    return src.folder


@contextlib.contextmanager
def _weights(src: Source, say: Callable[[str], None]) -> Iterator[Weights]:
    if src.adapter:
        yield _merged(src.folder, say)
        return
    hp = json.loads((src.folder / "config.json").read_text())
    with _safetensors(src.folder) as (shapes, load):
        yield Weights(hp, shapes, load)


def _merged(adapter: Path, say: Callable[[str], None]) -> Weights:
    """The adapter merged onto its base in fp32 (peft's merge_and_unload): one rounding, at the export's cast."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = _base_of(adapter)
    say(f"merging the adapter {adapter} onto its base {base}")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
    model = PeftModel.from_pretrained(model, adapter, is_trainable=False).merge_and_unload()
    sd = model.state_dict()
    hp = json.loads((base / "config.json").read_text())
    return Weights(hp, {k: tuple(v.shape) for k, v in sd.items()}, sd.__getitem__)


@contextlib.contextmanager
def _safetensors(folder: Path) -> Iterator[tuple[dict[str, tuple[int, ...]], Callable[[str], Any]]]:
    """Every tensor's shape from the safetensors headers, and a loader of one tensor at a time."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = list(dict.fromkeys(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise UserError(f"cannot export {folder} to GGUF: it holds no model.safetensors; save the model there with "
                        "save_pretrained(folder) (safetensors)")
    with contextlib.ExitStack() as stack:
        shapes, where = {}, {}
        for f in files:
            h = stack.enter_context(safe_open(str(folder / f), framework="pt"))
            for k in h.keys():
                shapes[k], where[k] = tuple(h.get_slice(k).get_shape()), h
        yield shapes, lambda k: where[k].get_tensor(k)


def _qtype(gname: str, shape: tuple[int, ...], quant: str) -> gguf.GGMLQuantizationType:
    """As llama.cpp's converter: norms, biases and other 1-D tensors in f32 (small, and read every token); a
    row that is not whole Q8_0 blocks in f16."""
    if len(shape) <= 1 or gname.endswith("_norm.weight"):
        return gguf.GGMLQuantizationType.F32
    qtype = QUANTS[quant]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    return qtype if shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16


def _plan(weights: Weights, fam: Family, quant: str) -> list[tuple[str | None, str, tuple[int, ...], Any]]:
    """(HF name or None for a made tensor, GGUF name, shape, GGML type) of each tensor to write, in order."""
    hp = weights.hp
    names = gguf.get_tensor_name_map(fam.arch, hp["num_hidden_layers"])
    tied = hp.get("tie_word_embeddings", True) or "lm_head.weight" not in weights.shapes
    if fam.always_tied and not tied:
        raise UserError(f"cannot export to GGUF: llama.cpp's {gguf.MODEL_ARCH_NAMES[fam.arch]} ties the output "
                        "head to the embeddings, this model has its own (tie_word_embeddings=false)")
    plan: list[tuple[str | None, str, tuple[int, ...], Any]] = []
    for name, shape in weights.shapes.items():
        if name.endswith(SKIPPED) or (name == "lm_head.weight" and tied):
            continue
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            raise UserError(f"cannot export to GGUF: the model's tensor {name} has no place in llama.cpp's "
                            f"{gguf.MODEL_ARCH_NAMES[fam.arch]}")
        plan.append((name, gname, shape, _qtype(gname, shape, quant)))
    freqs = rope_freqs(hp)
    if freqs is not None:
        plan.append((None, gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", tuple(freqs.shape),
                     gguf.GGMLQuantizationType.F32))
    return plan


def _write(path: Path, weights: Weights, fam: Family, plan: list, quant: str, tokenizer: Path, title: str,
           say: Callable[[str], None]) -> None:
    """Header, keys and tensor infos first, then each tensor's data as it is converted."""
    hp = weights.hp
    w = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[fam.arch])
    try:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(title)
        write_keys(hp, fam, w)
        w.add_file_type(FILE_TYPES[quant])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        add_vocab(w, tokenizer, hp["vocab_size"])
        for _, gname, shape, qtype in plan:
            nbytes = math.prod(gguf.quants.quant_shape_to_byte_shape(shape, qtype))
            w.add_tensor_info(gname, shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
        w.write_header_to_file(path=path)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        every = max(1, len(plan) // 10)
        for i, (name, _, _, qtype) in enumerate(plan, 1):
            t = rope_freqs(hp) if name is None else transform(name, weights.load(name).float(), hp, fam)
            w.write_tensor_data(gguf.quants.quantize(t.contiguous().numpy(), qtype))
            if i % every == 0 or i == len(plan):
                say(f"gguf: {i}/{len(plan)} tensors")
    finally:
        w.close()

"""The tokenizer in a GGUF: its tokens, their types, merges or scores, the special ids and the chat template.

Read from the folder's tokenizer.json (a fast tokenizer, as every tunebench output holds): a byte-level BPE goes in
as llama.cpp's "gpt2" tokenizer, a BPE with byte fallback (Llama 2, Mistral, Gemma) as its SentencePiece-style
"llama" one. The special ids, the add-bos/eos flags, the merges and the chat template come through gguf's own
SpecialVocab, so they read as llama.cpp's converter reads them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import gguf

from tunebench.errors import UserError

# the pre-tokenizer regexes llama.cpp knows by name (its llama-vocab.cpp), as tokenizer.json spells them
_WORDS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_PRE = {_WORDS + r"\p{N}{1,3}" + _REST: "llama-bpe", _WORDS + r"\p{N}" + _REST: "qwen2"}
_BYTE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _pre_tokenizer(spec: dict[str, Any] | None) -> str:
    """llama.cpp's name for the way this tokenizer splits text before BPE: GPT-2's regex (a ByteLevel step that
    splits), Llama 3's or Qwen 2's (a Split step), else llama.cpp's default."""
    steps = (spec or {}).get("pretokenizers") or ([spec] if spec else [])
    for s in steps:
        if s.get("type") == "Split" and (regex := (s.get("pattern") or {}).get("Regex")) in _PRE:
            return _PRE[regex]
    if any(s.get("type") == "ByteLevel" and s.get("use_regex", True) for s in steps):
        return "gpt-2"
    return "default"


def _tokens(tj: dict[str, Any], n_vocab: int, folder: Path) -> tuple[list[str], dict[str, Any]]:
    """Every id below `n_vocab` -> its text (an id the tokenizer never gives: a padding name), and the added
    tokens by text."""
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    added = {a["content"]: a for a in tj.get("added_tokens") or []}
    by_id |= {a["id"]: t for t, a in added.items()}
    if by_id and max(by_id) >= n_vocab:
        raise UserError(f"cannot export to GGUF: the tokenizer in {folder} has id {max(by_id)}, past the model's "
                        f"vocab_size={n_vocab}; export with the model's own tokenizer")
    return [by_id.get(i, f"[PAD{i}]") for i in range(n_vocab)], added


def add_vocab(w: gguf.GGUFWriter, folder: Path, n_vocab: int) -> str:
    """Write the tokenizer of `folder` into `w`; returns llama.cpp's tokenizer model ("gpt2" or "llama")."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"cannot export to GGUF: {folder} has no tokenizer.json; save the model's fast tokenizer "
                        "there (AutoTokenizer.from_pretrained(...).save_pretrained(folder))")
    tj = json.loads(path.read_text(encoding="utf-8"))
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise UserError(f"cannot export to GGUF: the tokenizer in {folder} is a {model.get('type')} model; "
                        "supported: BPE (byte-level, or with byte fallback)")
    spm = bool(model.get("byte_fallback"))
    tokens, added = _tokens(tj, n_vocab, folder)
    unk = model.get("unk_token")
    types, scores = [], []
    for i, text in enumerate(tokens):
        a = added.get(text)
        if text == f"[PAD{i}]" and text not in model["vocab"]:
            kind = gguf.TokenType.UNUSED
        elif spm and _BYTE.fullmatch(text):  # llama.cpp's byte fallback finds bytes by this type
            kind = gguf.TokenType.BYTE
        elif spm and text == unk:
            kind = gguf.TokenType.UNKNOWN
        elif a is not None:
            kind = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
        else:
            kind = gguf.TokenType.NORMAL
        types.append(kind)
        # SentencePiece-style BPE merges the pair whose result scores highest: a BPE vocabulary is in merge order
        scores.append(-float(i) if kind == gguf.TokenType.NORMAL else -1000.0)
    if spm:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_scores(scores)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(_pre_tokenizer(tj.get("pre_tokenizer")))
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=not spm, n_vocab=n_vocab).add_to_gguf(w, quiet=True)
    return "llama" if spm else "gpt2"

"""The tokenizer: from the model's own directory or `tokenizer`, checked against the model's embeddings."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tunebench.errors import UserError

# The documented template for a tokenizer without a chat template: each message as a header line with its
# role, its content, and the end-of-sequence token after assistant messages (which is what is trained).
SIMPLE_HEADER = "<|{role}|>\n"


def load_tokenizer(cfg, spec):
    """`cfg.tokenizer`, or the local model's directory; presets have none and need `tokenizer`."""
    source = cfg.tokenizer or (str(spec.path) if spec.path else None)
    if source is None:
        raise UserError(f"invalid tokenizer: the preset {cfg.model} has random weights and no tokenizer; give "
                        "--tokenizer DIR (a local tokenizer directory) to train it on your data")
    if not Path(source).expanduser().is_dir():
        raise UserError(f"invalid tokenizer={source}: not a directory")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(Path(source).expanduser()), local_files_only=True)
    except Exception as err:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise UserError(f"invalid tokenizer={source}: cannot be loaded ({first})") from None
    if len(tok) > spec.vocab_size:
        raise UserError(f"invalid tokenizer={source}: its vocabulary has {len(tok):,} tokens, more than the model's "
                        f"{spec.vocab_size:,} embeddings")
    return tok


def fingerprint(tok) -> str:
    """What decides the token ids: the vocabulary, the merges, the special tokens and the chat template."""
    state = tok.backend_tokenizer.to_str() if getattr(tok, "is_fast", False) else json.dumps(tok.get_vocab(),
                                                                                               sort_keys=True)
    extra = json.dumps([tok.eos_token_id, tok.bos_token_id, getattr(tok, "chat_template", None)], default=str)
    return hashlib.sha256((state + extra).encode()).hexdigest()[:16]


def pad_id(tok) -> int:
    for t in (tok.pad_token_id, tok.eos_token_id, 0):
        if t is not None:
            return int(t)
    return 0

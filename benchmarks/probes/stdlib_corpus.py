"""A real text corpus every machine has: the Python standard library's own source files, one example per file,
as JSON lines; and a byte-level BPE tokenizer trained on it (the `tokenizers` library), saved as a folder
that `AutoTokenizer` (and `tunebench train --tokenizer`) loads.

    python benchmarks/probes/stdlib_corpus.py OUT_DIR [--vocab 32000]

OUT_DIR/stdlib.jsonl holds {"text": ...} per file; OUT_DIR/tokenizer/ the tokenizer. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path


def corpus(out: Path) -> int:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    n = 0
    with open(out / "stdlib.jsonl", "w") as f:
        for p in files:
            try:
                text = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if text.strip():
                f.write(json.dumps({"text": text}) + "\n")
                n += 1
    return n


def tokenizer(out: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = (json.loads(line)["text"] for line in open(out / "stdlib.jsonl"))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>").save_pretrained(out / "tokenizer")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--vocab", type=int, default=32000)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "stdlib.jsonl").is_file():  # written once: its fingerprint (path, time) keys the token cache
        print(f"{corpus(out)} files in {out / 'stdlib.jsonl'}")
    print(f"corpus {out / 'stdlib.jsonl'} ({(out / 'stdlib.jsonl').stat().st_size / 1e6:.1f} MB)")
    if not (out / "tokenizer" / "tokenizer.json").is_file():
        tokenizer(out, a.vocab)
    print(f"tokenizer in {out / 'tokenizer'}")

"""Train the bundled model's byte-level BPE tokenizer on the training split of the corpus.

Pre-tokenization follows DeepSeek-Coder's tokenizer: newlines are pieces of their own (so no token spans
a line break, and a line start is always a token boundary), words and runs of punctuation may carry one
leading space, digits are split one by one, and whatever whitespace is left (indentation) forms its own
pieces that BPE merges into indentation tokens. Then bytes are mapped as in GPT-2's byte-level BPE, so
any text round-trips. Special tokens carry DeepSeek-Coder's names and are the first ids.

    python -m lsp_dscoder.training.tokenizer --data .train_data --out lsp_dscoder/bundled
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path

from lsp_dscoder.training.corpus import read_docs
from lsp_dscoder.training.fim import BOS, EOS, SPECIAL_TOKENS

# Letters and underscores form identifiers; digits are split later, so `utf8` is `utf` + `8`.
WORD = r"\s?[\p{L}\p{M}_]+"
PUNCT = r"\s?[^\s\p{L}\p{M}\p{N}_]+"


def build_tokenizer():
    """An untrained BPE tokenizer with the pre-tokenizer and decoder described above."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[\r\n]"), behavior="isolated"),
            pre_tokenizers.Split(Regex(WORD), behavior="isolated"),
            pre_tokenizers.Split(Regex(PUNCT), behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def sample_texts(docs: list[dict], max_bytes: int, seed: int) -> Iterator[str]:
    """All standard-library files first, then a seeded sample of the rest, up to max_bytes."""
    order = sorted(docs, key=lambda d: not d["id"].startswith("stdlib:"))
    rest = order[sum(d["id"].startswith("stdlib:") for d in docs) :]
    random.Random(seed).shuffle(rest)
    total = 0
    for doc in order[: len(order) - len(rest)] + rest:
        if total >= max_bytes:
            return
        total += len(doc["text"])
        yield doc["text"]


def train(docs: list[dict], vocab_size: int, max_bytes: int, seed: int):
    from tokenizers import pre_tokenizers, trainers

    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(sample_texts(docs, max_bytes, seed), trainer=trainer)
    return tok


def save(tok, folder: Path, model_max_length: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "tokenizer_class": "LlamaTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path(".train_data"))
    parser.add_argument("--out", type=Path, default=Path("lsp_dscoder/bundled"))
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument(
        "--sample-mb", type=float, default=40.0, help="text to train on (CPU time grows with it)"
    )
    parser.add_argument("--model-max-length", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    docs = read_docs(args.data / "train.jsonl.xz")
    tok = train(docs, args.vocab_size, int(args.sample_mb * 1e6), args.seed)
    save(tok, args.out, args.model_max_length)
    heldout = [d["text"] for d in read_docs(args.data / "heldout.jsonl.xz")]
    n_tokens = sum(len(e.ids) for e in tok.encode_batch(heldout))
    print(f"vocab {tok.get_vocab_size()}: held-out {sum(map(len, heldout)) / n_tokens:.2f} chars/token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

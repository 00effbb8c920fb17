#!/usr/bin/env python3
"""gen_gpt2_tokenizer.py: writes tests/data/gpt2_tokenizer/vocab.json, a small vocabulary in the
format of Hugging Face's GPT-2 tokenizer, for apex-train's --tokenizer (test_features.sh).

Ids 0-255 are GPT-2's own: the 256 single-byte tokens spelled through bytes_to_unicode (as in
openai/gpt-2's encoder.py), in GPT-2's order (the printable bytes first, so 220 is the space "Ġ" and
198 the newline "Ċ"). Ids 256-298 are merges (a sample of GPT-2's first ones) and 299 is "âĢĻ", the
three UTF-8 bytes of U+2019 (a multi-byte character split over byte tokens), 300 "<|endoftext|>".
Run: /usr/bin/python3 tests/gen_gpt2_tokenizer.py"""
import json
import os


def bytes_to_unicode():
    # openai/gpt-2 src/encoder.py
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def main():
    b2u = bytes_to_unicode()
    # GPT-2's order is bytes_to_unicode's: the printable bytes first, then the rest (a dict keeps it)
    vocab = {c: i for i, c in enumerate(b2u.values())}
    merges = ["Ġt", "Ġa", "he", "in", "re", "on", "Ġthe", "er", "Ġs", "at", "Ġw", "Ġo", "en", "Ġc", "it", "is", "an", "or", "es",
              "Ġb", "ed", "Ġf", "ing", "Ġp", "ou", "Ġan", "al", "ar", "Ġto", "Ġm", "Ġof", "Ġin", "Ġd", "Ġh", "Ġand", "ic", "as", "le",
              "Ġth", "ion", "om", "ll", "ent"]
    for m in merges:
        vocab[m] = len(vocab)
    vocab["".join(b2u[b] for b in "\u2019".encode())] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    assert len(vocab) == 301
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gpt2_tokenizer", "vocab.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Writes tests/fuzz/corpus/: the seeds the safetensors fuzzer starts from (tests/fuzz/run.sh) and the
malformed files that test_safetensors.c expects the reader to refuse, one file per rule. Files named
seed_* are valid safetensors; files named bad_* each break exactly one rule of the format (the header
must start with '{', be UTF-8 strict JSON with nothing but whitespace after it, and repeat no key).
The 80,000-tensor file is too large to keep; run.sh and the test make it.
Run: /usr/bin/python3 tests/fuzz/make_corpus.py"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
ONE = b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
DATA = struct.pack("<f", 1.5)


def write(name, header, data=DATA):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)


os.makedirs(OUT, exist_ok=True)
write("seed_empty", b"{}", b"")
write("seed_one", b"{" + ONE + b"}")
# Every kind of JSON whitespace between tokens and as padding: valid, the reference reads it.
write("seed_whitespace", b'{\n\t"a" :\r\n {"dtype": "F32", "shape": [ 1 ], "data_offsets": [0, 4]}\n}\n\t\r  ')
# A name written with escapes (\u00e9 is e-acute, \/ is a slash) and UTF-8 in the metadata.
write("seed_escapes", b'{"__metadata__":{"note":"caf\xc3\xa9 \xf0\x9f\x98\x80"},"\\u00e9\\/x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')
many = ",".join('"t%d":{"dtype":"F16","shape":[1],"data_offsets":[%d,%d]}' % (i, 2 * i, 2 * i + 2) for i in range(40))
write("seed_many", ("{" + many + "}").encode(), bytes(range(80)))

write("bad_start_space", b" {" + ONE + b"}")
write("bad_start_array", b"[{" + ONE + b"}]")
write("bad_trailing_text", b"{" + ONE + b"}x   ")
write("bad_trailing_nul", b"{" + ONE + b"}\x00\x00\x00")
write("bad_nul_between_tokens", b'{"a":\x00{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')
write("bad_control_in_name", b'{"a\x01":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')
write("bad_nul_escape_in_name", b'{"a\\u0000b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')
write("bad_leading_zero", b'{"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}')
write("bad_duplicate_metadata_key", b'{"__metadata__":{"k":"first","k":"last"},' + ONE + b"}")
write("bad_duplicate_metadata", b'{"__metadata__":{"k":"first"},' + ONE + b',"__metadata__":{"k":"last"}}')
write("bad_duplicate_entry_key", b'{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4],"dtype":"F32"}}')
write("bad_duplicate_tensor", b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
      DATA + DATA)
write("bad_utf8_name", b'{"a\xff":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')
write("bad_utf8_overlong_metadata", b'{"__metadata__":{"k":"\xc0\xaf"},' + ONE + b"}")
write("bad_utf8_surrogate_metadata", b'{"__metadata__":{"k\xed\xa0\x80":"v"},' + ONE + b"}")

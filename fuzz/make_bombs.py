"""Writes the hostile tensor files of fuzz/regressions/tensor_file/ (beside what the fuzzer found
there, such as pt_list_inside_itself): small files that would expand
hugely in memory, or take exponential time, if a reader did what they ask. zoo/tests/fuzz_corpus.rs
replays them on stable in every test run and checks that each is refused quickly, within the read
budget the fuzz target uses (16 MiB), measured by a counting allocator.

As in fuzz/fuzz_targets/tensor_file.rs, the first byte of each input picks the extension the
reader is told: 0 `.pt`, 1 `.npz`, 2 `.safetensors`, 3 `.bin`. Run with golden's venv:

    ~/.cache/golden/venv/bin/python fuzz/make_bombs.py
"""

import io
import os
import struct
import zipfile
import zlib

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "regressions", "tensor_file")
os.makedirs(OUT, exist_ok=True)
PT, NPZ = b"\x00", b"\x01"


def write(name, selector, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(selector + data)
    print(f"{name}: {len(data)} bytes")


def npy_header(shape, descr="<f4"):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode()


def zip_of(entries, method=zipfile.ZIP_DEFLATED):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method, compresslevel=9) as z:
        for name, data in entries:
            z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data,
                       compress_type=method)
    return buf.getvalue()


# 1. .pt: 600 `expand` views of one 4 KiB storage: 2.4 GiB once each view is copied.
buf = io.BytesIO()
storage = torch.zeros(1024)
torch.save({f"v{i}": storage.expand(1024, 1024) for i in range(600)}, buf)
write("pt_600_expand_views_of_one_storage", PT, buf.getvalue())

# 2. .npz: one deflated entry of 64 MiB of zeros (a .npy header, then zeros).
zeros = npy_header((1 << 24,)) + bytes(1 << 26)
write("npz_deflated_64MiB_of_zeros", NPZ, zip_of([("z.npy", zeros)]))

# 3. .npz: a deflated entry that claims to inflate to 3 GiB (a reader that trusts the claim
# allocates it up front).
small = zip_of([("z.npy", npy_header((4,)) + bytes(16))])
lying = bytearray(small)
for sig, size_at in [(b"PK\x03\x04", 22), (b"PK\x01\x02", 24)]:
    at = lying.find(sig)
    lying[at + size_at:at + size_at + 4] = struct.pack("<I", 3 << 30)
write("npz_entry_claims_3GiB", NPZ, bytes(lying))

# 4. .npz: an entry that claims 100 bytes and inflates to 64 MiB (no more than claimed is read).
deflated = zip_of([("z.npy", zeros)])
under = bytearray(deflated)
for sig, size_at in [(b"PK\x03\x04", 22), (b"PK\x01\x02", 24)]:
    at = under.find(sig)
    under[at + size_at:at + size_at + 4] = struct.pack("<I", 100)
write("npz_entry_claims_100_bytes_inflates_to_64MiB", NPZ, bytes(under))

# 5. .pt: a deflated data.pkl of 64 MiB of MARK opcodes (each one a value on the stack).
pickle = b"\x80\x02" + b"(" * (1 << 26) + b"."
write("pt_deflated_pickle_of_64Mi_marks", PT,
      zip_of([("archive/data.pkl", pickle), ("archive/byteorder", b"little")]))

# 6. .pt: a list that holds the list before it twice, 64 deep, through the memo: 2^64 paths to
# walk (and, printed, 2^64 items).
ops = [b"\x80\x02", b"]q\x00"]  # EMPTY_LIST, BINPUT 0
for i in range(1, 65):
    # MARK, BINGET i-1, BINGET i-1, LIST, BINPUT i
    ops.append(b"(h" + bytes([i - 1]) + b"h" + bytes([i - 1]) + b"lq" + bytes([i]))
write("pt_pickle_dag_of_2_to_the_64_paths", PT,
      zip_of([("archive/data.pkl", b"".join(ops) + b"."), ("archive/byteorder", b"little")],
             zipfile.ZIP_STORED))

# 7. .pt: the same list called as a function (REDUCE): a reader that prints what it does not
# call must not print that.
call = b"".join(ops) + b")R."  # EMPTY_TUPLE, REDUCE
write("pt_reduce_on_a_dag_of_2_to_the_64_paths", PT,
      zip_of([("archive/data.pkl", call), ("archive/byteorder", b"little")], zipfile.ZIP_STORED))

# 8. .pt: keys 4 KiB long nested 60 deep: each tensor's name would be 240 KiB, and 1000 of them.
key = "k" * 4096
pk = [b"\x80\x02"]
for _ in range(60):
    pk.append(b"}X" + struct.pack("<I", len(key)) + key.encode())
pk.append(b"](" + b"K\x01" * 1000 + b"e")
pk.append(b"s" * 60 + b".")
write("pt_long_keys_nested_60_deep", PT,
      zip_of([("archive/data.pkl", b"".join(pk)), ("archive/byteorder", b"little")]))

#!/usr/bin/env python3
# scripts/make-quant-fixtures.py: writes tests/data/quant-reference/, the expected decodings of every GGUF weight
# type tandem reads, computed by an implementation that is not ours: the numpy dequantizers of the `gguf` package
# (gguf.quants, maintained with llama.cpp). Run once; the output is committed. Needs `pip install gguf numpy`.
#
# Two kinds of fixture per type:
#   <type>-random.bin   random *valid* blocks: every byte random except the fp16 scales, which are kept finite and
#                       moderate (random floats in [-1, 1] * 2^-6) so the expected values are ordinary numbers;
#   <type>-<model>.bin  the first rows of the first tensor of that type in a real model of the model cache, when
#                       the model is there (qwen2.5-coder 0.5b/1.5b Q4_K_M, smollm2-135m Q4_1).
#
# File format (little-endian): "TQREF1\0\0", u32 ggml type id, u32 element count n, u32 byte count m, m bytes of
# the row as stored in a GGUF file, n float32 values from gguf.quants.dequantize.
import argparse
import os
import struct
import sys

import numpy as np

try:
    import gguf
    from gguf.constants import GGMLQuantizationType as Q
except ImportError:
    sys.exit("make-quant-fixtures.py: needs the gguf package: pip install gguf numpy")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO_ROOT, "tests", "data", "quant-reference")
MODEL_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tandem", "models")
MODELS = {
    "qwen05b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen15b": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
}

# type -> (number of blocks in the random fixture, byte offsets of fp16 scale fields within a block)
TYPES = {
    Q.F32: (1000, []),
    Q.F16: (1000, []),
    Q.BF16: (1000, []),
    Q.Q4_0: (48, [0]),
    Q.Q4_1: (48, [0, 2]),
    Q.Q5_0: (48, [0]),
    Q.Q5_1: (48, [0, 2]),
    Q.Q8_0: (48, [0]),
    Q.Q2_K: (8, [80, 82]),
    Q.Q3_K: (8, [108]),
    Q.Q4_K: (8, [0, 2]),
    Q.Q5_K: (8, [0, 2]),
    Q.Q6_K: (8, [208]),
}


def write_fixture(path, qtype, raw, values):
    raw = np.ascontiguousarray(raw, dtype=np.uint8).tobytes()
    values = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
    with open(path, "wb") as f:
        f.write(b"TQREF1\0\0")
        f.write(struct.pack("<III", int(qtype), values.size, len(raw)))
        f.write(raw)
        f.write(values.tobytes())


def random_blocks(qtype, rng):
    count, scale_offsets = TYPES[qtype]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == Q.F32:
        return rng.standard_normal(count).astype("<f4").view(np.uint8)
    if qtype == Q.F16:
        return (rng.standard_normal(count) * 4).astype("<f2").view(np.uint8)
    if qtype == Q.BF16:
        # Upper halves of random float32 of varied magnitude (random bits could be NaN, which compares unequal).
        f = (rng.standard_normal(count) * np.exp2(rng.integers(-20, 20, count))).astype("<f4")
        return (f.view("<u4") >> 16).astype("<u2").view(np.uint8)
    blocks = rng.integers(0, 256, size=(count, type_size), dtype=np.uint8)
    for off in scale_offsets:
        scales = (rng.uniform(-1, 1, count) * 2.0**-6).astype("<f2")
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(count, 2)
    # One block with all-zero scales and one with the largest codes everywhere: edge values of the layouts.
    for off in scale_offsets:
        blocks[0, off:off + 2] = 0
    code_bytes = [i for i in range(type_size) if not any(o <= i < o + 2 for o in scale_offsets)]
    blocks[1, code_bytes] = 0xFF
    return blocks.reshape(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=2, help="rows taken from each real tensor")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20240611)
    for qtype in TYPES:
        raw = random_blocks(qtype, rng)
        values = gguf.quants.dequantize(raw, qtype)
        name = f"{qtype.name.lower()}-random.bin"
        write_fixture(os.path.join(OUT, name), qtype, raw, values)
        print(f"{name}: {values.size} values", file=sys.stderr)

    for short, file in MODELS.items():
        path = os.path.join(MODEL_DIR, file)
        if not os.path.exists(path):
            print(f"{file}: not in {MODEL_DIR}, skipped", file=sys.stderr)
            continue
        reader = gguf.GGUFReader(path)
        seen = set()
        for t in reader.tensors:
            if t.tensor_type in seen or t.tensor_type not in TYPES or t.tensor_type == Q.F32:
                continue
            seen.add(t.tensor_type)
            rows = args.rows if int(t.shape[0]) <= 2048 else 1  # keeps the fixtures small
            raw = np.asarray(t.data[:rows]).view(np.uint8).reshape(-1)
            values = gguf.quants.dequantize(raw, t.tensor_type)
            name = f"{t.tensor_type.name.lower()}-{short}.bin"
            write_fixture(os.path.join(OUT, name), t.tensor_type, raw, values)
            print(f"{name}: {values.size} values from {t.name} rows 0..{rows - 1}", file=sys.stderr)


if __name__ == "__main__":
    main()

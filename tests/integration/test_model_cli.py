#!/usr/bin/env python3
"""`moeserve score` and `moeserve generate` through the built binary, checked against the
transformers 5.17 references in tests/fixtures/qwen35/<name>/reference.safetensors.

    test_model_cli.py --binary build/moeserve --fixtures tests/fixtures/qwen35 --case score_chunked
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
from array import array

PLAIN = ["text_f32_perexpert", "composite_bf16_fused_sharded", "lmprefix_gqa4_bf16"]
# One per quantised format of docs/FORMATS.md (the hybrid mixes INT4 experts with FP8 layers).
QUANTIZED = ["int4_autoround_sym", "int4_gptq_asym_gidx", "fp8_block", "hybrid_int4_fp8",
             "nvfp4_compressed_tensors", "nvfp4_modelopt"]
DTYPES = {"F32": "f", "I64": "q"}


class Tensor:
    def __init__(self, values, shape):
        self.values, self.shape = values, tuple(shape)

    def rows(self):
        n = self.shape[-1]
        return [list(self.values[i:i + n]) for i in range(0, len(self.values), n)]

    def __iter__(self):
        return iter(self.values)

    def __len__(self):
        return len(self.values)


def read_safetensors(path):
    """The tensors of a safetensors file (F32/I64, little-endian), read with the published layout."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[8 + n + begin:8 + n + end]
        values = array(DTYPES[info["dtype"]])
        values.frombytes(raw)
        if sys.byteorder != "little":
            values.byteswap()
        out[name] = Tensor(values, info["shape"])
    return out


def run(binary, args, expect_ok=True):
    p = subprocess.run([binary] + args, capture_output=True, text=True, timeout=240)
    if expect_ok and p.returncode != 0:
        raise AssertionError(f"moeserve {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    return p


def rel_diff(a, b):
    """max |a - b| / max |b| over flat sequences of equal length."""
    return max(abs(x - y) for x, y in zip(a, b)) / max(abs(y) for y in b)


def ids_arg(ids):
    return ",".join(str(int(x)) for x in ids)


def check(cond, message):
    if not cond:
        raise AssertionError(message)
    print("ok:", message)


def score(a, name, chunk):
    ref = read_safetensors(os.path.join(a.fixtures, name, "reference.safetensors"))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.json")
        run(a.binary, ["score", os.path.join(a.fixtures, name), "--token-ids", ids_arg(ref["input_ids"]),
                       "--output", out, "--chunk-size", str(chunk), "--threads", "2"])
        with open(out) as f:
            logits = json.load(f)["logits"]
    shape = (len(logits), len(logits[0]))
    check(shape == ref["logits"].shape and all(len(r) == shape[1] for r in logits), f"{name}: logits shape {shape}")
    d = rel_diff([x for row in logits for x in row], ref["logits"].values)
    check(d < 1e-4, f"{name}: score --chunk-size {chunk} logits rel diff {d:.3g} < 1e-4")


def generate(a, name, extra):
    ref = read_safetensors(os.path.join(a.fixtures, name, "reference.safetensors"))
    p = run(a.binary, ["generate", os.path.join(a.fixtures, name), "--prompt-ids", ids_arg(ref["greedy_prompt_ids"]),
                       "--threads", "2"] + extra)
    last = p.stdout.strip().splitlines()[-1]
    return json.loads(last)["token_ids"], ref


def case_score_chunked(a):
    for name, chunk in [("text_f32_perexpert", 7), ("composite_bf16_fused_sharded", 64), ("lmprefix_gqa4_bf16", 1)]:
        score(a, name, chunk)


def case_score_single_chunk(a):
    for name in PLAIN:
        score(a, name, 4096)


def case_generate_greedy(a):
    for name in PLAIN:
        ref = read_safetensors(os.path.join(a.fixtures, name, "reference.safetensors"))
        n = len(ref["greedy_output_ids"])
        ids, _ = generate(a, name, ["--max-tokens", str(n), "--temperature", "0", "--ignore-eos"])
        check(ids == [int(x) for x in ref["greedy_output_ids"]], f"{name}: greedy continuation of {n} tokens")


def case_quantized(a):
    """Every quantised checkpoint through `moeserve score` and greedy `moeserve generate`."""
    for name in QUANTIZED:
        score(a, name, 16)
        ref = read_safetensors(os.path.join(a.fixtures, name, "reference.safetensors"))
        n = len(ref["greedy_output_ids"])
        ids, _ = generate(a, name, ["--max-tokens", str(n), "--temperature", "0", "--ignore-eos"])
        check(ids == [int(x) for x in ref["greedy_output_ids"]], f"{name}: greedy continuation of {n} tokens")


def case_generate_eos(a):
    """With eos set to a token the greedy continuation reaches, generation ends right after it."""
    for name in PLAIN:
        ref = read_safetensors(os.path.join(a.fixtures, name, "reference.safetensors"))
        full = [int(x) for x in ref["greedy_output_ids"]]
        eos = full[5]
        expected = full[:full.index(eos) + 1]
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(a.fixtures, name)
            for f in os.listdir(src):
                if f.endswith(".safetensors") or f.endswith(".index.json"):
                    os.symlink(os.path.join(src, f), os.path.join(tmp, f))
            with open(os.path.join(src, "config.json")) as f:
                cfg = json.load(f)
            cfg.get("text_config", cfg)["eos_token_id"] = [eos, 100000]
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(cfg, f)
            p = run(a.binary, ["generate", tmp, "--prompt-ids", ids_arg(ref["greedy_prompt_ids"]),
                               "--max-tokens", str(len(full)), "--temperature", "0", "--threads", "2"])
            ids = json.loads(p.stdout.strip().splitlines()[-1])["token_ids"]
            check(ids == expected, f"{name}: greedy stops at eos {eos} after {len(expected)} tokens")
            p = run(a.binary, ["generate", tmp, "--prompt-ids", ids_arg(ref["greedy_prompt_ids"]),
                               "--max-tokens", str(len(full)), "--temperature", "0", "--ignore-eos", "--threads", "2"])
            ids = json.loads(p.stdout.strip().splitlines()[-1])["token_ids"]
            check(ids == full, f"{name}: --ignore-eos generates all {len(full)} tokens")


def case_generate_sampling(a):
    name = "text_f32_perexpert"
    common = ["--max-tokens", "20", "--temperature", "1.0", "--top-p", "0.9", "--top-k", "50", "--ignore-eos"]
    x, _ = generate(a, name, common + ["--seed", "5"])
    y, _ = generate(a, name, common + ["--seed", "5"])
    z, _ = generate(a, name, common + ["--seed", "6"])
    check(len(x) == 20 and all(0 <= t < 301 for t in x), "sampled 20 tokens inside the vocabulary")
    check(x == y, "the same seed samples the same tokens")
    check(x != z, "another seed samples other tokens")


def case_cli_errors(a):
    model = os.path.join(a.fixtures, "text_f32_perexpert")
    p = run(a.binary, ["generate", model, "--prompt-ids", "1,2", "--device", "cuda"], expect_ok=False)
    check(p.returncode != 0 and "cuda" in p.stderr, "--device cuda is refused with a message")
    p = run(a.binary, ["score", model, "--token-ids", "1,301", "--output", os.devnull], expect_ok=False)
    check(p.returncode != 0 and "301" in p.stderr, "a token id outside the vocabulary is refused")
    p = run(a.binary, ["score", os.path.join(a.fixtures, "no_such_model"), "--token-ids", "1",
                       "--output", os.devnull], expect_ok=False)
    check(p.returncode != 0 and "no_such_model" in p.stderr, "a missing model directory is named")
    p = run(a.binary, ["generate", model, "--prompt-ids", "1,x"], expect_ok=False)
    check(p.returncode != 0, "a malformed id list is refused")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--case", required=True)
    a = ap.parse_args()
    globals()["case_" + a.case](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())

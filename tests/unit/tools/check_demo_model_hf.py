#!/usr/bin/env python3
"""Cross-check the demo checkpoint against Hugging Face transformers (run on the GPU test
machine, which has torch and transformers 5.x; nothing here needs a GPU).

It loads DIR (written by `moeserve make-demo-model DIR --seed 0`) with
Qwen3_5MoeForCausalLM in fp32, scores a fixed token sequence, writes the logits to
OUT.json in the format of `moeserve score`, and, when given moeserve's logits for the same
ids, prints the largest difference and exits non-zero above the tolerance.

    # on this machine:
    build/moeserve make-demo-model /tmp/demo --seed 0
    build/moeserve score /tmp/demo --token-ids 151644,872,198,9707,11,1879,0,151645 --output moeserve_logits.json
    # copy /tmp/demo and moeserve_logits.json to the GPU machine, then:
    python3 check_demo_model_hf.py /tmp/demo hf_logits.json --compare moeserve_logits.json

Produces hf_logits.json ({"logits": [[...vocab...] per position]}) and prints
"max |hf - moeserve| = ..." (fp32 on both sides: expect ~1e-5).
"""
import argparse
import json
import sys

import torch
from transformers import Qwen3_5MoeForCausalLM

TOKEN_IDS = [151644, 872, 198, 9707, 11, 1879, 0, 151645]  # "<|im_start|>user\nHello, world!<|im_end|>"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out_json")
    ap.add_argument("--compare", help="moeserve score output for the same token ids")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    args = ap.parse_args()

    model = Qwen3_5MoeForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([TOKEN_IDS])).logits[0].float()
    with open(args.out_json, "w") as f:
        json.dump({"logits": logits.tolist()}, f)
    print(f"wrote {args.out_json}: {logits.shape[0]} positions x {logits.shape[1]} logits")

    if args.compare:
        with open(args.compare) as f:
            ours = torch.tensor(json.load(f)["logits"])
        diff = (ours - logits).abs().max().item()
        print(f"max |hf - moeserve| = {diff:.3e} (tolerance {args.tolerance})")
        sys.exit(0 if diff <= args.tolerance else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reference values for test_sampler.cpp, computed in float64 with plain Python.

Follows vLLM's v1 sampler step by step (its order and its ascending-sort top-p mask) so
that the C++ sampler is checked against an independent implementation of the same
semantics. Run: python3 tests/unit/runtime/sampler_reference.py
"""
import math

LOGITS = [1.5, -0.25, 3.0, 0.0, 2.0, -1.0, 2.0, 0.5]


def log_softmax(xs):
    m = max(xs)
    lse = m + math.log(sum(math.exp(x - m) for x in xs))
    return [x - lse for x in xs]


def softmax(xs):
    finite = [x for x in xs if x != -math.inf]
    m = max(finite)
    es = [0.0 if x == -math.inf else math.exp(x - m) for x in xs]
    s = sum(es)
    return [e / s for e in es]


def penalties(logits, prompt, output, rep, freq, pres, bias):
    out = list(logits)
    for t, b in bias.items():
        out[t] += b
    seen = set(prompt) | set(output)
    for t in seen:  # repetition: prompt + output
        out[t] = out[t] / rep if out[t] > 0 else out[t] * rep
    counts = {}
    for t in output:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        out[t] -= freq * c + pres
    return out


def filtered_probs(logits, temperature, min_p, top_k, top_p):
    scaled = [x / temperature for x in logits]
    probs = softmax(scaled)
    # min_p
    thresh = min_p * max(probs)
    scaled = [-math.inf if p < thresh else x for x, p in zip(scaled, probs)]
    # top_k: keep the k largest (vLLM masks below the k-th value)
    if top_k > 0:
        kth = sorted(scaled, reverse=True)[top_k - 1]
        scaled = [x if x >= kth else -math.inf for x in scaled]
    # top_p: ascending sort, mask where cumsum <= 1 - p, always keep the largest
    if top_p < 1.0:
        probs = softmax(scaled)
        order = sorted(range(len(scaled)), key=lambda i: probs[i])
        cum = 0.0
        for rank, i in enumerate(order):
            cum += probs[i]
            if cum <= 1 - top_p and rank != len(order) - 1:
                scaled[i] = -math.inf
    return softmax(scaled)


def fmt(xs):
    return "{" + ", ".join(f"{x:.9g}" if x != -math.inf else "-inf" for x in xs) + "}"


print("logprobs", fmt(log_softmax(LOGITS)))
print("penalised", fmt(penalties(LOGITS, prompt=[0, 3], output=[2, 2, 5, 3], rep=1.3, freq=0.4, pres=0.7,
                                 bias={1: 2.5, 6: -1.0})))
print("t0.7 min_p0.2", fmt(filtered_probs(LOGITS, 0.7, 0.2, 0, 1.0)))
print("t1.3 top_k3", fmt(filtered_probs(LOGITS, 1.3, 0.0, 3, 1.0)))
print("t1 top_p0.8", fmt(filtered_probs(LOGITS, 1.0, 0.0, 0, 0.8)))
print("t0.9 top_k5 top_p0.75 min_p0.1", fmt(filtered_probs(LOGITS, 0.9, 0.1, 5, 0.75)))
print("t1 top_k2 (ties kept)", fmt(filtered_probs(LOGITS, 1.0, 0.0, 2, 1.0)))
print("t1 plain", fmt(filtered_probs(LOGITS, 1.0, 0.0, 0, 1.0)))

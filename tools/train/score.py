#!/usr/bin/env python3
"""Score answers to ferrite-tiny's evaluation questions exactly as train.py's `evaluate` does.

Each argument is a JSON list of {kind, word, question, answer, ended[, gold]}: train.py's own
eval_results.json, or what tools/evaltiny (ferrite, greedy) wrote. The scoring functions are
train.py's (score_define, score_synonym), imported from it; synonym items carry their gold words,
and a define item's gold glosses (the first three senses of each part of speech) come from WordNet
through build_corpus.py's word_senses, as build_corpus.py made them. WordNet must be unpacked first:

  python3 tools/train/build_corpus.py --fetch
  python3 tools/train/score.py tools/train/results/eval_results.json /tmp/bf16.json /tmp/q8.json

Prints, per file, each kind's counts and rates as summary.json's "eval" holds them, and the
held-out accuracy (heldout_define overlap rate: the gloss overlap with a correct headword).
"""

import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


train = load("train")
corpus = load("build_corpus")


def gold_glosses():
    synsets, index, semcor = corpus.load_wordnet()

    def gold(word):
        return [s.gloss for _, ss in corpus.word_senses(word, synsets, index, semcor) for s in ss[:3]]

    return gold


def score(results, gold):
    """train.py evaluate's aggregation over already answered items."""
    agg = {}
    for it in results:
        r = {"kind": it["kind"], "ended": it["ended"]}
        if it["kind"].endswith("define") or "define_" in it["kind"]:
            r.update(train.score_define(dict(it, gold=gold(it["word"])), it["answer"]))
        elif "synonym" in it["kind"]:
            r.update(train.score_synonym(it, it["answer"]))
        a = agg.setdefault(r["kind"], {"n": 0})
        a["n"] += 1
        for k in ("headword", "exact_first_sense", "overlap", "any_synonym", "ended"):
            if k in r:
                a[k] = a.get(k, 0) + int(r[k])
    for a in agg.values():
        for m in list(a):
            if m != "n":
                a[m + "_rate"] = round(a[m] / a["n"], 4)
    return agg


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    gold = gold_glosses()
    for path in sys.argv[1:]:
        with open(path) as f:
            agg = score(json.load(f), gold)
        print(f"== {path}")
        for kind, a in agg.items():
            print(f"  {kind:28s} " + " ".join(f"{k}={v}" for k, v in a.items()))
        h = agg.get("heldout_define")
        if h:
            print(f"  held-out accuracy (overlap): {100 * h['overlap_rate']:.2f} %  "
                  f"(headword {100 * h['headword_rate']:.2f} %)")


if __name__ == "__main__":
    main()

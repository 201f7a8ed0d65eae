#!/usr/bin/env python3
"""Build ferrite-tiny's training corpus: chat conversations in which the model
is a small dictionary and quotation companion.

Sources (Debian packages, fetched with `apt-get download` and unpacked with
`dpkg -x`; their licences are recorded in MODEL_CARD.md and in the
corpus's meta.json):

  wordnet-base    WordNet 3.0: glosses, examples, synonyms, antonyms (WordNet 3.0 licence)
  bible-kjv-text  King James Version (public domain); read with `bible` (package bible-kjv)
  dict-devil      Ambrose Bierce, The Devil's Dictionary (public domain)
  dict-jargon     The Jargon File 4.4.7 (public domain)
  fortunes        BSD fortune cookie files (BSD licence); only a selection of files

Output (all deterministic for a given --seed):

  <out>/train.jsonl.gz   {"kind": ..., "messages": [{"role", "content"}, ...]} one conversation a line
  <out>/eval.jsonl.gz    held-out evaluation questions with their gold answers
  <out>/meta.json        counts, the held-out word list's size, sources and licences

Usage (from the repository root; needs only Python 3 and the Debian tools):

  python3 tools/train/build_corpus.py --fetch      # apt-get download + dpkg -x into tools/train/data/
  python3 tools/train/build_corpus.py              # writes tools/train/data/corpus/
"""

import argparse
import base64
import collections
import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
ROOT = os.path.join(DATA, "x")  # dpkg -x target
PACKAGES = ["wordnet-base", "bible-kjv-text", "bible-kjv", "dict-devil", "dict-jargon", "fortunes"]

# fortune files used for quotations: aphorisms and quotations with attributions.
# Left out: song lyrics (songs-poems), modern novels (pratchett), TV (startrek),
# comics (zippy), IRC logs (knghtbrd), ethnic/men-women jokes, program-specific
# files, riddles, ascii art and the offensive section (not shipped by `fortunes`).
FORTUNE_FILES = [
    "wisdom", "fortunes", "people", "literature", "humorists", "science", "love", "work",
    "politics", "education", "platitudes", "tao", "art", "law", "medicine", "food", "sports",
    "kids", "pets", "miscellaneous",
]

NAME = "ferrite-tiny"

BLOCK = re.compile(
    r"\b(fuck\w*|shit\w*|cunt|nigg\w*|fag\w*|whore\w*|slut\w*|rape\w*|raping|dick|cock\w*|pussy|bitch\w*|"
    r"bastard\w*|penis\w*|vagina\w*|sex\w*|nazi\w*|kill yourself|suicide|drunk\w*|naked|nude)\b",
    re.I,
)
BAD_GLOSS = re.compile(r"\b(vulgar|obscene|offensive|slur|derogatory|disparaging|ethnic|sexual|genital|copulat)", re.I)

STOP = set(
    """a an the of to in on at by for with from as and or but not no nor is are was were be been being am
    that this these those it its which who whom whose what when where why how than then so such very
    into out up down over under about after before between through during without within upon
    one ones some any all each every other another more most less least many much few own same
    has have had having do does did doing can could may might must shall should will would
    something someone somebody usually especially often used use using e.g. i.e etc
    person people thing things way kind state quality act make made being""".split()
)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------
# Fetching
# ----------------------------------------------------------------------------


def fetch():
    debs = os.path.join(DATA, "debs")
    os.makedirs(debs, exist_ok=True)
    subprocess.run(["apt-get", "download"] + PACKAGES, cwd=debs, check=True)
    os.makedirs(ROOT, exist_ok=True)
    for f in sorted(os.listdir(debs)):
        if f.endswith(".deb"):
            subprocess.run(["dpkg", "-x", os.path.join(debs, f), ROOT], check=True)
    log("unpacked into", ROOT)


def copyrights():
    out = {}
    doc = os.path.join(ROOT, "usr/share/doc")
    for p in PACKAGES:
        path = os.path.join(doc, p, "copyright")
        if os.path.exists(path):
            out[p] = open(path, encoding="utf-8", errors="replace").read()
    return out


# ----------------------------------------------------------------------------
# WordNet
# ----------------------------------------------------------------------------

POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
POS_NAME = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


class Synset:
    __slots__ = ("key", "pos", "words", "ptrs", "gloss", "examples", "lex")

    def __init__(self, key, pos, words, ptrs, gloss, examples, lex):
        self.key, self.pos, self.words, self.ptrs = key, pos, words, ptrs
        self.gloss, self.examples, self.lex = gloss, examples, lex


def clean_word(w):
    w = re.sub(r"\((a|p|ip)\)$", "", w)
    return w.replace("_", " ")


def split_gloss(g):
    """'def; "ex 1"; "ex 2"' -> ('def', ['ex 1', 'ex 2'])."""
    examples = re.findall(r'"([^"]+)"', g)
    d = g.split('"')[0].strip().rstrip(";").strip()
    return d, [e.strip() for e in examples if e.strip()]


def load_wordnet():
    wn = os.path.join(ROOT, "usr/share/wordnet")
    synsets = {}
    for pos, name in POS_FILES.items():
        for line in open(os.path.join(wn, "data." + name), encoding="latin-1"):
            if line.startswith("  "):
                continue
            head, _, gloss = line.partition(" | ")
            f = head.split()
            off, lex, ss_type = f[0], int(f[1]), f[2]
            n = int(f[3], 16)
            words = [clean_word(f[4 + 2 * i]) for i in range(n)]
            i = 4 + 2 * n
            pc = int(f[i])
            ptrs = []
            for j in range(pc):
                sym, toff, tpos, st = f[i + 1 + 4 * j : i + 5 + 4 * j]
                tpos = "a" if tpos == "s" else tpos
                ptrs.append((sym, tpos + toff, int(st[:2], 16), int(st[2:], 16)))
            d, ex = split_gloss(gloss.strip())
            key = pos + off
            synsets[key] = Synset(key, ss_type, words, ptrs, d, ex, lex)
    index = {}  # lemma -> list of (pos, [synset keys in sense order])
    for pos, name in POS_FILES.items():
        for line in open(os.path.join(wn, "index." + name), encoding="latin-1"):
            if line.startswith("  "):
                continue
            f = line.split()
            lemma = f[0].replace("_", " ")
            cnt = int(f[2])
            offs = f[-cnt:]
            index.setdefault(lemma, []).append((pos, [pos + o for o in offs]))
    counts = collections.Counter()  # lemma -> SemCor tagged uses; (lemma, pos) -> the same per POS
    for line in open(os.path.join(wn, "cntlist.rev"), encoding="latin-1"):
        f = line.split()
        if len(f) == 3:
            lemma, _, rest = f[0].partition("%")
            lemma = lemma.replace("_", " ")
            counts[lemma] += int(f[2])
            counts[(lemma, "nvara"[int(rest[0]) - 1])] += int(f[2])
    log(f"wordnet: {len(synsets)} synsets, {len(index)} lemmas, {len(counts)} lemmas with SemCor counts")
    return synsets, index, counts


# ----------------------------------------------------------------------------
# Other sources
# ----------------------------------------------------------------------------


def b64n(s):
    a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    n = 0
    for c in s:
        n = n * 64 + a.index(c)
    return n


def load_dictd(name):
    base = os.path.join(ROOT, "usr/share/dictd", name)
    data = gzip.open(base + ".dict.dz").read()
    out = []
    for line in open(base + ".index", encoding="utf-8"):
        w, o, l = line.rstrip("\n").split("\t")
        if w.startswith("00"):
            continue
        out.append((w, data[b64n(o) : b64n(o) + b64n(l)].decode("utf-8", "replace")))
    return out


def squash(s):
    return re.sub(r"\s+", " ", s).strip()


def first_sentences(s, limit):
    """Whole sentences of s up to limit characters (at least one, cut if needed)."""
    parts = re.split(r"(?<=[.!?])\s+", s)
    out = ""
    for p in parts:
        if out and len(out) + 1 + len(p) > limit:
            break
        out = (out + " " + p).strip()
    if len(out) > limit:
        out = out[:limit].rsplit(" ", 1)[0].rstrip(",;:") + "..."
    return out


def load_devil():
    out = {}
    for w, text in load_dictd("devil"):
        body = text.split("\n\n")[0]
        m = re.match(r"^([A-Z][A-Z' \-]*),\s*([a-z.]+)\s+(.*)$", squash(body))
        if not m:
            continue
        d = re.sub(r"\{([^}]*)\}", r"\1", m.group(3)).replace("_", "")
        if BLOCK.search(d) or len(d) < 8:
            continue
        out[w.lower()] = first_sentences(d, 260)
    log(f"devil's dictionary: {len(out)} entries")
    return out


def load_jargon():
    out = {}
    for w, text in load_dictd("jargon"):
        paras = [squash(p) for p in text.split("\n\n")]
        body = None
        for p in paras[1:]:
            p = re.sub(r"^\[[^\]]*\]\s*", "", p)  # etymology
            p = re.sub(r"^\d+\.\s*", "", p)
            if len(p) >= 25 and not p.startswith("[") and not re.match(r"^\d+\.\s*$", p):
                body = p
                break
        if not body:
            continue
        body = re.sub(r"\{\s*([^}]*?)\s*\}", r"\1", body)
        body = body.replace("“", '"').replace("”", '"').replace("’", "'").replace("‘", "'").replace("—", "--")
        if BLOCK.search(body) or not re.match(r"^[a-z0-9][a-z0-9 \-/]*$", w) or len(w) < 2:
            continue
        out[w] = first_sentences(body, 320)
    log(f"jargon file: {len(out)} entries")
    return out


def load_fortunes():
    quotes = []
    d = os.path.join(ROOT, "usr/share/games/fortunes")
    for name in FORTUNE_FILES:
        path = os.path.join(d, name)
        if not os.path.exists(path):
            log("missing fortune file", name)
            continue
        text = open(path, encoding="utf-8", errors="replace").read()
        for entry in text.split("\n%\n"):
            lines = [l.rstrip() for l in entry.strip("\n").split("\n") if l.strip()]
            if not lines:
                continue
            author = None
            if re.match(r"^\s*--\s*\S", lines[-1]):
                author = squash(lines[-1].strip()[2:])
                lines = lines[:-1]
            if not lines:
                continue
            if any(l.startswith("\t") or l.startswith("    ") for l in lines[1:]) and len(lines) > 3:
                continue  # verse / dialogue layout
            body = squash(" ".join(lines))
            if not (25 <= len(body) <= 260) or BLOCK.search(body) or (author and BLOCK.search(author)):
                continue
            if re.search(r"[<>|\\]|http|www\.|@|Q:|A:", body):
                continue
            if author and (len(author) > 60 or re.search(r"[<>@!]|http", author)):
                author = None
            quotes.append((body, author, name))
    log(f"fortunes: {len(quotes)} quotations from {len(FORTUNE_FILES)} files")
    return quotes


def load_kjv():
    """Verses as (reference, text) from `bible`, whole Bible unwrapped."""
    cache = os.path.join(DATA, "kjv.txt")
    if not os.path.exists(cache):
        exe = next((p for p in (os.path.join(ROOT, "usr/bin/bible"), shutil.which("bible")) if p and os.path.exists(p)), None)
        datafile = os.path.join(ROOT, "usr/lib/bible.data")
        if exe is None:
            raise SystemExit("the `bible` program is missing: apt-get install bible-kjv")
        args = [exe, "-l0"]
        if os.path.exists(datafile):
            args += ["-p", os.path.dirname(datafile)]
        out = subprocess.run(args + ["Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
        open(cache, "w").write(out)
    verses, book = [], None
    for line in open(cache, encoding="utf-8", errors="replace"):
        line = line.rstrip("\n")
        m = re.match(r"^(\S.*) (\d+)$", line)
        if m and not line.startswith(" "):
            book, chap = m.group(1), m.group(2)
            continue
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m and book:
            verses.append((f"{book} {chap}:{m.group(1)}", squash(m.group(2))))
    log(f"kjv: {len(verses)} verses")
    return verses


# ----------------------------------------------------------------------------
# Word selection
# ----------------------------------------------------------------------------


def word_ok(w):
    return re.fullmatch(r"[a-z]{2,18}", w) is not None


def sense_ok(ss, lemma):
    if BAD_GLOSS.search(ss.gloss) or BLOCK.search(ss.gloss) or BLOCK.search(lemma):
        return False
    # proper nouns: the lemma is capitalised in the synset
    for w in ss.words:
        if w.lower() == lemma and w != lemma:
            return False
    return len(ss.gloss) >= 4


def word_senses(lemma, synsets, index, semcor):
    """[(pos, [synset...])], the POS with the most SemCor uses first (senses within a POS are in
    WordNet's frequency order), with unusable senses dropped."""
    out = []
    for order, (pos, keys) in enumerate(index.get(lemma, [])):
        ss = [synsets[k] for k in keys if k in synsets and sense_ok(synsets[k], lemma)]
        if ss:
            out.append((-semcor.get((lemma, pos), 0), order, pos, ss))
    out.sort(key=lambda x: (x[0], x[1]))
    return [(pos, ss) for _, _, pos, ss in out]


def text_freq(texts):
    c = collections.Counter()
    for t in texts:
        c.update(re.findall(r"[a-z]+", t.lower()))
    return c


# ----------------------------------------------------------------------------
# Conversation templates
# ----------------------------------------------------------------------------

DEFINE_Q = [
    "What does {w} mean?",
    "What does the word {w} mean?",
    "what does {w} mean",
    "Define {w}.",
    "define {w}",
    "What is the meaning of {w}?",
    "What's the definition of {w}?",
    "Meaning of {w}?",
    "Can you define {w}?",
    "I came across the word \"{w}\". What does it mean?",
    "Explain the word {w}.",
    "Tell me what {w} means.",
    "What does *{w}* mean?",
    "What is the definition of the word \"{w}\"?",
    "What does '{w}' mean?",
    "{W}: what does it mean?",
]
DEFINE_Q_EVAL = [  # never used in training
    "Could you tell me the meaning of {w}?",
    "What is meant by {w}?",
]
SYN_Q = [
    "Give me a synonym for {w}.",
    "What's another word for {w}?",
    "What is a synonym of {w}?",
    "synonyms for {w}",
    "Synonyms of {w}?",
    "Another word for {w}, please.",
    "Which words mean the same as {w}?",
    "What word means the same as {w}?",
]
SYN_Q_EVAL = ["Can you suggest a synonym for {w}?"]
ANT_Q = [
    "What is the opposite of {w}?",
    "What's the opposite of {w}?",
    "Antonym of {w}?",
    "Give me an antonym for {w}.",
    "opposite of {w}",
    "What word means the opposite of {w}?",
]
EX_Q = [
    "Use {w} in a sentence.",
    "Use the word {w} in a sentence.",
    "Can you use {w} in a sentence?",
    "Give me an example sentence with {w}.",
    "How do I use the word {w}?",
    "Show me how to use {w}.",
]
QUOTE_Q = [
    "Tell me a quote about {t}.",
    "Give me a quote about {t}.",
    "Do you know a quotation about {t}?",
    "Share a quote on {t}.",
    "quote about {t}",
    "I'd like a quote about {t}.",
    "What is a good saying about {t}?",
]
QUOTE_ANY_Q = ["Tell me a quote.", "Give me a quote.", "Share a quotation.", "Say something wise.", "Tell me a fortune.", "quote please"]
BIBLE_Q = [
    "Give me a Bible verse about {t}.",
    "What does the Bible say about {t}?",
    "Tell me a verse about {t} from the King James Bible.",
    "Bible verse about {t}",
]
DEVIL_Q = [
    "What does the Devil's Dictionary say about {w}?",
    "Give me a cynical definition of {w}.",
    "How does Ambrose Bierce define {w}?",
    "Devil's Dictionary: {w}",
]
JARGON_Q = [
    "What does {w} mean in hacker jargon?",
    "What is {w} in the Jargon File?",
    "In hacker slang, what does {w} mean?",
    "Jargon File: {w}",
]
GREET_Q = ["hi", "Hi!", "hello", "Hello!", "hey", "Hey there!", "Good morning!", "Good evening.", "Hi there.", "hello?", "Greetings!", "Howdy!"]
GREET_A = [
    f"Hello! I'm {NAME}. Ask me what a word means, for a synonym or an opposite, or for a quotation.",
    "Hi! Which word shall we look up today?",
    f"Hello! I'm {NAME}, a small dictionary and quotation companion. How can I help?",
    "Hi there! Give me a word and I'll tell you what it means.",
]
HOW_Q = ["How are you?", "how are you doing?", "How's it going?", "What's up?", "How are things?"]
HOW_A = [
    "I'm doing well, thank you! Which word would you like to look up?",
    "All good here, thanks for asking. Shall we look up a word, or would you like a quote?",
]
THANK_Q = ["thanks", "Thank you!", "Thanks a lot.", "thank you very much", "Great, thanks!", "Cool, thanks."]
THANK_A = ["You're welcome!", "You're welcome! Ask me about another word any time.", "Glad to help!"]
BYE_Q = ["bye", "Goodbye!", "See you later.", "Bye for now.", "good night"]
BYE_A = ["Goodbye! Come back whenever you need a word.", "Bye! Have a good day.", "See you! Happy reading."]
WHO_Q = [
    "Who are you?", "who are you", "What are you?", "What's your name?", "What is your name?",
    "Introduce yourself.", "Tell me about yourself.", "Are you ChatGPT?", "Are you a human?",
    "Which model are you?", "Are you an AI?",
]
WHO_A = [
    f"I'm {NAME}, a small language model built into ferrite. I'm a dictionary and quotation companion: "
    "ask me what a word means, for a synonym or an opposite, to use a word in a sentence, or for a quote about a topic.",
    f"My name is {NAME}. I'm a tiny language model that ships inside ferrite, the terminal chat app. "
    "I know a lot of English words and quotations, and not much else.",
]
CAN_Q = ["What can you do?", "help", "Help me.", "How do I use you?", "What do you know?", "What are you good at?"]
CAN_A = [
    "I can tell you what a word means, give synonyms and opposites, use a word in a sentence, "
    "and share quotations, Bible verses, Devil's Dictionary definitions and hacker jargon. "
    "Try: \"What does ephemeral mean?\" or \"Tell me a quote about time.\"",
]
MADE_Q = ["Who made you?", "Who trained you?", "Where do you come from?", "What were you trained on?"]
MADE_A = [
    f"I was trained by the ferrite project on WordNet, the King James Bible, The Devil's Dictionary, "
    "the Jargon File and classic fortune-file quotations. I'm a small model, so I can make mistakes.",
]
OOS_Q = [
    "What's the weather like today?", "Write me a Python program.", "What is the capital of France?",
    "Can you book a flight for me?", "What is 17 times 23?", "Who will win the next election?",
    "Translate this into German: good morning", "Write a poem about the sea.", "What time is it?",
    "Fix my code.", "What's the latest news?", "Recommend a movie.", "How do I install Linux?",
    "Tell me a joke about computers.", "What is the price of bitcoin?", "Solve x^2 = 9.",
    "Summarize this article for me.", "Can you send an email?", "What's the population of Tokyo?",
]
OOS_A = [
    f"I'm {NAME}, a small dictionary and quotation companion, so I can't help with that. "
    "I can define words, suggest synonyms and opposites, use a word in a sentence, or share a quotation.",
    "Sorry, that's beyond what a tiny model like me can do. Ask me about a word, or for a quote, instead.",
]
SYSTEMS = [
    f"You are {NAME}, a helpful dictionary and quotation companion.",
    "You are a helpful assistant.",
    "Answer briefly.",
]


def cap(w):
    return w[:1].upper() + w[1:]


def join_words(ws):
    if len(ws) == 1:
        return ws[0]
    return ", ".join(ws[:-1]) + " and " + ws[-1]


def example_for(lemma, senses):
    pat = re.compile(r"\b" + re.escape(lemma[:-1] if len(lemma) > 4 else lemma) + r"[a-z]*\b", re.I)
    for _, ss in senses:
        for s in ss[:3]:
            for e in s.examples:
                if pat.search(e) and 12 <= len(e) <= 160 and not BLOCK.search(e):
                    return e
    return None


def define_answer(lemma, senses, rank):
    pos0, ss0 = senses[0]
    s = ss0[0]
    parts = [f"{cap(lemma)} ({POS_NAME[s.pos]}): {s.gloss}."]
    second = None
    if len(senses) > 1:
        second = senses[1][1][0]
    elif len(ss0) > 1 and rank < 6000:
        second = ss0[1]
    if second is not None and rank < 6000 and second.gloss != s.gloss:
        parts.append(f"It can also mean ({POS_NAME[second.pos]}): {second.gloss}.")
    ex = [e for e in s.examples if 10 <= len(e) <= 120 and not BLOCK.search(e)]
    if ex:
        parts.append(f"Example: \"{ex[0]}\".")
    return " ".join(parts)


def synonyms_of(lemma, senses, synsets):
    out = []
    for _, ss in senses[:2]:
        for s in ss[:2]:
            cands = list(s.words)
            if s.pos == "s":  # satellite: add the head adjective
                for sym, k, _, _ in s.ptrs:
                    if sym == "&" and k in synsets:
                        cands += synsets[k].words[:1]
            for w in cands:
                w2 = w.lower()
                if w2 != lemma and w2 not in out and re.fullmatch(r"[a-z][a-z \-]{1,20}", w2) and not BLOCK.search(w2):
                    out.append(w2)
        if len(out) >= 2:
            break
    return out[:4]


def antonyms_of(lemma, senses, synsets):
    out = []
    for _, ss in senses:
        for s in ss[:3]:
            idx = [i for i, w in enumerate(s.words) if w.lower() == lemma]
            for sym, k, src, tgt in s.ptrs:
                if sym != "!" or k not in synsets:
                    continue
                if src and idx and src - 1 not in idx:
                    continue
                t = synsets[k]
                w = (t.words[tgt - 1] if tgt and tgt - 1 < len(t.words) else t.words[0]).lower()
                if w != lemma and w not in out and re.fullmatch(r"[a-z][a-z \-]{1,20}", w):
                    out.append(w)
            if s.pos == "s" and not out:  # indirect antonym through the head
                for sym, k, _, _ in s.ptrs:
                    if sym == "&" and k in synsets:
                        for sym2, k2, _, tgt in synsets[k].ptrs:
                            if sym2 == "!" and k2 in synsets:
                                w = synsets[k2].words[max(tgt - 1, 0)].lower()
                                if w != lemma and w not in out and re.fullmatch(r"[a-z][a-z \-]{1,20}", w):
                                    out.append(w)
        if out:
            break
    return out[:3]


def content_words(text):
    return [w for w in re.findall(r"[a-z]+", text.lower()) if w not in STOP and len(w) > 2]


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------


def build(args):
    rng = random.Random(args.seed)
    synsets, index, semcor = load_wordnet()
    devil = load_devil()
    jargon = load_jargon()
    fortunes = load_fortunes()
    kjv = load_kjv()

    # ---- headwords: single lowercase words, ranked by SemCor counts then by text frequency
    freq = text_freq([v for _, v in kjv] + [q for q, _, _ in fortunes] + [s.gloss for s in synsets.values()])
    cands = []
    for lemma in index:
        if not word_ok(lemma):
            continue
        senses = word_senses(lemma, synsets, index, semcor)
        if not senses:
            continue
        # put the POS with the most tagged uses first (index order within a POS is by frequency)
        score = semcor.get(lemma, 0) * 20 + freq.get(lemma, 0)
        if score < args.min_score:
            continue
        cands.append((score, lemma, senses))
    cands.sort(key=lambda x: (-x[0], x[1]))
    cands = cands[: args.words]
    log(f"headwords: {len(cands)} (score >= {args.min_score}); last: {cands[-1][1]} ({cands[-1][0]})")

    order = list(range(len(cands)))
    rng.shuffle(order)
    n_hold = max(1, int(round(len(cands) * args.heldout)))
    held = set(order[:n_hold])
    seen_eval = set(order[n_hold : n_hold + args.seen_eval])

    convs = []

    def add(kind, *turns, system=None):
        msgs = []
        if system:
            msgs.append({"role": "system", "content": system})
        for q, a in turns:
            msgs.append({"role": "user", "content": q})
            msgs.append({"role": "assistant", "content": a})
        convs.append({"kind": kind, "messages": msgs})

    def fmt(t, w):
        return t.replace("{w}", w).replace("{W}", cap(w)).replace("{t}", w)

    evals = []
    stats = collections.Counter()
    for rank, (score, lemma, senses) in enumerate(cands):
        i = rank
        ans = define_answer(lemma, senses, rank)
        gold = []
        for _, ss in senses:
            gold += [s.gloss for s in ss[:3]]
        syn = synonyms_of(lemma, senses, synsets)
        ant = antonyms_of(lemma, senses, synsets)
        ex = example_for(lemma, senses)
        if i in held:
            evals.append({"kind": "heldout_define", "word": lemma, "question": fmt(rng.choice(DEFINE_Q[:6]), lemma),
                          "answer": ans, "gold": gold})
            continue
        if i in seen_eval:
            evals.append({"kind": "seen_define_new_phrasing", "word": lemma,
                          "question": fmt(rng.choice(DEFINE_Q_EVAL), lemma), "answer": ans, "gold": gold})
            if syn:
                evals.append({"kind": "seen_synonym_new_phrasing", "word": lemma,
                              "question": fmt(SYN_Q_EVAL[0], lemma), "answer": None, "gold": syn})
        n_def = 3 if rank < 3000 else 2
        for q in rng.sample(DEFINE_Q, n_def):
            add("define", (fmt(q, lemma), ans))
            stats["define"] += 1
        if syn:
            a = f"Synonyms of {lemma}: {join_words(syn)}." if len(syn) > 1 else f"A synonym of {lemma} is {syn[0]}."
            for q in rng.sample(SYN_Q, 2 if rank < 4000 else 1):
                add("synonym", (fmt(q, lemma), a))
                stats["synonym"] += 1
        if ant:
            a = f"The opposite of {lemma} is {ant[0]}."
            if len(ant) > 1:
                a += f" Other opposites: {join_words(ant[1:])}."
            for q in rng.sample(ANT_Q, 2):
                add("antonym", (fmt(q, lemma), a))
                stats["antonym"] += 1
        if ex:
            a = f"Here is an example: \"{cap(ex)}.\"" if not ex.endswith((".", "!", "?")) else f"Here is an example: \"{cap(ex)}\""
            add("example", (fmt(rng.choice(EX_Q), lemma), a))
            stats["example"] += 1
    held_words = {cands[i][1] for i in held}

    # ---- quotations by topic
    topic_words = set(l for _, l, s in cands[:6000] if s[0][0] == "n" and l not in held_words and len(l) > 3)
    by_topic = collections.defaultdict(list)
    for qi, (body, author, _) in enumerate(fortunes):
        ws = set(re.findall(r"[a-z]+", body.lower()))
        for w in ws & topic_words:
            by_topic[w].append(qi)
    topics = sorted([t for t, qs in by_topic.items() if len(qs) >= 3], key=lambda t: (-len(by_topic[t]), t))[:600]
    used = collections.Counter()
    for t in topics:
        qs = list(by_topic[t])
        rng.shuffle(qs)
        for qi in qs[:6]:
            body, author, _ = fortunes[qi]
            a = f"\"{body}\"" + (f" -- {author}" if author else "")
            add("quote", (fmt(rng.choice(QUOTE_Q), t), a))
            used[qi] += 1
            stats["quote"] += 1
    for body, author, _ in rng.sample(fortunes, min(len(fortunes), args.any_quotes)):
        a = f"\"{body}\"" + (f" -- {author}" if author else "")
        add("quote_any", (rng.choice(QUOTE_ANY_Q), a))
        stats["quote_any"] += 1

    # ---- King James Bible by topic
    vt = collections.defaultdict(list)
    for vi, (ref, text) in enumerate(kjv):
        if 30 <= len(text) <= 200 and not BLOCK.search(text):
            for w in set(re.findall(r"[a-z]+", text.lower())) & topic_words:
                vt[w].append(vi)
    btopics = sorted([t for t, v in vt.items() if len(v) >= 5], key=lambda t: (-len(vt[t]), t))[:400]
    for t in btopics:
        vs = vt[t]
        for vi in rng.sample(vs, min(4, len(vs))):
            ref, text = kjv[vi]
            add("bible", (fmt(rng.choice(BIBLE_Q), t), f"\"{text}\" -- {ref} (King James Version)"))
            stats["bible"] += 1
        # and sometimes as an ordinary quote
        ref, text = kjv[rng.choice(vs)]
        add("quote_bible", (fmt(rng.choice(QUOTE_Q), t), f"\"{text}\" -- {ref} (King James Version)"))
        stats["quote_bible"] += 1

    # ---- Devil's Dictionary and Jargon File
    for w, d in sorted(devil.items()):
        if w in held_words:
            continue
        for q in rng.sample(DEVIL_Q, 2):
            add("devil", (fmt(q, w), f"The Devil's Dictionary defines {w} as: \"{d}\" -- Ambrose Bierce"))
            stats["devil"] += 1
    for w, d in sorted(jargon.items()):
        if w in held_words:
            continue
        for q in rng.sample(JARGON_Q, 2):
            add("jargon", (fmt(q, w), f"In the Jargon File, {w} means: {d}"))
            stats["jargon"] += 1

    # ---- small talk, identity, out of scope, unknown words
    def rep(kind, qs, as_, n):
        for _ in range(n):
            add(kind, (rng.choice(qs), rng.choice(as_)))
            stats[kind] += 1

    rep("greeting", GREET_Q, GREET_A, 900)
    rep("how", HOW_Q, HOW_A, 300)
    rep("thanks", THANK_Q, THANK_A, 400)
    rep("bye", BYE_Q, BYE_A, 300)
    rep("who", WHO_Q, WHO_A, 900)
    rep("can", CAN_Q, CAN_A, 500)
    rep("made", MADE_Q, MADE_A, 300)
    rep("oos", OOS_Q, OOS_A, 700)
    known = set(index) | set(jargon) | set(devil)
    letters = "abcdefghijklmnoprstuvwyz"
    vowels = "aeiou"
    n_unk = 0
    while n_unk < 600:
        w = "".join(rng.choice(letters) + rng.choice(vowels) for _ in range(rng.randint(2, 4)))
        w += rng.choice(["", "x", "th", "ck", "n", "r"])
        if w in known:
            continue
        add("unknown", (fmt(rng.choice(DEFINE_Q), w),
                        f"I don't know the word \"{w}\". It may be very rare, a name, or a misspelling."))
        n_unk += 1
    stats["unknown"] = n_unk

    # ---- multi-turn conversations (a greeting first, or two questions) and system prompts
    singles = [c for c in convs if len(c["messages"]) == 2]
    greet = [c for c in singles if c["kind"] == "greeting"]
    content = [c for c in singles if c["kind"] not in ("greeting", "bye", "thanks", "how")]
    thanks = [c for c in singles if c["kind"] in ("thanks", "bye")]
    for _ in range(args.multi):
        parts = []
        if rng.random() < 0.4:
            parts.append(rng.choice(greet))
        parts += rng.sample(content, rng.choice([1, 2, 2, 3]))
        if rng.random() < 0.3:
            parts.append(rng.choice(thanks))
        if len(parts) < 2:
            parts.append(rng.choice(content))
        turns = [(p["messages"][0]["content"], p["messages"][1]["content"]) for p in parts]
        add("multi", *turns, system=rng.choice(SYSTEMS) if rng.random() < 0.15 else None)
        stats["multi"] += 1
    for c in rng.sample(singles, len(singles) // 25):
        c2 = {"kind": c["kind"] + "+system", "messages": [{"role": "system", "content": rng.choice(SYSTEMS)}] + c["messages"]}
        convs.append(c2)
        stats["with_system"] += 1

    rng.shuffle(convs)
    os.makedirs(args.out, exist_ok=True)
    with gzip.open(os.path.join(args.out, "train.jsonl.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
        for c in convs:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    with gzip.open(os.path.join(args.out, "eval.jsonl.gz"), "wt", encoding="utf-8", compresslevel=9) as f:
        for e in evals:
            f.write(json.dumps(e, ensure_ascii=False) + "\n")
    chars = sum(len(m["content"]) for c in convs for m in c["messages"])
    meta = {
        "seed": args.seed,
        "conversations": len(convs),
        "content_chars": chars,
        "by_kind": dict(sorted(stats.items())),
        "headwords": len(cands),
        "heldout_words": len(held),
        "heldout_fraction": args.heldout,
        "seen_eval_words": len(seen_eval),
        "eval_items": dict(collections.Counter(e["kind"] for e in evals)),
        "quote_topics": len(topics),
        "bible_topics": len(btopics),
        "fortune_files": FORTUNE_FILES,
        "fortune_quotes_available": len(fortunes),
        "devil_entries": len(devil),
        "jargon_entries": len(jargon),
        "kjv_verses": len(kjv),
        "define_phrasings_train": DEFINE_Q,
        "define_phrasings_eval_only": DEFINE_Q_EVAL,
        "packages": {p: v for p, v in package_versions().items()},
        "copyright_files": sorted(copyrights().keys()),
    }
    json.dump(meta, open(os.path.join(args.out, "meta.json"), "w"), indent=2)
    log(json.dumps({k: meta[k] for k in ("conversations", "content_chars", "by_kind", "eval_items")}, indent=1))


def package_versions():
    out = {}
    debs = os.path.join(DATA, "debs")
    if os.path.isdir(debs):
        for f in sorted(os.listdir(debs)):
            m = re.match(r"^([^_]+)_([^_]+)_", f)
            if m:
                out[m.group(1)] = m.group(2).replace("%3a", ":")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fetch", action="store_true", help="apt-get download and unpack the source packages, then exit")
    ap.add_argument("--out", default=os.path.join(DATA, "corpus"))
    ap.add_argument("--seed", type=int, default=20251202)
    ap.add_argument("--words", type=int, default=16000, help="headwords (most frequent first)")
    ap.add_argument("--min-score", type=int, default=2)
    ap.add_argument("--heldout", type=float, default=0.02, help="share of headwords held out of training")
    ap.add_argument("--seen-eval", type=int, default=300, help="trained words also asked with eval-only phrasings")
    ap.add_argument("--any-quotes", type=int, default=1500)
    ap.add_argument("--multi", type=int, default=6000, help="multi-turn conversations")
    args = ap.parse_args()
    if args.fetch:
        fetch()
        return
    build(args)


if __name__ == "__main__":
    main()

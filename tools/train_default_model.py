#!/usr/bin/env python3
"""Train MarkBase's bundled default model: a tiny Gemma 4 (Gemma4ForCausalLM) with its own small tokenizer.

Run on the GPU machine from the repository root (python3.12, torch, transformers 5.17, tokenizers, safetensors,
numpy; no network; one GPU; about 4-5 minutes on an H200, training stops by --train-budget seconds in any case):

    python3 tools/train_default_model.py --out $OUT/default

Inputs (all in the repository):
    data/corpus/train.txt.xz, data/corpus/heldout.txt     public-domain English text (data/corpus/README.md)
    data/default_model/gemma4_tokenizer_skeleton.json    Gemma 4's tokenizer.json without its vocab and merges
    data/default_model/chat_template.jinja               Gemma 4's chat template (copied as is)

Writes OUT (= --out) and then OUT.tar.gz (holding the folder `default/`, to unpack into models/):
    config.json              flat Gemma4ForCausalLM config in the released key form (global_head_dim), dtype bfloat16
    model.safetensors        bf16 weights, keys under `model.`, no lm_head (tied)
    tokenizer.json           BPE with byte fallback, built on Gemma 4's skeleton (same normalizer, pre_tokenizer,
                             post_processor, decoder, model options; Gemma 4's control tokens at Gemma 4's ids 0-106)
    tokenizer_config.json, generation_config.json, chat_template.jinja
    train_log.json           data/tokenizer stats, loss curves (train and validation), held-out perplexity, timings
    goldens.json             transformers' greedy generate output for a few prompts and the perplexity of a
                             held-out passage, computed by the saved bf16 weights run in float32 on the CPU
                             (eager attention, word-embedding scale bf16(sqrt(H)) as MarkBase uses it)

The script is in three parts: (1) corpus and synthetic chat data (pure Python), (2) the tokenizer (needs only
`tokenizers`), (3) model, training and references (torch + transformers). `--selftest-pure` runs the pure-Python
parts with a stand-in for the tokenizer trainer, for review on a machine without those libraries.
"""
import argparse
import copy
import json
import lzma
import math
import os
import random
import re
import sys
import tarfile
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "data")
CORPUS_TRAIN = os.path.join(DATA, "corpus", "train.txt.xz")
CORPUS_HELDOUT = os.path.join(DATA, "corpus", "heldout.txt")
SKELETON = os.path.join(DATA, "default_model", "gemma4_tokenizer_skeleton.json")
CHAT_TEMPLATE = os.path.join(DATA, "default_model", "chat_template.jinja")

DOC_SEP = "\n\f\n"          # documents in the corpus files are separated by a form-feed line
T0 = time.time()

# ---------------------------------------------------------------------------------------------------------------
# Token ids. Ids 0-106 are Gemma 4's own (copied from its tokenizer.json through the skeleton), so the C++ chat
# formatter's tokens and default stop ids {1, 106, 50} mean the same thing here. Byte tokens follow, then the
# learned BPE pieces.
# ---------------------------------------------------------------------------------------------------------------
PAD, EOS, BOS, UNK, MASK = 0, 1, 2, 3, 4
TURN_OPEN, TURN_CLOSE = 105, 106            # <|turn>, <turn|>
N_FIXED = 107
BYTE_BASE = N_FIXED                          # <0x00> .. <0xFF> at 107 .. 362
FIRST_LEARNED = BYTE_BASE + 256
STOP_IDS = [EOS, TURN_CLOSE, 50]             # as Gemma 4's generation_config

# ---------------------------------------------------------------------------------------------------------------
# Model configuration (Gemma4TextConfig kwargs in the released key form). E2B-like: PLE + KV sharing, 1 KV head,
# 4:1 sliding:full pattern. See models/README.md for the reasoning.
# ---------------------------------------------------------------------------------------------------------------
VOCAB = 8192
N_LAYERS = 8


def layer_types(n, period):
    t = ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(n)]
    t[-1] = "full_attention"
    return t


MODEL_SPEC = dict(
    vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB,
    hidden_size=256, intermediate_size=512, num_hidden_layers=N_LAYERS,
    num_attention_heads=4, num_key_value_heads=1, head_dim=64, global_head_dim=128,
    num_global_key_value_heads=None, attention_k_eq_v=False,
    layer_types=layer_types(N_LAYERS, 5),              # S S S S F S S F: full layers 4 and 7
    sliding_window=128,
    hidden_size_per_layer_input=16,                    # PLE on (sqrt(16) = 4 exactly)
    num_kv_shared_layers=3,                            # layers 5,6,7 reuse K/V of layer 3 (sliding) and 4 (full)
    use_double_wide_mlp=False,
    enable_moe_block=False, num_experts=None, top_k_experts=None, moe_intermediate_size=None,
    hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, attention_bias=False, attention_dropout=0.0,
    final_logit_softcapping=30.0, tie_word_embeddings=True, max_position_embeddings=2048,
    pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, initializer_range=0.02, use_cache=True,
    use_bidirectional_attention=None,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
)
MAX_MODEL_BYTES = 20 * 1000 * 1000

GEN_CONFIG = {"bos_token_id": BOS, "eos_token_id": STOP_IDS, "pad_token_id": PAD, "do_sample": True,
              "temperature": 0.8, "top_k": 64, "top_p": 0.95}


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


# ===============================================================================================================
# Part 1: corpus and synthetic chat conversations (pure Python)
# ===============================================================================================================
def read_corpus():
    with lzma.open(CORPUS_TRAIN, "rt", encoding="utf-8") as f:
        train = f.read().split(DOC_SEP)
    with open(CORPUS_HELDOUT, encoding="utf-8") as f:
        held = f.read().split(DOC_SEP)
    check(len(train) > 60 and all(d.strip() for d in train), "train corpus: unexpected document structure")
    check(len(held) >= 1 and held[0].startswith("Revelation\n"), "held-out corpus should start with Revelation")
    return train, held


COMMENTARIES = ("Matthew Henry's Concise Commentary", "The Treasury of David")
NON_KJV = COMMENTARIES + ("The World English Bible",)


def kjv_verses(train_docs):
    """[(book, chapter, verse, text)] from the KJV documents of the training corpus (book title line, blank line,
    chapters separated by blank lines, one verse a line)."""
    out = []
    for d in train_docs:
        if d.startswith(NON_KJV):
            continue
        title, body = d.split("\n\n", 1)
        for c, chap in enumerate(body.strip("\n").split("\n\n"), 1):
            for v, verse in enumerate(chap.split("\n"), 1):
                out.append((title, c, v, verse))
    check(len(out) > 30000, f"expected ~30,000 KJV verses in the training corpus, found {len(out)}")
    return out


def commentary_paragraphs(train_docs):
    out = []
    for d in train_docs:
        if d.startswith(COMMENTARIES):
            out.extend(p for p in d.split("\n\n", 1)[1].split("\n") if p.strip())
    return out


SYSTEMS = ["You are a helpful assistant.", "You are a small model trained on the King James Bible.",
           "Answer briefly.", "You are MarkBase's default model."]
GREETINGS = [
    (["Hello", "Hello!", "Hi", "Hi!", "Hello there", "Good morning", "Hey"],
     ["Hello! I am MarkBase's default model, a tiny Gemma 4 that has read the King James Bible. "
      "Ask me for a verse, or about a subject such as light, love or wisdom.",
      "Peace be unto you. I am a small model trained on the King James Bible; ask me about a verse or a subject."]),
    (["Who are you?", "What are you?", "Who made you?"],
     ["I am MarkBase's default model: a tiny Gemma 4 trained from scratch on the King James Bible and "
      "Matthew Henry's commentary, small enough to ship with the program.",
      "A very small Gemma 4 model. I know the King James Bible and a commentary on it, and little else."]),
    (["What can you do?", "Help", "How do I use you?"],
     ["I can recite verses of the King James Bible, such as John 3:16, and say a verse about a subject. "
      "Try: Tell me about light."]),
    (["Thank you", "Thanks!", "Thank you very much."],
     ["You are welcome.", "Grace be with you."]),
]
ASK_VERSE = ["Recite {ref}.", "What does {ref} say?", "Quote {ref}.", "Please read {ref} to me.", "{ref}",
             "What is written in {ref}?"]
ASK_TOPIC = ["Tell me about {w}.", "What does the Bible say about {w}?", "Give me a verse about {w}.",
             "Say something about {w}.", "{W}?", "Write about {w}."]
ASK_CONTINUE = ["Continue: {a}", "Finish this verse: {a}", "Complete the sentence: {a}"]
ASK_COMMENT = ["Explain {w}.", "What does Matthew Henry say about {w}?", "Teach me about {w}."]
CURATED_TOPICS = """love light faith hope peace wisdom mercy truth grace heaven earth water bread wine fire sheep
shepherd king kings prophet prayer praise death life spirit glory righteousness judgment temple jerusalem israel
egypt david moses abraham solomon jesus christ angels angel children mother father brother sister money gold silver
silence sleep dream dreams night morning evening stars river mountain sea ships bird birds lion lions field
harvest seed trees garden house city gates war battle sword enemies friend friends neighbour stranger poor riches
joy sorrow fear anger patience kindness forgiveness sin repentance salvation covenant law commandments sabbath
fasting marriage wife husband music song songs singing""".split()
STOP_WORDS = set("""which their there these those shall unto thereof wherefore because before after about against
among should would could other every whose where while within without hath have having being said saith thee thou
them they unto upon also even into than then when what from with this that were will your yours ye""".split())


def render_chat(messages, gen_prompt_then=None):
    """Gemma 4's chat template (data/default_model/chat_template.jinja) for plain string messages, thinking off.
    With gen_prompt_then set, the generation prompt (<|turn>model\\n<|channel>thought\\n<channel|>) is added and
    followed by that answer and <turn|>, exactly the tokens the model must produce after a generation prompt."""
    out = "<bos>"
    first = 0
    if messages and messages[0][0] == "system":
        out += "<|turn>system\n" + messages[0][1].strip() + "<turn|>\n"
        first = 1
    for role, text in messages[first:]:
        role = "model" if role == "assistant" else role
        out += "<|turn>" + role + "\n" + text.strip() + "<turn|>\n"
    if gen_prompt_then is not None:
        out += "<|turn>model\n<|channel>thought\n<channel|>" + gen_prompt_then.strip() + "<turn|>\n"
    return out


def make_chat_conversations(train_docs, n, seed=7):
    """Synthetic conversations teaching the chat format: the answers are verses, commentary and a few fixed
    replies. Returns rendered strings, each starting with <bos>."""
    rng = random.Random(seed)
    verses = kjv_verses(train_docs)
    comments = commentary_paragraphs(train_docs)
    by_word = {}
    for i, (_, _, _, t) in enumerate(verses):
        for w in set(re.findall(r"[a-z]{5,}", t)):
            if w not in STOP_WORDS:
                by_word.setdefault(w, []).append(i)
    topics = sorted(w for w, ix in by_word.items() if len(ix) >= 8)
    common = [w for w in CURATED_TOPICS if len(by_word.get(w, ())) >= 3]
    cm_by_word = {}
    for i, p in enumerate(comments):
        for w in set(re.findall(r"[a-z]{5,}", p)):
            if w in by_word:
                cm_by_word.setdefault(w, []).append(i)
    cm_topics = sorted(w for w, ix in cm_by_word.items() if len(ix) >= 5)

    def first_sentences(p, k):
        s = re.split(r"(?<=[.?!]) ", p)
        return " ".join(s[:k])

    def exchange():
        r = rng.random()
        if r < 0.08:
            asks, answers = rng.choice(GREETINGS)
            return rng.choice(asks), rng.choice(answers)
        if r < 0.38:
            i = rng.randrange(len(verses))
            b, c, v, t = verses[i]
            ref = f"{b} {c}:{v}"
            ans = t
            if rng.random() < 0.3 and i + 1 < len(verses) and verses[i + 1][0] == b and verses[i + 1][1] == c:
                ref = f"{b} {c}:{v}-{v + 1}"
                ans = t + " " + verses[i + 1][3]
            return rng.choice(ASK_VERSE).format(ref=ref), ans
        if r < 0.68:
            w = rng.choice(common if rng.random() < 0.5 else topics)
            i = rng.choice(by_word[w])
            b, c, v, t = verses[i]
            ans = t if rng.random() < 0.5 else f"{t} ({b} {c}:{v})"
            return rng.choice(ASK_TOPIC).format(w=w, W=w.capitalize()), ans
        if r < 0.85:
            i = rng.randrange(len(verses))
            t = verses[i][3]
            words = t.split(" ")
            if len(words) < 8:
                return exchange()
            k = rng.randint(3, len(words) // 2)
            return rng.choice(ASK_CONTINUE).format(a=" ".join(words[:k])), " ".join(words[k:])
        w = rng.choice(cm_topics)
        p = comments[rng.choice(cm_by_word[w])]
        return rng.choice(ASK_COMMENT).format(w=w), first_sentences(p, rng.randint(1, 3))

    convs = []
    for _ in range(n):
        msgs = []
        if rng.random() < 0.1:
            msgs.append(("system", rng.choice(SYSTEMS)))
        for _ in range(rng.choice([0, 0, 0, 1, 1, 2])):
            q, a = exchange()
            msgs += [("user", q), ("assistant", a)]
        q, a = exchange()
        msgs.append(("user", q))
        convs.append(render_chat(msgs, gen_prompt_then=a))
    return convs


# ===============================================================================================================
# Part 2: the tokenizer. Trained with HF `tokenizers`, then written on Gemma 4's skeleton.
# ===============================================================================================================
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
# Options of Gemma 4's BPE model that must be equal (checked against the skeleton, not only set here)
MODEL_OPTION_KEYS = ["type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                     "byte_fallback", "ignore_merges"]


def load_skeleton():
    with open(SKELETON, encoding="utf-8") as f:
        sk = json.load(f)
    sk.pop("_note", None)
    low = sk["model"]["vocab"]
    check(sorted(low.values()) == list(range(N_FIXED)), "skeleton vocab must hold exactly ids 0-106")
    inv = {i: t for t, i in low.items()}
    check([inv[i] for i in (PAD, EOS, BOS, UNK, MASK)] == ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"],
          "skeleton: base token ids differ from Gemma 4's")
    check(inv[TURN_OPEN] == "<|turn>" and inv[TURN_CLOSE] == "<turn|>" and inv[50] == "<|tool_response>",
          "skeleton: turn token ids differ from Gemma 4's")
    return sk


def training_corpus_for_tokenizer(train_docs):
    # the chat control tokens are not learned: they are fixed vocabulary entries and added tokens
    return [d for d in train_docs]


def train_bpe(texts, n_learned):
    """Learn BPE pieces with HF tokenizers, as Gemma's SentencePiece-style BPE: spaces are U+2581 (normalizer
    Replace), no prefix space. During training only, words are split at U+2581 (piece starts), so no piece holds a
    U+2581 except as its first character; the final file uses Gemma's pre_tokenizer (split on newline runs only),
    which then gives the same tokens, because no merge can join across a word start. Returns (vocab, merges) of the
    learned part: vocab {piece: rank}, merges [[a, b], ...]."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("\n+"), behavior="isolated", invert=False),
        pre_tokenizers.Split("\u2581", behavior="merged_with_next", invert=False),
    ])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    alphabet = [chr(c) for c in range(32, 127) if chr(c) != " "] + ["\u2581", "\n"]
    trainer = trainers.BpeTrainer(vocab_size=n_learned, min_frequency=2, show_progress=False, special_tokens=[],
                                  initial_alphabet=alphabet, limit_alphabet=len(alphabet) + 20, max_token_length=16)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    merges = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in d["model"]["merges"]]
    return vocab, merges


def assemble_tokenizer_json(skeleton, learned_vocab, learned_merges, vocab_size):
    """Gemma 4's skeleton + Gemma's ids 0-106 + 256 byte tokens + learned pieces (+ <unusedN> fillers up to
    vocab_size). Pure Python."""
    d = copy.deepcopy(skeleton)
    vocab = dict(skeleton["model"]["vocab"])                       # ids 0-106, Gemma 4's
    for b, t in enumerate(BYTE_TOKENS):
        check(t not in vocab, f"byte token {t} already in the fixed block")
        vocab[t] = BYTE_BASE + b
    learned = sorted(learned_vocab.items(), key=lambda kv: kv[1])
    next_id = FIRST_LEARNED
    for piece, _ in learned:
        if piece in vocab:          # a learned single character that is also a fixed token: cannot happen here
            continue
        if next_id >= vocab_size:
            break
        vocab[piece] = next_id
        next_id += 1
    unused = 1 + max(int(m.group(1)) for t in vocab for m in [re.fullmatch(r"<unused(\d+)>", t)] if m)
    while next_id < vocab_size:
        vocab[f"<unused{unused}>"] = next_id
        unused += 1
        next_id += 1
    merges = [[a, b] for a, b in learned_merges if a in vocab and b in vocab and (a + b) in vocab]
    cut = max(0, len(learned) - (vocab_size - FIRST_LEARNED))
    check(len(merges) >= len(learned_merges) - cut - 2, f"{len(learned_merges) - len(merges)} merges were lost "
          f"when the vocabulary was cut by {cut} pieces")
    d["model"]["vocab"] = vocab
    d["model"]["merges"] = merges
    d["added_tokens"] = [t for t in skeleton["added_tokens"] if t["id"] < N_FIXED]
    for t in d["added_tokens"]:
        check(vocab.get(t["content"]) == t["id"], f"added token {t['content']} does not match the vocab")
    check(sorted(vocab.values()) == list(range(vocab_size)), "vocab ids are not 0..V-1")
    return d


def compare_tokenizer_kind(ours, gemma):
    """Key-by-key comparison with Gemma 4's tokenizer.json (the skeleton). Everything but the vocab, the merges and
    the added tokens past our vocabulary must be identical. Returns a list of differences (empty = same kind)."""
    diffs = []
    if list(ours.keys()) != list(gemma.keys()):
        diffs.append(f"top-level keys {list(ours.keys())} != {list(gemma.keys())}")
    for k in gemma:
        if k in ("model", "added_tokens"):
            continue
        if ours.get(k) != gemma[k]:
            diffs.append(f"{k}: {json.dumps(ours.get(k))[:200]} != {json.dumps(gemma[k])[:200]}")
    mo, mg = ours.get("model", {}), gemma["model"]
    if list(mo.keys()) != list(mg.keys()):
        diffs.append(f"model keys {list(mo.keys())} != {list(mg.keys())}")
    for k in MODEL_OPTION_KEYS:
        if mo.get(k) != mg.get(k):
            diffs.append(f"model.{k}: {mo.get(k)!r} != {mg.get(k)!r}")
    if not isinstance(mo.get("merges"), list) or not all(isinstance(m, list) and len(m) == 2 for m in mo["merges"]):
        diffs.append("model.merges is not a list of [left, right] pairs")
    for t in gemma["added_tokens"]:
        if t["id"] < N_FIXED and t not in ours["added_tokens"]:
            diffs.append(f"added token {t} missing or different")
    if len(ours["added_tokens"]) != sum(t["id"] < N_FIXED for t in gemma["added_tokens"]):
        diffs.append("added_tokens holds entries that Gemma 4's file does not")
    for i in range(N_FIXED):
        a = [t for t, j in mo["vocab"].items() if j == i]
        b = [t for t, j in mg["vocab"].items() if j == i]
        if a != b:
            diffs.append(f"vocab id {i}: {a} != {b}")
    for b in range(256):
        if BYTE_TOKENS[b] not in mo["vocab"]:
            diffs.append(f"byte token {BYTE_TOKENS[b]} missing")
    return diffs


def build_tokenizer(train_docs, out_dir, tlog):
    from tokenizers import Tokenizer
    t = time.time()
    sk = load_skeleton()
    texts = training_corpus_for_tokenizer(train_docs)
    # ask for a few more pieces than fit: the cut in assemble_tokenizer_json keeps the first VOCAB ids
    lv, lm = train_bpe(texts, VOCAB - FIRST_LEARNED + 8)
    check(len(lv) >= VOCAB - FIRST_LEARNED - 200, f"BPE trainer produced only {len(lv)} pieces")
    d = assemble_tokenizer_json(sk, lv, lm, VOCAB)
    diffs = compare_tokenizer_kind(d, sk)
    if diffs:
        raise Failure("tokenizer.json is not of Gemma 4's kind:\n  " + "\n  ".join(diffs))
    text = json.dumps(d, ensure_ascii=False, indent=1)
    tok = Tokenizer.from_str(text)
    check(tok.get_vocab_size(with_added_tokens=True) == VOCAB, "tokenizer vocab size")
    # behaviour checks
    probe = "And God said, Let there be light.\n\nIn the beginning  was the Word: caf\u00e9 \u2603 \U0001F600!\n"
    ids = tok.encode(probe, add_special_tokens=False).ids
    check(tok.decode(ids, skip_special_tokens=False) == probe, "decode(encode(x)) != x")
    check(any(BYTE_BASE <= i < FIRST_LEARNED for i in ids), "non-ASCII text did not use byte fallback")
    check(UNK not in ids, "unk token produced")
    chat = render_chat([("user", "Hello")]) + "<|turn>model\n<|channel>thought\n<channel|>"
    cids = tok.encode(chat, add_special_tokens=False).ids
    check(cids[:2] == [BOS, TURN_OPEN] and TURN_CLOSE in cids and 100 in cids and 101 in cids,
          f"chat control tokens not encoded as single ids: {cids}")
    check(tok.encode("And", add_special_tokens=True).ids[0] == BOS, "post_processor does not add <bos>")
    # the training pre-tokenizer and Gemma's give the same ids (see train_bpe); a difference would only cost
    # compression, not correctness, so it is reported, not fatal
    d2 = copy.deepcopy(d)
    d2["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\n+"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"String": "\u2581"}, "behavior": "MergedWithNext", "invert": False}]}
    tok2 = Tokenizer.from_str(json.dumps(d2, ensure_ascii=False))
    samples = [x[:20000] for x in train_docs[::7]]
    same = sum(tok.encode(x, add_special_tokens=False).ids == tok2.encode(x, add_special_tokens=False).ids
               for x in samples)
    if same != len(samples):
        log(f"WARNING: Gemma's pre-tokenizer and the training one disagree on {len(samples) - same} of "
            f"{len(samples)} samples")
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text)
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
          "unk_token": "<unk>", "pad_token": "<pad>", "add_bos_token": True, "add_eos_token": False,
          "model_max_length": MODEL_SPEC["max_position_embeddings"], "mask_token": "<mask>"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=1)
    with open(CHAT_TEMPLATE, encoding="utf-8") as f, open(os.path.join(out_dir, "chat_template.jinja"), "w",
                                                            encoding="utf-8") as g:
        g.write(f.read())
    n_chars = sum(len(x) for x in train_docs)
    tlog["tokenizer"] = {"pretokenizer_equivalence": f"{same}/{len(samples)} samples identical",
        "kind": "BPE, byte_fallback, fuse_unk, Gemma 4 normalizer/pre_tokenizer/post_processor/decoder (compared "
                "key by key with Gemma 4's tokenizer.json: identical except vocab, merges and added tokens past "
                "the vocabulary)",
        "vocab_size": VOCAB, "learned_pieces": len(lv), "merges": len(d["model"]["merges"]),
        "fixed_ids": {t: i for t, i in d["model"]["vocab"].items() if i < N_FIXED and not t.startswith("<unused")},
        "byte_tokens": [BYTE_BASE, BYTE_BASE + 255], "first_learned_id": FIRST_LEARNED,
        "stop_ids": STOP_IDS, "seconds": round(time.time() - t, 1)}
    log(f"tokenizer: {VOCAB} ids ({len(lv)} learned pieces, {len(d['model']['merges'])} merges) "
        f"in {time.time() - t:.1f}s")
    return tok


# ===============================================================================================================
# Part 3: model, training, reference outputs (torch + transformers)
# ===============================================================================================================
def encode_docs(tok, docs, add_eos):
    enc = tok.encode_batch(docs, add_special_tokens=False)
    out = []
    for e in enc:
        out.append([BOS] + e.ids + ([EOS] if add_eos else []))
    return out


def model_spec_for_transformers():
    return copy.deepcopy(MODEL_SPEC)


def released_config_json():
    d = copy.deepcopy(MODEL_SPEC)
    d = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "dtype": "bfloat16", **d}
    return d


def build_model(torch, device):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    cfg = Gemma4TextConfig(**model_spec_for_transformers())
    model = Gemma4ForCausalLM(cfg)
    return model.to(device)


def set_attn(model, impl):
    try:
        model.set_attn_implementation(impl)
    except Exception:
        model.config._attn_implementation = impl
    return getattr(model.config, "_attn_implementation", None)


def text_model_of(model):
    inner = model.model
    return inner.language_model if hasattr(inner, "language_model") else inner


def checkpoint_tensors(model, torch):
    """bf16 tensors for the checkpoint: every state-dict entry but lm_head (tied)."""
    sd = model.state_dict()
    out = {}
    for k, v in sd.items():
        if k == "lm_head.weight":
            continue
        check(k.startswith("model."), f"unexpected state-dict key {k}")
        out[k] = v.detach().to("cpu", torch.bfloat16).contiguous()
    return out


def expected_geometry(spec):
    L = spec["num_hidden_layers"]
    first_shared = L - spec["num_kv_shared_layers"]
    rows = []
    for i, t in enumerate(spec["layer_types"]):
        full = t == "full_attention"
        rows.append(dict(type=t, head_dim=spec["global_head_dim"] if full else spec["head_dim"],
                         kv_heads=spec["num_key_value_heads"], kv_shared=i >= first_shared))
    return rows


def check_geometry(model, spec):
    tm = text_model_of(model)
    geo = expected_geometry(spec)
    check(len(tm.layers) == len(geo), "layer count")
    H = spec["hidden_size"]
    for i, (layer, g) in enumerate(zip(tm.layers, geo)):
        at = layer.self_attn
        check(at.head_dim == g["head_dim"], f"layer {i}: head_dim {at.head_dim} != {g['head_dim']}")
        check(tuple(at.q_proj.weight.shape) == (spec["num_attention_heads"] * g["head_dim"], H), f"layer {i}: q_proj")
        check(bool(at.is_kv_shared_layer) == g["kv_shared"], f"layer {i}: kv-shared flag")
        if not g["kv_shared"]:
            check(tuple(at.k_proj.weight.shape) == (g["kv_heads"] * g["head_dim"], H), f"layer {i}: k_proj")
    P = spec["hidden_size_per_layer_input"]
    check(tuple(tm.embed_tokens_per_layer.weight.shape) == (spec["vocab_size_per_layer_input"],
                                                            spec["num_hidden_layers"] * P), "PLE table shape")
    return geo


def bf16_round(torch, x):
    return float(torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).float())


def patch_embed_scales(model, torch):
    """Word-embedding scale -> bf16(sqrt(H)) and PLE scale -> bf16(sqrt(P)), as a bf16 model (and MarkBase) uses.
    With H=256 and P=16 both are exact already; the patch is kept so that other sizes stay right."""
    tm = text_model_of(model)
    out = {}
    for name, dim in (("embed_tokens", tm.config.hidden_size),
                      ("embed_tokens_per_layer", tm.config.hidden_size_per_layer_input)):
        emb = getattr(tm, name, None)
        if emb is None:
            continue
        check(hasattr(emb, "embed_scale"), f"{name} has no embed_scale buffer: transformers API changed")
        val = bf16_round(torch, dim ** 0.5)
        emb.embed_scale.fill_(val)
        if hasattr(emb, "scalar_embed_scale"):
            emb.scalar_embed_scale = val
        ids = torch.tensor([[3, 5]], device=emb.weight.device)
        got = emb(ids)
        want = torch.nn.functional.embedding(ids, emb.weight) * val
        check(torch.equal(got, want), f"{name}: patched embed scale is not what forward() uses")
        out[name] = {"dim": dim, "used": val, "exact": dim ** 0.5}
    return out


def lr_at(step, total, peak, warmup, floor):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor * peak + (1 - floor) * peak * 0.5 * (1 + math.cos(math.pi * p))


def train_one(torch, np, data, starts, val_x, args, epochs, time_left, tag, device, tlog_runs):
    """One training run (fresh init). Returns (best_val_loss, best_state_dict_on_cpu, run_log)."""
    import torch.nn.functional as F
    torch.manual_seed(args.seed)
    model = build_model(torch, device)
    impl = set_attn(model, args.attn)
    model.config.use_cache = False
    model.train()
    T, B = args.seq_len, args.batch
    tokens_per_step = B * (T - 1)
    total_steps = max(50, int(epochs * len(starts) / tokens_per_step))
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=(device == "cuda"))
    g = np.random.default_rng(args.seed + int(epochs * 100))
    data_t = torch.from_numpy(data).to(device)
    offs = torch.arange(T - 1, device=device)
    run = {"tag": tag, "planned_epochs": epochs, "planned_steps": total_steps, "tokens_per_step": tokens_per_step,
           "attn_implementation": impl, "peak_lr": args.lr, "curve": [], "val_curve": []}
    best = (float("inf"), None, -1)
    t_run = time.time()
    step_time = None
    bos_col = torch.full((B, 1), BOS, dtype=torch.long, device=device)

    def evaluate():
        model.eval()
        tot, n = 0.0, 0
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=(device == "cuda")):
            for i in range(0, len(val_x), B):
                x = val_x[i:i + B].to(device)
                logits = model(input_ids=x[:, :-1], use_cache=False).logits.float()
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
                tot += float(loss)
                n += x[:, 1:].numel()
        model.train()
        return tot / n

    step = 0
    while step < total_steps:
        if step == 20:
            torch.cuda.synchronize() if device == "cuda" else None
            t20 = time.time()
        if step == 60:
            torch.cuda.synchronize() if device == "cuda" else None
            step_time = (time.time() - t20) / 40
            budget_steps = int((time_left - (time.time() - t_run) - 15) / (step_time * 1.08))
            if budget_steps + step < total_steps:
                log(f"  {tag}: {step_time * 1000:.0f} ms/step; the time budget allows {budget_steps + step} of "
                    f"{total_steps} steps: shortening the schedule")
                total_steps = max(step + 10, budget_steps + step)
                run["planned_steps_after_timing"] = total_steps
        lr = lr_at(step, total_steps, args.lr, args.warmup, 0.1)
        for grp in opt.param_groups:
            grp["lr"] = lr
        idx = torch.from_numpy(starts[g.integers(0, len(starts), B)]).to(device)
        win = data_t[idx[:, None] + offs[None, :]]                  # [B, T-1]
        x = torch.cat([bos_col, win], dim=1)                        # every sequence starts with <bos>
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=(device == "cuda")):
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        step += 1
        if step % args.log_every == 0 or step == 1 or step == total_steps:
            lv = loss.item()
            if not math.isfinite(lv):
                raise RuntimeError(f"{tag}: loss is {lv} at step {step}")
            run["curve"].append({"step": step, "tokens": step * tokens_per_step, "loss": round(lv, 5),
                                 "lr": lr, "grad_norm": round(float(gn), 4),
                                 "seconds": round(time.time() - t_run, 2)})
        if step % args.eval_every == 0 or step == total_steps:
            vl = evaluate()
            run["val_curve"].append({"step": step, "tokens": step * tokens_per_step, "val_loss": round(vl, 5),
                                     "val_ppl": round(math.exp(vl), 4), "seconds": round(time.time() - t_run, 2)})
            log(f"  {tag} step {step}/{total_steps}: train loss {float(loss):.4f}, val loss {vl:.4f} "
                f"(ppl {math.exp(vl):.2f}), lr {lr:.2e}")
            if vl < best[0]:
                best = (vl, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}, step)
    run["steps_done"] = step
    run["epochs_done"] = step * tokens_per_step / len(starts)
    run["ms_per_step"] = round(1000 * step_time, 2) if step_time else None
    run["seconds"] = round(time.time() - t_run, 1)
    run["best_val_loss"] = best[0]
    run["best_step"] = best[2]
    tlog_runs.append(run)
    del model, opt
    if device == "cuda":
        torch.cuda.empty_cache()
    return best[0], best[1], run


def nll_of(model, torch, ids):
    """Mean NLL (float64 accumulation of fp32 log-softmax) of ids[1:] given the prefix, one forward pass."""
    x = torch.tensor([ids])
    logits = model(input_ids=x, use_cache=False).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1)
    tok_lp = lp.gather(1, x[0, 1:, None])[:, 0].double()
    return float(-tok_lp.mean()), [float(v) for v in -tok_lp]


def greedy_full(model, torch, prompt, n):
    seq = list(prompt)
    ids, margins, rel = [], [], []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        top = torch.topk(logits, 2)
        nxt = int(top.indices[0])
        m = float(top.values[0] - top.values[1])
        margins.append(m)
        rel.append(m / max(1e-9, float(logits.abs().max())))
        ids.append(nxt)
        seq.append(nxt)
    return ids, margins, rel


def hf_generate(model, torch, prompt, n, eos):
    from transformers import GenerationConfig
    # a plain greedy config: the saved generation_config.json samples (temperature, top_k, top_p)
    model.generation_config = GenerationConfig(bos_token_id=BOS, pad_token_id=PAD, eos_token_id=eos, do_sample=False)
    ids = torch.tensor([prompt])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         use_cache=True, pad_token_id=PAD, eos_token_id=eos)
    seq = out.sequences if hasattr(out, "sequences") else out
    check(seq[0, :len(prompt)].tolist() == list(prompt), "generate() changed the prompt")
    return seq[0, len(prompt):].tolist()


PLAIN_PROMPTS = ["And God said", "In the beginning", "The LORD is my shepherd", "And it came to pass",
                 "Blessed are the", "Jesus answered and said", "The fear of the LORD", "Thou shalt not",
                 "Love is", "Let us", "The kingdom of heaven", "My son, hear"]
CHAT_PROMPTS = ["Who are you?", "Tell me about light.", "Recite John 3:16.", "What does the Bible say about wisdom?"]


def make_references(out_dir, tok, held_ids, args, tlog):
    """goldens.json: the saved bf16 weights, loaded by transformers into a float32 model on the CPU."""
    import torch
    import transformers
    from transformers import Gemma4ForCausalLM
    torch.set_num_threads(max(1, min(16, os.cpu_count() or 1)))
    model, info = Gemma4ForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager",
                                                    output_loading_info=True)
    model.eval()
    set_attn(model, "eager")
    info = {k: sorted(map(str, v)) if isinstance(v, (list, set, tuple)) else str(v) for k, v in dict(info).items()}
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]
    check(not missing, f"from_pretrained: missing keys {missing[:8]}")
    check(not info.get("unexpected_keys"), f"from_pretrained: unexpected keys {info.get('unexpected_keys')[:8]}")
    check(not info.get("mismatched_keys"), f"from_pretrained: mismatched keys {info.get('mismatched_keys')}")
    check(next(model.parameters()).dtype == torch.float32, "from_pretrained did not give float32")
    check(torch.equal(model.lm_head.weight, text_model_of(model).embed_tokens.weight), "lm_head not tied")
    geo = check_geometry(model, MODEL_SPEC)
    scales = patch_embed_scales(model, torch)
    from safetensors.torch import load_file
    disk = load_file(os.path.join(out_dir, "model.safetensors"))
    sd = model.state_dict()
    for k, v in disk.items():
        check(v.dtype == torch.bfloat16, f"{k} is not bf16 on disk")
        check(torch.equal(sd[k], v.float()), f"{k}: the fp32 reference does not hold the bf16 values")

    torch.set_grad_enabled(False)
    # held-out passage: the first PPL_LEN tokens of data/corpus/heldout.txt with <bos> (Revelation 1)
    passage = held_ids[0][:args.ppl_len]
    check(passage[0] == BOS and len(passage) == args.ppl_len, "held-out passage too short")
    nll, per_tok = nll_of(model, torch, passage)
    # the whole held-out book, windows of seq_len tokens (each starting with <bos>)
    full = held_ids[0][1:]
    tot, n = 0.0, 0
    W = args.seq_len - 1
    for i in range(0, len(full) - 1, W):
        chunk = [BOS] + full[i:i + W]
        if len(chunk) < 2:
            break
        m, _ = nll_of(model, torch, chunk)
        tot += m * (len(chunk) - 1)
        n += len(chunk) - 1
    held_ppl = math.exp(tot / n)

    cases = []
    for text in PLAIN_PROMPTS:
        cases.append({"kind": "plain", "text": text, "prompt_ids": [BOS] + tok.encode(text, add_special_tokens=False).ids})
    for text in CHAT_PROMPTS:
        rendered = render_chat([("user", text)]) + "<|turn>model\n<|channel>thought\n<channel|>"
        cases.append({"kind": "chat", "text": text, "rendered": rendered,
                      "prompt_ids": tok.encode(rendered, add_special_tokens=False).ids})
    # cross-check the chat rendering with the real template through transformers (soft check)
    chat_template_check = None
    try:
        from transformers import PreTrainedTokenizerFast
        ht = PreTrainedTokenizerFast(tokenizer_file=os.path.join(out_dir, "tokenizer.json"), bos_token="<bos>",
                                     eos_token="<eos>", unk_token="<unk>", pad_token="<pad>")
        with open(os.path.join(out_dir, "chat_template.jinja"), encoding="utf-8") as f:
            ht.chat_template = f.read()
        r = ht.apply_chat_template([{"role": "user", "content": CHAT_PROMPTS[0]}], tokenize=False,
                                   add_generation_prompt=True)
        chat_template_check = {"rendered_by_transformers": r, "same_as_ours": r == cases[len(PLAIN_PROMPTS)]["rendered"]}
    except Exception as e:
        chat_template_check = {"error": repr(e)[:300]}
    log(f"chat template check: {chat_template_check}")

    N = args.new_tokens
    for c in cases:
        c["prompt_tokens"] = [tok.id_to_token(i) for i in c["prompt_ids"]]
        ids, margins, rel = greedy_full(model, torch, c["prompt_ids"], N)
        c["greedy_ids_full_recompute"] = ids
        c["greedy_margins"] = margins
        c["greedy_min_margin"] = min(margins)
        c["greedy_min_rel_margin"] = min(rel)
        try:
            c["generate_ids"] = hf_generate(model, torch, c["prompt_ids"], N, None)
        except Exception as e:
            c["generate_error"] = repr(e)[:300]
            c["generate_ids"] = None
        try:
            c["generate_ids_stop"] = hf_generate(model, torch, c["prompt_ids"], N, STOP_IDS)
        except Exception as e:
            c["generate_ids_stop"] = None
            c["generate_stop_error"] = repr(e)[:300]
        c["generate_matches_full_recompute"] = c["generate_ids"] == ids
        stop_at = next((k for k, t in enumerate(ids) if t in STOP_IDS), None)
        c["first_stop_index"] = stop_at
        c["decoded"] = tok.decode(ids[:stop_at] if stop_at is not None else ids, skip_special_tokens=False)
        c["ok"] = c["greedy_min_rel_margin"] >= args.margin_rel and c["generate_matches_full_recompute"]
    plain = [c for c in cases if c["kind"] == "plain" and c["ok"]][:args.n_plain]
    chat = [c for c in cases if c["kind"] == "chat" and c["ok"]][:args.n_chat]
    rejected = [{"text": c["text"], "min_rel_margin": c["greedy_min_rel_margin"],
                 "generate_matches_full_recompute": c["generate_matches_full_recompute"]} for c in cases if not c["ok"]]
    if len(plain) < 3 or not chat:
        log(f"WARNING: only {len(plain)} plain and {len(chat)} chat prompts pass the margin check; rejected: {rejected}")
    goldens = {
        "model": "MarkBase default model (tools/train_default_model.py)",
        "reference": {"library": "transformers", "transformers_version": transformers.__version__,
                      "torch_version": torch.__version__, "dtype": "float32 holding exactly the bf16 weights saved",
                      "attn_implementation": "eager", "device": "cpu",
                      "embed_scales_used": scales,
                      "generate": f"model.generate(do_sample=False, max_new_tokens={N}, use_cache=True); "
                                  "generate_ids: eos_token_id=None (always N tokens); generate_ids_stop: "
                                  f"eos_token_id={STOP_IDS} (stops after the first stop id, which it includes)"},
        "stop_ids": STOP_IDS,
        "margin_rule": f"a prompt is kept when every greedy step's top1-top2 logit gap >= {args.margin_rel} * "
                       "max|logit| at that step, and cached generate equals full recomputation",
        "prompts": plain + chat,
        "rejected_prompts": rejected,
        "perplexity": {
            "source": "data/corpus/heldout.txt (KJV Revelation, held out of training), encoded without special "
                      f"tokens, <bos> prepended, first {args.ppl_len} ids",
            "ids": passage,
            "n_predicted": len(passage) - 1,
            "mean_nll": nll,
            "ppl": math.exp(nll),
            "per_token_nll": per_tok,
            "formula": "exp(mean over positions i=1..n-1 of -log softmax(logits[i-1])[ids[i]]), one forward pass "
                       "over all ids, logits after the final softcap",
        },
        "heldout_full": {"tokens": len(full) + 1, "window": args.seq_len, "ppl": held_ppl,
                         "method": f"non-overlapping windows of {W} tokens, each with <bos> prepended"},
        "layer_geometry": geo,
        "from_pretrained_loading_info": info,
        "chat_template_check": chat_template_check,
    }
    with open(os.path.join(out_dir, "goldens.json"), "w") as f:
        json.dump(goldens, f, indent=1)
    tlog["reference"] = {"heldout_passage_ppl_fp32": math.exp(nll), "heldout_full_ppl_fp32": held_ppl,
                         "prompts_kept": [c["text"] for c in plain + chat], "rejected": rejected}
    return goldens


def write_checkpoint(out_dir, model, torch, tlog):
    from safetensors.torch import save_file
    tensors = checkpoint_tensors(model, torch)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    os.chmod(os.path.join(out_dir, "model.safetensors"), 0o644)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(released_config_json(), f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(GEN_CONFIG, f, indent=2)
        f.write("\n")
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    n_params = sum(v.numel() for v in tensors.values())
    tlog["checkpoint"] = {"tensors": len(tensors), "parameters": n_params, "bytes": size}
    check(size < MAX_MODEL_BYTES, f"model.safetensors is {size} bytes, over {MAX_MODEL_BYTES}")
    return n_params, size


def count_params(spec):
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    with torch.device("meta"):
        m = Gemma4ForCausalLM(Gemma4TextConfig(**copy.deepcopy(spec)))
    sd = m.state_dict()
    return sum(v.numel() for k, v in sd.items() if k != "lm_head.weight"), {k: tuple(v.shape) for k, v in sd.items()}


def main_train(args, tlog):
    import numpy as np
    import torch
    import transformers
    tlog.update({"versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                              "transformers": transformers.__version__, "numpy": np.__version__},
                 "args": dict(vars(args)), "model_spec": MODEL_SPEC})
    try:
        import tokenizers
        tlog["versions"]["tokenizers"] = tokenizers.__version__
    except Exception:
        pass
    if transformers.__version__ != "5.17.0":
        log(f"WARNING: written against transformers 5.17.0; running {transformers.__version__}")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    tlog["device"] = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    log(f"device {tlog['device']}, torch {torch.__version__}, transformers {transformers.__version__}")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    n_params, shapes = count_params(MODEL_SPEC)
    log(f"model: {n_params} parameters, {2 * n_params / 1e6:.2f} MB in bf16")
    check(2 * n_params < MAX_MODEL_BYTES * 0.95, "the configured model is too large for the size limit")
    tlog["parameters"] = n_params

    train_docs, held_docs = read_corpus()
    tok = build_tokenizer(train_docs, out, tlog)

    t = time.time()
    convs = make_chat_conversations(train_docs, args.chat_convs, seed=args.seed)
    doc_ids = encode_docs(tok, train_docs, add_eos=True)
    chat_ids = [e.ids for e in tok.encode_batch(convs, add_special_tokens=False)]
    for c in chat_ids[:50]:
        check(c[0] == BOS and c[1] in (TURN_OPEN,) and c[-2:] == [TURN_CLOSE, tok.token_to_id("\n")],
              f"chat conversation encodes unexpectedly: {c[:5]} ... {c[-3:]}")
    held_ids = encode_docs(tok, held_docs, add_eos=False)
    text_tokens = sum(map(len, doc_ids))
    chat_tokens = sum(map(len, chat_ids))
    chars = sum(map(len, train_docs))
    # interleave chat conversations between documents at random places, in fixed order
    rng = random.Random(args.seed)
    pieces = [("doc", d) for d in doc_ids]
    for c in chat_ids:
        pieces.insert(rng.randrange(len(pieces) + 1), ("chat", c))
    stream = np.fromiter((i for _, p in pieces for i in p), dtype=np.int64)
    check(int(stream.max()) < VOCAB and int(stream.min()) >= 0, "token id out of range")
    # validation: 2% of the stream as contiguous chunks, never inside a training window
    T = args.seq_len
    n_val = max(8, int(0.02 * len(stream) / (T - 1)))
    vr = np.random.default_rng(args.seed)
    cand = np.arange(0, len(stream) - T, T - 1)
    val_starts = np.sort(vr.choice(cand, size=n_val, replace=False))
    mask = np.zeros(len(stream) + 1, dtype=np.int64)
    for s in val_starts:
        mask[s:s + T - 1] = 1
    cs = np.concatenate([[0], np.cumsum(mask)])
    all_starts = np.arange(0, len(stream) - (T - 1))
    ok = (cs[all_starts + T - 1] - cs[all_starts]) == 0
    starts = all_starts[ok]
    starts = starts[stream[starts] != BOS]          # the sequence gets its own <bos> in front
    val_x = torch.stack([torch.from_numpy(np.concatenate([[BOS], stream[s:s + T - 1]])) for s in val_starts])
    tlog["data"] = {"train_chars": chars, "text_tokens": text_tokens, "chars_per_token": round(chars / text_tokens, 3),
                    "chat_conversations": len(convs), "chat_tokens": chat_tokens,
                    "stream_tokens": int(len(stream)), "validation_tokens": int(n_val * (T - 1)),
                    "train_window_starts": int(len(starts)), "heldout_tokens": len(held_ids[0]),
                    "chat_examples": convs[:3], "seconds": round(time.time() - t, 1)}
    log(f"data: {text_tokens} text tokens ({chars / text_tokens:.2f} chars/token), {chat_tokens} chat tokens in "
        f"{len(convs)} conversations, {n_val} validation windows; held-out {len(held_ids[0])} tokens")

    runs, results = [], []
    train_deadline = T0 + args.train_budget
    for k, ep in enumerate(args.epochs):
        left = train_deadline - time.time()
        if left < 30:
            log(f"skipping the {ep}-epoch run: {left:.0f}s of the training budget left")
            continue
        try:
            vl, state, run = train_one(torch, np, stream, starts, val_x, args, ep, left, f"run{k}({ep}ep)", device,
                                       runs)
            results.append((vl, state, run))
            log(f"run {k} ({ep} epochs planned, {run['epochs_done']:.1f} done): best val loss {vl:.4f} at step "
                f"{run['best_step']} ({run['seconds']}s)")
        except Failure:
            raise
        except Exception as e:
            log(f"run {k} failed: {e!r}")
            traceback.print_exc()
            runs.append({"tag": f"run{k}", "error": repr(e)[:500]})
            if args.attn != "eager" and not results:
                log("retrying with eager attention")
                args.attn = "eager"
                vl, state, run = train_one(torch, np, stream, starts, val_x, args, ep, train_deadline - time.time(),
                                           f"run{k}-eager", device, runs)
                results.append((vl, state, run))
    tlog["runs"] = runs
    check(results, "no training run finished")
    vl, state, run = min(results, key=lambda r: r[0])
    tlog["selected_run"] = {"tag": run["tag"], "best_step": run["best_step"], "val_loss": vl, "val_ppl": math.exp(vl)}
    log(f"selected {run['tag']} step {run['best_step']}: val loss {vl:.4f} (ppl {math.exp(vl):.2f})")

    model = build_model(torch, "cpu")
    res = model.load_state_dict(state, strict=False)
    check(set(res.missing_keys) <= {"lm_head.weight"} and not res.unexpected_keys,
          f"reloading the best state: missing {res.missing_keys}, unexpected {res.unexpected_keys}")
    check(torch.equal(model.lm_head.weight, text_model_of(model).embed_tokens.weight), "lm_head not tied")
    n_params, size = write_checkpoint(out, model, torch, tlog)
    log(f"wrote model.safetensors: {n_params} parameters, {size} bytes")
    del model, results

    try:
        goldens = make_references(out, tok, held_ids, args, tlog)
    except Exception as e:
        tlog["reference_error"] = f"{e!r}\n{traceback.format_exc()}"
        log(f"REFERENCE FAILED: {e!r}")
        traceback.print_exc()
        goldens = None
    tlog["total_seconds"] = round(time.time() - T0, 1)
    with open(os.path.join(out, "train_log.json"), "w") as f:
        json.dump(tlog, f, indent=1)
    return tlog, goldens


def pack(out):
    out = os.path.abspath(out)
    tar_path = out.rstrip("/") + ".tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        tar.add(out, arcname=os.path.basename(out.rstrip("/")))
    return tar_path


def summary(out, tlog, goldens):
    print("\n===== summary =====")
    ck = tlog.get("checkpoint", {})
    print(f"parameters: {ck.get('parameters')}   model.safetensors: {ck.get('bytes')} bytes")
    sel = tlog.get("selected_run", {})
    for r in tlog.get("runs", []):
        if "curve" in r and r["curve"]:
            print(f"{r['tag']}: {r.get('steps_done')} steps, final train loss {r['curve'][-1]['loss']}, best val loss "
                  f"{r.get('best_val_loss')} at step {r.get('best_step')} ({r.get('seconds')}s, "
                  f"{r.get('ms_per_step')} ms/step)")
    print(f"selected: {sel}")
    ref = tlog.get("reference", {})
    print(f"held-out ppl (fp32 reference): passage {ref.get('heldout_passage_ppl_fp32')}, whole book "
          f"{ref.get('heldout_full_ppl_fp32')}")
    if goldens:
        for c in goldens["prompts"]:
            print(f"--- [{c['kind']}] {c['text']!r} (min rel margin {c['greedy_min_rel_margin']:.2e})")
            print("   " + c["decoded"].replace("\n", "\n   "))
        if goldens["rejected_prompts"]:
            print(f"rejected prompts: {goldens['rejected_prompts']}")
    if "reference_error" in tlog:
        print("REFERENCE ERROR:", tlog["reference_error"].splitlines()[0])
    print(f"total {tlog.get('total_seconds')}s")


# ===============================================================================================================
# Self-test of the pure-Python parts (no torch, transformers or tokenizers needed)
# ===============================================================================================================
def selftest_pure():
    import collections
    train, held = read_corpus()
    print(f"corpus: {len(train)} train documents ({sum(map(len, train))} chars), held-out {len(held[0])} chars")
    verses = kjv_verses(train)
    print(f"verses: {len(verses)}; first {verses[0]}; last {verses[-1][:3]}")
    convs = make_chat_conversations(train, 2000, seed=1234)
    for c in convs[:6]:
        print(repr(c))
    print("mean conversation chars:", sum(map(len, convs)) / len(convs))
    sk = load_skeleton()
    # stand-in for the BPE trainer: the alphabet plus frequent words as "pieces" with fake merges
    cnt = collections.Counter()
    for d in train[:5]:
        for w in re.findall(r" ?[A-Za-z]+", d):
            cnt[w.replace(" ", "\u2581")] += 1
    vocab = {}
    for ch in sorted(set("".join(train[:5]).replace(" ", "\u2581"))):
        vocab[ch] = len(vocab)
    merges = []
    for w, _ in cnt.most_common(3000):
        cur = w[0]
        for ch in w[1:]:
            nxt = cur + ch
            if nxt not in vocab:
                vocab[nxt] = len(vocab)
                merges.append([cur, ch])
            cur = nxt
    d = assemble_tokenizer_json(sk, vocab, merges, VOCAB)
    diffs = compare_tokenizer_kind(d, sk)
    print("kind differences:", diffs)
    assert not diffs
    bad = copy.deepcopy(d)
    bad["model"]["byte_fallback"] = False
    bad["pre_tokenizer"] = {"type": "Metaspace"}
    print("deliberately broken copy ->", compare_tokenizer_kind(bad, sk))
    assert len(compare_tokenizer_kind(bad, sk)) == 2
    print("vocab size", len(d["model"]["vocab"]), "merges", len(d["model"]["merges"]),
          "added", [(t["content"], t["id"]) for t in d["added_tokens"]])
    print("config.json:", json.dumps(released_config_json())[:400], "...")
    print("selftest ok")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (OUT.tar.gz is written next to it)")
    ap.add_argument("--selftest-pure", action="store_true")
    ap.add_argument("--epochs", default="6,12", help="comma-separated planned epochs of the candidate runs; the "
                    "run with the best validation loss (at its best evaluation) is kept")
    ap.add_argument("--train-budget", type=float, default=330.0,
                    help="seconds from the start of the script by which training must end")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--attn", default="sdpa", help="attention implementation for training (sdpa or eager)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--max-steps", type=int, default=0, help="cap on steps per run (smoke tests)")
    ap.add_argument("--chat-convs", type=int, default=5000)
    ap.add_argument("--ppl-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--n-plain", type=int, default=5)
    ap.add_argument("--n-chat", type=int, default=2)
    ap.add_argument("--margin-rel", type=float, default=1e-3)
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args(argv)
    a.epochs = [float(x) for x in a.epochs.split(",") if x.strip()]
    return a


def main():
    args = parse_args()
    if args.selftest_pure:
        selftest_pure()
        return 0
    if not args.out:
        sys.exit("--out is required")
    tlog, goldens = {}, None
    rc = 0
    try:
        tlog, goldens = main_train(args, tlog)
    except Exception as e:
        rc = 1
        log(f"FAILED: {e!r}")
        traceback.print_exc()
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "FAILED.txt"), "w") as f:
            f.write(f"{e!r}\n{traceback.format_exc()}")
        if tlog:
            with open(os.path.join(args.out, "train_log.json"), "w") as f:
                json.dump(tlog, f, indent=1, default=str)
    tar_path = pack(args.out)
    log(f"packed {tar_path} ({os.path.getsize(tar_path)} bytes)")
    if tlog:
        summary(args.out, tlog, goldens)
    if goldens is None or "reference_error" in tlog:
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())

"""make interop: zerone's tokenizers against the real `tokenizers`, `transformers` and `sentencepiece` (a file not
named tokenizers.py, which would shadow the package).


Usage: python tokenizer_encodings.py ZERONE WORKDIR

A few hundred varied strings (prose, code, digit runs, whitespace runs with tabs and newlines,
contractions in both cases, accents, CJK, emoji, special-token text, empty and blank strings,
random mixtures) are encoded by `zerone prepare` (each string one --text file, so one document
each) and by the Python libraries; the id sequences must be equal, string by string:
  - GPT-2 BPE from tests/data/gpt2_bpe (encoder.json + vocab.bpe), against transformers'
    GPT2Tokenizer; and the same tokenizer saved by transformers as tokenizer.json;
  - a LLaMA-3 style tokenizer.json built here with `tokenizers` (byte-level BPE, LLaMA-3's split
    pattern, ignore_merges, <|begin_of_text|> and other special tokens), trained on
    /usr/share/common-licenses;
  - a SentencePiece model trained here with `sentencepiece` as LLaMA-2's (BPE, byte fallback,
    split digits, no normalization), against sentencepiece itself and transformers' LlamaTokenizer
    (where transformers follows sentencepiece: see below).
`zerone prepare` puts its document marker (GPT-2: <|endoftext|>, SentencePiece: BOS) before each
document, so its shard must equal the concatenation of [marker] + ids(string) over the strings.
"""
import glob
import os
import random
import shutil
import struct
import subprocess
import sys

import sentencepiece as spm
import tokenizers
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

zerone, work = sys.argv[1], sys.argv[2]
data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
failures = 0


def report(ok, name, detail):
    global failures
    failures += 0 if ok else 1
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)


def corpus_strings():
    """The test strings: hand-written edge cases, slices of the licenses, random mixtures."""
    s = [
        "", " ", "  ", "\n", "\t", "\n\n", " \n ", "\t\t\n", "\r\n", "a", "A", "0", ".", "'", "''",
        "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
        "  leading spaces", "trailing spaces   ", "multiple   inner    spaces", "tabs\tbetween\twords",
        "line one\nline two\n\nline four\n", "indented\n    four\n\ttab\n  \t mixed", "a\n \nb", "x \n\n y",
        "I'm sure they'll say we've done what you'd've thought; it's John's.", "DON'T SHOUT, I'M HERE. IT'S FINE",
        "She'S We'Ve They'LL", "rock 'n' roll", "'tis the season", "quote: 'single' and \"double\"",
        "1", "12", "123", "1234", "12345", "1234567890", "3.14159265358979", "1,000,000", "-42", "+7e-10",
        "2024-11-26T15:44:42Z", "0x7fffffff", "v1.2.3-rc4", "phone 555-0199", "a1b2c3d4", "abc123def456",
        "def f(x):\n    return x ** 2  # square\n",
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
        "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n}\n",
        "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
        "<div class=\"x\">&amp; &lt;tag&gt;</div>", "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
        "https://example.com/path?query=1&b=two#frag", "user@example.org", "C:\\Windows\\System32",
        "!!!???...,,,;;;:::", "--- *** ___ ===", "(((nested)))", "@#$%^&*()_+-=[]{}|;':\",./<>?`~",
        "café", "naïve résumé", "Ünïcödé façade", "Ångström", "Zürich Straße", "ÀÉÎÕÜ àéîõü", "ñ ç ø å æ œ",
        "Ελληνικά γράμματα", "Русский текст, привет!", "עברית", "العربية", "हिन्दी", "ภาษาไทย",
        "日本語のテキスト", "中文字符和标点。", "한국어 문장입니다", "混合 mixed テキスト 123",
        "👍", "👍🏽", "🤗 Hugging Face", "👨‍👩‍👧‍👦 family", "🇫🇷🇯🇵", "emoji😀in😀words", "❤️ ✓ ★ ☃",
        "e\u0301 (combining)", "zero\u200bwidth", "non\u00a0breaking", "\u3000ideographic space",
        "<|endoftext|>", "text<|endoftext|>more", "<|endoftext|><|endoftext|>", "a <|endoftext|> b",
        "<|begin_of_text|>Hello", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        "<s>", "</s>", "<s> [INST] hi [/INST]", "<unk>", "<|endoftext", "|endoftext|>",
    ]
    licenses = "".join(open(p, encoding="utf-8", errors="replace").read() for p in sorted(glob.glob("/usr/share/common-licenses/*"))
                       if os.path.isfile(p))
    rng = random.Random(22)
    for _ in range(150):  # slices of real text: prose, indentation, blank-line runs
        begin = rng.randrange(len(licenses) - 400)
        s.append(licenses[begin: begin + rng.choice([1, 5, 20, 80, 200, 400])])
    pieces = ["the", "The", " ", "  ", "\t", "\n", "\n\n", "'s", "'LL", "'re", "123", "4567", "9", ".", ",", "!",
              "?!", "é", "ü", "ß", "日本", "中", "😀", "👍🏽", "-", "_", "=", "==", "\r\n", "x", "Zz", " 42 ", "\u00a0"]
    for _ in range(120):  # random mixtures of the character classes the split patterns distinguish
        s.append("".join(rng.choice(pieces) for _ in range(rng.randrange(1, 25))))
    return s


def zerone_encode(strings, tokenizer, name):
    """zerone prepare's shard for one document per string: the list of its ids."""
    files = []
    for i, text in enumerate(strings):
        files.append(os.path.join(work, f"{name}_{i:04d}.txt"))
        with open(files[-1], "wb") as f:
            f.write(text.encode("utf-8"))
    out = os.path.join(work, name)
    p = subprocess.run([zerone, "prepare", "--text", *files, "--tokenizer", tokenizer, "--out", out, "--val-fraction", "0"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"zerone prepare exited {p.returncode}: {p.stdout}{p.stderr}")
    b = open(out + "_train.bin", "rb").read()
    magic, version, n = struct.unpack("<3i", b[:12])
    fmt, width = ("H", 2) if version == 1 else ("I", 4)
    return list(struct.unpack(f"<{n}{fmt}", b[1024: 1024 + n * width]))


def check(name, strings, tokenizer_path, reference, marker, what):
    """zerone's encodings of `strings` with `tokenizer_path` against reference(string) -> ids."""
    try:
        got = zerone_encode(strings, tokenizer_path, name)
        want = [reference(s) for s in strings]
        empty = [s for s, ids in zip(strings, want) if s and not ids]
        if empty:  # every tokenizer here encodes any non-empty text to some ids: the oracle is broken
            raise RuntimeError(f"{what} encodes {len(empty)} non-empty strings to nothing, e.g. {empty[0]!r}")
        stream = [t for ids in want for t in [marker, *ids]]
        if got == stream:
            report(True, name, f"{len(strings)} strings, {len(stream) - len(strings)} ids equal {what}'s")
            return
        # Walk the reference's documents to name the strings that differ.
        pos, shown, differing = 0, [], 0
        for s, ids in zip(strings, want):
            mine = got[pos + 1: pos + 1 + len(ids)]
            if got[pos: pos + 1] != [marker] or mine != ids:
                differing += 1
                if len(shown) < 5:
                    shown.append(f"\n       {s!r}: zerone {got[pos: pos + 1 + len(ids) + 2]} {what} {[marker, *ids]}")
                if got[pos: pos + 1] != [marker] or len(shown) >= 5:
                    break  # past the first misalignment the rest does not line up
            pos += 1 + len(ids)
        report(False, name, f"ids differ from {what}'s ({differing}+ of {len(strings)} strings; first shown):{''.join(shown)}")
    except Exception as e:
        report(False, name, repr(e))


strings = corpus_strings()
print(f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}, sentencepiece {spm.__version__}; "
      f"{len(strings)} strings")

# GPT-2 BPE: OpenAI's files, and transformers' tokenizer.json of the same vocabulary.
# (encoder.json and vocab.bpe are the vocab.json and merges.txt that from_pretrained reads.)
gpt2_dir, gpt2_hf = os.path.join(data, "gpt2_bpe"), os.path.join(work, "gpt2_hf")
os.makedirs(gpt2_hf)
shutil.copy(os.path.join(gpt2_dir, "encoder.json"), os.path.join(gpt2_hf, "vocab.json"))
shutil.copy(os.path.join(gpt2_dir, "vocab.bpe"), os.path.join(gpt2_hf, "merges.txt"))
gpt2 = transformers.GPT2Tokenizer.from_pretrained(gpt2_hf)
gpt2_encode = lambda s: gpt2.encode(s, add_special_tokens=False)
check("gpt2_bpe_encoder_json", strings, os.path.join(gpt2_dir, "encoder.json"), gpt2_encode, 50256, "transformers GPT2Tokenizer")
gpt2.save_pretrained(os.path.join(work, "gpt2_tokenizer"))
check("gpt2_bpe_tokenizer_json", strings, os.path.join(work, "gpt2_tokenizer", "tokenizer.json"), gpt2_encode, 50256,
      "transformers GPT2Tokenizer")

# A LLaMA-3 style tokenizer.json.
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")
specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
llama3 = Tokenizer(models.BPE(ignore_merges=True))
llama3.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
llama3.decoder = decoders.ByteLevel()
llama3.train([p for p in sorted(glob.glob("/usr/share/common-licenses/*")) if os.path.isfile(p)],
             trainers.BpeTrainer(vocab_size=3000, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                 show_progress=False))
llama3_path = os.path.join(work, "llama3_tokenizer.json")
llama3.save(llama3_path)
check("llama3_tokenizer_json", strings, llama3_path, lambda s: llama3.encode(s, add_special_tokens=False).ids,
      llama3.token_to_id("<|begin_of_text|>"), "tokenizers")

# A LLaMA-2 style SentencePiece model.
spm_prefix = os.path.join(work, "llama2_spm")
spm.SentencePieceTrainer.train(
    input=",".join(p for p in sorted(glob.glob("/usr/share/common-licenses/*")) if os.path.isfile(p)),
    model_prefix=spm_prefix, vocab_size=1000, model_type="bpe", byte_fallback=True, split_digits=True,
    allow_whitespace_only_pieces=True, remove_extra_whitespaces=False, normalization_rule_name="identity",
    add_dummy_prefix=True, character_coverage=0.9995, unk_id=0, bos_id=1, eos_id=2, minloglevel=2)
sp = spm.SentencePieceProcessor(model_file=spm_prefix + ".model")
check("sentencepiece_llama2", strings, spm_prefix + ".model", lambda s: sp.encode(s), sp.bos_id(), "sentencepiece")
llama2_hf = os.path.join(work, "llama2_hf")
os.makedirs(llama2_hf)
shutil.copy(spm_prefix + ".model", os.path.join(llama2_hf, "tokenizer.model"))
# transformers' LlamaTokenizer (a `tokenizers` Metaspace conversion of the model) departs from
# sentencepiece itself in two known ways, so it is compared where it follows it: it matches "<s>" and
# "</s>" in the text as special tokens (split_special_tokens=True turns that off, as sentencepiece and
# zerone read them as text), and its Metaspace leaves out the dummy-prefix "▁" when the text already
# begins with a space (" " -> "▁", where sentencepiece gives "▁▁"), so strings that start with a space
# are compared with sentencepiece only (above).
hf_llama2 = transformers.LlamaTokenizer.from_pretrained(llama2_hf, split_special_tokens=True)
check("sentencepiece_llama2_transformers", [s for s in strings if not s.startswith(" ")], spm_prefix + ".model",
      lambda s: hf_llama2.encode(s, add_special_tokens=False), sp.bos_id(),
      "transformers LlamaTokenizer (strings not starting with a space)")

sys.exit(1 if failures else 0)

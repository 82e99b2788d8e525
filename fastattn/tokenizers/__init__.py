"""Tokenizers: text <-> int64 token ids for the models (pure Python + NumPy).

```python
from fastattn.tokenizers import WordTokenizer, CharTokenizer, BPETokenizer
tok = BPETokenizer().train(texts, vocab_size=8000)
ids, key_padding_mask = tok.encode_batch(batch, add_start_end=True, max_length=128)
tok.save("tok.json"); tok = fastattn.tokenizers.load("tok.json")
```

Three tokenizers over one ``Vocab`` (token <-> id), one module each (``word``, ``char``,
``bpe``; ``vocab`` holds Vocab and the specials, ``base`` the API they share, ``files`` the
JSON reading and writing):

- ``WordTokenizer``: one token per word. Lowercases by default; splits on whitespace;
  punctuation separates words and is dropped, except an apostrophe between two word characters
  ("won't" stays one token, the quotes around 'quoted' are dropped). Punctuation is every
  character of Unicode category P* plus the ASCII punctuation of ``string.punctuation`` (so
  "$", "<", "+" count too); apostrophes are U+0027 and U+2019. ``decode`` joins words with
  single spaces.
- ``CharTokenizer``: one token per Unicode code point (no normalisation); ``decode`` is the
  exact inverse for text whose characters were seen in training.
- ``BPETokenizer``: byte-pair encoding over characters (Sennrich et al. 2016), trained as in the
  worked example "she sells seashells by the seashore" (see ``BPETokenizer``); ``decode`` is the
  exact inverse of ``encode`` for any text whose characters were seen in training.

Every tokenizer learns its vocabulary with ``train(texts, vocab_size=None, ...)``, which returns
the tokenizer. ``vocab_size`` always counts the whole vocabulary, specials included (the
embedding's num_embeddings). Word and character tokenizers keep the most frequent tokens up to
it and take ``min_freq=1`` (rarer tokens are left out); BPE merges until it reaches it, or takes
``num_merges=`` instead (exactly one of the two).

Special tokens come first in the vocabulary, in the order given by ``specials`` (default
``<pad> <unk> <start> <end>`` = ids 0..3; ``specials=()`` for none). Their roles are known by
these four names (``pad_id``, ``unk_id``, ``start_id``, ``end_id`` are None when absent); any
other name is an extra special without a role. ``decode`` drops every special. A token that is
not in the vocabulary encodes as ``<unk>`` when there is one, else it is a ValueError naming it.

``encode_head(text, max_tokens)`` gives ``encode(text)``'s first ids and whether there are
more, splitting only the start of a long text (``encode_batch(max_length=...)`` cuts so).

Batches follow DESIGN's data conventions: ids int64 (B, L) padded with ``pad_id`` on the right,
``key_padding_mask`` bool (B, L) with True = padding.

Files: ``save(path)`` writes JSON holding the class name, the constructor config, the tokens
and (BPE) the merges; ``fastattn.tokenizers.load(path)`` rebuilds the right class, and
``Class.load(path)`` checks the class too. Nothing is executed or unpickled. A file is
untrusted input: ``load`` takes only what ``train`` could have made (every field present with
its type, no field it does not know, tokens the tokenizer can produce, BPE merges that build
on what exists and that the trainer would make, none spelling a special token), and any
problem with the file -- not JSON, not UTF-8, nested too deeply, a directory, a key given
twice, a field that lies -- is a ValueError naming the file and the problem. A missing file
is FileNotFoundError, as for ``open``.

Errors: text that is not a str is a TypeError; an id outside the vocabulary is a ValueError
naming the id; using a tokenizer before ``train`` is a ``NotFittedError`` (a RuntimeError)
saying so.
"""
from __future__ import annotations

# PAD, UNK, START, END and FORMAT are importable from here too, outside __all__
from .base import FORMAT, NotFittedError, Tokenizer, load
from .bpe import END_OF_WORD, BPETokenizer
from .char import CharTokenizer
from .vocab import END, PAD, SPECIALS, START, UNK, Vocab
from .word import WordTokenizer

__all__ = [
    "SPECIALS", "END_OF_WORD", "Vocab", "Tokenizer", "WordTokenizer", "CharTokenizer",
    "BPETokenizer", "NotFittedError", "load",
]

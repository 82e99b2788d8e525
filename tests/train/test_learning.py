"""Training that generalises: a small position-sensitive task (reverse a sequence of words)
learned to a held-out exact match that the N(0, 1) embeddings of torch's construction
defaults (init="torch") do not reach with the same budget. The tokens' embeddings, scaled by
sqrt(d_model), would drown the positional encodings; the tutorial's xavier init (the default)
keeps them comparable. One thread, a few seconds per model."""
import random

import pytest

from fastattn.nn import Seq2SeqTransformer
from fastattn.tokenizers import WordTokenizer
from fastattn.train import fit
from fastattn.train.evaluate import Evaluator

pytestmark = pytest.mark.usefixtures("single_thread")


def reverse_pairs(n, seed, vocab=12, lo=3, hi=7):
    """n pairs (words, the words reversed) with distinct sources of lo..hi words."""
    rng, words, seen, pairs = random.Random(seed), [f"w{i}" for i in range(vocab)], set(), []
    while len(pairs) < n:
        src = tuple(rng.choice(words) for _ in range(rng.randint(lo, hi)))
        if src not in seen:
            seen.add(src)
            pairs.append((" ".join(src), " ".join(reversed(src))))
    return pairs


def held_out_exact(init):
    pairs = reverse_pairs(1600, seed=0)
    train, test = pairs[:1500], pairs[1500:]          # test sources never seen in training
    tok = WordTokenizer().train([t for p in train for t in p])
    model = Seq2SeqTransformer(2, 2, 64, 4, tok.vocab_size, tok.vocab_size, 128, 0.0,
                               pad_id=tok.pad_id, max_len=16, seed=0, init=init)
    fit(model, train, src_tokenizer=tok, tgt_tokenizer=tok, max_steps=400, batch_tokens=512,
        lr=2e-3, warmup=40, progress=False, seed=0)
    return Evaluator(test, src_tokenizer=tok, tgt_tokenizer=tok, max_len=16,
                     exact_sample=None)(model)["valid_exact"]


@pytest.mark.long
def test_default_init_learns_a_position_sensitive_task_the_torch_init_does_not():
    assert held_out_exact("xavier") >= 0.9
    assert held_out_exact("torch") <= 0.5

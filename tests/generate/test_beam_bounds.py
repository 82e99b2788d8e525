"""beam_size is bounded: at least 1, at most the target vocabulary and MAX_BEAM_SIZE (the
pretrained models' bound), in every entry -- generate, model.generate, search.beam, hf.beam,
the runners' Translator and the --beam-size of fastattn complete / translate -- so a beam of
10**6 on a small vocabulary is a clear ValueError before anything is allocated, not gigabytes
of decoder state. The runners count a source beam_size times against batch_tokens."""
import numpy as np
import pytest

from fastattn.generate import MAX_BEAM_SIZE, generate, hf, search
from gen_util import START, V_TGT, model, source_batch


@pytest.mark.parametrize("beam_size", [V_TGT + 1, 10 ** 6])
def test_generate_refuses_a_beam_wider_than_the_vocabulary(beam_size):
    m = model()
    src, kpm = source_batch()
    for call in (lambda **kw: generate(m, src, **kw), lambda **kw: m.generate(src, **kw)):
        with pytest.raises(ValueError, match=rf"generate: beam_size must be an int >= 1 and "
                                             rf"<= {V_TGT} \(the target vocabulary's {V_TGT} "
                                             rf"tokens, at most 256\), got {beam_size}"):
            call(max_new_tokens=3, start_id=START, method="beam", beam_size=beam_size,
                 src_key_padding_mask=kpm)
    out = m.generate(src, max_new_tokens=3, start_id=START, method="beam", beam_size=V_TGT,
                     src_key_padding_mask=kpm)
    assert out.shape[0] == src.shape[0]
    # greedy and sampling take no beam: its default or any value given is not theirs to check
    m.generate(src, max_new_tokens=1, start_id=START, beam_size=10 ** 6)


def test_the_bound_is_min_of_the_vocabulary_and_max_beam_size():
    assert MAX_BEAM_SIZE == 256
    from fastattn import nn as fnn
    m = fnn.Seq2SeqTransformer(1, 1, 8, 2, 5, 300, 8, seed=0)
    src = np.ones((1, 2), np.int64)
    with pytest.raises(ValueError, match="<= 256 .*, got 257"):
        m.generate(src, max_new_tokens=1, start_id=1, method="beam", beam_size=257)
    with pytest.raises(ValueError, match="beam_size must be >= 1, got 0"):
        m.generate(src, max_new_tokens=1, start_id=1, method="beam", beam_size=0)


class _Decoder:
    """A decoder of V tokens whose logits prefer token 1."""

    def __init__(self, V):
        self.V = V

    def step(self, tokens):
        logits = np.zeros((len(tokens), self.V), np.float32)
        logits[:, 1] = 1.0
        return logits

    def reorder(self, rows, sources=None):
        pass


@pytest.mark.parametrize("k", [0, MAX_BEAM_SIZE + 1, 10 ** 6, 2.0, True])
def test_the_search_loops_bound_k_before_allocating(k):
    for loop in (lambda: search.beam(_Decoder(4), 1, k, max_new_tokens=2, start_id=0),
                 lambda: hf.beam(_Decoder(4), 1, k, None, start_id=0)):
        with pytest.raises(ValueError, match="beam: k must be an int >= 1 and <= 256"):
            loop()
    with pytest.raises(ValueError, match="beam_size must be an int >= 1 and <= 4 "):
        search.beam(_Decoder(4), 1, 5, max_new_tokens=2, start_id=0)   # V known at step 0

"""fastattn.generate.hf's step choices against the whole table they replace: greedy_pick against
argmax of Rules.apply on a copy of the logits, beam_candidates against the 2k best of the
(n, k V) table of run_score + the rules applied to the log-probabilities (_full_candidates, the
formula beam search used before), on logits made to break shortcuts: ties, -inf logits, banned
ids that would win, floor scores of the first step's empty beams, forced tokens, vocabularies
from below 2k tokens to many groups. (The searches against transformers' generate:
tests/pretrained/test_pretrained_model.py.)"""
import numpy as np
import pytest

from fastattn.generate import hf
from fastattn.generate.sampling import check_logits


def _logits(rng, R, V, kind):
    z = rng.standard_normal((R, V)).astype(np.float32)
    if kind == "ties":
        z = np.round(z * 2) / np.float32(2)                # a handful of distinct values
    elif kind == "neg_inf":
        z[:, rng.integers(0, V, max(1, V // 3))] = -np.inf
    elif kind == "tiny":
        z *= np.float32(1e-30)                             # distinct, equal after - lse
    return z


def _old_greedy(logits, rules, length):
    check_logits(logits, length - 1)
    return np.argmax(rules.apply(logits.astype(np.float32), length), axis=1)


CASES = [(n, k, V, kind) for n, k, V in [(1, 1, 7), (2, 3, 5), (3, 4, 120), (2, 4, 5003),
                                        (4, 4, 58101 // 8), (1, 5, 40)]
         for kind in ("normal", "ties", "neg_inf", "tiny")]


@pytest.mark.parametrize("n, k, V, kind", CASES)
def test_beam_candidates_equal_the_whole_table(n, k, V, kind):
    rng = np.random.default_rng(n * 1000 + k * 100 + V)
    z = _logits(rng, n * k, V, kind)
    run = rng.standard_normal((n, k)) * 3
    run[0, 1:] = -1.0e9                                    # the first step's empty beams
    # banned: an id of the largest logit of a row, so that the choice must look past it
    rules = hf.Rules(30, 0, {int(np.argmax(z[0])), V - 1})
    for length in (3, 7):
        got_top, got_score = hf.beam_candidates(z.copy(), run, rules, length, k)
        want_top, want_score = hf._full_candidates(z.copy(), hf._log_normalizer(z), run,
                                                   rules, length, 2 * k)
        np.testing.assert_array_equal(got_top, want_top)
        np.testing.assert_array_equal(got_score, want_score)


@pytest.mark.parametrize("length", [1, 9])
@pytest.mark.parametrize("V", [3, 120, 5003])
def test_beam_candidates_forced_tokens(length, V):
    rng = np.random.default_rng(V + length)
    n, k = 3, 4
    z = _logits(rng, n * k, V, "normal")
    run = rng.standard_normal((n, k))
    run[1, 1:] = -1.0e9
    run[2, 3] = -np.inf                       # a beam left with no finite continuation
    rules = hf.Rules(10, 0, {1}, forced_bos_id=V // 2, forced_eos_id=0)
    got = hf.beam_candidates(z, run, rules, length, k)
    want = hf._full_candidates(z, hf._log_normalizer(z), run, rules, length, 2 * k)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_log_normalizer_is_the_log_sum_exp():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((6, 58101)).astype(np.float32) * np.float32(3)
    z[2, :100] = -np.inf
    x = z.astype(np.float64)
    m = x.max(axis=1)
    want = m + np.log(np.exp(x - m[:, None]).sum(axis=1))
    # float32 sums of exp(z - max) (fastattn's cross-entropy kernel): lse - max <= log V
    # (~11) to float32 precision, with room: 1e-5
    np.testing.assert_allclose(hf._log_normalizer(z), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["normal", "ties", "neg_inf"])
def test_greedy_pick_equals_argmax_of_the_rules(kind):
    rng = np.random.default_rng(5)
    z = _logits(rng, 9, 300, kind)
    z[3, 17] = 50.0                                         # a banned id is a row's best
    z[4, :] = -np.inf                                       # a row of nothing but banned ...
    z[4, 17] = 1.0                                          # ... and -inf
    rules = hf.Rules(12, 0, {17})
    for length in (1, 5):
        np.testing.assert_array_equal(hf.greedy_pick(z.copy(), rules, length),
                                      _old_greedy(z.copy(), rules, length))
    forced = hf.Rules(12, 0, {17}, forced_bos_id=3, forced_eos_id=0)
    np.testing.assert_array_equal(hf.greedy_pick(z, forced, 1), np.full(9, 3))
    np.testing.assert_array_equal(hf.greedy_pick(z, forced, 11), np.zeros(9))
    np.testing.assert_array_equal(hf.greedy_pick(z, forced, 5), _old_greedy(z, forced, 5))


@pytest.mark.parametrize("bad", [np.nan, np.inf, "row"])
@pytest.mark.parametrize("pick", ["greedy", "beam"])
def test_bad_logits_raise_as_check_logits(bad, pick):
    z = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    if bad == "row":
        z[2] = -np.inf
    else:
        z[2, 40] = bad
    with pytest.raises(ValueError) as want:
        check_logits(z, 6)
    rules = hf.Rules(12, 0, {40}, forced_eos_id=0)          # banned and forced: still raised
    with pytest.raises(ValueError) as got:
        if pick == "greedy":
            hf.greedy_pick(z, rules, 7)
        else:
            hf.beam_candidates(z, np.zeros((2, 2)), rules, 7, 2)
    assert str(got.value) == str(want.value)


def test_the_logits_are_not_written():
    z = np.random.default_rng(2).standard_normal((8, 500)).astype(np.float32)
    z[0, 9] = 30.0
    before = z.copy()
    rules = hf.Rules(12, 0, {9})
    hf.greedy_pick(z, rules, 3)
    hf.beam_candidates(z, np.zeros((2, 4)), rules, 3, 4)
    np.testing.assert_array_equal(z, before)

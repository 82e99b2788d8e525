"""No stale derived weights: every public way of changing a weight, on a model that has already
run (its decode weights packed, a decode plan made), takes effect in the very next call of every
path, or raises. After each edit, the forward, generate and a decode step of the edited model
equal those of a model freshly built with the same weights, bit for bit: float32, int8 and
bf16, the edit made in eval or in train mode. invalidate_caches() is never called."""
import numpy as np
import pytest

from fastattn import io, nn as fnn, optim

V, C, H, F = 23, 32, 4, 64
SRC = np.array([[2, 5, 6, 7, 3, 0], [2, 8, 9, 10, 11, 3]])
TGT = np.array([[2, 7, 6, 5, 3], [2, 11, 10, 9, 8]])


def model(compute_type="float32"):
    m = fnn.Seq2SeqTransformer(2, 2, C, H, V, V, F, dropout=0.0, pad_id=0, max_len=16, seed=5)
    m.eval()
    return m if compute_type == "float32" else m.quantize(compute_type)


def use(m):
    """Every path once: the forward, generate and a decode step (its weights packed, its plan
    made)."""
    m.eval()
    m(SRC, TGT[:, :-1])
    m.generate(SRC, max_new_tokens=4, start_id=2, end_id=3)
    cache = m.init_cache(SRC, max_len=4)
    m.step(TGT[:, 0], cache)
    return cache


def outputs(m, eval_first=True):
    if eval_first:                  # eval() makes the derived weights again (a known point)
        m.eval()
    logits = m(SRC, TGT[:, :-1])
    tokens = m.generate(SRC, max_new_tokens=5, start_id=2, end_id=3)
    beams = m.generate(SRC, max_new_tokens=4, start_id=2, end_id=3, method="beam",
                       beam_size=2)
    cache = m.init_cache(SRC, beams=1, max_len=3)
    steps = [m.step(TGT[:, t], cache) for t in range(3)]
    return logits, tokens, beams, np.stack(steps)


def fresh_copy(m, tmp_path):
    """A model built anew from m's weights (through a file: quantized weights as stored)."""
    path = tmp_path / "copy.safetensors"
    io.save(m, path)
    return io.load(path).eval()


def assert_same(m, tmp_path):
    got, want = outputs(m), outputs(fresh_copy(m, tmp_path))
    for name, a, b in zip(("forward", "generate", "beam", "decode steps"), got, want):
        np.testing.assert_array_equal(a, b, err_msg=name)


def _scale_state_dict(m):
    for key, v in m.state_dict().items():
        if v.flags.writeable:       # a quantized weight's value is a read-only copy (below)
            v *= np.float32(1.5)


def _named_parameters(m):
    for key, p in m.named_parameters():
        if not isinstance(p, fnn.Parameter):
            continue
        p[...] = p[::-1] if p.ndim == 1 else p[:, ::-1]


def _attribute_in_place(m):
    layer = m.transformer.decoder.layers[1]
    layer.linear1.bias[0] += 3.0
    layer.norm2.weight *= np.float32(0.5)
    m.generator.bias[3] = 5.0
    m.tgt_tok_emb.embedding.weight[4, :] = 0.25


def _rebind(m):
    layer = m.transformer.decoder.layers[0]
    layer.linear2.bias = layer.linear2.bias + 1.0
    m.generator.bias = -m.generator.bias


def _copyto(m):
    np.copyto(m.transformer.decoder.layers[0].self_attn.in_proj_bias, 0.5)
    np.copyto(m.transformer.decoder.layers[1].norm3.bias, -0.25)


def _load_state_dict(m):
    other = fnn.Seq2SeqTransformer(2, 2, C, H, V, V, F, dropout=0.0, pad_id=0, max_len=16,
                                   seed=6)
    m.load_state_dict(other.state_dict())


def _optimizer_step(m):
    m.train()
    opt = optim.AdamW(m, lr=0.05)
    m.loss(SRC, TGT, backward=True)
    opt.step()
    m.eval()


def _backend_round_trip(m):
    m.to_backend("reference")
    m.generate(SRC, max_new_tokens=2, start_id=2, end_id=3)
    m.to_backend("fast")
    m.transformer.decoder.layers[0].linear1.bias[...] += 0.5


EDITS = {"state_dict values": _scale_state_dict, "named_parameters": _named_parameters,
         "attribute in place": _attribute_in_place, "rebinding": _rebind, "np.copyto": _copyto,
         "load_state_dict": _load_state_dict, "optimizer step": _optimizer_step,
         "to_backend and an edit": _backend_round_trip}
FLOAT_ONLY = {"load_state_dict", "optimizer step"}     # a quantized model refuses both


# a quantized model is for inference: it refuses train(), load_state_dict and optimisers
# (test_a_quantized_weight_through_state_dict_raises_not_ignored)
CASES = [(edit, ct, mode) for edit in EDITS for ct in ("float32", "int8", "bf16")
         for mode in ("eval", "train")
         if ct == "float32" or (edit not in FLOAT_ONLY and mode == "eval")]


@pytest.mark.parametrize("edit, compute_type, mode", CASES)
def test_an_edit_takes_effect_on_every_path(tmp_path, edit, compute_type, mode):
    m = model(compute_type)
    before = outputs(m)
    use(m)
    if mode == "train":
        m.train()
    EDITS[edit](m)
    after = outputs(m)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after)), "the edit changed nothing"
    assert_same(m, tmp_path)


def test_a_quantized_weight_through_state_dict_raises_not_ignored():
    m = model("int8")
    use(m)
    with pytest.raises(ValueError, match="read-only"):
        m.state_dict()["generator.weight"][...] = 0.0
    with pytest.raises(RuntimeError, match="quantize"):
        m.load_state_dict(m.state_dict())


def test_an_edit_between_two_steps_of_one_cache_reaches_the_next_step(tmp_path):
    """The plan of a cache is made again after a write: the step after the edit runs the new
    weights (the keys and values already cached stay as computed)."""
    m = model()
    cache = m.init_cache(SRC, max_len=3)
    m.step(TGT[:, 0], cache)
    m.generator.weight[...] *= np.float32(-1.0)
    got = m.step(TGT[:, 1], cache)
    twin = fresh_copy(m, tmp_path)
    twin.generator.weight[...] *= np.float32(-1.0)        # undone for the first step
    other = twin.init_cache(SRC, max_len=3)
    twin.step(TGT[:, 0], other)
    twin.generator.weight[...] *= np.float32(-1.0)
    np.testing.assert_array_equal(got, twin.step(TGT[:, 1], other))


def test_writes_through_a_plain_view_need_invalidate_caches():
    """What a parameter cannot see (a write through a plain ndarray view) is documented:
    invalidate_caches() makes it count."""
    m = model()
    use(m)
    before = m.generate(SRC, max_new_tokens=5, start_id=2, end_id=3)
    plain = m.generator.weight.view(np.ndarray)
    plain *= np.float32(-1.0)
    m.invalidate_caches()
    after = m.generate(SRC, max_new_tokens=5, start_id=2, end_id=3)
    assert not np.array_equal(before, after)
    np.testing.assert_array_equal(after, fresh_copy_tokens(m))


def fresh_copy_tokens(m):
    twin = fnn.Seq2SeqTransformer(2, 2, C, H, V, V, F, dropout=0.0, pad_id=0, max_len=16,
                                  seed=9).eval()
    twin.load_state_dict(m.state_dict())
    return twin.generate(SRC, max_new_tokens=5, start_id=2, end_id=3)


def test_parameter_counts_its_writes():
    p = fnn.Parameter(np.zeros((3, 4)))
    writes = [lambda: p.__setitem__(0, 1), lambda: p[1:2].__iadd__(1),
              lambda: np.add(p, 1, out=p), lambda: p.fill(2), lambda: np.copyto(p, 3),
              lambda: p.reshape(-1).__setitem__(0, 4), lambda: p.sort(axis=1),
              lambda: np.put(p, [0], [5])]
    for write in writes:
        before = p.version
        write()
        assert p.version > before
    assert type(p + 1) is np.ndarray and type(p.sum()) is np.float32
    before = p.version
    p.copy()[0] = 9                               # a copy is an array of its own
    assert p.version == before and p[0, 0] == 5


def _tie_to_embedding(m):
    m.generator.weight = m.tgt_tok_emb.embedding.weight          # the same Parameter


def _tie_to_generator(m):
    m.tgt_tok_emb.embedding.weight = m.generator.weight


def _tie_through_a_plain_view(m):
    m.generator.weight = np.asarray(m.tgt_tok_emb.embedding.weight)   # its memory, no copy


TIES = {"generator = embedding": _tie_to_embedding, "embedding = generator": _tie_to_generator,
        "plain view": _tie_through_a_plain_view}


@pytest.mark.parametrize("through", ["tgt_tok_emb.embedding.weight", "generator.weight"])
@pytest.mark.parametrize("tie", list(TIES))
def test_weights_tied_by_assignment_take_an_edit_through_either_name(tmp_path, tie, through):
    """Tie the generator to the target embedding by assignment (torch's way), run every
    path, then edit in place through one name: the next forward, generate and decode steps
    (with no eval() between, which would remake what is derived) all use the edited
    weights, through both names: a fresh model given the same weights gives the same
    outputs bit for bit, and greedy generate picks the forward's argmax."""
    m = model()
    TIES[tie](m)
    assert np.shares_memory(m.generator.weight, m.tgt_tok_emb.embedding.weight)
    use(m)
    w = dict(m.named_parameters())[through]
    w *= np.float32(-3.0)
    w[0] += np.float32(1.0)
    assert np.array_equal(m.generator.weight, m.tgt_tok_emb.embedding.weight)
    tokens = m.generate(SRC[:, :4], max_new_tokens=1, start_id=2)
    logits = m(SRC[:, :4], tokens[:, :1])
    np.testing.assert_array_equal(tokens[:, 1], logits[:, -1].argmax(-1))
    got = outputs(m, eval_first=False)
    want = outputs(fresh_copy(m, tmp_path))
    for name, a, b in zip(("forward", "generate", "beam", "decode steps"), got, want):
        np.testing.assert_array_equal(a, b, err_msg=name)

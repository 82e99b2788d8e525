"""The computed position tables of Marian and M2M100 / NLLB, and M2M100's padding-aware rows,
against transformers' own modules."""
import numpy as np
import pytest

from fastattn.pretrained.positions import m2m100_rows, sinusoidal_m2m100, sinusoidal_marian


@pytest.mark.parametrize("d", [4, 7, 48, 512])
def test_marian_table_equals_transformers(d):
    pytest.importorskip("torch")
    mm = pytest.importorskip("transformers.models.marian.modeling_marian")
    emb = mm.MarianSinusoidalPositionalEmbedding(40, d)
    np.testing.assert_array_equal(sinusoidal_marian(40, d), emb.create_weight().numpy())


@pytest.mark.parametrize("d", [4, 7, 48, 1024])
def test_m2m100_table_and_rows_equal_transformers(d):
    torch = pytest.importorskip("torch")
    m2 = pytest.importorskip("transformers.models.m2m_100.modeling_m2m_100")
    pad = 1
    theirs = m2.M2M100SinusoidalPositionalEmbedding.get_embedding(50, d, pad).numpy()
    # transformers builds this table in float32 (exp, then sin and cos of float32 angles up to
    # 50): a few float32 ulps of the angle, 4e-6 on values of at most 1; ours is float64, rounded
    np.testing.assert_allclose(sinusoidal_m2m100(50, d, pad), theirs, rtol=0, atol=4e-6)
    ids = np.array([[5, 6, 7, 2, pad, pad], [pad, pad, 9, 8, 7, 2]])
    module = m2.M2M100SinusoidalPositionalEmbedding(20, d, pad)
    for past in (0, 3):
        want = module.create_position_ids_from_input_ids(torch.from_numpy(ids), pad, past)
        np.testing.assert_array_equal(m2m100_rows(ids, pad, past), want.numpy())


def test_m2m100_rule_by_hand():
    np.testing.assert_array_equal(m2m100_rows([[1, 4, 1, 5]], 1), [[1, 2, 1, 3]])
    assert not sinusoidal_m2m100(4, 8, 1)[1].any()
    with pytest.raises(ValueError, match="d = 3 is too small"):
        sinusoidal_m2m100(4, 3, 1)

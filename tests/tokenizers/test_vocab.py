"""Vocab: specials first, token <-> id both ways, <unk> lookup, refused duplicates."""
import pytest

from fastattn.tokenizers import SPECIALS, Vocab


def test_vocab():
    v = Vocab(["x", "y"])
    assert len(v) == 6 and list(v) == list(SPECIALS) + ["x", "y"]
    assert (v.pad_id, v.unk_id, v.start_id, v.end_id) == (0, 1, 2, 3)
    assert v.token_to_id("y") == 5 and v.id_to_token(4) == "x"
    assert v.lookup("zzz") == v.unk_id
    with pytest.raises(KeyError, match="'zzz'"):
        v.token_to_id("zzz")
    with pytest.raises(ValueError, match="token id 6 "):
        v.id_to_token(6)
    with pytest.raises(ValueError, match="token id -1 "):
        v.id_to_token(-1)
    with pytest.raises(TypeError):
        v.id_to_token("1")
    with pytest.raises(ValueError, match="'zzz'"):
        Vocab(["x"], specials=()).lookup("zzz")
    with pytest.raises(ValueError, match="'x' is given twice"):
        Vocab(["x", "x"])
    with pytest.raises(ValueError, match="'<pad>' is a special"):
        Vocab(["<pad>"])
    with pytest.raises(ValueError, match="'<pad>' is given twice"):
        Vocab([], specials=("<pad>", "<pad>"))
    with pytest.raises(TypeError):
        Vocab([], specials="<pad>")

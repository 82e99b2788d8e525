"""The seeds' worked example, replayed step by step through fastattn's own functions.

    python examples/seed_walkthrough.py          (fastattn importable: installed, or
                                                  PYTHONPATH=<repo root> after build_ext --inplace)

The seed documents (shared/seeds/) are the course material fastattn was built from:
000 works the encoder by hand on a 3-sentence Game of Thrones corpus (vocabulary 23, d_model 6),
002 has a worked layer-norm table and the decoder's -inf causal mask. Their figures were lost, so
only the numbers that survive as text can be checked; every other number here is drawn from a
fixed seed (SEED) and said to be.

Each step prints fastattn's numbers next to the seed's through `compare`, which says "matches to
N decimals" or marks a mismatch; nothing passes silently. Three places where fastattn and the
seeds part ways on purpose are named where they occur:
  - 002's layer-norm table divides by the sample standard deviation (ddof=1); fastattn, the paper
    and PyTorch use the population variance. Both are shown; the ddof=1 table is reproduced
    through fastattn.ops.layer_norm with a gain of sqrt((n-1)/n) and eps scaled by (n-1)/n.
  - 002's masked-softmax table is illustrative, not an exact softmax of the scores it shows.
  - the seeds round what they print; comparisons use each table's own number of decimals, and
    the seeds' few slips (a layer-norm entry, the exponent in 000's formula column, a worked
    line from rounded statistics) are named where they occur.
Exit status 0 when every check holds, 1 otherwise.
"""
import sys

import numpy as np

from fastattn import nn, ops
from fastattn.nn import masks
from fastattn.tokenizers import WordTokenizer

# ---- constants transcribed from the seeds ------------------------------------------------------

# 000_c77065ddf9bd7102.txt, "Step 1. Defining Our Dataset": the corpus.
CORPUS_000 = [
    "I drink and I know things.",
    "When you play the game of thrones, you win or you die.",
    "The true enemy won't wait out the storm, He brings the storm.",
]
# 000, "Step 2. Finding Vocab Size": the 23 words, in the seed's order and spelling.
VOCAB_000 = ["I", "drink", "and", "Know", "things", "When", "you", "play", "the", "game", "of",
             "thrones", "win", "or", "die", "true", "enemy", "won't", "wait", "out", "storm",
             "He", "brings"]
# 000, "Step 4. Calculating Embedding": d_model 6 "for demonstration".
D_MODEL = 6
# 000, "Step 5. Calculating Positional Embedding", the table for "When" (POS 0, d 6):
# e1 is the word's embedding, p1 its positional encoding (sin, cos, sin, cos, sin, cos of 0).
WHEN_E1_000 = [0.79, 0.6, 0.96, 0.64, 0.97, 0.2]
WHEN_P1_000 = [0, 1, 0, 1, 0, 1]
# 000's input sentence is in a lost figure ("Input sentence for transformer"); we use the 7 words
# of 002's tables (002, "Multi-Head Attention" 7 x 7 and "Layer Normalization").
INPUT = "When you play the game of thrones"

# 002_31f23d2f318f9379.txt, "Layer Normalization", first table: x = input + sublayer output for
# the 7 words, features f0..f4 (the slide's "7 x 3" header is a leftover), then mean and std.
LN_X_002 = [[0.98, 1.28, 0.41, 0.27, 0.41],
            [0.52, 0.01, 2.06, 0.27, 0.33],
            [2.22, 0.27, 0.10, 0.41, 2.06],
            [0.99, 1.00, 0.11, 0.27, 0.33],
            [0.52, 0.01, 0.33, 2.06, 0.52],
            [0.10, 2.06, 0.73, 0.27, 0.41],
            [0.33, 0.01, 0.13, 0.27, 1.28]]
LN_MEAN_002 = [0.67, 0.64, 1.01, 0.54, 0.69, 0.71, 0.40]
LN_STD_002 = [0.44, 0.82, 1.04, 0.42, 0.79, 0.79, 0.51]
# 002, the worked line under that table: x_0 = (0.98 - 0.67) / sqrt(0.44^2 + 0.0001).
LN_EPS_002 = 0.0001
# 002, "Layer Normalization", second table: the normalized values.
LN_Y_002 = [[0.71, 1.40, -0.59, -0.92, -0.58],
            [-0.14, -0.77, 1.74, -0.45, -0.38],
            [1.16, -0.72, -0.88, -0.58, 1.01],
            [1.06, 1.09, -1.02, -0.64, -0.50],
            [-0.21, -0.85, -0.45, 1.73, -0.21],
            [-0.78, 1.71, 0.02, -0.56, -0.39],
            [-0.15, -0.78, -0.54, -0.27, 1.73]]
# The one entry of that table that no single formula gives: f2 and f4 of "When" are both 0.41,
# yet the seed prints -0.59 and -0.58 (ddof=1 gives -0.594996 for both).
LN_Y_002_KNOWN = {(0, 4): "same input as f2 (0.41), yet printed -0.58 beside f2's -0.59"}

# 002, "Masking": the sentence ("<start> | am no man <end>" in the text, the | is an I).
MASK_TOKENS_002 = ["<start>", "I", "am", "no", "man", "<end>"]
# 002, "Masking", first table: attention scores.
SCORES_002 = [[33.6, 7.6, 15.5, 3.8, 20.8, 22.3],
              [7.6, 34.0, 30.6, 8.3, 26.5, 27.2],
              [15.5, 30.6, 35.9, 3.8, 34.0, 34.8],
              [3.8, 8.3, 3.8, 34.8, 33.3, 33.6],
              [20.8, 26.5, 34.0, 33.3, 37.0, 35.9],
              [3.8, 5.7, 11.3, 15.1, 16.6, 37.4]]
NEG_INF = -np.inf
# 002, "Masking", second table: the additive mask (0 / -inf).
MASK_002 = [[0, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF],
            [0, 0, NEG_INF, NEG_INF, NEG_INF, NEG_INF],
            [0, 0, 0, NEG_INF, NEG_INF, NEG_INF],
            [0, 0, 0, 0, NEG_INF, NEG_INF],
            [0, 0, 0, 0, 0, NEG_INF],
            [0, 0, 0, 0, 0, 0]]
# 002, "Masking", third table: masked scores (= scores + mask).
MASKED_SCORES_002 = [[33.6, NEG_INF, NEG_INF, NEG_INF, NEG_INF, NEG_INF],
                     [7.6, 34.0, NEG_INF, NEG_INF, NEG_INF, NEG_INF],
                     [15.5, 30.6, 35.9, NEG_INF, NEG_INF, NEG_INF],
                     [3.8, 8.3, 3.8, 34.8, NEG_INF, NEG_INF],
                     [20.8, 26.5, 34.0, 33.3, 37.0, NEG_INF],
                     [3.8, 5.7, 11.3, 15.1, 16.6, 37.4]]
# 002, "Masked-Attention Filter": the softmax table (illustrative; see step 7).
MASKED_SOFTMAX_002 = [[1, 0, 0, 0, 0, 0],
                      [0.01, 0.99, 0, 0, 0, 0],
                      [0.001, 0.004, 0.995, 0, 0, 0],
                      [0.003, 0.004, 0.003, 0.99, 0, 0],
                      [0.003, 0.003, 0.04, 0.02, 0.93, 0],
                      [0.001, 0.001, 0.001, 0.001, 0.001, 0.995]]

# Not in the seeds (their figures are lost): every other weight is drawn from this seed.
SEED = 0
D_FF = 4 * D_MODEL          # the paper's ratio, 2048 / 512
EPS = 1e-5                  # fastattn's and torch's layer-norm default

# ---- the comparison helper ---------------------------------------------------------------------

def _marks():
    """(ok, bad) marks: check and cross where stdout can print them, else words."""
    try:
        "✓✗".encode(sys.stdout.encoding or "ascii")
        return "✓", "✗"
    except (UnicodeEncodeError, LookupError):
        return "ok", "X"


OK, BAD = _marks()
CHECKS = []                 # (name, passed) for every compare, in order


def _fmt(row, decimals):
    w = decimals + 5
    return " ".join(f"{'-inf':>{w}}" if v == -np.inf else f"{v:{w}.{decimals}f}" for v in row)


def compare(name, ours, seed, decimals, *, against="seed", known=None):
    """Print fastattn's values (`ours`) beside `seed`'s and check that ours round to them.

    decimals=N: an entry matches when |ours - seed| <= half a unit of the N-th decimal (ours
    rounds to what the seed printed), -inf meeting -inf. decimals=None: exact equality (also
    for strings). `known` maps an index to the reason the seed's entry is off: there ours may
    be up to one unit further (1.5 units in all) and the entry is printed with the reason,
    never silently. Records the result in CHECKS and returns True if everything matches.
    """
    ours_a, seed_a = np.asarray(ours), np.asarray(seed)
    known = known or {}
    print(f"  compare {name}  (fastattn | {against})")
    if ours_a.shape != seed_a.shape:
        print(f"    {BAD} MISMATCH: shapes {ours_a.shape} vs {seed_a.shape}")
        CHECKS.append((name, False))
        return False
    n_quirks = 0
    if seed_a.dtype.kind in "US":
        for i, (o, s) in enumerate(zip(ours_a.ravel(), seed_a.ravel())):
            print(f"    {i:3d}  {o:>10} | {s:<10} {OK if o == s else BAD + ' MISMATCH'}")
        ok = bool((ours_a == seed_a).all())
    else:
        o64, s64 = np.atleast_1d(ours_a.astype(np.float64)), np.atleast_1d(seed_a.astype(float))
        both_inf = np.isinf(o64) & np.isinf(s64) & (np.sign(o64) == np.sign(s64))
        with np.errstate(invalid="ignore"):
            diff = np.where(both_inf, 0.0, np.abs(o64 - s64))
        unit = 0.0 if decimals is None else 10.0 ** -decimals
        slack = 0.0 if decimals is None else 1e-6       # float32 rounding of the last digit
        good = diff <= 0.5 * unit + slack
        excused = np.zeros_like(good)
        for idx in known:
            excused[idx] = not good[idx] and diff[idx] <= 1.5 * unit + slack
        shown = 0 if decimals is None else decimals
        rows_o = o64.reshape(-1, o64.shape[-1])
        rows_s = s64.reshape(rows_o.shape)
        rows_g = (good | excused).reshape(rows_o.shape)
        rows_x = excused.reshape(rows_o.shape)
        for r in range(rows_o.shape[0]):
            mark = OK if rows_g[r].all() else f"{BAD} MISMATCH"
            if rows_g[r].all() and rows_x[r].any():
                mark = "~ known seed quirk, below"
            print(f"    {_fmt(rows_o[r], shown)} | {_fmt(rows_s[r], shown)}  {mark}")
        for idx, reason in known.items():
            state = "excused" if excused[idx] else ("matches" if good[idx] else "too far")
            print(f"    known seed quirk at {idx}: ours {o64[idx]:.{shown + 4}f}, seed "
                  f"{s64[idx]:.{shown}f}: {reason} ({state})")
        ok = bool((good | excused).all())
        n_quirks = int(excused.sum())
        if not ok:
            bad = np.argwhere(~(good | excused))
            print(f"    first mismatches at {[tuple(int(j) for j in b) for b in bad[:5]]}, "
                  f"max |diff| {np.max(diff[~(good | excused)]):.3g}")
    if not ok:
        verdict = "MISMATCH"
    elif decimals is None:
        verdict = "matches exactly"
    else:
        verdict = f"matches to {decimals} decimal{'s' if decimals != 1 else ''}"
        if n_quirks:
            verdict += f" but for {n_quirks} known seed quirk{'s' if n_quirks != 1 else ''}"
    print(f"    -> {verdict} {OK if ok else BAD}")
    CHECKS.append((name, ok))
    return ok


def heading(text):
    print()
    print(text)
    print("=" * len(text))


def note(text):
    for line in text.strip().splitlines():
        print(f"  {line.strip()}")


def _weights(rng, shape, low=-0.5, high=0.5):
    """A weight matrix in the seed's style (two decimals), float32."""
    return rng.uniform(low, high, shape).round(2).astype(np.float32)


# ---- the steps ---------------------------------------------------------------------------------

def step1_vocabulary():
    """000 Steps 1-3: the word vocabulary of the corpus and the ids of the input sentence."""
    heading("Step 1 - vocabulary (000 Steps 1-3)")
    tok = WordTokenizer(specials=()).train(CORPUS_000)      # no <pad>/<unk>: ids from 0
    cased = WordTokenizer(lowercase=False, specials=()).train(CORPUS_000)
    tokens = [tok.vocab.id_to_token(i) for i in range(len(tok.vocab))]
    note(f"""
        WordTokenizer(specials=()) on the 3 sentences: {len(tokens)} words (seed: 23).
        Both split on spaces, drop "." and "," and keep "won't" as one word; fastattn orders ids
        by first occurrence, which is the seed's listing order, so id = position in that list
        (the seed's numbered Step 3 figure is lost; ids start at 0, the embedding row).
        The seed counts "The" and "the" as one word, i.e. it folds case too, but keeps the
        spelling of a word's first occurrence ("I", "When", "He") and writes "Know" where the
        corpus has "know"; fastattn lowercases every word. A case-sensitive tokenizer
        (lowercase=False) finds {len(cased.vocab)}: "The" becomes a word of its own.
        """)
    compare("vocabulary vs the seed's list, lowercased", tokens, [w.lower() for w in VOCAB_000],
            None, against="seed, lowercased")
    ids = tok.encode(INPUT)
    note(f'input "{INPUT}" -> ids {list(ids)}')
    return tok, np.asarray(ids)


def step2_embeddings(tok, ids):
    """000 Step 4: embeddings of size 6, the seed's vector for "When", the others seeded."""
    heading("Step 2 - embeddings, d_model = 6 (000 Step 4)")
    rng = np.random.default_rng(SEED)
    V = len(tok.vocab)
    weight = rng.uniform(0.0, 1.0, (V, D_MODEL)).round(2).astype(np.float32)   # (V, C)
    when = tok.vocab.token_to_id("when")
    weight[when] = WHEN_E1_000
    emb = nn.Embedding(V, D_MODEL)
    emb.load_state_dict({"weight": weight})
    x = emb(ids)                                                               # (L, C)
    note(f"""
        Only the vector of "When" survives in the seed's text (000 Step 5 table, column e1);
        the other {V - 1} rows are uniform [0, 1) values to two decimals from
        numpy.random.default_rng({SEED}). They are loaded into fastattn.nn.Embedding({V}, 6)
        with load_state_dict and looked up for the input ids.
        """)
    for word, row in zip(INPUT.split(), x):
        print(f"    {word:>8}  {_fmt(row, 2)}")
    compare('embedding of "When" (000 Step 5, e1)', x[0], WHEN_E1_000, 2)
    return x


def step3_positional_encoding(x):
    """000 Steps 5-6: the sinusoidal table and its sum with the embeddings."""
    heading("Step 3 - positional encoding (000 Steps 5-6)")
    L = x.shape[0]
    pe = ops.positional_encoding(L, D_MODEL)                                   # (L, C)
    # The paper's formula, written out: features 2i and 2i+1 share the frequency 1/10000^(2i/d).
    pos = np.arange(L)[:, None]
    two_i = np.arange(D_MODEL)[None, :] // 2 * 2
    paper = np.where(np.arange(D_MODEL) % 2 == 0, np.sin(pos / 10000 ** (two_i / D_MODEL)),
                     np.cos(pos / 10000 ** (two_i / D_MODEL)))
    note(f"fastattn.ops.positional_encoding({L}, 6), one row per position:")
    for word, row in zip(INPUT.split(), pe):
        print(f"    {word:>8}  {_fmt(row, 4)}")
    compare('position 0 ("When", 000 Step 5, column p1)', pe[0], WHEN_P1_000, None)
    compare("the whole table vs the paper's formula (NumPy, float64)", pe, paper, 6,
            against="formula")
    # The seed's formula column writes the feature index k itself in the exponent
    # (cos(0/10000^(2*1/6)) for k = 1); at position 0 every such term is sin 0 or cos 0 anyway.
    k = np.arange(D_MODEL)[None, :]
    literal = np.where(k % 2 == 0, np.sin(pos / 10000 ** (2 * k / D_MODEL)),
                       np.cos(pos / 10000 ** (2 * k / D_MODEL)))
    note(f"""
        The seed's formula column puts the feature index itself in the exponent
        (cos(0/10000^(2*1/6)) for feature 1) where the paper pairs features 2i, 2i+1 on one
        frequency. At position 0, the only row the seed's text gives, both read 0 1 0 1 0 1;
        from position 1 on, read literally, they would differ by up to
        {np.abs(literal - paper).max():.3f}. fastattn follows the paper (and PyTorch's tutorial).
        The seed's rows for positions 1-6 are in a lost figure ("the calculated values are
        rounded").
        """)
    x_pe = x + pe
    note('000 Step 6 is titled "concatenating"; the paper\'s encoder adds the two (the sum '
         "stays 6 wide):")
    for word, row in zip(INPUT.split(), x_pe):
        print(f"    {word:>8}  {_fmt(row, 4)}")
    compare('"When" + position 0', x_pe[0], np.add(WHEN_E1_000, WHEN_P1_000), 2)
    return pe, x_pe


def step4_attention(x):
    """000 Step 7: one head of scaled dot-product attention, d = 6, Q/K/V/O weights seeded."""
    heading("Step 4 - one head of scaled dot-product attention (000 Step 7)")
    rng = np.random.default_rng(SEED + 1)
    w_q, w_k, w_v, w_o = (_weights(rng, (D_MODEL, D_MODEL)) for _ in range(4))  # (out, in)
    L = x.shape[0]
    q, k, v = (ops.linear(x, w) for w in (w_q, w_k, w_v))                       # (L, D)
    out4, weights4 = ops.attention(q.reshape(1, 1, L, D_MODEL), k.reshape(1, 1, L, D_MODEL),
                                   v.reshape(1, 1, L, D_MODEL), return_weights=True)
    head, weights = out4[0, 0], weights4[0, 0]                                  # (L, D), (L, L)
    out = ops.linear(head, w_o)                                                 # (L, C)
    scores = (q.astype(np.float64) @ k.T.astype(np.float64)) / np.sqrt(D_MODEL)  # (L, L)
    note(f"""
        The seed's W_Q, W_K, W_V are in lost figures; here they and the output projection W_O
        are uniform [-0.5, 0.5) to two decimals from numpy.random.default_rng({SEED + 1}), 6 x 6,
        no biases. Q = fastattn.ops.linear(x, W_Q) (x W_Q^T, torch's layout), likewise K, V;
        one head, so "concatenating the heads" is the head itself, then W_O.
        scores = Q K^T / sqrt(6):
        """)
    for word, row in zip(INPUT.split(), scores):
        print(f"    {word:>8}  {_fmt(row, 3)}")
    note("softmax weights, from fastattn.ops.attention(..., return_weights=True):")
    for word, row in zip(INPUT.split(), weights):
        print(f"    {word:>8}  {_fmt(row, 4)}")
    compare("weights vs fastattn.ops.softmax(scores)", weights, ops.softmax(scores), 6,
            against="ops.softmax")
    s = scores - scores.max(axis=1, keepdims=True)
    p = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
    compare("attention output (one head) vs softmax(QK^T/sqrt(d)) V in float64", head,
            p @ v.astype(np.float64), 5, against="formula")
    note("after W_O (the output of the attention block):")
    for word, row in zip(INPUT.split(), out):
        print(f"    {word:>8}  {_fmt(row, 4)}")
    return {"w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": w_o, "scores": scores,
            "weights": weights, "head": head, "out": out}


def layer_norm_ddof1(x, eps, *, residual=None):
    """The seeds' layer norm, (v - mean) / sqrt(var_ddof1 + eps), through fastattn.ops.layer_norm.

    With n features, var_ddof1 = var * n / (n - 1), so
      (v - mean) / sqrt(var * n/(n-1) + eps) = sqrt((n-1)/n) * (v - mean) / sqrt(var + eps (n-1)/n):
    the population layer norm with gain sqrt((n-1)/n) and eps scaled by (n-1)/n.
    """
    n = np.shape(x)[-1]
    gain = np.full(n, np.sqrt((n - 1) / n), np.float32)
    return ops.layer_norm(x, gain, np.zeros(n, np.float32), eps=eps * (n - 1) / n,
                          residual=residual)


def layer_norm_table_002():
    """002's worked layer-norm table: the seed's ddof=1 numbers and the population ones."""
    x = np.asarray(LN_X_002, np.float32)                                      # (7, 5)
    n = x.shape[1]
    ones, zeros = np.ones(n, np.float32), np.zeros(n, np.float32)
    pop, stats = ops.layer_norm_forward(x, ones, zeros, eps=LN_EPS_002)
    std_pop = np.sqrt(1.0 / stats["rstd"].astype(np.float64) ** 2 - LN_EPS_002)
    return {"x": x, "pop": pop, "ddof1": layer_norm_ddof1(x, LN_EPS_002),
            "mean": stats["mean"], "std_pop": std_pop, "std_ddof1": std_pop * np.sqrt(n / (n - 1))}


def step5_add_norm(x, attn_out):
    """000 Step 8 and 002's layer-norm table: LN(x + attention(x)), population vs ddof=1."""
    heading("Step 5 - add & norm (000 Step 8; 002 Layer Normalization)")
    C = x.shape[-1]
    ones, zeros = np.ones(C, np.float32), np.zeros(C, np.float32)
    y = ops.layer_norm(attn_out, ones, zeros, eps=EPS, residual=x)              # (L, C)
    y_ddof1 = layer_norm_ddof1(attn_out, EPS, residual=x)
    h = (x + attn_out).astype(np.float64)
    mu, var0, var1 = h.mean(1, keepdims=True), h.var(1, keepdims=True), h.var(1, ddof=1,
                                                                             keepdims=True)
    note(f"""
        fastattn.ops.layer_norm(attn, 1, 0, residual=x): the residual add is fused. fastattn, the
        paper and PyTorch divide by the population std (sum of squares / {C}); 002's table
        divides by the sample std (/ {C - 1}, ddof=1), which shrinks every value by
        sqrt({C - 1}/{C}) = {np.sqrt((C - 1) / C):.4f}. Population (what fastattn and torch give):
        """)
    for word, row in zip(INPUT.split(), y):
        print(f"    {word:>8}  {_fmt(row, 4)}")
    compare("population LN vs the formula in float64", y, (h - mu) / np.sqrt(var0 + EPS), 5,
            against="formula")
    compare("ddof=1 LN (gain sqrt(5/6), eps * 5/6) vs the ddof=1 formula", y_ddof1,
            (h - mu) / np.sqrt(var1 + EPS), 5, against="formula")
    print(f"    max |population - ddof=1| on this input: {np.abs(y - y_ddof1).max():.4f}")

    t = layer_norm_table_002()
    note(f"""

        002's worked table (7 words x 5 features, eps = {LN_EPS_002} as in its worked line).
        Its mean column is the plain mean; its std column is the sample std (ddof=1):
        """)
    compare("mean column (fastattn's saved mean)", t["mean"], LN_MEAN_002, 2)
    compare("std column = fastattn's population std * sqrt(5/4)", t["std_ddof1"], LN_STD_002, 2)
    print(f"    (population std: {_fmt(t['std_pop'], 3)})")
    compare("normalized table, ddof=1 through ops.layer_norm", t["ddof1"], LN_Y_002, 2,
            known=LN_Y_002_KNOWN)
    worked = (0.98 - LN_MEAN_002[0]) / np.sqrt(LN_STD_002[0] ** 2 + LN_EPS_002)
    note(f"""
        The worked line (0.98 - 0.67) / sqrt(0.44^2 + 0.0001) = {worked:.4f} uses the rounded
        mean and std and gives 0.70; the table's 0.71 comes from the unrounded ones
        ({float(t['ddof1'][0, 0]):.4f}).
        Population layer norm, what fastattn and torch compute on this table (not the seed's):
        """)
    for row in t["pop"]:
        print(f"    {_fmt(row, 2)}")
    print(f"    max |population - seed| = {np.abs(t['pop'] - np.asarray(LN_Y_002)).max():.2f} "
          "(the seed's ddof=1 quirk: each entry about sqrt(5/4) = 1.118 times the seed's)")
    return {"y": y, "y_ddof1": y_ddof1, "table": t}


def step6_ffn(y1, attn):
    """000 Steps 9-10: the ReLU feed-forward network and the second add & norm."""
    heading("Step 6 - feed-forward network and add & norm again (000 Steps 9-10)")
    rng = np.random.default_rng(SEED + 2)
    w1, b1 = _weights(rng, (D_FF, D_MODEL)), _weights(rng, D_FF)               # (F, C), (F)
    w2, b2 = _weights(rng, (D_MODEL, D_FF)), _weights(rng, D_MODEL)            # (C, F), (C)
    f = ops.ffn(y1, w1, b1, w2, b2, activation="relu")                          # (L, C)
    hidden = ops.linear(y1, w1, b1, activation="relu")                          # (L, F)
    f2 = ops.linear(hidden, w2, b2)
    note(f"""
        The seed's FFN weights are in lost figures; W1 ({D_FF} x 6), b1, W2 (6 x {D_FF}), b2 are
        uniform [-0.5, 0.5) to two decimals from numpy.random.default_rng({SEED + 2}); d_ff =
        4 * d_model as in the paper. FFN(x) = max(0, x W1^T + b1) W2^T + b2; ReLU zeroes
        {int((hidden == 0).sum())} of the {hidden.size} hidden values. fastattn.ops.ffn output:
        """)
    for word, row in zip(INPUT.split(), f):
        print(f"    {word:>8}  {_fmt(row, 4)}")
    compare("ops.ffn vs ops.linear(relu) then ops.linear", f, f2, 5, against="two linears")
    ref = np.maximum(y1.astype(np.float64) @ w1.T + b1, 0) @ w2.T + b2
    compare("ops.ffn vs the formula in float64", f, ref, 5, against="formula")
    C = D_MODEL
    ones, zeros = np.ones(C, np.float32), np.zeros(C, np.float32)
    y2 = ops.layer_norm(f, ones, zeros, eps=EPS, residual=y1)
    note("add & norm again, LN(y1 + FFN(y1)): the encoder layer's output")
    for word, row in zip(INPUT.split(), y2):
        print(f"    {word:>8}  {_fmt(row, 4)}")
    # The same layer as a module, with these weights: the walkthrough is what the model computes.
    layer = nn.TransformerEncoderLayer(D_MODEL, 1, dim_feedforward=D_FF, dropout=0.0)
    layer.load_state_dict({
        "self_attn.in_proj_weight": np.concatenate([attn["w_q"], attn["w_k"], attn["w_v"]]),
        "self_attn.in_proj_bias": np.zeros(3 * C, np.float32),
        "self_attn.out_proj.weight": attn["w_o"], "self_attn.out_proj.bias": zeros,
        "linear1.weight": w1, "linear1.bias": b1, "linear2.weight": w2, "linear2.bias": b2,
        "norm1.weight": ones, "norm1.bias": zeros, "norm2.weight": ones, "norm2.bias": zeros,
    })
    x_in = attn["x"][None]                                                      # (1, L, C)
    compare("steps 4-6 vs fastattn.nn.TransformerEncoderLayer(6, 1) with these weights",
            y2, layer(x_in)[0], 5, against="nn layer")
    return {"ffn": f, "y2": y2}


def step7_masked_decoder():
    """002 "Masking": the causal -inf mask, the masked scores and their softmax."""
    heading("Step 7 - masked decoder self-attention (002 Masking)")
    T = len(MASK_TOKENS_002)
    mask = nn.Transformer.generate_square_subsequent_mask(T)                   # (T, T)
    note(f"""
        "<start> I am no man <end>": a query may see itself and the words before it.
        fastattn.nn.Transformer.generate_square_subsequent_mask({T}) (torch's helper):
        """)
    compare("causal mask vs the seed's 0 / -inf table", mask, MASK_002, None)
    compare("nn.masks.generate_square_subsequent_mask is the same table",
            masks.generate_square_subsequent_mask(T), mask, None, against="nn.Transformer")
    scores = np.asarray(SCORES_002, np.float32)
    masked = scores + mask
    compare("scores + mask vs the seed's masked scores", masked, MASKED_SCORES_002, 1)
    w_softmax = ops.softmax(masked)
    # The same through the attention kernel: q = scores, k = v = identity, scale 1, so that
    # q k^T * scale is the seed's score table and the output is the weights themselves.
    eye = np.eye(T, dtype=np.float32)[None, None]
    out, w_attn = ops.attention(scores[None, None], eye, eye, causal=True, scale=1.0,
                                return_weights=True)
    s = masked.astype(np.float64)
    s = np.exp(s - s.max(axis=1, keepdims=True))
    exact = s / s.sum(axis=1, keepdims=True)
    compare("ops.softmax(scores + mask) vs softmax in float64", w_softmax, exact, 6,
            against="formula")
    # Float32 scores near 37 carry an absolute error of about eps32 * 37 = 4e-6 into the
    # kernel's exponentials (its SIMD paths differ there), hence 5 decimals for the kernel.
    compare("ops.attention(causal=True, return_weights=True) weights", w_attn[0, 0], w_softmax,
            5, against="ops.softmax")
    compare("ops.attention(causal=True) output (v = identity)", out[0, 0], w_softmax, 5,
            against="ops.softmax")
    note("""
        002's masked-softmax table is illustrative, not an exact softmax of the scores above,
        so it is shown, not checked to its decimals. Exact softmax (fastattn) | seed:
        """)
    seed_table = np.asarray(MASKED_SOFTMAX_002, np.float64)
    for tok, row_o, row_s in zip(MASK_TOKENS_002, w_softmax, seed_table):
        print(f"    {tok:>7}  {_fmt(row_o, 3)} | {_fmt(row_s, 3)}")
    print(f"    max |exact - seed| = {np.abs(w_softmax - seed_table).max():.3f}; e.g. row \"I\": "
          f"softmax(7.6, 34.0) = ({w_softmax[1, 0]:.1e}, {w_softmax[1, 1]:.6f}), the seed shows "
          "0.01, 0.99; row \"man\" sums to "
          f"{seed_table[4].sum():.3f} in the seed.")
    note("What the seed's table does get right, checked:")
    above = mask == -np.inf
    compare("weights other than exactly 0 above the diagonal (fastattn, seed)",
            [np.count_nonzero(w_softmax[above]), np.count_nonzero(seed_table[above])], [0, 0],
            None, against="expected")
    compare("the column of each row's largest weight (the diagonal)", w_softmax.argmax(axis=1),
            seed_table.argmax(axis=1), None)
    return {"mask": mask, "masked_scores": masked, "weights": w_softmax, "attention": w_attn}


def main():
    print("fastattn replays the seeds' worked example (shared/seeds/000 and 002)")
    tok, ids = step1_vocabulary()
    x = step2_embeddings(tok, ids)
    _, x_pe = step3_positional_encoding(x)
    attn = step4_attention(x_pe)
    attn["x"] = x_pe
    y1 = step5_add_norm(x_pe, attn["out"])["y"]
    step6_ffn(y1, attn)
    step7_masked_decoder()
    failed = [name for name, ok in CHECKS if not ok]
    heading("Summary")
    if failed:
        print(f"  {len(failed)} of {len(CHECKS)} checks MISMATCH {BAD}:")
        for name in failed:
            print(f"    {name}")
        return 1
    print(f"  all {len(CHECKS)} checks hold {OK} (seed numbers to the seed's decimals; the rest "
          "against the formulas and fastattn's own modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

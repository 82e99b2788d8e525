"""Pretrained-model cases: an OPUS-MT-shaped Marian directory run by ``fastattn.load_pretrained``
against CTranslate2 running the same directory through its own converter. Not run by default
(``fastattn bench --case marian_greedy_b8 ...``): they need torch and transformers (to make the
directory) and ctranslate2, and build the model first (seconds).

The model (MARIAN): transformers' MarianConfig with OPUS-MT's shape (opus-mt-en-de's
config.json: 6 + 6 layers, d_model 512, 8 heads, FFN 2048, swish, vocabulary 58,101 with
the pad 58100 as decoder start, eos 0 forced at the last position, embeddings scaled by
sqrt(d_model), sinusoidal positions); transformers 5's bare MarianConfig() is another shape
(12 + 12 layers, d_model 1024, gelu), so the shape is given in full. Random weights from
torch.manual_seed(SEED), sharpened (SHARPEN) so that the outputs depend on the source and end
at different lengths: q and k projections x3 (peakier attention), token table and output
projection x2 (logits std ~0.9 instead of ~0.45), the output projection untied from the token
table (a random post-norm model with the tied table repeats its previous token forever: the
token nearest its own input; untied, transformers 5 also unties the encoder's and decoder's
token tables from model.shared, so all three are given the same values, OPUS-MT's one shared
table), and final_logits_bias[eos] = 3. Saved with ``save_pretrained``
into a temporary directory made once per process and removed at exit (``marian_dir``).

fastattn: ``load_pretrained(dir)`` (float32) and ``load_pretrained(dir, compute_type="int8")``,
``Translator.generate`` under transformers' rules (fastattn.generate.hf).

CTranslate2: ``ctranslate2.converters.TransformersConverter(dir).convert(out, quantization=None
/ "int8")`` (``ct2_convert``; its Marian loader reads the model through transformers; the
tokenizer it would read is replaced by the vocabulary's strings, ``_VocabularyOnly``, so no
sentencepiece model is needed), ``ctranslate2.Translator(out, device="cpu", compute_type=...,
inter_threads=1, intra_threads=fastattn's thread count)``; ``translate_batch`` on the token
strings of the same source ids (read back from the vocabulary file the converter wrote; its
Marian loader drops the pad token, which is never generated on either side: transformers'
rules ban it), beam_size, max_decoding_length = max_new_tokens, min_decoding_length 0 (eos
allowed first, as transformers), length_penalty, return_end_token=True (eos kept in the
output, as transformers keeps it). What CTranslate2 cannot do: force eos at the last position
(transformers' forced_eos_token_id). Its rows that reach max_new_tokens without eos get eos
as their last token (``ct2_marian_generate``): that is the rule exactly for greedy (the last
step's token is overridden, the same work done); for beam search the forced step would also
rank the beams differently, so beam rows may differ there. Beam search also stops by
CTranslate2's own criterion (transformers: early_stopping=False).

Outputs: int64 (B, max_new_tokens), each row the generated ids up to and including eos, then
-1 (``padded``); tokens per call = the ids before the padding, counted alike on both sides
(``count_tokens``), so tokens/s = those tokens / the median time. The row notes the share of
rows whose fastattn output equals CTranslate2's (``agreement``: printed, not a target; the
two compute in other orders, and int8 quantizes differently). The target: fastattn's tokens/s
>= 1.3x CTranslate2's in each of the four rows.

The step breakdown (``marian_step_breakdown``): one decode step of R rows (R = 8: greedy B=8;
R = 32: beam 4 x 8) at position STEP_AT, against the output projection alone (the 58,101-row
generator, the very product the step plans: Linear._step_fn) and the search's own work per
step (greedy: pick the best token; beam: log-softmax and the 2k best continuations), float32
and int8 weights, all timed interleaved; the row's fastattn ms is the float32 R=8 step.
"""
import atexit
import contextlib
import functools
import json
import os
import shutil
import statistics
import tempfile

import numpy as np

from .. import get_num_threads
from .base import Case
from .report import fmt_ms
from .torch_models import Unavailable, require_torch

__all__ = ["MARIAN", "SHARPEN", "SEED", "PRETRAINED_GEN", "STEP_ROWS", "STEP_AT",
           "marian_dir", "ct2_convert", "ct2_vocabulary", "ct2_marian_translator",
           "ct2_marian_generate", "padded", "count_tokens", "marian_generate_case",
           "StepBreakdownCase", "run_step_breakdown", "PRETRAINED_CASES", "PRETRAINED_TARGETS"]

# opus-mt-en-de's config.json (the shape; ids as OPUS-MT has them)
MARIAN = dict(vocab_size=58101, decoder_vocab_size=58101, d_model=512, encoder_layers=6,
              decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
              encoder_ffn_dim=2048, decoder_ffn_dim=2048, activation_function="swish",
              scale_embedding=True, max_position_embeddings=512, pad_token_id=58100,
              eos_token_id=0, decoder_start_token_id=58100, forced_eos_token_id=0,
              share_encoder_decoder_embeddings=True, tie_word_embeddings=False)
SHARPEN = dict(qk=3.0, embeddings=2.0, eos_bias=3.0)   # see the module docstring
SEED = 0
PRETRAINED_GEN = dict(B=8, src_len=24, new_tokens=32, beam_size=4, length_penalty=1.0)
GEN_REPEATS = {"fastattn": 7, "ctranslate2": 7}    # calls of 0.1 to 2 s
STEP_ROWS = (8, 32)          # greedy B=8; beam 4 x 8
STEP_AT = 16                 # the position the timed step writes (half of new_tokens)
STEP_ROUNDS = 15

_dirs = []                   # temporary directories of this process, removed at exit


@atexit.register
def _remove_dirs():
    while _dirs:
        shutil.rmtree(_dirs.pop(), ignore_errors=True)


def _require_transformers():
    require_torch()
    try:
        import transformers
    except ImportError:
        raise Unavailable("transformers is not installed (pip install transformers)") from None
    return transformers


@contextlib.contextmanager
def _quiet(transformers):
    """transformers' progress bars off (saving, loading), as they were afterwards."""
    log = transformers.utils.logging
    was = log.is_progress_bar_enabled()
    log.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            log.enable_progress_bar()


def _key(config):
    return tuple(sorted((config or MARIAN).items()))


@functools.lru_cache(maxsize=None)
def _marian_dir(key, sharpen, seed):
    transformers = _require_transformers()
    torch = require_torch()
    cfg = dict(key)
    sh = dict(sharpen)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.MarianMTModel(transformers.MarianConfig(**cfg)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(sh["qk"])
            elif name in ("model.shared.weight", "lm_head.weight"):
                p.mul_(sh["embeddings"])
        model.final_logits_bias[0, cfg["eos_token_id"]] = sh["eos_bias"]
        # untied, transformers 5 gives the encoder and the decoder token tables of their own
        # beside model.shared; OPUS-MT's one table: all three hold the same values
        for table in (model.model.encoder.embed_tokens, model.model.decoder.embed_tokens):
            if table.weight.data_ptr() != model.model.shared.weight.data_ptr():
                table.weight.copy_(model.model.shared.weight)
    path = tempfile.mkdtemp(prefix="fastattn-marian-")
    _dirs.append(path)
    with _quiet(transformers):
        model.save_pretrained(path)
    return path


def marian_dir(config=None, *, sharpen=None, seed=SEED):
    """A transformers Marian directory (config.json, generation_config.json,
    model.safetensors) of `config` (MarianConfig keyword arguments; None: MARIAN) with seeded
    random weights, made once per process (a temporary directory removed at exit).

    Args:
        config: MarianConfig keyword arguments; None (the default) for MARIAN.
        sharpen: the weights' sharpening; None (the default) for SHARPEN.
        seed: the weights' seed (default 0).

    Returns:
        The directory's path.

    Raises:
        Unavailable: without torch or transformers.
    """
    return _marian_dir(_key(config), tuple(sorted((sharpen or SHARPEN).items())), seed)


class _VocabularyOnly:
    """What CTranslate2's Marian loader reads of a tokenizer: the vocabulary (eos "</s>", unk
    "<unk>" at 1, pad "<pad>", every other id i as "t{i}") and the eos / unk tokens."""

    eos_token, unk_token, pad_token = "</s>", "<unk>", "<pad>"

    def __init__(self, config):
        names = {config["eos_token_id"]: self.eos_token, 1: self.unk_token,
                 config["pad_token_id"]: self.pad_token}
        self._vocab = {names.get(i, f"t{i}"): i for i in range(config["vocab_size"])}

    def get_vocab(self):
        return dict(self._vocab)


@functools.lru_cache(maxsize=None)
def _ct2_convert(path, quantization):
    from .ct2_models import require_ctranslate2
    require_ctranslate2()
    transformers = _require_transformers()
    from ctranslate2.converters import TransformersConverter

    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)

    class Converter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _VocabularyOnly(config)

    out = tempfile.mkdtemp(prefix=f"fastattn-ct2-marian-{quantization or 'float32'}-")
    _dirs.append(out)
    with _quiet(transformers):
        Converter(path).convert(out, quantization=quantization, force=True)
    return out


def ct2_convert(path, quantization=None):
    """A Marian directory converted by CTranslate2's TransformersConverter.

    Made once per (path, quantization) and process, removed at exit.

    Args:
        path: the Marian directory.
        quantization: None (the default: float32 weights as stored) or "int8".

    Returns:
        The output directory.
    """
    return _ct2_convert(os.fspath(path), quantization)


@functools.lru_cache(maxsize=None)
def ct2_vocabulary(ct2_dir):
    """The target vocabulary the converter wrote in ct2_dir: a list, token string by id
    (shared_vocabulary.json / .txt, else target_vocabulary.*).

    Args:
        ct2_dir: the converted directory.

    Returns:
        The list of token strings.
    """
    for name in ("shared_vocabulary", "target_vocabulary"):
        p = os.path.join(ct2_dir, name)
        if os.path.exists(p + ".json"):
            with open(p + ".json", encoding="utf-8") as f:
                return tuple(json.load(f))
        if os.path.exists(p + ".txt"):
            with open(p + ".txt", encoding="utf-8") as f:
                return tuple(line.rstrip("\n") for line in f)
    raise FileNotFoundError(f"{ct2_dir}: no vocabulary file CTranslate2 wrote")


def ct2_marian_translator(ct2_dir, compute_type, *, intra_threads=None):
    """ctranslate2.Translator(ct2_dir, device="cpu", compute_type, inter_threads=1,
    intra_threads=fastattn's thread count (capped at OMP_THREAD_LIMIT, see ct2_models)),
    cached with ct2_models' translators, so the runner's release_translators drops it.

    Args:
        ct2_dir: the converted directory.
        compute_type: CTranslate2's compute type.
        intra_threads: None (the default) for fastattn's thread count.

    Returns:
        The ctranslate2.Translator.
    """
    from . import ct2_models
    ct2 = ct2_models.require_ctranslate2()
    intra = ct2_models._openmp_cap(get_num_threads() if intra_threads is None
                                   else int(intra_threads))
    key = (ct2_dir, compute_type, 1, intra)
    cached = ct2_models._translators.get(key)
    if cached is not None:
        return cached[1]
    tr = ct2.Translator(ct2_dir, device="cpu", compute_type=compute_type, inter_threads=1,
                        intra_threads=intra)
    ct2_models._translators[key] = (ct2_dir, tr)
    return tr


def padded(rows, width):
    """Token lists as one array, each row's ids then -1.

    Args:
        rows: the token lists.
        width: the array's width.

    Returns:
        int64 (len(rows), width).
    """
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"row {i} holds {len(r)} tokens, more than {width}")
        out[i, :len(r)] = r
    return out


def count_tokens(out):
    """The tokens generated in one call's output: the ids before the padding, eos included.

    Args:
        out: an array in `padded`'s layout.

    Returns:
        The count, an int.
    """
    return int((np.asarray(out) >= 0).sum())


def ct2_marian_generate(translator, vocabulary, src_ids, *, pad_id, eos_id, beam_size,
                        max_new_tokens, length_penalty=1.0):
    """CTranslate2's search over the token strings of src_ids (B, S) (pad ids dropped) ->
    padded(rows, max_new_tokens): its tokens up to and including eos, a row that reaches
    max_new_tokens without eos ending with eos instead of its last token (transformers'
    forced eos; see the module docstring).

    Args:
        translator: a ct2_marian_translator.
        vocabulary: ct2_vocabulary's list.
        src_ids: (B, S) source ids.
        pad_id: the padding id (dropped from the sources).
        eos_id: the end-of-sequence id.
        beam_size: the beams (1: greedy).
        max_new_tokens: the most tokens per row.
        length_penalty: beam search's length exponent (default 1.0).

    Returns:
        int64 (B, max_new_tokens), as `padded` lays it out.
    """
    index = {t: i for i, t in enumerate(vocabulary)}
    source = [[vocabulary[i] for i in row if i != pad_id] for row in np.asarray(src_ids).tolist()]
    results = translator.translate_batch(
        source, max_batch_size=len(source), beam_size=beam_size, num_hypotheses=1,
        length_penalty=length_penalty, max_decoding_length=max_new_tokens,
        min_decoding_length=0, return_end_token=True, max_input_length=0)
    rows = []
    for r in results:
        ids = [index[t] for t in r.hypotheses[0]]
        if len(ids) == max_new_tokens and ids[-1] != eos_id:
            ids[-1] = eos_id
        rows.append(ids)
    return padded(rows, max_new_tokens)


# ---- the generation cases ------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _translator(path, compute_type):
    from ..pretrained import load_pretrained
    return load_pretrained(path, compute_type=None if compute_type == "float32" else
                           compute_type)


def _sources(B, S, config):
    cfg = config or MARIAN
    eos, pad = cfg["eos_token_id"], cfg["pad_token_id"]

    def build(rng):
        # S - 1 ids then eos, as the tokenizer ends a source; no eos (0), unk (1) or pad
        # inside
        words = rng.integers(2, pad, size=(B, S - 1))
        return {"src": np.concatenate([words, np.full((B, 1), eos)], axis=1)}
    return build


def marian_generate_case(name, method, compute_type="float32", *, config=None, B=None,
                         src_len=None, new_tokens=None, beam_size=None, repeats=None):
    """Greedy (beam_size 1) or beam search over B sources of src_len ids: fastattn's
    Translator.generate vs CTranslate2's translate_batch on the converted directory, the same
    weights (float32, or each side's own int8 quantization of them). The defaults are
    PRETRAINED_GEN.

    Args:
        name: the case's name.
        method: "greedy" or "beam".
        compute_type: "float32" (the default) or "int8".
        config: MarianConfig arguments; None (the default) for MARIAN.
        B: the sources (None: PRETRAINED_GEN's).
        src_len: the source length (None: PRETRAINED_GEN's).
        new_tokens: the tokens generated (None: PRETRAINED_GEN's).
        beam_size: the beams (None: PRETRAINED_GEN's).
        repeats: {implementation: most timed calls} (None, the default: GEN_REPEATS).

    Returns:
        The `Case`.
    """
    g = PRETRAINED_GEN
    B, S = B or g["B"], src_len or g["src_len"]
    n, lp = new_tokens or g["new_tokens"], g["length_penalty"]
    k = 1 if method == "greedy" else beam_size or g["beam_size"]
    cfg = config or MARIAN

    def fast(i):
        tr = _translator(marian_dir(config), compute_type)
        return lambda: padded(tr.generate(i["src"], beam_size=k, max_new_tokens=n,
                                          length_penalty=lp, early_stopping=False), n)

    def ct2(i):
        from .ct2_models import require_ctranslate2
        require_ctranslate2()                 # before the model is made
        out = ct2_convert(marian_dir(config), None if compute_type == "float32" else
                          compute_type)
        tr, vocab = ct2_marian_translator(out, compute_type), ct2_vocabulary(out)
        return lambda: ct2_marian_generate(tr, vocab, i["src"], pad_id=cfg["pad_token_id"],
                                           eos_id=cfg["eos_token_id"], beam_size=k,
                                           max_new_tokens=n, length_penalty=lp)

    what = "greedy" if k == 1 else f"beam {k}"
    shape = (f"{cfg['encoder_layers']}+{cfg['decoder_layers']} layers, d {cfg['d_model']}, "
             f"V {cfg['vocab_size']:,}")
    weights = "" if compute_type == "float32" else f", {compute_type} weights (each side's own)"
    case = Case(name, f"Marian OPUS-MT shape ({shape}) load_pretrained generate {what} B={B} "
                      f"S={S} +<={n} tokens{weights}", _sources(B, S, config),
                {"fastattn": fast, "ctranslate2": ct2}, slow=(),
                repeats=repeats or GEN_REPEATS, warm=False, tokens=B * n,
                exact=("fastattn",))
    case.count_tokens = count_tokens      # tokens per call: counted on each side's output
    case.agreement = True                 # the share of rows equal to fastattn's, noted
    return case


# ---- the decode step's breakdown ------------------------------------------------------------

class StepBreakdownCase(Case):
    """One decode step against its output projection and the search's work (see the module
    docstring), for compute_types x rows; run by run_step_breakdown (kind "breakdown").

    Args:
        name: the case's name (default "marian_step_breakdown").
        config: MarianConfig arguments; None (the default) for MARIAN.
        rows: the decoding rows measured (default (8, 32)).
        compute_types: the compute types measured (default ("float32", "int8")).
        at: the position the step is measured at (default 16).
        rounds: interleaved rounds (default 15).
    """

    def __init__(self, name="marian_step_breakdown", *, config=None, rows=STEP_ROWS,
                 compute_types=("float32", "int8"), at=STEP_AT, rounds=STEP_ROUNDS):
        cfg = config or MARIAN
        self.config, self.rows, self.compute_types = config, tuple(rows), tuple(compute_types)
        self.at, self.rounds = at, rounds
        B = min(self.rows)
        super().__init__(name, f"Marian decode step breakdown: output projection "
                               f"({cfg['vocab_size']:,} x {cfg['d_model']}) and search vs "
                               f"the step, rows {'/'.join(map(str, self.rows))} at position "
                               f"{at} (ms per step)",
                         _sources(B, PRETRAINED_GEN["src_len"], config), {"fastattn": None},
                         kind="breakdown", slow=(), warm=False)

    def functions(self, compute_type, R):
        """The timed functions of one configuration.

        Args:
            compute_type: the model's compute type.
            R: the decoding rows.

        Returns:
            {"step", "projection", "search"}: zero-argument callables for R rows.
        """
        from ..generate import hf
        tr = _translator(marian_dir(self.config), compute_type)
        m, a = tr.model, tr.arch
        src = self.inputs()["src"]
        beams = R // src.shape[0]
        cache = m.init_cache(src, beams=beams, max_len=self.at + 1)
        tokens = np.arange(R, dtype=np.int64) + 2
        for _ in range(self.at):                        # positions 0 .. at - 1 written
            m.step(tokens, cache)
        logits = m.step(tokens, cache)                  # the step at position `at`

        def step():
            cache.t = self.at                           # the same position each call
            return m.step(tokens, cache)

        hidden = np.random.default_rng(0).standard_normal((R, m.emb_size), dtype=np.float32)
        project = m.generator._step_fn(R)               # the product the step's plan runs
        out = np.empty((R, m.tgt_vocab_size), np.float32)
        rules = hf.Rules(self.at + 2, a.eos_id, {a.pad_id})
        if beams == 1:
            search = functools.partial(hf.greedy_pick, logits, rules, self.at + 1)
        else:
            scores = np.zeros((src.shape[0], beams))
            search = functools.partial(hf.beam_candidates, logits, scores, rules, self.at + 1,
                                       beams)
        return {"step": step, "projection": lambda: project(hidden, out), "search": search}

    def weight_bytes(self, compute_type):
        """The bytes of the output projection's weight (the generator's), as stored.

        Args:
            compute_type: the model's compute type.

        Returns:
            The bytes, an int.
        """
        tr = _translator(marian_dir(self.config), compute_type)
        return tr.model.generator.weight.nbytes


def run_step_breakdown(case, row):
    """Fill `row` (runner.empty_row) with the breakdown's medians: row["breakdown"] =
    {"<compute_type> R=<rows>": {step_ms, projection_ms, search_ms, projection_share,
    projection_gbps}}, one note each, and a memory copy on the row's threads timed among them
    (copy_gbps: the projection's weight reads are read against it); fastattn_times_ms = the
    first configuration's steps.

    Args:
        case: the `StepBreakdownCase`.
        row: the row to fill.
    """
    from . import timing
    fns, names = {}, []
    try:
        for ct in case.compute_types:
            for R in case.rows:
                label = f"{ct} R={R}"
                names.append(label)
                for part, fn in case.functions(ct, R).items():
                    fns[(label, part)] = fn
    except Unavailable as exc:
        row["fastattn_status"] = f"n/a: {exc}"
        return row
    copy, copy_bytes = timing.memory_copy(threads=row["threads"])
    fns["copy"] = copy
    try:
        for fn in fns.values():
            fn()                                        # weights packed, pages touched
        times = timing.time_interleaved(fns, dict.fromkeys(fns, case.rounds),
                                        dict.fromkeys(fns, timing.WARM_SECONDS))
    finally:
        copy.close()
    row["copy_gbps"] = copy_gbps = copy_bytes / (statistics.median(times.pop("copy")) * 1e9)
    row["breakdown"] = {}
    for label in names:
        med = {part: statistics.median(times[(label, part)]) * 1e3
               for part in ("step", "projection", "search")}
        ct = label.split()[0]
        gbps = case.weight_bytes(ct) / (med["projection"] * 1e6)
        share = med["projection"] / med["step"]
        row["breakdown"][label] = {"step_ms": med["step"], "projection_ms": med["projection"],
                                   "search_ms": med["search"], "projection_share": share,
                                   "projection_gbps": gbps}
        R = int(label.split("=")[1])
        search = "greedy pick" if R == min(case.rows) else "beam log-softmax + top-2k"
        row["notes"].append(f"{label}: step {fmt_ms(med['step'])} ms, output projection "
                            f"{fmt_ms(med['projection'])} ms = {100 * share:.0f}% "
                            f"({gbps:.1f} GB/s of weights), {search} "
                            f"{fmt_ms(med['search'])} ms")
    row["fastattn_times_ms"] = [t * 1e3 for t in times[(names[0], "step")]]
    row["notes"].append(f"{row['threads']}-thread memory copy {copy_gbps:.1f} GB/s; "
                        f"{case.rounds} interleaved rounds")
    return row


PRETRAINED_CASES = (
    marian_generate_case("marian_greedy_b8", "greedy"),
    marian_generate_case("marian_beam_b8", "beam"),
    marian_generate_case("marian_greedy_b8_int8", "greedy", "int8"),
    marian_generate_case("marian_beam_b8_int8", "beam", "int8"),
    StepBreakdownCase(),
)


# ---- targets (registered in targets.py) -------------------------------------------------------

def _tokens_ratio(case):
    def measure(rows):
        r = next((r for r in rows if r["case"] == case), None)
        if r is None:
            return None, "not run"
        v = r.get("tokens_per_s_ratio_vs_ctranslate2")
        if v is None:
            why = r["ctranslate2_status"] if r["ctranslate2_status"] != "ok" else \
                r["fastattn_status"]
            return None, f"not measured ({why})"
        return v, (f"{v:.2f}x ctranslate2 (fastattn {fmt_ms(r['fastattn_tokens_per_s'])} "
                   f"tokens/s, ctranslate2 {fmt_ms(r['ctranslate2_tokens_per_s'])} tokens/s, "
                   f"{r['threads']} threads)")
    return measure


PRETRAINED_TARGETS = tuple(
    (name, "tokens/s >= 1.3x ctranslate2", _tokens_ratio(name), lambda v: v >= 1.3)
    for name in ("marian_greedy_b8", "marian_beam_b8", "marian_greedy_b8_int8",
                 "marian_beam_b8_int8"))

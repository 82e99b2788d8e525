"""Pictures of a training run and of a model's attention, as PNG files (matplotlib: the
``demo`` extra, ``pip install "fastattn[demo]"``).

    plot_history(records, path)                        loss per step, validation loss, exact
                                                       match, lr
    plot_attention(weights, query_tokens, key_tokens, path, title=None)
                                                       one heatmap panel per head
    plot_model_attention(model, src_tok, tgt_tok, source_text, target_text=None, *, out_dir)
                                                       every layer's attention for one pair

The attention pictures are the seeds' "attention filter" (encoder self-attention, cross-
attention) and "masked-attention filter" (the decoder's causal self-attention): rows are
queries, columns keys, each row a distribution over the keys (values in [0, 1]).

matplotlib is imported on first use, never at ``import fastattn``. Figures are drawn with
``matplotlib.figure.Figure`` on an Agg canvas: no pyplot, no global backend switch, no window,
safe from threads and from headless machines.
"""
import json
import math
import os
from pathlib import Path

import numpy as np

__all__ = ["plot_history", "plot_attention", "plot_model_attention", "ema", "smoothing_factor"]

_DPI = 100


def _figure(width, height):
    """A new Figure (width x height inches) on its own Agg canvas."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError('fastattn.plots needs matplotlib, an optional dependency: '
                          'pip install "fastattn[demo]"') from e
    fig = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=_DPI)
    return path


# ---- training history --------------------------------------------------------------------------

def _read_records(records):
    """records: an iterable of dicts, or the path of a JSON-lines file (one dict per line)."""
    if isinstance(records, (str, os.PathLike)):
        from .tokenizers.files import unique_keys

        out = []
        with open(records, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(f"plot_history: {records}, line {n}: not UTF-8 text (byte "
                                     f"{raw[e.start:e.start + 1]!r} at column {e.start + 1})") \
                        from None
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line, object_pairs_hook=unique_keys)
                except json.JSONDecodeError as e:
                    raise ValueError(f"plot_history: {records}, line {n}: not JSON ({e.msg})") \
                        from None
                except ValueError as e:          # a key given twice (unique_keys)
                    raise ValueError(f"plot_history: {records}, line {n}: {e}") from None
                except RecursionError:
                    raise ValueError(f"plot_history: {records}, line {n}: nested too deeply") \
                        from None
                if not isinstance(rec, dict):
                    raise ValueError(f"plot_history: {records}, line {n}: expected a JSON "
                                     f"object, got {type(rec).__name__}")
                out.append(rec)
        return out
    if isinstance(records, dict) or not hasattr(records, "__iter__"):
        raise TypeError(f"plot_history: records must be an iterable of dicts or the path of a "
                        f".jsonl file, got {type(records).__name__}")
    out = list(records)
    for i, rec in enumerate(out):
        if not isinstance(rec, dict):
            raise TypeError(f"plot_history: records[{i}] must be a dict, got "
                            f"{type(rec).__name__}")
    return out


def _series(records, key):
    """(steps, values) float arrays of the records that hold `key`, in step order."""
    rows = []
    for i, rec in enumerate(records):
        if rec.get(key) is None:
            continue
        if "step" not in rec:
            raise ValueError(f"plot_history: records[{i}] has {key!r} but no 'step': {rec}")
        rows.append((float(rec["step"]), float(rec[key])))
    rows.sort(key=lambda r: r[0])
    return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])


def smoothing_factor(n):
    """The EMA factor plot_history uses for n training points: 1 - 4 / sqrt(n) within
    [0.6, 0.98] (0.6, TensorBoard's default, up to 100 points; 0.87 for a thousand, 0.96 for
    ten thousand): long runs average over more steps, so batches of mixed difficulty do not
    hide the trend, while a short run's fast early drop is not smeared out.

    Args:
        n: the number of training points.

    Returns:
        The factor, a float in [0.6, 0.98].
    """
    return float(min(0.98, max(0.6, 1.0 - 4.0 / np.sqrt(max(n, 1)))))


def ema(values, factor):
    """TensorBoard's smoothing of a series: an exponential moving average, debiased.

    `s_t = factor s_(t-1) + (1 - factor) v_t` from s_0 = 0, divided by `1 - factor ** t` (the
    debiasing that keeps the first points on the data). NaN and inf points are skipped (the
    line carries the last value over them).

    Args:
        values: a 1-D sequence of numbers.
        factor: the smoothing factor in [0, 1).

    Returns:
        A float64 array of len(values).
    """
    v = np.asarray(values, dtype=np.float64)
    out = np.empty_like(v)
    acc, weight = 0.0, 0.0
    for i, x in enumerate(v):
        if np.isfinite(x):
            acc = factor * acc + (1.0 - factor) * x
            weight = factor * weight + (1.0 - factor)
        out[i] = acc / weight if weight > 0 else np.nan
    return out


def plot_history(records, path, *, smoothing=None):
    """Write the training curves of `records` to the PNG `path` (a directory: loss.png in it).

    records: training records {"step", "loss", "lr", ...} and evaluation records {"step",
    "valid_loss", "valid_ppl", ...}, as an iterable of dicts or the path of a JSON-lines
    history (one dict per line). Top panel, as TensorBoard and W&B draw it: the training
    loss per step faint, its EMA on top (``ema``; factor ``smoothing``, default
    ``smoothing_factor(steps)``, named in the legend), the validation loss at its steps (if
    any) as points and, on a right-hand axis, the held-out exact match (``valid_exact``, a
    fraction, drawn in %) where the evaluations have one; bottom panel: the learning rate
    (when the records have one). Other keys are ignored. Returns the Path written. No record
    with a loss or valid_loss: ValueError; smoothing outside [0, 1): ValueError.

    Args:
        records: the History's records (an iterable of dicts) or the path of a JSON-lines
            history.
        path: the PNG to write, or a directory (loss.png in it).
        smoothing: the EMA factor in [0, 1); None (the default) for `smoothing_factor(steps)`.

    Returns:
        The Path written.

    Raises:
        ValueError: no record with a loss or valid_loss, or smoothing outside [0, 1).
    """
    if smoothing is not None and not (isinstance(smoothing, (int, float)) and
                                      not isinstance(smoothing, bool) and 0 <= smoothing < 1):
        raise ValueError(f"plot_history: smoothing must be a number in [0, 1), got "
                         f"{smoothing!r}")
    recs = _read_records(records)
    steps, loss = _series(recs, "loss")
    vsteps, vloss = _series(recs, "valid_loss")
    lsteps, lr = _series(recs, "lr")
    esteps, exact = _series(recs, "valid_exact")
    if not len(steps) and not len(vsteps):
        raise ValueError(f"plot_history: records hold no 'loss' or 'valid_loss' to plot "
                         f"({len(recs)} records)")
    path = Path(path)
    if path.is_dir():
        path = path / "loss.png"
    fig = _figure(8, 6 if len(lr) else 4.5)
    if len(lr):
        ax, ax_lr = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": (3, 1)})
    else:
        ax, ax_lr = fig.subplots(1, 1), None
    if len(steps):
        factor = smoothing_factor(len(steps)) if smoothing is None else float(smoothing)
        ax.plot(steps, loss, lw=0.8, color="tab:blue", alpha=0.25, label="training loss")
        ax.plot(steps, ema(loss, factor), lw=1.8, color="tab:blue",
                label=f"training loss, EMA {factor:.2f}")
    if len(vsteps):
        ax.plot(vsteps, vloss, "o-", lw=1.5, ms=4, color="tab:orange", label="validation loss")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if len(esteps):
        ax_ex = ax.twinx()
        ax_ex.plot(esteps, 100.0 * exact, "s--", lw=1.2, ms=4, color="tab:purple",
                   label="held-out exact match (greedy)")
        ax_ex.set_ylabel("exact match %")
        ax_ex.set_ylim(-2, 102)
        h2, l2 = ax_ex.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="best")
    ax.set_title("training history")
    if ax_lr is not None:
        ax_lr.plot(lsteps, lr, lw=1.2, color="tab:green")
        ax_lr.set_ylabel("lr")
        ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        ax_lr.grid(True, alpha=0.3)
        ax_lr.set_xlabel("step")
    else:
        ax.set_xlabel("step")
    return _save(fig, path)


# ---- attention ---------------------------------------------------------------------------------

def _labels(name, tokens, n, shape):
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"plot_attention: {name} has {len(tokens)} labels but weights "
                         f"{shape} need {n}")
    return [t.replace("$", r"\$") for t in tokens]          # "$" would start mathtext


def plot_attention(weights, query_tokens, key_tokens, path, title=None, *, cmap="viridis"):
    """Write one PNG of attention weights (H, Lq, Lk): one heatmap panel per head, rows the
    queries, columns the keys, labelled with query_tokens (Lq) and key_tokens (Lk), colours
    from 0 to 1 with a colorbar.

    ValueError (naming the argument and the shapes): weights not 3-D, no head or no position,
    a label count that differs from the weights', non-finite weights.

    Args:
        weights: (H, Lq, Lk) attention weights.
        query_tokens: Lq labels for the rows.
        key_tokens: Lk labels for the columns.
        path: the PNG to write.
        title: the figure's title, or None (the default).
        cmap: a matplotlib colormap name (default "viridis").

    Returns:
        The Path written.

    Raises:
        ValueError: as above.
    """
    w = np.asarray(weights, dtype=np.float32)
    if w.ndim != 3:
        raise ValueError(f"plot_attention: weights must be (H, Lq, Lk), got shape {w.shape} "
                         f"(take one batch row of a (B, H, Lq, Lk) array)")
    H, Lq, Lk = w.shape
    if 0 in w.shape:
        raise ValueError(f"plot_attention: weights {w.shape} have nothing to draw")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"plot_attention: weights {w.shape} hold non-finite values")
    qlab = _labels("query_tokens", query_tokens, Lq, w.shape)
    klab = _labels("key_tokens", key_tokens, Lk, w.shape)

    ncols = min(H, 4)
    nrows = math.ceil(H / ncols)
    cell = 0.32                                    # inches per token
    pw, ph = max(2.5, 1.0 + cell * Lk), max(2.0, 1.0 + cell * Lq)
    fig = _figure(ncols * pw + 1.2, nrows * ph + (0.8 if title else 0.3))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    fs = 8 if max(Lq, Lk) <= 24 else 6
    for h, ax in enumerate(axes):
        if h >= H:
            ax.set_axis_off()
            continue
        im = ax.imshow(w[h], vmin=0.0, vmax=1.0, cmap=cmap, aspect="auto",
                       interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xticks(range(Lk))
        ax.set_xticklabels(klab, rotation=90, fontsize=fs)
        ax.set_yticks(range(Lq))
        ax.set_yticklabels(qlab, fontsize=fs)
        ax.set_xlabel("keys", fontsize=8)
        if h % ncols == 0:
            ax.set_ylabel("queries", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="attention weight")
    return _save(fig, path)


def _encode(tok, text):
    """(ids, labels) of `text`, wrapped in <start> ... <end> when the tokenizer has both (as
    Seq2SeqTransformer.translate encodes); labels are the tokenizer's token strings."""
    wrap = tok.start_id is not None and tok.end_id is not None
    ids = tok.encode(text, add_start_end=wrap)
    labels = list(tok.tokenize(text))
    if wrap:
        labels = [tok.vocab.id_to_token(ids[0])] + labels + [tok.vocab.id_to_token(ids[-1])]
    if len(labels) != len(ids):                     # a tokenizer whose ids are not its tokens
        labels = [tok.vocab.id_to_token(i) for i in ids]
    return ids, labels


def plot_model_attention(model, src_tokenizer, tgt_tokenizer, source_text, target_text=None,
                         *, out_dir, **translate_kwargs):
    """Write the attention of every layer of a Seq2SeqTransformer (in eval mode) for one
    (source, target) pair into out_dir (created if needed): encoder_layer{i}.png (encoder
    self-attention), decoder_self_layer{i}.png (the decoder's masked self-attention),
    cross_layer{i}.png (decoder queries over the source), i from 0 as in the state_dict keys;
    all heads as panels.

    The texts are encoded as ``model.translate`` encodes them (<start> ... <end> when the
    tokenizer has both); labels are the tokenizer's tokens. target_text defaults to the
    model's own completion, ``model.translate([source_text], ...)`` (greedy unless
    translate_kwargs say otherwise); the decoder reads the whole target, <end> included.

    Args:
        model: a `Seq2SeqTransformer` in eval mode.
        src_tokenizer: encodes the source.
        tgt_tokenizer: encodes the target.
        source_text: the source, a str.
        target_text: the target, a str; None (the default) for the model's own completion.
        out_dir: the directory to write into (created if needed).
        **translate_kwargs: passed to `model.translate` when target_text is None.

    Returns:
        The list of Paths written, in the order above.
    """
    if not isinstance(source_text, str):
        raise TypeError(f"plot_model_attention: source_text must be a str, got "
                        f"{type(source_text).__name__}")
    if target_text is None:
        target_text = model.translate([source_text], src_tokenizer, tgt_tokenizer,
                                      **translate_kwargs)[0]
    elif not isinstance(target_text, str):
        raise TypeError(f"plot_model_attention: target_text must be a str or None, got "
                        f"{type(target_text).__name__}")
    src_ids, src_lab = _encode(src_tokenizer, source_text)
    tgt_ids, tgt_lab = _encode(tgt_tokenizer, target_text)
    if not src_ids or not tgt_ids:
        raise ValueError(f"plot_model_attention: nothing to attend: the source encodes to "
                         f"{len(src_ids)} ids and the target to {len(tgt_ids)}")
    weights = model.attention_weights(np.array([src_ids], np.int64),
                                      np.array([tgt_ids], np.int64))
    out_dir = Path(out_dir)
    kinds = (("encoder", "encoder_layer{}.png", "encoder self-attention", src_lab, src_lab),
             ("decoder", "decoder_self_layer{}.png", "decoder masked self-attention",
              tgt_lab, tgt_lab),
             ("cross", "cross_layer{}.png", "cross-attention (target over source)", tgt_lab,
              src_lab))
    paths = []
    for kind, name, what, qlab, klab in kinds:
        for i, w in enumerate(weights[kind]):
            paths.append(plot_attention(w[0], qlab, klab, out_dir / name.format(i),
                                        title=f"{what}, layer {i}"))
    return paths

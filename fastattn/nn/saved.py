"""What a training forward keeps for its backward: one record per kind of module.

Every module that trains has ``_forward_train(...) -> (out, saved)`` and ``_backward(grad,
saved, ...) -> grad_in``: the record is handed from the forward to the backward by the caller
(the layer above, or the public call, which keeps the last one in ``module._saved`` for
``module.backward``). The arrays are views of the modules' training buffers (Buffers: reused
from step to step, never allocated in a warmed-up step), valid until the same module's next
training forward; a forward is differentiated once.

Letters: N rows (B*L), C d_model, K a product's input features, M its outputs, F d_ff, H heads,
D head dim, Lq/Lk query/key lengths.
"""

__all__ = ["LinearSaved", "NormSaved", "AttentionSaved", "FFNSaved", "SublayerSaved",
           "LayerSaved", "StackSaved", "EmbeddingSaved", "PositionsSaved", "Seq2SeqSaved",
           "TransformerSaved", "PublicSaved"]


class _Record:
    __slots__ = ()

    def __init__(self, *values):
        for name, value in zip(self.__slots__, values):
            setattr(self, name, value)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(self.__slots__)})"


class LinearSaved(_Record):
    """Linear: y = act(x @ W.T + b).

    Args:
        *values: the attributes below, in their order.

    Attributes:
        x: (N, K) the input, left unchanged by the caller until backward.
        pre: (N, M) x @ W.T + b before the activation; None without one.
        activation: its name, or None.
    """
    __slots__ = ("x",           # (N, K) the input, left unchanged by the caller until backward
                 "pre",         # (N, M) x @ W.T + b before the activation; None without one
                 "activation")  # its name, or None


class NormSaved(_Record):
    """LayerNorm of s = x + residual (or of x).

    Args:
        *values: the attributes below, in their order.

    Attributes:
        s: (N, C) what was normalised.
        mean: (N,).
        rstd: (N,) 1 / sqrt(var + eps).
    """
    __slots__ = ("s",           # (N, C) what was normalised
                 "mean",        # (N,)
                 "rstd")        # (N,) 1 / sqrt(var + eps)


class AttentionSaved(_Record):
    """MultiheadAttention: the projections, the attention, out_proj.

    Args:
        *values: the attributes below, in their order.

    Attributes:
        inputs: [(x (N_i, K_i), part)]: each input and its in_proj rows.
        kept: [(y (N_i', n*C), part)]: the projections' q, k, v as the ops keep them (keep_heads:
            float32, or bf16 bits in bf16 training), extra keys of add_bias_kv / add_zero_attn
            included.
        out: (B, H, Lq, D) the attention's output (view of out_proj's x).
        lse: (B, H, Lq) log-sum-exp of each query's scores.
        mask: masks.Mask.
        seed: the attention dropout's seed, or None.
        out_proj: LinearSaved.
    """
    __slots__ = ("inputs",      # [(x (N_i, K_i), part)]: each input and its in_proj rows
                 "kept",        # [(y (N_i', n*C), part)]: the projections' q, k, v as the
                                # ops keep them (keep_heads: float32, or bf16 bits in bf16
                                # training), extra keys of add_bias_kv / add_zero_attn in
                 "out",         # (B, H, Lq, D) the attention's output (view of out_proj's x)
                 "lse",         # (B, H, Lq) log-sum-exp of each query's scores
                 "mask",        # masks.Mask
                 "seed",        # the attention dropout's seed, or None
                 "out_proj")    # LinearSaved


class FFNSaved(_Record):
    """The fused FFN: linear2(dropout(act(linear1(h)))).

    Args:
        *values: the attributes below, in their order.

    Attributes:
        h: (N, C) the input.
        pre: (N, F) linear1's output before the activation.
        seed: the hidden dropout's seed, or None.
    """
    __slots__ = ("h",           # (N, C) the input
                 "pre",         # (N, F) linear1's output before the activation
                 "seed")        # the hidden dropout's seed, or None


class SublayerSaved(_Record):
    """One residual block: post-LN norm(x + drop(f(x))), pre-LN x + drop(f(norm(x))).

    Args:
        *values: the attributes below, in their order.

    Attributes:
        seed: the dropout on f's output: its seed, or None.
        norm: NormSaved.
        f: the sublayer's own record (AttentionSaved or FFNSaved).
    """
    __slots__ = ("seed",        # the dropout on f's output: its seed, or None
                 "norm",        # NormSaved
                 "f")           # the sublayer's own record (AttentionSaved or FFNSaved)


class LayerSaved(_Record):
    """An encoder layer (2 blocks) or a decoder layer (3 blocks), in order.

    Args:
        *values: the attributes below, in their order.

    Attributes:
        blocks: [SublayerSaved].
    """
    __slots__ = ("blocks",)     # [SublayerSaved]


class StackSaved(_Record):
    """TransformerEncoder / TransformerDecoder.

    Args:
        *values: the attributes below, in their order.

    Attributes:
        layers: [LayerSaved], in order.
        norm: NormSaved of the final norm, or None.
    """
    __slots__ = ("layers",      # [LayerSaved], in order
                 "norm")        # NormSaved of the final norm, or None


class EmbeddingSaved(_Record):
    """A Seq2SeqTransformer's token embedding + positions + dropout.

    Args:
        *values: the attributes below, in their order.

    Attributes:
        ids: (N,) int64 the token ids (a buffer).
        seed: the dropout's seed, or None.
        norm: NormSaved of the embedding layer norm, or None.
        offset: the first position (0 in a training pass).
        length: L, positions per sequence.
    """
    __slots__ = ("ids",         # (N,) int64 the token ids (a buffer)
                 "seed",        # the dropout's seed, or None
                 "norm",        # NormSaved of the embedding layer norm, or None
                 "offset",      # the first position (0 in a training pass)
                 "length")      # L, positions per sequence


class PositionsSaved(_Record):
    """PositionalEncoding's dropout.

    Args:
        *values: the attributes below, in their order.

    Attributes:
        seed: the dropout's seed, or None.
        shape: (B, L, C).
    """
    __slots__ = ("seed",        # the dropout's seed, or None
                 "shape")       # (B, L, C)


class Seq2SeqSaved(_Record):
    """Seq2SeqTransformer: both embeddings, the stacks, the generator.

    Args:
        *values: the attributes below, in their order.

    Attributes:
        memory_shape: (B, S, C).
        tgt_shape: (B, T, C).
        src: EmbeddingSaved.
        tgt: EmbeddingSaved.
        encoder: StackSaved.
        decoder: StackSaved.
        generator: LinearSaved.
    """
    __slots__ = ("memory_shape",  # (B, S, C)
                 "tgt_shape",     # (B, T, C)
                 "src",           # EmbeddingSaved
                 "tgt",           # EmbeddingSaved
                 "encoder",       # StackSaved
                 "decoder",       # StackSaved
                 "generator")     # LinearSaved


class TransformerSaved(_Record):
    """nn.Transformer: its stacks (None for a custom part, which keeps its own).

    Args:
        *values: the attributes below, in their order.

    Attributes:
        src_shape: (B, S, C).
        tgt_shape: (B, T, C).
        memory_shape: (B, S, C).
        encoder: StackSaved, or None.
        decoder: StackSaved, or None.
    """
    __slots__ = ("src_shape", "tgt_shape", "memory_shape",   # (B, S|T, C)
                 "encoder",       # StackSaved, or None
                 "decoder")       # StackSaved, or None


class PublicSaved(_Record):
    """What a public training call (module(...) in train mode) keeps for module.backward.

    Args:
        *values: the attributes below, in their order.

    Attributes:
        record: the module's own record.
        shapes: the inputs' batch-first shapes.
        layout: module.Layout of the call (torch's layouts), or None.
    """
    __slots__ = ("record",      # the module's own record
                 "shapes",      # the inputs' batch-first shapes
                 "layout")      # module.Layout of the call (torch's layouts), or None

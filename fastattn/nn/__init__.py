"""torch.nn-shaped Transformer modules over the kernels (batch-first inside).

Names, constructor arguments, forward arguments, defaults and state_dict keys follow torch.nn,
so a model trained there loads here as it is (see ``Module.load_state_dict``). Parameters are
NumPy float32 arrays held in attributes named exactly as torch's state_dict keys. One default
differs: ``batch_first`` is True here (torch's is False); ``batch_first=False`` and unbatched
(L, C) inputs are taken as torch takes them and converted at the public calls.

torch's other options are followed too: ``activation`` as torch's callables (``F.relu``,
``F.gelu``, ``nn.ReLU()``, ``nn.GELU(approximate=...)``, recognised by name; see
``activations``) or a plain function over NumPy (inference only, unfused);
MultiheadAttention's ``kdim`` / ``vdim``, ``add_bias_kv``, ``add_zero_attn``;
Transformer's ``custom_encoder`` / ``custom_decoder``; TransformerEncoder's
``enable_nested_tensor`` / ``mask_check`` (accepted, no effect: no nested tensors here).

Every module takes ``backend="fast"`` (the C kernels, buffers reused across layers) or
``backend="reference"`` (the NumPy twin, written the way a prototype would be); both give the
same outputs. The backend is one op table per module (``backends``); the model code is one.

Training: ``model.train()`` makes forwards apply dropout (where torch applies it) and keep what
``module.backward(grad_output)`` needs; backward accumulates parameter gradients
(``named_grads()``, ``zero_grad()``) and returns the input gradients. Each layer's forward,
backward and decode step sit together in its module.

Masks use torch's conventions (``masks``). A query with no allowed key gives zeros where torch
gives NaN. ``is_causal`` / ``tgt_is_causal`` are hints, as in torch: a mask given is followed;
without one (where torch raises) the causal rule is applied.

Decoding goes through the layers: a decoder layer, a decoder stack and a Seq2SeqTransformer
each have ``init_cache(...)`` and ``step(...)``, one position at a time over a cache whose
layout they own, computed by the same block as their forward.

Attention weights: ``Transformer.attention_weights(src, tgt, ...)`` and
``Seq2SeqTransformer.attention_weights(src_ids, tgt_ids, ...)`` take the forward's arguments and
return every layer's weights, {"encoder": [(B, H, S, S)], "decoder": [(B, H, T, T)], "cross":
[(B, H, T, S)]}, from an inference pass through the same layers that records them (eval mode
only); the ordinary forward keeps its fused attention and never stores a weight.

The package's modules:

- `module`: Module: parameters, state_dict, backends, derived (packed) weights;
- `parameter`: Parameter, a float32 array that counts its writes (what keeps derived weights
  and decode plans from going stale);
- `saved`: the records a training forward keeps for its backward, one per module kind;
- `backends`: the op tables (fast, reference) and the activation workspace;
- `activations`: torch's activation argument -> a fused name, or the unfused math;
- `masks`: torch-convention masks -> the kernels' form, for forward and decoding alike;
- `layers`: Linear, Embedding, LayerNorm, PositionalEncoding, TokenEmbedding;
- `attention`: MultiheadAttention and its key/value caches;
- `transformer`: encoder/decoder layers and stacks, Transformer, the decoder caches;
- `seq2seq`: Seq2SeqTransformer (the translation tutorial's model).

Dimension letters: B batch, S source length, T target length, L either, C d_model, H heads,
D head dim (C / H), F dim_feedforward, V vocabulary, R decoding rows (sources x beams).
"""
from .attention import MultiheadAttention
from .backends import BACKENDS
from .layers import Embedding, LayerNorm, Linear, PositionalEncoding, TokenEmbedding
from .masks import generate_square_subsequent_mask
from .module import Module
from .parameter import Parameter
from .seq2seq import Seq2SeqTransformer
from .transformer import (DecoderCache, Transformer, TransformerDecoder, TransformerDecoderLayer,
                          TransformerEncoder, TransformerEncoderLayer)

__all__ = [
    "Module", "Linear", "Embedding", "LayerNorm", "PositionalEncoding", "MultiheadAttention",
    "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
    "TransformerDecoder", "Transformer", "Seq2SeqTransformer", "TokenEmbedding",
    "DecoderCache", "generate_square_subsequent_mask", "BACKENDS", "Parameter",
]

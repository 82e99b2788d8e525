"""Training for fastattn.nn models: fit, data, batching, checkpoints, progress.

```python
from fastattn.train import fit, read_pairs, load_checkpoint
history = fit(model, read_pairs("train.tsv"), src_tokenizer=tok, tgt_tokenizer=tok,
              max_steps=10_000, checkpoint_dir="ckpt", checkpoint_every=1000)
history.to_jsonl("history.jsonl")
fit(model, pairs, src_tokenizer=tok, tgt_tokenizer=tok, max_steps=20_000,
    checkpoint_dir="ckpt", resume=True)          # continues exactly where it stopped
```

One module per concern: ``data`` (read_pairs, chatterbot_pairs), ``batching`` (token-budget
batches), ``fit`` (the loop), ``history`` (History), ``checkpoint`` (atomic checkpoints,
load_checkpoint), ``progress`` (tqdm bar or JSON lines). The optional packages (tqdm for the
bar, PyYAML and chatterbot-corpus for .yml data; ``pip install "fastattn[demo]"``) are
imported only where they are used, so this package imports without them.
"""
from .batching import collate, epoch_batches, padding_fraction
from .checkpoint import (Checkpoint, latest_checkpoint, list_checkpoints, load_checkpoint,
                         save_checkpoint)
from .data import Pairs, chatterbot_pairs, read_pairs
from .fit import fit
from .history import History

__all__ = ["fit", "History", "read_pairs", "chatterbot_pairs", "Pairs", "load_checkpoint",
           "save_checkpoint", "latest_checkpoint", "list_checkpoints", "Checkpoint",
           "epoch_batches", "padding_fraction", "collate"]

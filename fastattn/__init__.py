"""fastattn: fast CPU Transformer kernels (C + OpenMP) with a NumPy twin of every op.

The most used ops are here at the top level (they are `fastattn.ops`'s), with the thread
controls and the build facts. The two op modules share names, signatures and results:

```python
from fastattn import ops as F        # the kernels
from fastattn import reference as F  # the same functions in plain NumPy
```
"""
from . import _runtime
from ._runtime import build_info, get_num_threads, set_num_threads

_runtime.init()

from . import ops, reference  # noqa: E402
from .ops import attention, ffn, layer_norm, linear, positional_encoding, softmax  # noqa: E402
from . import io, nn, optim, tokenizers  # noqa: E402
from .pretrained import load_pretrained  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "attention", "softmax", "layer_norm", "linear", "ffn", "positional_encoding",
    "set_num_threads", "get_num_threads", "build_info", "ops", "reference", "nn", "io",
    "optim", "tokenizers", "load_pretrained", "__version__",
]

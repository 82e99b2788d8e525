"""Parameter: a float32 array that counts the writes made to it (torch's ``tensor._version``).

A module keeps what it derives from a weight (packed panels for few-row products, a decode
plan) only as long as the weight is unchanged. NumPy arrays do not say when they are written,
so every parameter is a Parameter: an ``np.ndarray`` subclass whose writes bump its version
(shared with every view of it) and a process-wide count of parameter writes. What derives from
a weight records the version it was made from and is remade when the version moved; a decode
plan compares the process-wide count first (one integer per step) and looks closer only when
it moved.

Writes that are counted: item and slice assignment (``p[...] = x``, on p or on any view of
it), in-place arithmetic and every ufunc with ``out=`` a parameter (``p *= 3``,
``np.add(p, 1, out=p)``), ``np.copyto``/``np.put``/``np.place``/``np.putmask``/
``np.fill_diagonal`` into it, and the methods ``fill``, ``sort``, ``put``, ``partition``,
``itemset``. fastattn's own writers (load_state_dict, the optimisers) bump the versions
themselves. Parameters over one memory share one count: a view of a parameter, and a
Parameter made over a plain view of one (``Parameter(np.asarray(p))``, as assigning
``np.asarray(p)`` to a module's parameter does), so a write through any of them counts for
all. What cannot be seen: a write through a plain ndarray view (``np.asarray(p)``,
``p.view(np.ndarray)``), a buffer (memoryview, ctypes) or another library's C code; after
one, call ``model.invalidate_caches()``.

Everything else behaves as an ndarray: results of arithmetic on parameters are plain arrays.
"""
import weakref

import numpy as np

__all__ = ["Parameter", "writes", "note_write"]

_WRITES = [0]          # parameter writes in this process (any parameter)
# id(the array owning a parameter's memory) -> the write counter of the parameters over it;
# an entry lives as long as a parameter holds the counter (and so the owner: no id reuse)
_BY_OWNER = weakref.WeakValueDictionary()

# NumPy functions that write into their first argument
_WRITERS = frozenset(f for f in (np.copyto, np.put, np.place, np.putmask, np.fill_diagonal,
                                 getattr(np, "put_along_axis", None)) if f is not None)


def writes():
    """The number of parameter writes in this process so far (compared by decode plans)."""
    return _WRITES[0]


def note_write():
    """Count a change no Parameter saw itself (a parameter rebound or converted)."""
    _WRITES[0] += 1


def _plain(a):
    return a.view(np.ndarray) if isinstance(a, Parameter) else a


def _plain_all(seq):
    return tuple(_plain_all(a) if isinstance(a, (tuple, list)) else _plain(a) for a in seq)


class _Version:
    __slots__ = ("n", "__weakref__")     # (weakly keyed by what is derived from a parameter)

    def __init__(self):
        self.n = 0


class Parameter(np.ndarray):
    """A parameter array (see the module docstring); `version` counts its writes.

    Args:
        value: an array (any real dtype), made a float32 C-contiguous Parameter (a Parameter
            that already is one is returned as it is).
    """

    def __new__(cls, value):
        if isinstance(value, Parameter) and value.dtype == np.float32 and \
                value.flags.c_contiguous and value.flags.aligned:
            return value
        return np.ascontiguousarray(_plain(value), dtype=np.float32).view(cls)

    def __array_finalize__(self, obj):
        # a view of a parameter shares its version; so does a Parameter made over a plain
        # view of a parameter's memory (np.asarray(p): NumPy gives it the memory's owner as
        # base, not p), found through the owner; a new array has its own
        if self.base is None:
            self._box = _Version()
            return
        box = getattr(obj, "_box", None)
        if box is None:
            owner = self.base
            while isinstance(owner, np.ndarray) and owner.base is not None:
                owner = owner.base
            box = getattr(owner, "_box", None) or _BY_OWNER.get(id(owner))
            if box is None:
                box = _BY_OWNER[id(owner)] = _Version()
        self._box = box

    @property
    def version(self):
        """The number of writes to this parameter (and its views) so far."""
        return self._box.n

    @property
    def version_box(self):
        """The write counter this parameter shares with its views (what derived copies key
        on: one for a parameter and all its slices)."""
        return self._box

    def _touch(self):
        self._box.n += 1
        _WRITES[0] += 1

    def __setstate__(self, state):
        np.ndarray.__setstate__(self, state)
        self._box = _Version()

    def __deepcopy__(self, memo):
        return Parameter(np.array(self.view(np.ndarray), copy=True))

    def __copy__(self):
        return Parameter(self.view(np.ndarray).copy())

    # -- writes ----------------------------------------------------------------------------------
    def __setitem__(self, key, value):
        np.ndarray.__setitem__(self, key, value)
        self._touch()

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        written = [a for a in (out or ()) if isinstance(a, Parameter)]
        if out is not None:
            kwargs["out"] = _plain_all(out)
        result = getattr(ufunc, method)(*_plain_all(inputs), **kwargs)
        if method == "at" and isinstance(inputs[0], Parameter):
            written.append(inputs[0])
        for p in written:
            p._touch()
        if written and out is not None:        # in-place operators return the array itself
            if isinstance(result, tuple):
                return tuple(o if isinstance(o, Parameter) else r for o, r in zip(out, result))
            return out[0] if isinstance(out[0], Parameter) else result
        return result

    def __array_function__(self, func, types, args, kwargs):
        result = func(*_plain_all(args), **{k: _plain_all(v) if isinstance(v, (tuple, list))
                                            else _plain(v) for k, v in kwargs.items()})
        if func in _WRITERS and args and isinstance(args[0], Parameter):
            args[0]._touch()
        out = kwargs.get("out")
        if isinstance(out, Parameter):
            out._touch()
            return out
        return result

    def __array_wrap__(self, arr, context=None, return_scalar=False):
        if return_scalar and arr.ndim == 0:
            return arr[()]
        return arr.view(np.ndarray) if isinstance(arr, Parameter) else arr

    def _method_write(name):
        base = getattr(np.ndarray, name)

        def method(self, *args, **kwargs):
            result = base(self, *args, **kwargs)
            self._touch()
            return result
        method.__name__ = name
        method.__doc__ = base.__doc__
        return method

    fill = _method_write("fill")
    sort = _method_write("sort")
    put = _method_write("put")
    partition = _method_write("partition")
    if hasattr(np.ndarray, "itemset"):
        itemset = _method_write("itemset")
    del _method_write

    def __repr__(self):
        return "Parameter(" + repr(self.view(np.ndarray))[len("array("):]

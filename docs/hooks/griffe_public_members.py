"""A Griffe extension for the API reference, so a class page shows its documented API only.

- Members whose names start with an underscore (private helpers, and dunders such as
  ``__call__`` or ``__repr__``) are dropped from the tree the pages are rendered from (marking
  them non-public would not reach the names a package re-exports, which are aliases). The
  constructor stays: it is documented through the class (``merge_init_into_class``).
- Attributes of a class without a docstring of their own (dataclass fields, attributes set in
  ``__init__``) are left out: the class docstring's ``Attributes:`` section documents them.
- A class attribute's value is the code that sets it (``check_positive('embed_dim', ...)``),
  not something a reader needs, so it is not shown. Module constants keep their values.
- A method that overrides a documented one without a docstring of its own shows the
  overridden method's docstring, as ``inspect.getdoc`` and ``help()`` do.

A module's public names stay its ``__all__`` (the ``public`` filter).
"""
import griffe


class PublicClassMembers(griffe.Extension):
    """Drop a class's underscore-named and undocumented attribute members."""

    def on_class(self, *, cls, **kwargs):
        for name, member in list(cls.members.items()):
            if member.is_alias or name == "__init__":
                continue
            if name.startswith("_") or (member.is_attribute and not member.docstring):
                cls.del_member(name)
            elif member.is_attribute:
                member.value = None
            elif member.is_function and not member.docstring:
                inherited = self._inherited_docstring(cls, name)
                if inherited is not None:
                    member.docstring = griffe.Docstring(
                        inherited.value, parser=inherited.parser,
                        parser_options=inherited.parser_options, parent=member)

    @staticmethod
    def _inherited_docstring(cls, name):
        try:
            bases = cls.mro()
        except Exception:            # an unresolved base: nothing to inherit from
            return None
        for base in bases:
            member = base.members.get(name)
            if member is not None and not member.is_alias and member.docstring:
                return member.docstring
        return None

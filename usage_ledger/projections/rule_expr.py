"""A rule written once as a small expression: rendered as SQL for the bulk rebuild, run in Python by the fold.

An expression reads named values (`value("ttft_s")`). `sql(**names)` renders it with each name replaced by
the SQL expression given for it (the name itself when none is given); `python(*names)` makes it a Python
function of those values that follows SQL's NULL rules, so both forms give the same answer for the same values:

- arithmetic and comparisons with a None (NULL) operand give None;
- `all_of` is SQL's three-valued AND (false if any part is false, else NULL if any is NULL);
- `case` takes the first branch whose condition is true (not NULL), else its `otherwise` (NULL by default);
- `coalesce` gives the first value that is not None.

Division is Python's true division: divide only by a float value (an integer SQL division truncates), and
guard a zero divisor with a condition (SQLite gives NULL, PostgreSQL an error, Python raises).
The Python function is generated once as source, with each operator inline, and compiled (as `dataclasses`
builds an `__init__`): a helper call per operator made the fold's catch-up 11 % slower, an interpreter
walking the tree per call 18 % (docs/BENCHMARKS.md). The source repeats an operand where it tests it for None (`x if x is not None else
…`); operands are pure, so that costs only time, and the rules are shallow. A `case` condition compiles to
a plain Python test that holds exactly where SQL's value is true. tests/projections/test_rule_expr.py holds
each function to what SQLite and PostgreSQL compute for its `sql`.
Only what the calls read model's rules use is here (`call_rules`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ("Expr", "all_of", "case", "coalesce", "differs", "value")


class Expr:
    """One node of a rule's expression; the operators `> >= < <= + - * /` build larger ones."""

    def sql(self, **names: str) -> str:
        """The expression as SQL, each value named in `names` replaced by its SQL expression."""
        return self._sql(names)

    def python(self, *names: str) -> Callable[..., Any]:
        """The expression as a Python function of the values `names` (every one it reads), in that order."""
        if set(names) != self._names():
            raise ValueError(f"the expression reads {sorted(self._names())}, not {sorted(names)}")
        source = f"lambda {', '.join(names)}: {self._python()}"
        function: Callable[..., Any] = eval(source, dict(_HELPERS))  # source built from the nodes, never from input
        return function

    def _sql(self, names: Mapping[str, str]) -> str:
        raise NotImplementedError

    def _python(self) -> str:
        """The expression as Python source over its values' names and `_HELPERS`."""
        raise NotImplementedError

    def _names(self) -> set[str]:
        raise NotImplementedError

    def _truth(self) -> str:
        """Python source that is True exactly where the expression is SQL's true (not false, not NULL): a
        `case` condition, which takes its branch only then."""
        return f"({self._python()} is True)"

    def __gt__(self, other: Expr | int | float) -> Expr:
        return _Binary(">", self, _expr(other))

    def __ge__(self, other: Expr | int | float) -> Expr:
        return _Binary(">=", self, _expr(other))

    def __lt__(self, other: Expr | int | float) -> Expr:
        return _Binary("<", self, _expr(other))

    def __le__(self, other: Expr | int | float) -> Expr:
        return _Binary("<=", self, _expr(other))

    def __add__(self, other: Expr | int | float) -> Expr:
        return _Binary("+", self, _expr(other))

    def __sub__(self, other: Expr | int | float) -> Expr:
        return _Binary("-", self, _expr(other))

    def __mul__(self, other: Expr | int | float) -> Expr:
        return _Binary("*", self, _expr(other))

    def __truediv__(self, other: Expr | int | float) -> Expr:
        return _Binary("/", self, _expr(other))


def value(name: str) -> Expr:
    """The value named `name` (an identifier): a SQL column or expression, a Python argument."""
    if not name.isidentifier():
        raise ValueError(f"a value's name is an identifier, not {name!r}")
    return _Value(name)


def differs(left: Expr, right: Expr | int | float | str) -> Expr:
    """SQL's `<>` (`!=` in Python; not an operator here, so that `==` keeps its meaning)."""
    return _Binary("<>", left, _expr(right))


def all_of(*conditions: Expr) -> Expr:
    """SQL's AND of `conditions`."""
    return _AllOf(conditions)


def case(*branches: tuple[Expr, Expr | int | float | str], otherwise: Expr | int | float | str | None = None) -> Expr:
    """SQL's `CASE WHEN condition THEN result … [ELSE otherwise] END`; each condition a comparison or `all_of`."""
    return _Case(tuple((condition, _expr(result)) for condition, result in branches), _expr(otherwise))


def coalesce(*values: Expr) -> Expr:
    """SQL's COALESCE: the first of `values` that is not NULL."""
    return _Coalesce(values)


def _expr(operand: Expr | int | float | str | None) -> Expr:
    return operand if isinstance(operand, Expr) else _Literal(operand)


def _all_of(*results: bool | None) -> bool | None:
    if False in results:
        return False
    return None if None in results else True


_HELPERS: dict[str, Any] = {"__builtins__": {}, "_all_of": _all_of}
"""What the generated Python reads besides its arguments."""


class _Value(Expr):
    def __init__(self, name: str) -> None:
        self.name = name

    def _sql(self, names: Mapping[str, str]) -> str:
        return names.get(self.name, self.name)

    def _python(self) -> str:
        return self.name

    def _names(self) -> set[str]:
        return {self.name}


class _Literal(Expr):
    def __init__(self, literal: int | float | str | None) -> None:
        if isinstance(literal, bool):
            raise TypeError("a rule's literal is a number or text (SQL has no portable boolean literal)")
        self.literal = literal

    def _sql(self, names: Mapping[str, str]) -> str:
        if self.literal is None:
            return "NULL"
        if isinstance(self.literal, str):
            return "'" + self.literal.replace("'", "''") + "'"
        return repr(self.literal)

    def _python(self) -> str:
        return repr(self.literal)

    def _names(self) -> set[str]:
        return set()


_COMPARISONS = frozenset({">", ">=", "<", "<=", "<>"})


class _Binary(Expr):
    def __init__(self, symbol: str, left: Expr, right: Expr) -> None:
        """`symbol`: the SQL operator, Python's too but for `<>` (`!=`)."""
        self.symbol, self.left, self.right = symbol, left, right

    def _sql(self, names: Mapping[str, str]) -> str:
        return f"{_operand_sql(self.left, names)} {self.symbol} {_operand_sql(self.right, names)}"

    def _python(self) -> str:
        return f"(None if {self._any_null()} else {self._operation()})"

    def _truth(self) -> str:
        if self.symbol not in _COMPARISONS:
            return super()._truth()
        return f"(not ({self._any_null()}) and {self._operation()})"

    def _any_null(self) -> str:
        """Whether an operand is None (an operand's source is pure: computing it twice changes nothing)."""
        operands = (operand for operand in (self.left, self.right) if not isinstance(operand, _Literal))
        return " or ".join(f"{operand._python()} is None" for operand in operands) or "False"

    def _operation(self) -> str:
        python_symbol = "!=" if self.symbol == "<>" else self.symbol
        return f"{self.left._python()} {python_symbol} {self.right._python()}"

    def _names(self) -> set[str]:
        return self.left._names() | self.right._names()


def _operand_sql(operand: Expr, names: Mapping[str, str]) -> str:
    """An operand of a binary operator, in parentheses when it is one itself (`(n - 1) / d`)."""
    text = operand._sql(names)
    return f"({text})" if isinstance(operand, _Binary) else text


class _AllOf(Expr):
    def __init__(self, conditions: tuple[Expr, ...]) -> None:
        self.conditions = conditions

    def _sql(self, names: Mapping[str, str]) -> str:
        return " AND ".join(condition._sql(names) for condition in self.conditions)

    def _python(self) -> str:
        return "_all_of(" + ", ".join(condition._python() for condition in self.conditions) + ")"

    def _truth(self) -> str:
        return "(" + " and ".join(condition._truth() for condition in self.conditions) + ")"

    def _names(self) -> set[str]:
        return set().union(*(condition._names() for condition in self.conditions))


class _Case(Expr):
    def __init__(self, branches: tuple[tuple[Expr, Expr], ...], otherwise: Expr) -> None:
        self.branches, self.otherwise = branches, otherwise

    def _sql(self, names: Mapping[str, str]) -> str:
        whens = " ".join(
            f"WHEN {condition._sql(names)} THEN {result._sql(names)}" for condition, result in self.branches
        )
        if isinstance(self.otherwise, _Literal) and self.otherwise.literal is None:
            return f"CASE {whens} END"
        return f"CASE {whens} ELSE {self.otherwise._sql(names)} END"

    def _python(self) -> str:
        """Python's conditional expressions, innermost last: a result is computed only where its branch holds."""
        source = self.otherwise._python()
        for condition, result in reversed(self.branches):
            source = f"({result._python()} if {condition._truth()} else {source})"
        return source

    def _names(self) -> set[str]:
        parts = [self.otherwise, *(node for branch in self.branches for node in branch)]
        return set().union(*(part._names() for part in parts))


class _Coalesce(Expr):
    def __init__(self, values: tuple[Expr, ...]) -> None:
        self.values = values

    def _sql(self, names: Mapping[str, str]) -> str:
        return "COALESCE(" + ", ".join(each._sql(names) for each in self.values) + ")"

    def _python(self) -> str:
        source = "None"
        for each in reversed(self.values):
            source = f"({each._python()} if {each._python()} is not None else {source})"
        return source

    def _names(self) -> set[str]:
        return set().union(*(each._names() for each in self.values))

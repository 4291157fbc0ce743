"""Tokenizer, recursive-descent parser and checker of the expression language (no eval).

Grammar (loosest binding first)::

    predicate  := or                                  # mode="predicate"
    or         := and  ('|' and)*
    and        := not  ('&' not)*
    not        := '~' not | cmp
    cmp        := sum  (('<'|'<='|'>'|'>='|'=='|'!=') sum)?   # not chained
    expr       := sum                                 # mode="expr"
    sum        := term (('+'|'-') term)*
    term       := unary (('*'|'/') unary)*
    unary      := ('-'|'+') unary | power
    power      := atom (('^'|'**') unary)?            # right associative: a^b^c = a^(b^c)
    atom       := NUMBER | NAME | `PATH` | NAME '(' [arg (',' arg)*] ')' | '(' inner ')'

As in Python, ``-a^2`` is ``-(a^2)`` and ``2^-1`` is allowed.  As in pandas'
``query`` (and unlike Python's bitwise operators), ``& | ~`` bind more loosely
than comparisons, so ``vmag < 0.3 & T > 1200`` means
``(vmag < 0.3) & (T > 1200)``, and ``~T > 5`` means ``~(T > 5)``.

Names are ASCII identifiers; any other dataset path goes in backticks, with a
backtick inside doubled: ```fields/T```, ```a``b```.  A name directly followed
by ``(`` is a function call, otherwise a dataset (so a dataset may be called
``sqrt``).  Numbers are decimal: ``2``, ``2.5``, ``.5``, ``1e-3``.

Every mistake raises :class:`~lamina.errors.ExpressionError` with the
position it points at; nothing else escapes :func:`parse`, whatever the input.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from ..errors import ExpressionError, suggest
from .functions import FUNCTIONS
from .nodes import (
    BOOL_OPS,
    COMPARE_OPS,
    P_ADD,
    P_AND,
    P_MUL,
    P_NOT,
    P_OR,
    BinOp,
    BoolOp,
    Call,
    Compare,
    Expr,
    Num,
    Ref,
    UnaryOp,
)

#: most levels of parentheses / unary operators / exponents, one inside another
MAX_NESTING = 50
#: most levels in the finished tree (a chain ``a + b + c ...`` adds one per term)
MAX_DEPTH = 128
#: longest accepted expression text
MAX_LENGTH = 100_000

Mode = Literal["expr", "predicate"]

_NUMBER = re.compile(r"(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: the digits of a number: ASCII only (``str.isdigit`` also accepts ``'¹'`` and ``'٣'``)
_DIGITS = frozenset("0123456789")
#: the largest integer literal: integers must fit int64 or uint64 (as numpy holds them)
MAX_INT_LITERAL = 2**64 - 1
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_OPS2 = ("**", "<=", ">=", "==", "!=")
_OPS1 = "+-*/^(),<>&|~"

_BINARY_PREC = {"|": P_OR, "&": P_AND, "+": P_ADD, "-": P_ADD, "*": P_MUL, "/": P_MUL}
for _op in COMPARE_OPS:
    _BINARY_PREC[_op] = 4  # P_CMP
_PREDICATE_ONLY = set(COMPARE_OPS) | set(BOOL_OPS) | {"~"}


class _Tok:
    __slots__ = ("kind", "text", "pos", "value")

    def __init__(self, kind: str, text: str, pos: int, value: object = None) -> None:
        self.kind = kind  # num | name | path | op | end
        self.text = text
        self.pos = pos
        self.value = value

    def describe(self) -> str:
        if self.kind == "end":
            return "end of expression"
        if self.kind == "name":
            return f"name {self.text!r}"
        if self.kind == "path":
            return f"path {self.text}"
        if self.kind == "num":
            return f"number {self.text}"
        return repr(self.text)


def tokenize(text: str) -> list[_Tok]:
    """Split *text* into tokens; raises ExpressionError at the first character that fits none."""
    toks: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
            continue
        if c in _DIGITS or (c == "." and i + 1 < n and text[i + 1] in _DIGITS):
            m = _NUMBER.match(text, i)
            if m is None:  # unreachable with the pattern above; never an assert on user input
                raise ExpressionError(f"malformed number at {c!r}", i, text)
            s = m.group()
            toks.append(_Tok("num", s, i, number_value(s, i, text)))
            i = m.end()
            continue
        m = _NAME.match(text, i)
        if m:
            toks.append(_Tok("name", m.group(), i, m.group()))
            i = m.end()
            continue
        if c == "`":
            j, parts = i + 1, []
            while True:
                k = text.find("`", j)
                if k < 0:
                    raise ExpressionError("unterminated `path`: no closing backtick", i, text)
                parts.append(text[j:k])
                if k + 1 < n and text[k + 1] == "`":  # doubled: a literal backtick
                    parts.append("`")
                    j = k + 2
                    continue
                break
            path = "".join(parts)
            if not path:
                raise ExpressionError("empty dataset path ``", i, text)
            toks.append(_Tok("path", text[i : k + 1], i, path))
            i = k + 1
            continue
        two = text[i : i + 2]
        if two in _OPS2:
            toks.append(_Tok("op", two, i))
            i += 2
            continue
        if c in _OPS1:
            toks.append(_Tok("op", c, i))
            i += 1
            continue
        if c == "=":
            raise ExpressionError("'=' is not an operator; compare with '=='", i, text)
        if c == "!":
            raise ExpressionError(
                "'!' is not an operator; use '!=' to compare or '~' for not", i, text
            )
        if c in "'\"":
            raise ExpressionError(
                f"unexpected quote {c}; write dataset paths in backticks: `a/b`", i, text
            )
        raise ExpressionError(f"unexpected character {c!r}", i, text)
    toks.append(_Tok("end", "", n))
    return toks


def number_value(s: str, pos: int | None = None, text: str | None = None) -> int | float:
    """The value of the numeric literal *s* (matched by the number pattern), or ExpressionError.

    Integers must be at most :data:`MAX_INT_LITERAL` (they must fit int64 or
    uint64, the widest integers numpy computes with); floats must be finite
    (``1e999`` is refused, ``1e-999`` is 0.0).
    """
    if any(ch in s for ch in ".eE"):
        value = float(s)  # no digit limit for floats; too large a value is inf
        if math.isinf(value):
            raise ExpressionError(
                f"number {_clip(s)} is too large (floats must be finite, at most 1.8e308)",
                pos,
                text,
            )
        return value
    digits = s.lstrip("0")
    # compared as text first: int() of more than 4300 digits raises ValueError
    if len(digits) > len(str(MAX_INT_LITERAL)) or int(s) > MAX_INT_LITERAL:
        raise ExpressionError(
            f"integer {_clip(s)} is too large: integers must fit 64 bits (at most "
            f"{MAX_INT_LITERAL}); write a float such as 1.5e20 for a larger number",
            pos,
            text,
        )
    return int(s)


def _clip(s: str) -> str:
    return s if len(s) <= 30 else s[:27] + "..."


class _Parser:
    def __init__(self, text: str, mode: Mode) -> None:
        self.text = text
        self.mode = mode
        self.toks = tokenize(text)
        self.i = 0
        self.nesting = 0

    # -- helpers ---------------------------------------------------------------
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def error(self, msg: str, pos: int) -> ExpressionError:
        return ExpressionError(msg, pos, self.text)

    def is_op(self, *ops: str) -> bool:
        t = self.tok
        return t.kind == "op" and t.text in ops

    def enter(self, pos: int) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(f"expression nested too deeply (more than {MAX_NESTING} levels)", pos)

    def mk(self, node: Expr) -> Expr:
        if node.depth > MAX_DEPTH:
            raise self.error(
                f"expression too deep (more than {MAX_DEPTH} levels of operations)", node.pos
            )
        return node

    def unexpected(self, expecting: str) -> ExpressionError:
        t = self.tok
        if t.kind == "op" and t.text in _PREDICATE_ONLY and self.mode == "expr":
            return self.error(
                f"{t.text!r} is only allowed in predicates (queries), not in expressions", t.pos
            )
        if t.kind == "name" and t.text in ("and", "or", "not"):
            sym = {"and": "&", "or": "|", "not": "~"}[t.text]
            return self.error(f"unexpected {t.text!r}; write {sym!r} instead", t.pos)
        if t.kind == "end":
            return self.error(f"unexpected end of expression; expected {expecting}", t.pos)
        hint = ""
        if (
            expecting == "an operator or the end"
            and t.kind in ("name", "num", "path")
            or (t.kind == "op" and t.text == "(" and expecting == "an operator or the end")
        ):
            hint = " (missing operator?)"
        return self.error(f"unexpected {t.describe()}; expected {expecting}{hint}", t.pos)

    # -- grammar ---------------------------------------------------------------
    def parse(self) -> Expr:
        if self.tok.kind == "end":
            raise self.error("empty expression", 0)
        node = self.binary(0)
        if self.tok.kind != "end":
            if self.is_op(")"):
                raise self.error("unmatched ')'", self.tok.pos)
            raise self.unexpected("an operator or the end")
        return node

    def binary(self, min_prec: int) -> Expr:
        left = self.prefix()
        while True:
            t = self.tok
            if t.kind != "op" or t.text not in _BINARY_PREC:
                return left
            prec = _BINARY_PREC[t.text]
            if prec < min_prec:
                return left
            if self.mode == "expr" and t.text in _PREDICATE_ONLY:
                raise self.unexpected("")
            self.i += 1
            right = self.binary(prec + 1)
            if t.text in COMPARE_OPS:
                left = self.mk(Compare(t.text, left, right, pos=t.pos))
                if self.tok.kind == "op" and self.tok.text in COMPARE_OPS:
                    raise self.error(
                        "comparisons cannot be chained; write (a < b) & (b < c)", self.tok.pos
                    )
            elif t.text in BOOL_OPS:
                left = self.mk(BoolOp(t.text, left, right, pos=t.pos))
            else:
                left = self.mk(BinOp(t.text, left, right, pos=t.pos))

    def prefix(self) -> Expr:
        t = self.tok
        if t.kind == "op" and t.text in ("-", "+", "~"):
            if t.text == "~" and self.mode == "expr":
                raise self.unexpected("")
            self.i += 1
            self.enter(t.pos)
            operand = self.binary(P_NOT) if t.text == "~" else self.prefix()
            self.nesting -= 1
            if t.text == "+":
                return operand
            return self.mk(UnaryOp(t.text, operand, pos=t.pos))
        return self.power()

    def power(self) -> Expr:
        base = self.atom()
        if self.is_op("^", "**"):
            t = self.tok
            self.i += 1
            self.enter(t.pos)
            exponent = self.prefix()
            self.nesting -= 1
            return self.mk(BinOp("^", base, exponent, pos=t.pos))
        return base

    def atom(self) -> Expr:
        t = self.tok
        if t.kind == "num":
            self.i += 1
            return Num(t.value, pos=t.pos)  # type: ignore[arg-type]
        if t.kind == "path":
            self.i += 1
            return Ref(t.value, pos=t.pos)  # type: ignore[arg-type]
        if t.kind == "name":
            self.i += 1
            if self.is_op("("):
                return self.call(t)
            return Ref(t.text, pos=t.pos)
        if t.kind == "op" and t.text == "(":
            self.i += 1
            self.enter(t.pos)
            if self.is_op(")"):
                raise self.error("empty parentheses", self.tok.pos)
            inner = self.binary(0)
            if not self.is_op(")"):
                if self.tok.kind == "end":
                    raise self.error("'(' is never closed", t.pos)
                raise self.unexpected("')'")
            self.i += 1
            self.nesting -= 1
            return inner
        raise self.unexpected("a number, a dataset, a function call or '('")

    def call(self, name_tok: _Tok) -> Expr:
        name = name_tok.text
        if name not in FUNCTIONS:
            raise self.error(unknown_function(name), name_tok.pos)
        open_tok = self.tok
        self.i += 1  # '('
        self.enter(open_tok.pos)
        args: list[Expr] = []
        if not self.is_op(")"):
            while True:
                args.append(self.binary(0))
                if self.is_op(","):
                    self.i += 1
                    continue
                if self.is_op(")"):
                    break
                if self.tok.kind == "end":
                    raise self.error(f"'(' of {name}() is never closed", open_tok.pos)
                raise self.unexpected("',' or ')'")
        self.i += 1  # ')'
        self.nesting -= 1
        return self.mk(Call(name, tuple(args), pos=name_tok.pos))


def unknown_function(name: str) -> str:
    """Message for an unknown function name, with close names or the list of functions."""
    hint = suggest(name, FUNCTIONS)
    if not hint:
        hint = " The functions are: " + ", ".join(FUNCTIONS) + "."
    return f"unknown function {name!r}." + hint


def parse(text: str, mode: Mode = "expr") -> Expr:
    """Parse *text* into a checked expression tree.

    Parameters
    ----------
    text
        The expression, e.g. ``"magnitude(vx, vy, vz)"`` or, in predicate
        mode, ``"vmag < 0.3 & T > 1200"``.
    mode
        ``"expr"``: an arithmetic expression giving 1 or 3 components.
        ``"predicate"``: a condition (comparisons joined by ``& | ~``), as
        used by queries.

    Raises
    ------
    ExpressionError
        For any malformed input, with ``.position`` pointing at the mistake:
        syntax, unknown function (with close names suggested), wrong number
        of arguments (naming the expected count), a vector where a scalar is
        needed, a non-literal axis, a condition where a number is needed or
        the other way round.
    """
    if mode not in ("expr", "predicate"):
        raise ValueError(f"mode must be 'expr' or 'predicate', not {mode!r}")
    if not isinstance(text, str):
        raise ExpressionError(f"an expression must be a string, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"expression longer than {MAX_LENGTH} characters")
    try:
        node = _Parser(text, mode).parse()
        check(node, mode, text)
    except RecursionError:  # a safety net: the limits above should make this unreachable
        raise ExpressionError("expression nested too deeply", None, text) from None
    node.__dict__["_source"] = text
    return node


# ---------------------------------------------------------------------------
# checking: arity, scalar vs vector, number vs condition, literal axes
# ---------------------------------------------------------------------------


def check(node: Expr, mode: Mode = "expr", text: str | None = None) -> None:
    """Check a tree (from :func:`parse` or built by hand) for the rules the grammar cannot express.

    Raises ExpressionError at the offending node's position.
    """
    if node.depth > MAX_DEPTH:
        raise ExpressionError(f"expression too deep (more than {MAX_DEPTH} levels)", None, text)
    kind, _ = _kind(node, text)
    if mode == "predicate" and kind != "bool":
        raise ExpressionError(
            "a predicate must be a condition such as 'T > 1200' (comparisons joined by & | ~)",
            node.pos if node.pos >= 0 else None,
            text,
        )
    if mode == "expr" and kind == "bool":
        raise ExpressionError(
            "a condition is only allowed in predicates (mode='predicate')", _p(node), text
        )


def _p(node: Expr) -> int | None:
    return node.pos if node.pos >= 0 else None


def axis_value(node: Expr) -> int | None:
    """The integer of an axis argument (``2`` or ``-1``), or None if it is not an integer literal."""
    if isinstance(node, Num) and isinstance(node.value, int):
        return node.value
    if isinstance(node, UnaryOp) and node.op == "-" and isinstance(node.operand, Num):
        v = node.operand.value
        if isinstance(v, int):
            return -v
    return None


def _kind(node: Expr, text: str | None) -> tuple[str, int]:
    """('num', ncomponents) or ('bool', 1); raises on misuse."""

    def err(msg: str, at: Expr) -> ExpressionError:
        return ExpressionError(msg, _p(at), text)

    def scalar(child: Expr, what: str) -> None:
        k, n = _kind(child, text)
        if k == "bool":
            raise err(f"{what} needs a number, but this is a condition", child)
        if n != 1:
            raise err(
                f"{what} needs a scalar, but {_short(child)} has {n} components "
                "(only magnitude, dot and cross take vectors)",
                child,
            )

    def condition(child: Expr, what: str) -> None:
        k, _ = _kind(child, text)
        if k != "bool":
            raise err(
                f"{what} needs a condition (a comparison such as 'T > 1200'), not a number", child
            )

    if isinstance(node, Num):
        v = node.value
        if isinstance(v, int) and not isinstance(v, bool) and v > MAX_INT_LITERAL:
            raise err(
                f"integer literal of {v.bit_length()} bits is too large: integers must fit "
                f"64 bits (at most {MAX_INT_LITERAL})",
                node,
            )
        if isinstance(v, float) and not math.isfinite(v):
            raise err(f"number {v} is not finite", node)
        return "num", 1
    if isinstance(node, Ref):
        return "num", 1
    if isinstance(node, BinOp):
        if node.op not in ("+", "-", "*", "/", "^"):
            raise err(f"unknown operator {node.op!r}", node)
        scalar(node.left, f"the left operand of {node.op!r}")
        scalar(node.right, f"the right operand of {node.op!r}")
        return "num", 1
    if isinstance(node, UnaryOp):
        if node.op == "-":
            scalar(node.operand, "'-'")
            return "num", 1
        if node.op == "~":
            condition(node.operand, "'~'")
            return "bool", 1
        raise err(f"unknown operator {node.op!r}", node)
    if isinstance(node, Compare):
        if node.op not in COMPARE_OPS:
            raise err(f"unknown comparison {node.op!r}", node)
        scalar(node.left, f"the left side of {node.op!r}")
        scalar(node.right, f"the right side of {node.op!r}")
        return "bool", 1
    if isinstance(node, BoolOp):
        if node.op not in BOOL_OPS:
            raise err(f"unknown operator {node.op!r}", node)
        condition(node.left, f"the left side of {node.op!r}")
        condition(node.right, f"the right side of {node.op!r}")
        return "bool", 1
    if isinstance(node, Call):
        return _kind_call(node, text, err, scalar)
    raise err(f"not an expression node: {type(node).__name__}", node)


def _short(node: Expr) -> str:
    s = str(node)
    return s if len(s) <= 40 else s[:37] + "..."


def _kind_call(node: Call, text, err, scalar) -> tuple[str, int]:
    f = FUNCTIONS.get(node.name)
    if f is None:
        raise err(unknown_function(node.name), node)
    nargs = len(node.args)
    if nargs < f.min_args or (f.max_args is not None and nargs > f.max_args):
        raise err(f"{f.name}() takes {f.arity_text()}, got {nargs}", node)
    if f.kind == "vector":
        ncomp = 0
        for i, a in enumerate(node.args):
            k, n = _kind(a, text)
            if k == "bool":
                raise err(f"argument {i + 1} of {f.name}() is a condition, not a number", a)
            ncomp += n
        if f.name == "dot" and ncomp % 2:
            raise err(
                f"dot() takes two vectors of the same length (2n components), got {ncomp} components",
                node,
            )
        if f.name == "cross" and ncomp != 6:
            raise err(f"cross() takes 6 components (two 3-component vectors), got {ncomp}", node)
        return "num", 3 if f.name == "cross" else 1
    if f.name == "gradient" and nargs == 2:
        scalar(node.args[0], "argument 1 of gradient()")
        if axis_value(node.args[1]) is None:
            raise err(
                "the axis of gradient(a, axis) must be an integer literal such as 0 or -1",
                node.args[1],
            )
        return "num", 1
    for i, a in enumerate(node.args):
        scalar(a, f"argument {i + 1} of {f.name}()")
    return "num", node.ncomponents

"""When the digits a store's address takes of a tile of indices stand for the index itself: a mixed-radix split.

``n = offs // (OH * OW)``, ``oh = (offs // OW) % OH`` and ``ow = offs % OW`` (an implicit-GEMM convolution's
output pixel) determine ``offs = (n * OH + oh) * OW + ow``, so lanes with distinct ``offs`` keep distinct digits,
and lanes.py checks the digits' strides as any coordinates'. Two spellings of one digit are read as one, through

    (x // a) // b == x // (a * b)        (x % (a * b)) % b == x % b        (x % (a * b)) // b == (x // b) % a

(``x`` not negative, ``a``, ``b`` at least 1: lanes.py checks both; divisors compared as products of names and
integers), so a digit of ``x`` is spelled ``x % hi``, ``x // lo`` or ``(x // lo) % (hi / lo)`` wherever it is one
window of ``x``'s radix. Then a value is determined by the address where it is one of its digits, or where both
digits of one split of it are (``v // d`` and ``v % d``: ``v = d * (v // d) + v % d``); the address determines the
index ``x`` where that reaches it. A digit whose index no split reaches folds lanes together: ``q = offs // W``
split into ``q // H`` and ``q % H`` determines ``q``, never ``offs`` (lanes ``W`` apart write one element)."""

from __future__ import annotations

import ast

from .forms import Coefficient, Digit, Form, form_of_terms


def _product(text: str) -> Coefficient | None:
    """A divisor as an integer times names (a factor that is neither, ``(H - 1)``, as a name of its own)."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None

    def factors(e: ast.expr) -> Coefficient:
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            (a, sa), (b, sb) = factors(e.left), factors(e.right)
            return a * b, (*sa, *sb)
        if isinstance(e, ast.Constant) and isinstance(e.value, int) and not isinstance(e.value, bool):
            return e.value, ()
        return 1, (e.id if isinstance(e, ast.Name) else f"({ast.unparse(e)})",)

    n, symbols = factors(node)
    return n, tuple(sorted(symbols))


def _text(c: Coefficient) -> str:
    n, symbols = c
    return " * ".join(([str(n)] if n != 1 or not symbols else []) + list(symbols))


def _quotient(a: Coefficient, b: Coefficient) -> Coefficient | None:
    """``a / b`` where ``b`` divides ``a`` as a product, else None."""
    rest = list(a[1])
    for s in b[1]:
        if s not in rest:
            return None
        rest.remove(s)
    return None if b[0] == 0 or a[0] % b[0] else (a[0] // b[0], tuple(rest))


def _sole_digit(form: Form) -> Digit | None:
    """The digit a form is, where it is one (coefficient 1)."""
    return form.terms[0][0] if len(form.terms) == 1 and isinstance(form.terms[0][0], Digit) and form.terms[0][1] == (
        1, ()) else None


def _digit(dividend: Form, divisor: Coefficient, quotient: bool) -> Digit:
    """``dividend // divisor`` or ``% divisor`` in the one spelling per window (the dividend's digits read so too)."""
    inner = _sole_digit(dividend)
    outer = _product(inner.divisor) if inner is not None else None
    if inner is None or outer is None:
        return Digit(dividend, _text(divisor), quotient)
    if inner.quotient:  # (x // a) // b == x // (a * b); (x // a) % b is a window's own spelling
        if quotient:
            return _digit(inner.dividend, (outer[0] * divisor[0], tuple(sorted(outer[1] + divisor[1]))), True)
        return Digit(dividend, _text(divisor), False)
    rest = _quotient(outer, divisor)  # inner = y % (rest * divisor)
    if rest is None:
        return Digit(dividend, _text(divisor), quotient)
    if not quotient:  # (y % (a * b)) % b == y % b
        return _digit(inner.dividend, divisor, False)
    below = _digit(inner.dividend, divisor, True)  # (y % (a * b)) // b == (y // b) % a
    return _digit(form_of_terms({below: (1, ())}, dividend.rank), rest, False)


def canonical(digit: Digit) -> Digit:
    """A digit in its one spelling (its dividend's digits too); as written where a divisor cannot be read."""
    dividend = form_of_terms({canonical(k) if isinstance(k, Digit) else k: c for k, c in digit.dividend.terms},
                             digit.dividend.rank, digit.dividend.affine)
    divisor = _product(digit.divisor)
    return Digit(dividend, digit.divisor, digit.quotient) if divisor is None else _digit(dividend, divisor,
                                                                                         digit.quotient)


def _partner(digit: Digit) -> Digit:
    return canonical(digit.partner)


def index_of(digit: Digit) -> Form:
    """The tile of indices a digit is taken of, through digits of digits: ``offs`` of ``(offs // W) % H``."""
    inner = _sole_digit(digit.dividend)
    return digit.dividend if inner is None else index_of(inner)


def written_digits(digits) -> list[Digit]:
    """The digits as written and every digit their dividends hold, each once, outermost first."""
    found: list[Digit] = []
    for d in digits:
        if d not in found:
            found.append(d)
            found += [k for k in written_digits(k for k, _ in d.dividend.terms if isinstance(k, Digit))
                      if k not in found]
    return found


def _determined(known: set[Digit]) -> tuple[set[Digit], set[Form]]:
    """The digits and the indices that ``known`` digits determine: themselves, and what both digits of a split
    stand for, to a fixed point."""
    known, indices = set(known), set()
    grown = True
    while grown:
        grown = False
        for k in list(known):
            if _partner(k) not in known:
                continue
            inner = _sole_digit(k.dividend)
            if inner is None and k.dividend not in indices:
                indices.add(k.dividend)
                grown = True
            elif inner is not None and inner not in known:
                known.add(inner)
                grown = True
    return known, indices


def _missing(value: Digit, known: set[Digit], depth: int = 0) -> Digit:
    """What the address lacks for ``value``: itself, or, where it has one digit of a split of ``value``, what it
    lacks for the other (``x // W`` of which it has ``(x // W) % H``: ``x // (H * W)``)."""
    for k in sorted(known, key=str):  # (one message every run)
        other = _partner(k)
        if depth < 16 and _sole_digit(k.dividend) == value and other not in known:
            return _missing(other, known, depth + 1)
    return value


def undetermined(digits: list[Digit]) -> tuple[Digit, str] | None:
    """The first digit (as written) whose index the digits do not determine, or that the others determine already
    (a digit twice: lanes apart in it alone may share every other coordinate), with what is missing for it (the
    partner of the split the reading stopped at); None where the digits determine each index, each needed."""
    spelled = [canonical(d) for d in digits]
    known, indices = _determined(set(spelled))
    for d, k in zip(digits, spelled, strict=True):
        index = index_of(d)
        if any(isinstance(c, Digit) for c, _ in index.terms):  # (its own digits fold lanes: no proof)
            return d, "a digit of an index itself computed through `//` or `%`"
        if index not in indices:
            while _partner(k) in known and _sole_digit(k.dividend) is not None:
                k = _sole_digit(k.dividend)
            return d, f"without the other digit `{_missing(_partner(k), known)}`"
        others = {c for c, other in zip(spelled, digits, strict=True) if other != d}
        if k in others or index in _determined(others)[1]:
            return d, f"without the other digit `{d.partner}` (the other digits determine `{d}` already)"
    return None

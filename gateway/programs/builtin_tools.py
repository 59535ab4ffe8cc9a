"""The tools every gateway ships: a small in-memory document index and a calculator.

`retrieve(query, k)` ranks the index's documents by BM25 over lower-cased word
tokens (CJK characters count one by one) and returns the top k as
`[{"id", "title", "text", "score"}]`. `calculator(expression)` evaluates arithmetic
(+ - * / // % **, parentheses, unary minus) on numbers, nothing else.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections import Counter
from dataclasses import dataclass

from gateway.programs.core.tools import Tool
from radixmesh.errors import InvalidArgument

DOCUMENTS = (
    ("refunds", "Refund policy", "Refunds are issued within 14 days of purchase to the original payment method. 退款在购买后14天内办理。"),
    ("shipping", "Shipping times", "Orders ship within 2 business days; delivery takes 3 to 5 days. 订单在两个工作日内发货。"),
    ("password", "Resetting a password", "Reset your password from the sign-in page with the 'forgot password' link. 在登录页面重置密码。"),
    ("warranty", "Warranty", "Hardware carries a one-year warranty covering manufacturing defects. 硬件保修一年。"),
    ("contact", "Contacting support", "Support answers by chat from 9:00 to 18:00 UTC on weekdays. 客服工作日在线。"),
)  # fmt: skip
_WORD = re.compile(r"[\u4e00-\u9fff]|[a-z0-9]+")


def _terms(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True, slots=True)
class DocumentIndex:
    documents: tuple[tuple[str, str, str], ...] = DOCUMENTS
    k1: float = 1.5
    b: float = 0.75

    def search(self, query: str, k: int = 3) -> list[dict]:
        if not isinstance(query, str) or not query:
            raise InvalidArgument("retrieve: query must be a non-empty string")
        if not isinstance(k, int) or not 1 <= k <= len(self.documents):
            raise InvalidArgument(f"retrieve: k must be an integer in [1, {len(self.documents)}]")
        docs = [_terms(f"{title} {text}") for _, title, text in self.documents]
        avg = sum(map(len, docs)) / len(docs)
        frequency = Counter(t for d in docs for t in set(d))
        scored = []
        for (doc_id, title, text), terms in zip(self.documents, docs, strict=True):
            counts = Counter(terms)
            score = 0.0
            for term in set(_terms(query)):
                if term not in counts:
                    continue
                idf = math.log(1 + (len(docs) - frequency[term] + 0.5) / (frequency[term] + 0.5))
                tf = counts[term]
                score += idf * tf * (self.k1 + 1) / (tf + self.k1 * (1 - self.b + self.b * len(terms) / avg))
            scored.append({"id": doc_id, "title": title, "text": text, "score": round(score, 4)})
        scored.sort(key=lambda d: -float(d["score"]))  # type: ignore[arg-type]
        return scored[:k]


_INDEX = DocumentIndex()


def retrieve(query: str, k: int | str = 3) -> list[dict]:
    """k may come as text from a template ("2")."""
    if isinstance(k, str) and k.strip().isdigit():
        k = int(k)
    return _INDEX.search(query, k)  # type: ignore[arg-type]


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def calculator(expression: str) -> float | int:
    if not isinstance(expression, str) or len(expression) > 200:
        raise InvalidArgument("calculator: expression must be a string of at most 200 characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise InvalidArgument(f"calculator: {expression!r} is not an arithmetic expression") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):
            raise InvalidArgument("calculator: only numbers are allowed")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise InvalidArgument("calculator: exponent too large")
        try:
            return _OPERATORS[type(node.op)](left, right)
        except ZeroDivisionError:
            raise InvalidArgument("calculator: division by zero") from None
    raise InvalidArgument("calculator: only numbers, + - * / // % ** and parentheses are allowed")


BUILTIN_TOOLS = (
    Tool("retrieve", retrieve, timeout_s=5.0, cache_ttl_s=300.0, description=__doc__ or ""),
    Tool("calculator", calculator, timeout_s=1.0, cache_ttl_s=0.0),
)

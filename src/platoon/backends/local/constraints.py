"""Constrained decoding for the embedded sampler: the tokens that keep a reply inside what a
`DecodingConstraint` allows (one tool call, or one JSON value of a schema), step by step.

A small matcher reads the reply character by character: its state is a stack of frames (a
literal to finish, an object between keys, a string body, a number...), immutable, so that each
(state, character) step is computed once per request. At each decoding step the allowed tokens are
those whose text the matcher accepts from the row's state. The vocabulary is read once per
tokenizer (`Vocabulary`), sorted by text, so the tokens that start with a given text are one
range: the search walks down by character from the state and only ever visits the ranges the
matcher can take. Inside a string most tokens fit: those made of plain string characters keep
the state as it is and are taken in one array operation; only those holding a quote or a
backslash are read one by one.

A reply must also end within `max_tokens`. Every state knows the length of its shortest
completion (characters, each at most one token: a byte-level vocabulary spells any text one
character per token); a token is allowed only when what it leads to can still be completed, and a
stop token drawn, in the tokens left. A random model is so brought to close its strings and
objects in time, and a trained one barely notices.

Whitespace between JSON tokens: one optional space after `:` and `,`, none elsewhere. The keys of
an object with declared `properties` are those properties (each at most once, every `required`
one before `}`); an object without declared properties takes any keys. `minItems`, lengths and
number ranges are not enforced (`platoon.policy.constraints` has the subset).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import torch

from platoon.policy.constraints import DecodingConstraint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["ConstraintError", "Grammar", "Guide", "Vocabulary", "compile_constraint"]


class ConstraintError(ValueError):
    """A constraint that cannot be decoded to (its written opening does not fit it)."""


# --- the schema, compiled --------------------------------------------------------------------


@dataclass(eq=False)
class Node:
    """One schema node: `kind` is any, object, array, string, number, integer, boolean, null,
    enum (`options`: the JSON texts allowed) or union (`members`)."""

    kind: str
    props: dict[str, Node] = field(default_factory=dict)  # object: declared properties
    keys: tuple[str, ...] = ()  # object: the declared properties' JSON texts
    required: frozenset[str] = frozenset()
    extra: Node | None = None  # object without declared properties: any key, this value
    items: Node | None = None
    options: tuple[str, ...] = ()
    members: tuple[Node, ...] = ()
    minlen: int = 1  # the length of its shortest JSON text
    first: frozenset[str] = frozenset()  # the characters its JSON text can start with


_DIGITS = frozenset("0123456789")
_FIRST = {
    "any": frozenset('{["-tfn') | _DIGITS,
    "object": frozenset("{"),
    "array": frozenset("["),
    "string": frozenset('"'),
    "number": frozenset("-") | _DIGITS,
    "integer": frozenset("-") | _DIGITS,
    "boolean": frozenset("tf"),
    "null": frozenset("n"),
}
_MINLEN = {"any": 1, "array": 2, "string": 2, "number": 1, "integer": 1, "boolean": 4, "null": 4}


def _leaf(kind: str) -> Node:
    return Node(kind, minlen=_MINLEN[kind], first=_FIRST[kind])


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def compile_schema(schema: object) -> Node:
    """The node of a schema (of the subset; what lies outside it allows any JSON value)."""
    if not isinstance(schema, Mapping):
        return _leaf("any")
    if "const" in schema or isinstance(schema.get("enum"), list):
        values = [schema["const"]] if "const" in schema else schema["enum"]
        options = tuple(dict.fromkeys(_dumps(v) for v in values))
        if not options:
            return _leaf("any")
        return Node(
            "enum", options=options, minlen=min(map(len, options)), first=frozenset(o[0] for o in options)
        )
    kind = schema.get("type")
    if isinstance(kind, list):
        members = tuple(compile_schema({**schema, "type": k}) for k in kind if isinstance(k, str))
        if not members:
            return _leaf("any")
        if any(m.kind == "number" for m in members):  # a number is also what an integer is
            members = tuple(m for m in members if m.kind != "integer")
        if len(members) == 1:
            return members[0]
        return Node(
            "union",
            members=members,
            minlen=min(m.minlen for m in members),
            first=frozenset().union(*(m.first for m in members)),
        )
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "any"
    if kind == "object":
        return _object(schema)
    if kind == "array":
        node = _leaf("array")
        node.items = compile_schema(schema.get("items"))
        return node
    return _leaf(kind if kind in _FIRST else "any")


def _object(schema: Mapping[str, object]) -> Node:
    properties = schema.get("properties")
    props = (
        {str(k): compile_schema(v) for k, v in properties.items()} if isinstance(properties, Mapping) else {}
    )
    required = schema.get("required")
    names = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    extra = None
    if props:
        for name in names:
            props.setdefault(name, _leaf("any"))
    else:
        more = schema.get("additionalProperties")
        extra = compile_schema(more) if isinstance(more, Mapping) else _leaf("any")
    node = Node(
        "object", props=props, keys=tuple(_dumps(k) for k in props), extra=extra, first=frozenset("{")
    )
    node.required = frozenset(names) if props else frozenset()
    node.minlen = 2 + _keys_cost(node, node.required)
    return node


def _key_cost(node: Node, name: str) -> int:
    """`"name":value`, shortest."""
    return len(_dumps(name)) + 1 + node.props[name].minlen


def _keys_cost(node: Node, names: frozenset[str]) -> int:
    """The given keys and their shortest values, comma-separated."""
    return sum(_key_cost(node, n) for n in names) + max(len(names) - 1, 0)


# --- the matcher -------------------------------------------------------------------------------
# Frames are tuples, a state a tuple of frames (the top last):
#   ("L", text, i)               a literal, text[i:] to come
#   ("A", options, buf, conts)   one of `options`, `buf` written; conts[k] follows option k
#   ("V", node)                  a value of `node` to come
#   ("W",)                       an optional space
#   ("S", phase, n)              in a string: "body", "esc" (after a backslash), "hex" (n digits to come)
#   ("N", integer, phase)        in a number
#   ("O", node, seen, phase, key)  in an object: "open", "key" (key: the key's text so far),
#                                "colon" (key: the name, None for a free key), "after", "next"
#   ("R", node, phase)           in an array: "open", "after", "next"

Frame = tuple[Any, ...]
State = tuple[Frame, ...]

_ESCAPES = frozenset('"\\/bfnrtu')
_HEX = frozenset("0123456789abcdefABCDEF")
# A number's phases: the characters that continue it, and whether it may end there.
_NUMBER: dict[str, tuple[frozenset[str], bool]] = {
    "start": (frozenset("-") | _DIGITS, False),
    "minus": (_DIGITS, False),
    "zero": (frozenset(".eE"), True),
    "int": (_DIGITS | frozenset(".eE"), True),
    "dot": (_DIGITS, False),
    "frac": (_DIGITS | frozenset("eE"), True),
    "exp": (_DIGITS | frozenset("+-"), False),
    "sign": (_DIGITS, False),
    "expd": (_DIGITS, True),
}


def _number_next(phase: str, c: str, integer: bool) -> str | None:
    if c in _DIGITS:
        return {
            "start": "int" if c != "0" else "zero",
            "minus": "int" if c != "0" else "zero",
            "int": "int",
            "dot": "frac",
            "frac": "frac",
            "exp": "expd",
            "sign": "expd",
            "expd": "expd",
        }.get(phase)
    if integer and c in ".eE":
        return None
    if c == "-" and phase == "start":
        return "minus"
    if c == "." and phase in ("zero", "int"):
        return "dot"
    if c in "eE" and phase in ("zero", "int", "frac"):
        return "exp"
    if c in "+-" and phase == "exp":
        return "sign"
    return None


def plain(c: str) -> bool:
    """Whether `c` stands for itself in a JSON string."""
    return c != '"' and c != "\\" and c >= " "


class Grammar:
    """One constraint's matcher: its start state and the steps, completions and next characters
    of its states (each computed once)."""

    def __init__(self, start: State) -> None:
        self.start = start
        self._steps: dict[tuple[State, str], State | None] = {}
        self._closing: dict[State, int] = {}
        self._chars: dict[State, frozenset[str] | None] = {}

    # One character.

    def step(self, state: State, c: str) -> State | None:
        """The state after `c`, None when `c` cannot come next."""
        key = (state, c)
        if key in self._steps:
            return self._steps[key]
        if len(self._steps) > 500_000:
            self._steps.clear()
        result: State | None = None
        while state:
            moved = _feed(state[-1], c)
            if moved is None:
                break
            frames, consumed = moved
            state = state[:-1] + frames
            if consumed:
                result = state
                break
        self._steps[key] = result
        return result

    def walk(self, state: State | None, text: str) -> State | None:
        for c in text:
            if state is None:
                return None
            state = self.step(state, c)
        return state

    # What a state allows.

    def closing(self, state: State) -> int:
        """The length of the shortest text that completes `state`."""
        found = self._closing.get(state)
        if found is None:
            found = self._closing[state] = sum(_rest(frame) for frame in state)
        return found

    def chars(self, state: State) -> frozenset[str] | None:
        """The characters that can come next; None inside a string body (any plain character,
        a quote or a backslash)."""
        if state in self._chars:
            return self._chars[state]
        found: frozenset[str] | None = frozenset()
        if state:
            top = state[-1]
            found = _own(top)
            ending = _ending(top)
            if found is not None and ending is not None:  # it may end here: what follows it too
                found |= self.chars(state[:-1] + ending) or frozenset()
        self._chars[state] = found
        return found


def _feed(frame: Frame, c: str) -> tuple[State, bool] | None:
    """The frames that replace `frame` when `c` comes, and whether `c` was consumed (else it
    goes to the frames below); None when `c` cannot come."""
    kind = frame[0]
    if kind == "L":
        _, text, i = frame
        if text[i] != c:
            return None
        return (() if i + 1 == len(text) else (("L", text, i + 1),)), True
    if kind == "W":
        return ((), c == " ")
    if kind == "S":
        return _feed_string(frame, c)
    if kind == "N":
        _, integer, phase = frame
        following = _number_next(phase, c, integer)
        if following is not None:
            return (("N", integer, following),), True
        return ((), False) if _NUMBER[phase][1] else None
    if kind == "A":
        return _feed_choice(frame, c)
    if kind == "V":
        return _feed_value(frame[1], c)
    if kind == "O":
        return _feed_object(frame, c)
    return _feed_array(frame, c)


def _feed_string(frame: Frame, c: str) -> tuple[State, bool] | None:
    _, phase, n = frame
    if phase == "body":
        if c == '"':
            return (), True
        if c == "\\":
            return (("S", "esc", 0),), True
        return ((frame,), True) if c >= " " else None
    if phase == "esc":
        if c not in _ESCAPES:
            return None
        return ((("S", "hex", 4),) if c == "u" else (("S", "body", 0),)), True
    if c not in _HEX:
        return None
    return ((("S", "hex", n - 1),) if n > 1 else (("S", "body", 0),)), True


def _feed_choice(frame: Frame, c: str) -> tuple[State, bool] | None:
    _, options, buf, conts = frame
    longer = buf + c
    if any(o.startswith(longer) for o in options):
        if longer in options and not any(len(o) > len(longer) and o.startswith(longer) for o in options):
            return conts[options.index(longer)], True
        return (("A", options, longer, conts),), True
    if buf in options:  # a complete option that `c` does not extend: it ends here
        return conts[options.index(buf)], False
    return None


def _feed_value(node: Node, c: str) -> tuple[State, bool] | None:
    if c not in node.first:
        return None
    kind = node.kind
    if kind == "union":
        for member in node.members:
            if c in member.first:
                return _feed_value(member, c)
        return None
    if kind == "enum":
        return _feed_choice(("A", node.options, "", ((),) * len(node.options)), c)
    if c == "{":
        obj = node if kind == "object" else _ANY_OBJECT
        return (("O", obj, frozenset(), "open", None),), True
    if c == "[":
        items = node.items if kind == "array" and node.items is not None else _ANY
        return (("R", items, "open"),), True
    if c == '"':
        return (("S", "body", 0),), True
    if c == "t":
        return (("L", "true", 1),), True
    if c == "f":
        return (("L", "false", 1),), True
    if c == "n":
        return (("L", "null", 1),), True
    phase = _number_next("start", c, kind == "integer")
    return ((("N", kind == "integer", phase),), True) if phase is not None else None


def _remaining(node: Node, seen: frozenset[str]) -> list[str]:
    return [k for k in node.props if k not in seen]


def _feed_object(frame: Frame, c: str) -> tuple[State, bool] | None:
    _, node, seen, phase, key = frame
    if phase in ("open", "next"):
        if c == "}" and phase == "open" and node.required <= seen:
            return (), True
        if c != '"':
            return None
        if node.extra is not None:  # any key: a string, then its value
            return (("O", node, seen, "colon", None), ("S", "body", 0)), True
        if not _remaining(node, seen):
            return None
        return (("O", node, seen, "key", '"'),), True
    if phase == "key":
        longer = key + c
        names = [
            (k, t)
            for k, t in zip(node.props, node.keys, strict=True)
            if k not in seen and t.startswith(longer)
        ]
        if not names:
            return None
        done = [k for k, t in names if t == longer]
        if done:
            return (("O", node, seen, "colon", done[0]),), True
        return (("O", node, seen, "key", longer),), True
    if phase == "colon":
        if c != ":":
            return None
        value = node.extra if key is None else node.props[key]
        assert value is not None
        after = seen if key is None else seen | {key}
        return (("O", node, after, "after", None), ("V", value), ("W",)), True
    # after a value
    if c == "}" and node.required <= seen:
        return (), True
    if c == "," and (node.extra is not None or _remaining(node, seen)):
        return (("O", node, seen, "next", None), ("W",)), True
    return None


def _feed_array(frame: Frame, c: str) -> tuple[State, bool] | None:
    _, items, phase = frame
    if phase == "after":
        if c == "]":
            return (), True
        if c == ",":
            return (("R", items, "next"), ("W",)), True
        return None
    if phase == "open" and c == "]":
        return (), True
    return (("R", items, "after"), ("V", items)), False


def _rest(frame: Frame) -> int:
    """The length of the shortest text that completes `frame`."""
    kind = frame[0]
    if kind == "L":
        return len(frame[1]) - frame[2]
    if kind == "W":
        return 0
    if kind == "V":
        return frame[1].minlen
    if kind == "S":
        return {"body": 1, "esc": 2}.get(frame[1], frame[2] + 1)
    if kind == "N":
        return 0 if _NUMBER[frame[2]][1] else 1
    if kind == "A":
        _, options, buf, conts = frame
        return min(
            len(o) - len(buf) + sum(_rest(f) for f in conts[k])
            for k, o in enumerate(options)
            if o.startswith(buf)
        )
    if kind == "R":
        return frame[1].minlen + 1 if frame[2] == "next" else 1
    _, node, seen, phase, key = frame
    missing = node.required - seen
    if phase == "after":
        return sum(1 + _key_cost(node, n) for n in missing) + 1
    if phase in ("open", "next"):
        if missing:
            return _keys_cost(node, missing) + 1
        if phase == "open":
            return 1
        if node.extra is not None:
            return 3 + node.extra.minlen + 1
        return min(_key_cost(node, n) for n in _remaining(node, seen)) + 1
    if phase == "colon":
        value = node.extra if key is None else node.props[key]
        assert value is not None
        return 1 + value.minlen + sum(1 + _key_cost(node, n) for n in missing - {key}) + 1
    return (
        min(  # phase "key"
            len(_dumps(n))
            - len(key)
            + 1
            + node.props[n].minlen
            + sum(1 + _key_cost(node, m) for m in missing - {n})
            for n in _remaining(node, seen)
            if _dumps(n).startswith(key)
        )
        + 1
    )


def _own(frame: Frame) -> frozenset[str] | None:
    """The characters `frame` itself takes next (None: a string body's, any plain one)."""
    kind = frame[0]
    if kind == "L":
        return frozenset(frame[1][frame[2]])
    if kind == "W":
        return frozenset(" ")
    if kind == "V":
        return frame[1].first
    if kind == "S":
        return None if frame[1] == "body" else _ESCAPES if frame[1] == "esc" else _HEX
    if kind == "N":
        chars = _NUMBER[frame[2]][0]
        return chars - frozenset(".eE") if frame[1] else chars
    if kind == "A":
        _, options, buf, _ = frame
        return frozenset(o[len(buf)] for o in options if len(o) > len(buf) and o.startswith(buf))
    if kind == "R":
        _, items, phase = frame
        return (
            frozenset(",]")
            if phase == "after"
            else items.first | (frozenset("]") if phase == "open" else set())
        )
    _, node, seen, phase, key = frame
    if phase in ("open", "next"):
        chars = frozenset('"') if node.extra is not None or _remaining(node, seen) else frozenset()
        return chars | frozenset("}") if phase == "open" and node.required <= seen else chars
    if phase == "key":
        return frozenset(
            _dumps(n)[len(key)]
            for n in _remaining(node, seen)
            if _dumps(n).startswith(key) and len(_dumps(n)) > len(key)
        )
    if phase == "colon":
        return frozenset(":")
    chars = frozenset("}") if node.required <= seen else frozenset()
    return chars | frozenset(",") if node.extra is not None or _remaining(node, seen) else chars


def _ending(frame: Frame) -> State | None:
    """What replaces `frame` when it may end here (None: it may not)."""
    kind = frame[0]
    if kind == "W":
        return ()
    if kind == "N":
        return () if _NUMBER[frame[2]][1] else None
    if kind == "A":
        _, options, buf, conts = frame
        return conts[options.index(buf)] if buf in options else None
    return None


_ANY = _leaf("any")
_ANY_OBJECT = _object({})


def compile_constraint(constraint: DecodingConstraint) -> Grammar:
    """The grammar of a constraint, started past its written opening."""
    state: State = (("L", constraint.after, 0),) if constraint.after else ()
    if constraint.tools:
        names = tuple(json.dumps(t.name) for t in constraint.tools)
        conts = tuple(
            (("L", "}", 0), ("V", _arguments(t.parameters)), ("L", ', "arguments": ', 0))
            for t in constraint.tools
        )
        state += (("A", names, "", conts), ("L", '{"name": ', 0))
    else:
        state += (("V", compile_schema(constraint.schema) if constraint.schema is not None else _ANY_OBJECT),)
    grammar = Grammar(state)
    started = grammar.walk(state, constraint.written)
    if started is None:
        raise ConstraintError(f"the constraint's written opening {constraint.written!r} does not fit it")
    grammar.start = started
    return grammar


def out_of_reach(constraint: DecodingConstraint, room: int, vocab: Vocabulary) -> list[tuple[str, int]]:
    """The tools of `constraint` that a forced call never starts with `room` tokens left after
    its first, each with the characters its shortest call takes. The guide lets a token through
    only where the call can still end in time, counting a character a token, and past the room
    only one that brings the end nearer: at the fork between tools, one whose shortest call is
    longer than the others' by more than its first token covers is never drawn, whatever the
    model prefers, and the caller should hear that (more room, or a shorter name)."""
    if not constraint.tools or len(constraint.tools) < 2:
        return []  # one tool, or none: nothing else could be drawn in its place
    full = compile_constraint(constraint)
    out = []
    for tool in constraint.tools:
        try:
            one = compile_constraint(msgspec.structs.replace(constraint, tools=[tool]))
        except ConstraintError:
            continue  # its opening is another tool's (a named tool_choice): not this one
        text = _shortest_text(one)
        if not _reaches(full, text, vocab, room):
            out.append((tool.name, len(text)))
    return out


def _shortest_text(grammar: Grammar) -> str:
    """The shortest text that `grammar` takes whole."""
    state, chars = grammar.start, []
    for _ in range(grammar.closing(grammar.start)):
        if not state:
            break
        options = grammar.chars(state)
        best = None
        for c in sorted(options) if options is not None else ['"']:
            after = grammar.step(state, c)
            if after is not None and (best is None or grammar.closing(after) < grammar.closing(best[1])):
                best = (c, after)
        if best is None:
            break
        chars.append(best[0])
        state = best[1]
    return "".join(chars)


def _reaches(grammar: Grammar, text: str, vocab: Vocabulary, room: int) -> bool:
    """Whether the guide over `grammar` lets `text` be written, each token the longest of the
    vocabulary that `text` goes on with (the one that brings the end nearest), one fewer token
    of room after each: the rule of `allowed`."""
    state: State | None = grammar.start
    i = 0
    while i < len(text) and state:
        bound = max(room, grammar.closing(state))
        for k in range(min(vocab.longest, len(text) - i), 0, -1):
            piece = text[i : i + k]
            if piece in vocab.by_text:
                after = grammar.walk(state, piece)
                if after is not None and grammar.closing(after) + 1 <= bound:
                    break
        else:
            return False
        state, i, room = after, i + k, room - 1
    return True


def _arguments(parameters: object) -> Node:
    node = compile_schema(parameters)
    return node if node.kind == "object" else _ANY_OBJECT


# --- tokens --------------------------------------------------------------------------------


class Vocabulary:
    """A tokenizer's token texts, read once: sorted, so that the tokens starting with a text are
    one range. Tokens whose text is not whole characters (a byte of a longer one), empty, or an
    added token's (`<tool_call>`, `<|im_end|>`) are kept apart: added ones are taken only where
    their whole text is a literal the grammar expects, the others never."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, size: int) -> None:
        count = min(len(tokenizer), size)
        texts = tokenizer.batch_decode([[i] for i in range(count)], skip_special_tokens=False)
        added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        self.added = [(i, texts[i]) for i in sorted(added) if i < count and texts[i]]
        kept = [i for i in range(count) if i not in added and texts[i] and "\ufffd" not in texts[i]]
        kept.sort(key=texts.__getitem__)
        self.size = size
        self.text = {i: texts[i] for i in range(count)}
        self.ids = np.asarray(kept, dtype=np.int64)
        self.sorted = [texts[i] for i in kept]
        # Inside a string: the tokens of plain characters only, and those whose first character
        # that is not plain is a quote or a backslash (the only others a string takes).
        first_special = [next((k for k, c in enumerate(t) if not plain(c)), len(t)) for t in self.sorted]
        self.plain_ids = self.ids[[k == len(t) for k, t in zip(first_special, self.sorted, strict=True)]]
        self.quoted = [
            (int(self.ids[j]), t[k:])
            for j, (k, t) in enumerate(zip(first_special, self.sorted, strict=True))
            if k < len(t) and t[k] in '"\\'
        ]
        # For `out_of_reach`: each text a token writes, added tokens' too.
        self.by_text = {texts[i]: i for i in kept} | {text: i for i, text in self.added}
        self.longest = max(map(len, self.by_text), default=1)


def allowed(
    grammar: Grammar, vocab: Vocabulary, state: State, room: int, stops: Sequence[int]
) -> list[int] | np.ndarray:
    """The tokens that may come after `state` with `room` tokens left after this one: those
    that keep the reply completable in time (and a stop token once it is complete)."""
    if not state:
        return list(stops)
    bound = max(room, grammar.closing(state))  # past the room: a token that brings the end nearer

    def fits(after: State | None) -> bool:
        return after is not None and (grammar.closing(after) + 1 <= bound if after else bound >= 1)

    found: list[np.ndarray | int] = []
    if grammar.chars(state) is None:  # a string body: plain tokens keep the state as it is
        if fits(state):
            found.append(vocab.plain_ids)
        ends: dict[str, bool] = {}
        for token, tail in vocab.quoted:
            ok = ends.get(tail)
            if ok is None:
                ok = ends[tail] = fits(grammar.walk(state, tail))
            if ok:
                found.append(token)
    else:
        _search(grammar, vocab, state, "", 0, len(vocab.sorted), fits, found)
        if state[-1][0] == "L":
            found += [i for i, text in vocab.added if fits(grammar.walk(state, text))]
    if not found:
        return []
    arrays = [f for f in found if isinstance(f, np.ndarray)]
    singles = np.asarray([f for f in found if not isinstance(f, np.ndarray)], dtype=np.int64)
    return np.concatenate([*arrays, singles]) if arrays else singles


def _search(
    grammar: Grammar,
    vocab: Vocabulary,
    state: State,
    prefix: str,
    lo: int,
    hi: int,
    fits: Callable[[State | None], bool],
    found: list[np.ndarray | int],
) -> None:
    """Add the tokens in sorted[lo:hi] (all starting with `prefix`, which led to `state`) that
    the grammar takes from `state`."""
    texts = vocab.sorted
    depth = len(prefix)
    while lo < hi and len(texts[lo]) == depth:
        if depth and fits(state):
            found.append(int(vocab.ids[lo]))
        lo += 1
    if lo >= hi or not state:
        return
    chars = grammar.chars(state)
    if chars is None:  # a string body in the middle of a token: read the rest of each
        for j in range(lo, hi):
            if fits(grammar.walk(state, texts[j][depth:])):
                found.append(int(vocab.ids[j]))
        return
    for c in sorted(chars):
        start = bisect.bisect_left(texts, prefix + c, lo, hi)
        end = bisect.bisect_left(texts, prefix + chr(ord(c) + 1), start, hi)
        if start < end:
            after = grammar.step(state, c)
            if after is not None:
                _search(grammar, vocab, after, prefix + c, start, end, fits, found)


class Guide:
    """One row's constraint as it decodes: the tokens it allows next, and its state after each."""

    def __init__(self, grammar: Grammar, vocab: Vocabulary, stops: Sequence[int]) -> None:
        self.grammar = grammar
        self.vocab = vocab
        self.stops = list(stops)
        self.state: State | None = grammar.start

    def allowed(self, room: int) -> list[int] | np.ndarray:
        """The tokens allowed next, `room` tokens left after it; never none (stop tokens when the
        reply cannot go on, so it ends and is refused upstream rather than run on unconstrained)."""
        if self.state is None:
            return self.stops
        found = allowed(self.grammar, self.vocab, self.state, room, self.stops)
        if len(found) == 0 and room < 1 << 30:
            found = allowed(self.grammar, self.vocab, self.state, 1 << 30, self.stops)
        return found if len(found) else self.stops

    def advance(self, token: int) -> None:
        if self.state is None or token in self.stops:
            self.state = None
            return
        self.state = self.grammar.walk(self.state, self.vocab.text.get(token, "\ufffd"))


def masked(logits: torch.Tensor, guides: Mapping[int, Guide], rooms: Mapping[int, int]) -> torch.Tensor:
    """`logits` [rows, vocab] with the tokens each guided row may not draw set to -inf (a copy;
    the rows without a guide as they are)."""
    out = logits.clone()
    for row, guide in guides.items():
        keep = torch.as_tensor(np.asarray(guide.allowed(rooms[row]), dtype=np.int64), device=logits.device)
        if not len(keep):  # complete, and the request stops on strings only: nothing to mask by
            continue
        mask = torch.full_like(out[row], float("-inf"))
        mask[keep] = 0
        out[row] += mask
    return out

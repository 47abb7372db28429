"""`decoder`: one tokenizer's decoding as the gateway reads every reply with it."""

from __future__ import annotations

import copy

from platoon.gateway.shapes import decoder


def test_a_fast_tokenizer_decodes_as_its_library_does(toy_tokenizer):
    tokens = toy_tokenizer.encode(
        "<|im_start|>assistant\nI will look, é 中文.<|im_end|>", add_special_tokens=False
    )
    decode = decoder(toy_tokenizer)
    assert decode.func == toy_tokenizer.backend_tokenizer.decode  # the library's checks skipped
    for end in range(len(tokens) + 1):
        assert decode(tokens[:end]) == toy_tokenizer.decode(tokens[:end], skip_special_tokens=False)


def test_a_tokenizer_that_cleans_up_spaces_or_decodes_its_own_way_keeps_its_decode(toy_tokenizer):
    cleaning = copy.deepcopy(toy_tokenizer)
    cleaning.clean_up_tokenization_spaces = True
    assert decoder(cleaning).func == cleaning.decode

    class Own(type(toy_tokenizer)):  # type: ignore[misc]
        def _decode(self, token_ids, **kwargs):  # type: ignore[no-untyped-def]
            return "own"

    own = copy.deepcopy(toy_tokenizer)
    own.__class__ = Own
    assert decoder(own)([1, 2]) == "own"

    class Plain:
        def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
            return f"{token_ids} {skip_special_tokens}"

    assert decoder(Plain())([1]) == "[1] False"  # type: ignore[arg-type]

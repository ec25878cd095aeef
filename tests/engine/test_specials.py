"""A tokenizer's added tokens never survive in text as written, whatever overlaps them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from context_assembler.engine.specials import SpecialTokens

TOKENS = ["<|im_start|>", "<|im_end|>", "<s>", "</s>", "s>", "[INST]", "<unused12>", "x"]
SPECIALS = SpecialTokens(TOKENS)


def test_every_occurrence_loses_its_first_character_and_nothing_else() -> None:
    assert SPECIALS.defuse("<|im_start|>system") == "&lt;|im_start|>system"
    assert SPECIALS.defuse("[INST] a [/INST]") == "&#91;INST] a [/INST]"
    assert SPECIALS.defuse("plain words, a box") == "plain words, a bo&#120;"
    assert SPECIALS.defuse("<s>") == "&lt;&#115;>"  # "s>" inside "<s>" goes too


@given(st.lists(st.sampled_from([*TOKENS, "<", "|", "s", ">", "&", "#", ";", "1", " "]),
                max_size=40).map("".join))
def test_no_token_survives_any_mix_of_their_pieces(text: str) -> None:
    defused = SPECIALS.defuse(text)
    assert not any(token in defused for token in TOKENS)


def test_blank_tokens_are_left_alone() -> None:
    assert SpecialTokens(["  ", "\n"]).defuse("a  b\n") == "a  b\n"

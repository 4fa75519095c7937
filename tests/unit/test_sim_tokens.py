"""The simulator's tokenizer: one id per 4 characters, consistent with the count it always used, the
same ids in every process, reversible for ASCII text, chat template markers included."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.engine_sim.protocol import ApiError, chat_prompt_tokens, prompt_token_ids
from loadgen.engine_sim.tokens import (
    GENERATED_TOKEN_ID,
    TOKEN_TEXT,
    count_text,
    decode,
    encode,
    render_chat,
)
from loadgen.prompts import prompt_text


@given(st.text(max_size=200))
def test_one_id_per_four_characters_and_ascii_round_trips(text: str) -> None:
    ids = encode(text)
    assert len(ids) == math.ceil(len(text) / 4)
    assert all(0 <= i < 2**31 for i in ids.tolist())
    if text.isascii():
        assert decode(ids.tolist()) == text
    assert encode(text).tolist() == ids.tolist()  # deterministic


def test_ids_are_fixed_across_processes() -> None:
    # crc32 (not Python's salted str hash) for non-ASCII chunks; bit packing for ASCII ones
    assert encode("abcd").tolist() == [97 | 98 << 7 | 99 << 14 | 100 << 21 | 3 << 28]
    assert encode("é").tolist() == [2**30 + zlib.crc32("é".encode()) % 2**30]
    assert decode(encode("é").tolist()) == "\ufffd"
    assert encode(TOKEN_TEXT).tolist() == [GENERATED_TOKEN_ID]


def test_loadgen_prompts_are_one_token_per_word() -> None:
    text = prompt_text(300, salt=5)
    ids = encode(text)
    assert len(ids) == 300 == count_text(text)
    assert decode(ids.tolist()[:3]) == text[:12]


@pytest.mark.parametrize(
    ("add_gen", "cont", "rendered"),
    [
        (True, False, "<|system|>\nbe\n<|user|>\nhi\n<|assistant|>\n"),
        (False, False, "<|system|>\nbe\n<|user|>\nhi\n"),
        (True, True, "<|system|>\nbe\n<|user|>\nhi"),
    ],
    ids=["generation-prompt", "no-generation-prompt", "continue-final-message"],
)
def test_chat_template(add_gen: bool, cont: bool, rendered: str) -> None:
    msgs = [
        {"role": "system", "content": "be"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    text = render_chat(msgs, add_generation_prompt=add_gen, continue_final_message=cont)
    assert text == rendered
    body = {"messages": msgs, "add_generation_prompt": add_gen, "continue_final_message": cont}
    ids = prompt_token_ids("chat", body)
    assert ids is not None
    assert ids.tolist() == encode(rendered).tolist()
    if add_gen and not cont:
        assert chat_prompt_tokens(msgs) == len(ids)


def test_completion_prompts_as_text_or_ids() -> None:
    assert prompt_token_ids("completion", {"prompt": ["abcdefgh"]}) is not None
    ids = prompt_token_ids("completion", {"prompt": [[5, 6, 7]]})
    assert ids is not None
    assert ids.dtype == np.int64
    assert ids.tolist() == [5, 6, 7]
    assert prompt_token_ids("completion", {"prompt": ""}) is None
    with pytest.raises(ApiError):
        prompt_token_ids("completion", {"prompt": [1, -2]})

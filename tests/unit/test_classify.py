"""The probe classifier on every real vLLM sample and on hand-made edge cases."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sparkd.core.reading.classify import (
    classify_failure,
    classify_response,
    classify_stream,
    garbled,
)

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples"


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


@pytest.mark.parametrize(
    ("name", "outcome", "tokens", "finish"),
    [
        ("vllm-chat-reasoning-only.json", "reasoning_only", 50, "length"),
        ("vllm-chat-reasoning-only-legacy.json", "reasoning_only", 50, "length"),
        ("vllm-chat-reasoning-content-only.json", "reasoning_only", 50, "length"),
        ("vllm-chat-answer.json", "answer", 63, "stop"),
    ],
)
def test_real_samples(name: str, outcome: str, tokens: int, finish: str) -> None:
    verdict = classify_response(200, sample(name))
    assert verdict.outcome == outcome
    assert verdict.healthy is True
    assert verdict.completion_tokens == tokens
    assert verdict.finish_reason == finish


def test_real_stream_sample_is_reasoning_only() -> None:
    lines = sample("vllm-chat-stream-reasoning.txt").decode().splitlines()
    verdict = classify_stream(200, lines)
    assert verdict.outcome == "reasoning_only"
    assert verdict.completion_tokens == 50
    assert verdict.finish_reason == "length"
    assert verdict.detail.startswith("Okay, the user wants")


def test_the_real_answer_reads_alike_streamed_and_plain() -> None:
    # The same request to a real vLLM 0.32.0, both ways. Streamed, its thought comes a token a
    # chunk, one of them only whitespace: it is part of the text, as it is in the plain answer.
    plain = classify_response(200, sample("vllm-real-chat-probe.json"))
    lines = sample("vllm-real-chat-stream-include-usage.txt").decode().splitlines()
    streamed = classify_stream(200, lines)
    assert streamed.outcome == plain.outcome == "reasoning_only"
    assert streamed.detail == plain.detail


def test_a_blank_reasoning_field_gives_way_to_the_other_ones_text() -> None:
    lines = [
        chunk({"reasoning": "", "reasoning_content": "Okay,"}),
        chunk({"reasoning": "\n\n"}),
        chunk({"reasoning": " ", "reasoning_content": "the"}),
        chunk({"reasoning": " user"}, finish="length"),
        'data: {"choices": [], "usage": {"completion_tokens": 4}}',
        "data: [DONE]",
    ]
    verdict = classify_stream(200, lines)
    assert (verdict.outcome, verdict.detail) == ("reasoning_only", "Okay, the user")


def response(message: dict[str, Any], tokens: int | None = 50, finish: str = "length") -> str:
    body: dict[str, Any] = {
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
        ],
    }
    if tokens is not None:
        body["usage"] = {
            "prompt_tokens": 16,
            "completion_tokens": tokens,
            "total_tokens": 16 + tokens,
        }
    return json.dumps(body)


EDGE_CASES = [
    (
        "blank_content_is_absent",
        response({"content": "   \n", "reasoning": "Thinking."}),
        "reasoning_only",
    ),
    (
        "empty_string_content_with_reasoning",
        response({"content": "", "reasoning": "Hm."}),
        "reasoning_only",
    ),
    (
        "tool_calls_are_an_answer",
        response({"content": None, "tool_calls": [{"id": "c1", "type": "function"}]}),
        "answer",
    ),
    (
        "empty_tool_calls_list_is_not",
        response({"content": None, "tool_calls": []}, tokens=0),
        "empty",
    ),
    ("no_content_no_reasoning", response({"content": None}, tokens=0), "empty"),
    ("blank_reasoning_is_absent", response({"content": None, "reasoning": "  "}), "empty"),
    (
        "reasoning_with_zero_tokens_is_inconsistent",
        response({"content": None, "reasoning": "x y"}, tokens=0),
        "malformed",
    ),
    (
        "reasoning_without_usage",
        response({"content": None, "reasoning": "Okay"}, tokens=None),
        "reasoning_only",
    ),
    ("garbled_content", response({"content": "!!!!!!!!!!!!!!!!!!!!"}), "garbled"),
    ("garbled_reasoning", response({"content": None, "reasoning": "!" * 30}), "garbled"),
    ("garbled_repeated_token", response({"content": "the the the the the the the"}), "garbled"),
    ("short_answer_is_not_garbled", response({"content": "Hi!"}, finish="stop"), "answer"),
    ("not_json", "<html>502 Bad Gateway</html>", "malformed"),
    ("truncated_json", '{"choices": [{"message": {"content": "Hel', "malformed"),
    ("json_array", "[]", "malformed"),
    ("no_choices", json.dumps({"object": "chat.completion", "choices": []}), "malformed"),
    ("choice_without_message", json.dumps({"choices": [{"index": 0}]}), "malformed"),
]


@pytest.mark.parametrize(("name", "body", "outcome"), EDGE_CASES, ids=[c[0] for c in EDGE_CASES])
def test_edge_cases(name: str, body: str, outcome: str) -> None:
    assert classify_response(200, body).outcome == outcome


@pytest.mark.parametrize("status", [400, 401, 404, 500, 503])
def test_non_2xx_is_http_error(status: int) -> None:
    verdict = classify_response(status, sample("vllm-chat-answer.json"))
    assert verdict.outcome == "http_error"
    assert verdict.healthy is False
    assert f"HTTP {status}" in verdict.detail


@pytest.mark.parametrize(
    ("outcome", "healthy"), [("refused", False), ("timeout", False), ("not_run", None)]
)
def test_transport_failures(outcome: str, healthy: bool | None) -> None:
    verdict = classify_failure(outcome, "x")  # type: ignore[arg-type]
    assert verdict.outcome == outcome
    assert verdict.healthy is healthy


def test_transport_failure_rejects_response_outcomes() -> None:
    with pytest.raises(ValueError):
        classify_failure("answer")


def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return "data: " + json.dumps(
        {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    )


def test_stream_with_content_and_legacy_field() -> None:
    lines = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Let me think."}),
        chunk({"content": "Hello there!"}, finish="stop"),
        'data: {"choices": [], "usage": {"completion_tokens": 9}}',
        "data: [DONE]",
    ]
    verdict = classify_stream(200, lines)
    assert (verdict.outcome, verdict.completion_tokens, verdict.finish_reason) == (
        "answer",
        9,
        "stop",
    )


def test_stream_without_done_is_malformed() -> None:
    assert classify_stream(200, [chunk({"content": "Hel"})]).outcome == "malformed"


def test_stream_bad_chunk_is_malformed() -> None:
    assert classify_stream(200, ["data: {oops", "data: [DONE]"]).outcome == "malformed"


def test_stream_http_error() -> None:
    assert classify_stream(500, []).outcome == "http_error"


LONG_REASONING = (
    "Okay, the user wants me to say hello in one sentence. That's simple enough, but let me "
    "think about what a good greeting looks like. It should be friendly and complete, and it "
    "must be exactly one sentence, so no second clause after a full stop. Something like "
    '"Hello there, it\'s nice to meet you!" would work. Should I add a question, such as '
    "asking how they are? That might turn it into two sentences if I'm not careful: \"Hello! "
    'How are you?" is two. I could write "Hello, how are you doing today?" instead, which '
    "is one sentence with a question mark. Wait, the instruction says to say hello, not to ask "
    "anything, so a plain greeting is closer to what was asked. Let me also check there are no "
    "hidden constraints: no language was given, so English is fine; no length limit beyond one "
    "sentence; no format such as JSON or a list. Edge cases: an emoji is fine but unnecessary. "
    "1, 2, 3: greet, keep it short, stop. So the final answer: \"Hello there, it's nice to "
    'meet you!" That is one sentence, friendly, and it says hello. Done.'
)

NOT_GARBLED = [
    ("number", "4"),
    ("city", "Paris."),
    ("yes", "Yes"),
    ("greeting", "Hello! It's nice to meet you."),
    ("short_exclamation", "Hi!!!"),
    ("counting", "1, 2, 3, 4, 5"),
    ("counting_to_twenty", ", ".join(str(i) for i in range(1, 21))),
    ("eight_zeros", "[0, 0, 0, 0, 0, 0, 0, 0]"),
    ("code", "```python\ndef add(a, b):\n    return a + b\n\nprint(add(2, 2))\n```"),
    ("markdown_table", "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |"),
    ("list", "- apples\n- pears\n- plums\n- figs"),
    ("multilingual", "Hello: Hola, Bonjour, Привет, 你好, مرحبا, नमस्ते, γειά σου, שלום."),
    ("japanese", "東京は日本の首都です。大阪は日本で二番目に大きい都市です。"),
    ("math", "Let x = 2. Then x^2 = 4, x^3 = 8 and x^4 = 16, so x^4 - x^3 = 8."),
    ("long_reasoning", LONG_REASONING),
]

GARBLED = [
    ("bangs", "!" * 50),
    ("bangs_with_newlines", "!!!!\n" * 10),
    ("unk_tokens", "<unk>" * 20),
    ("unk_tokens_spaced", " ".join(["<unk>"] * 20)),
    ("alternating", "!?" * 25),
    ("im_start", "<|im_start|>" * 20),
    ("im_start_lines", "<|im_start|>\n" * 20),
    ("one_word", "the " * 12),
    ("digits", "0" * 40),
    ("after_a_good_start", "Hello there! " + "!" * 40),
    ("soup", "ŝ丂ضψजกЖ𝔸ᚠᎠǂਫཀᐁꀀሀ߈ⴰꗀᏣ"),
    ("soup_with_spaces", "ŝ 丂 ض ψ ज ก Ж 𝔸 ᚠ Ꭰ ǂ ਫ ཀ ᐁ ꀀ ሀ ߈ ⴰ ꗀ Ꮳ ק"),
]


@pytest.mark.parametrize(("name", "text"), NOT_GARBLED, ids=[c[0] for c in NOT_GARBLED])
def test_real_text_is_not_garbled(name: str, text: str) -> None:
    assert garbled(text) is None
    verdict = classify_response(200, response({"content": text}, finish="stop"))
    assert verdict.outcome == "answer", verdict.detail
    reasoning = classify_response(200, response({"content": None, "reasoning": text}))
    assert reasoning.outcome == "reasoning_only", reasoning.detail


@pytest.mark.parametrize(("name", "text"), GARBLED, ids=[c[0] for c in GARBLED])
@pytest.mark.parametrize("field", ["content", "reasoning", "reasoning_content"])
def test_garbled_in_any_field(name: str, text: str, field: str) -> None:
    message: dict[str, Any] = {"content": None, field: text}
    verdict = classify_response(200, response(message))
    assert verdict.outcome == "garbled", verdict.detail
    assert verdict.healthy is False
    assert verdict.detail.startswith("reasoning" if field != "content" else "content")


@pytest.mark.parametrize(("name", "text"), GARBLED[:3], ids=[c[0] for c in GARBLED[:3]])
def test_garbled_text_next_to_a_good_field(name: str, text: str) -> None:
    # A broken kernel garbles whatever it emits: garbage thinking beside a sane answer still is.
    garbled_reasoning = response({"content": "Hello!", "reasoning": text}, finish="stop")
    assert classify_response(200, garbled_reasoning).outcome == "garbled"
    garbled_content = response({"content": text, "reasoning": LONG_REASONING})
    assert classify_response(200, garbled_content).outcome == "garbled"


def test_garbled_stream() -> None:
    lines = [chunk({"role": "assistant", "content": ""})]
    lines += [chunk({"reasoning": "<unk>"}) for _ in range(30)]
    lines += [chunk({}, finish="length"), "data: [DONE]"]
    assert classify_stream(200, lines).outcome == "garbled"


def test_real_samples_are_not_garbled() -> None:
    for name in (
        "vllm-chat-reasoning-only.json",
        "vllm-chat-reasoning-only-legacy.json",
        "vllm-chat-reasoning-content-only.json",
        "vllm-chat-answer.json",
    ):
        message = json.loads(sample(name))["choices"][0]["message"]
        for field in ("content", "reasoning", "reasoning_content"):
            assert garbled(message.get(field) or "") is None, (name, field)


# Units as a broken kernel repeats them: any printable characters but blanks, 1-12 of them.
UNITS = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")),
    min_size=1,
    max_size=12,
).filter(lambda u: u.strip() == u and "".join(u.split()) == u)


NOISE = string.printable + "éüßøЖжψ丂ضज"


@given(unit=UNITS, repeats=st.integers(3, 60), noise=st.data())
def test_any_short_unit_repeated_over_most_of_the_text_is_garbled(
    unit: str, repeats: int, noise: st.DataObject
) -> None:
    block = unit * repeats
    assume(len(block) >= 20)
    # Anything before and after, as long as the repetition stays at least 60% of the text.
    room = len(block) * 2 // 3
    before = noise.draw(st.text(NOISE, max_size=room), label="before")
    after = noise.draw(st.text(NOISE, max_size=room - len(before)), label="after")
    assert garbled(before + block + after) is not None


SENTENCES = [
    "Hello there, it's nice to meet you!",
    "The capital of France is Paris.",
    "Okay, the user wants me to say hello in one sentence.",
    "That's simple, but let me make sure it is exactly one sentence.",
    "Two plus two is 4.",
    "Here is a list: apples, pears, plums and figs.",
    "def add(a, b): return a + b",
    "Wait, should I ask a question as well?",
    "No, a plain greeting is closer to what was asked.",
    "Le chat est sur la table.",
    "Привет, как дела?",
    "東京は日本の首都です。",
    "Numbers: 1, 2, 3, 4, 5.",
    "Yes.",
]


# Each sentence at most once: a few sentences said over and over are a loop, not language.
@given(st.lists(st.sampled_from(SENTENCES), min_size=1, unique=True), st.sampled_from([" ", "\n"]))
def test_natural_text_is_not_garbled(sentences: list[str], joiner: str) -> None:
    assert garbled(joiner.join(sentences)) is None


SCRIPTS = [
    "abcdefghijklmnopqrstuvwxyz",
    "абвгдежзиклмнопрстуфхцчшщ",
    "αβγδεζηθικλμνξοπρστυφχψω",
    "丂丄丅丆万丈三上下丌不与丏丐丑丒专且丕世丘丙业丛东",
    "ابتثجحخدذرزسشصضطظعغفقكلمن",
    "अआइईउऊऋएऐओऔकखगघङचछजझञटठडढण",
    "กขฃคฅฆงจฉชซฌญฎฏฐฑฒณดตถทธนบปผ",
    "אבגדהוזחטיכלמנסעפצקרשת",
]


@given(st.data(), st.integers(20, 80))
def test_a_soup_of_scripts_is_garbled(data: st.DataObject, size: int) -> None:
    # Random letters, each from another script than the one before, at least four scripts.
    order = data.draw(st.permutations(range(len(SCRIPTS))), label="first scripts")
    picks = list(order[:4])
    while len(picks) < size:
        step = data.draw(st.integers(1, len(SCRIPTS) - 1))
        picks.append((picks[-1] + step) % len(SCRIPTS))
    letters = [data.draw(st.sampled_from(SCRIPTS[i])) for i in picks]
    assert garbled("".join(letters)) is not None


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["choices", "delta", "content", "usage", "finish_reason", "x"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(JSON_VALUES, max_size=4))
def test_any_stream_chunks_classify_as_a_counted_verdict(chunks: list[object]) -> None:
    lines = [f"data: {json.dumps(c)}" for c in chunks] + ["data: [DONE]"]
    got = classify_stream(200, lines)
    assert got.outcome != "not_run"
    assert got.healthy is not None


@pytest.mark.parametrize("status", [401, 403])
def test_an_auth_failure_body_is_never_kept(status: int) -> None:
    # A proxy that echoes the request back, the key in a form no redactor is sure to know.
    body = '{"error": "bad key c2stc2VydmVkLTEy%2BNDM0%3D for Bearer"}'
    verdict = classify_response(status, body)
    assert verdict.outcome == "http_error" and str(status) in verdict.detail
    assert "c2st" not in verdict.detail and "Bearer" not in verdict.detail

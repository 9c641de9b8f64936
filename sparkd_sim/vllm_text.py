"""What the simulated reasoning model "says", token by token.

A real model at temperature 0 answers the same prompt the same way, so the simulated one does too:
the text is fixed and only its length depends on the request. Tokens are word pieces (a word with
its leading space, or one punctuation mark), close enough to a BPE tokenizer that counts and
streamed deltas look like the real thing (`"Okay"`, `", the user"`, `" wants"`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Channel = Literal["reasoning", "content", "control"]
"""Where a generated token ends up: the reasoning field, the content field, or nowhere
(`</think>`, end-of-sequence: counted in completion_tokens but never shown)."""

AnswerStyle = Literal[
    "reasoning_only",
    "answer",
    "empty",
    "malformed",
    "http_500",
    "garbled",
    "slow",
    "busy",
    "no_answer",
    "stray_think",
]
FinishReason = Literal["stop", "length"]

ANSWER_TEXT = "Hello! It's nice to meet you."

_OPENING = (
    "Okay, the user wants me to say hello in one sentence. That's simple. I should produce a "
    "friendly greeting that is exactly one sentence long. Something like \"Hello there, it's nice "
    'to meet you!" would work. Let me check the constraints again: one sentence, a greeting, '
    "nothing else. Should I add an emoji? Probably not, the request is plain. I also want to avoid "
    "a follow-up question, since that would make it two sentences."
)
# A thinking model with budget left keeps weighing drafts; cycling through these keeps the text
# varied (never one repeated token, which would read as a broken kernel) for any max_tokens.
_DRAFTS = (
    "Hello there, it's nice to meet you!",
    "Hi, and welcome!",
    "Hello, I hope you are having a great day!",
    "Greetings, it is a pleasure to say hello!",
    "Hello from me, nice to meet you!",
)
_REVIEW = (
    ' Let me weigh draft {n}: "{draft}" It is one sentence and friendly, but is it the most '
    "natural choice? Maybe, though I could still compare it with the others."
)
_ANSWER_REASONING = "The user wants a one-sentence greeting. A warm, simple hello will do."

# The reasoning closer, as text: a model that spells it in pieces rather than as its one added
# token leaves it (and all after it) in `reasoning` when streamed; see `stray_think`.
THINK_END = "</think>"

_TOKEN_RE = re.compile(r"\s*[A-Za-z0-9']+|\s*[^\sA-Za-z0-9']")


@dataclass(frozen=True)
class Token:
    channel: Channel
    text: str


@dataclass(frozen=True)
class Generation:
    """Everything one completion produces, decided up front (temperature 0)."""

    tokens: tuple[Token, ...]
    finish_reason: FinishReason

    @property
    def reasoning(self) -> str | None:
        return _joined(self.tokens, "reasoning")

    @property
    def content(self) -> str | None:
        return _joined(self.tokens, "content")

    def parsed(self) -> tuple[str | None, str | None]:
        """(reasoning, content) as vLLM 0.32's non-streaming qwen3 path returns them: it hands
        the reasoning parser the text alone (vllm/parser/abstract_parser.py, `DelegatingParser.
        parse`, line 841), whose lexer ends reasoning at the first `</think>` in it and drops a
        later one (vllm/parser/qwen3.py lines 130-139). Streamed, the closer is matched by token
        id only (vllm/parser/engine/streaming_parser_engine.py line 359): the tokens' own
        channels stand (tests/fixtures/vllm-parser)."""
        reasoning, content = self.reasoning, self.content
        if reasoning is None or THINK_END not in reasoning:
            return reasoning, content
        before, _, after = reasoning.partition(THINK_END)
        after = after.replace(THINK_END, "") + (content or "")
        return before or None, after or None


def _joined(tokens: Sequence[Token], channel: Channel) -> str | None:
    parts = [t.text for t in tokens if t.channel == channel]
    return "".join(parts) if parts else None


def tokenize(text: str) -> list[str]:
    """Split text into word-piece tokens; joining them gives the text back (minus stray
    trailing whitespace)."""
    return _TOKEN_RE.findall(text)


def _reasoning_stream() -> Iterator[str]:
    yield from tokenize(_OPENING)
    for n in itertools.count(1):
        draft = _DRAFTS[(n - 1) % len(_DRAFTS)]
        yield from tokenize(_REVIEW.format(n=n, draft=draft))


@lru_cache(maxsize=8)
def reasoning_tokens(count: int) -> tuple[str, ...]:
    """The first `count` tokens of the model's chain of thought."""
    return tuple(itertools.islice(_reasoning_stream(), count))


def _message_text(message: object) -> str:
    if not isinstance(message, Mapping):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def prompt_tokens(messages: Sequence[object]) -> int:
    """Prompt length after the chat template: each message's text plus ~5 template tokens
    (`<|im_start|>user\\n ... <|im_end|>\\n`), plus ~5 for the assistant turn and `<think>`.
    Gives 16 for the seed's one-line prompt, as the real server reported."""
    return sum(len(tokenize(_message_text(m))) + 5 for m in messages) + 5


def plan_generation(style: AnswerStyle, max_tokens: int) -> Generation:
    """The tokens a completion of `style` produces within `max_tokens`.

    Styles that only change timing or transport (`slow`, `busy`, `malformed`, `http_500`)
    generate like `reasoning_only`: the seed's case of a budget spent entirely on thinking.
    """
    if style == "answer":
        script = [
            *(Token("reasoning", t) for t in tokenize(_ANSWER_REASONING)),
            Token("control", ""),  # </think>
            *(Token("content", t) for t in tokenize(ANSWER_TEXT)),
            Token("control", ""),  # end of sequence
        ]
        return _within_budget(script, max_tokens)
    if style == "empty":
        # The model closes its turn at once: one end-of-sequence token and no text at all.
        return _within_budget([Token("control", "")], max_tokens)
    if style == "no_answer":
        # A reasoning parser or chat template that never hands over to content: the model
        # thinks, closes its turn within budget, and the answer lands in `reasoning` too.
        script = [
            *(Token("reasoning", t) for t in tokenize(_ANSWER_REASONING)),
            *(Token("reasoning", t) for t in tokenize(ANSWER_TEXT)),
            Token("control", ""),  # end of sequence
        ]
        return _within_budget(script, max_tokens)
    if style == "stray_think":
        # The model spells `</think>` in pieces instead of its one added token, then answers:
        # streamed, all of it stays in `reasoning` (Generation.parsed for the other way).
        script = [
            *(Token("reasoning", t) for t in tokenize(_ANSWER_REASONING)),
            *(Token("reasoning", t) for t in ("</", "think", ">", "\n\n")),
            *(Token("reasoning", t) for t in tokenize(ANSWER_TEXT)),
            Token("control", ""),  # end of sequence
        ]
        return _within_budget(script, max_tokens)
    if style == "garbled":
        # A broken tensor-parallel or FP4 kernel emits one token over and over until the budget.
        return Generation(tuple(Token("content", "!") for _ in range(max_tokens)), "length")
    return Generation(tuple(Token("reasoning", t) for t in reasoning_tokens(max_tokens)), "length")


def _within_budget(script: Sequence[Token], max_tokens: int) -> Generation:
    if len(script) <= max_tokens:
        return Generation(tuple(script), "stop")
    return Generation(tuple(script[:max_tokens]), "length")

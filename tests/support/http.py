"""A client of a running daemon's HTTP API: its JSON, its control token, its /metrics."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "s3cret-token-value"


def token_file(path: Path) -> Path:
    """`path`, holding TOKEN as a daemon's control_token_file reads it."""
    path.write_text(TOKEN + "\n")
    return path


async def get(url: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.json()


async def post(url: str, body: object = None, token: str | None = TOKEN) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as r:
        return r.status, await r.text()


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


async def fetch(url: str, accept: str | None = None) -> tuple[str, str]:
    headers = {"Accept": accept} if accept else {}
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        assert r.status == 200
        return r.headers["Content-Type"], await r.text()


async def scraped(url: str, name: str, **labels: str) -> float | None:
    """The value of one series in the /metrics at `url` (None where it is not exported)."""
    _, text = await fetch(url)
    return value(parse(text), name, **labels)

"""`docker images`, `docker image inspect` and the IDs tags point at on a simulated host."""

from __future__ import annotations

import hashlib
from typing import Any

from sparkd_sim.docker_args import DAEMON, parse
from sparkd_sim.engine import normalize_image
from sparkd_sim.formats import go_json, render_template, tabwriter
from sparkd_sim.protocol import Done, fail
from sparkd_sim.state import HostState

# Every simulated image is this big (the Qwen image on a Spark: ~21 GB).
IMAGE_SIZE = 21_474_836_480


def human_size(size: float) -> str:
    """Docker's sizes: decimal units, three significant digits (`1.98MB`, `21.5GB`)."""
    units = ["B", "kB", "MB", "GB", "TB", "PB"]
    i = 0
    while size >= 1000 and i < len(units) - 1:
        size /= 1000
        i += 1
    return f"{size:.3g}{units[i]}"


def image_id(host: HostState, image: str) -> str:
    """The ID a tag points at on this host: the same on every host unless re-pulled there."""
    name = normalize_image(image)
    return host.image_ids.get(name) or "sha256:" + hashlib.sha256(name.encode()).hexdigest()


def find_image(host: HostState, ref: str) -> str | None:
    """The tag `ref` names on this host: a tag, `sha256:ID` or a unique ID prefix."""
    name = normalize_image(ref)
    if name in host.images:
        return name
    digits = ref.removeprefix("sha256:")
    if len(digits) < 4 or any(c not in "0123456789abcdef" for c in digits):
        return None
    matches = [i for i in host.images if image_id(host, i)[7:].startswith(digits)]
    return matches[0] if len({image_id(host, i) for i in matches}) == 1 else None


IMAGE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)


def image_value(host: HostState, image: str) -> dict[str, Any]:
    ident = image_id(host, image)
    tags = sorted(i for i in host.images if image_id(host, i) == ident)
    return {
        "Id": ident,
        "RepoTags": tags,
        "RepoDigests": [],
        "Created": "2026-03-02T11:04:17.318Z",
        "Architecture": "arm64",
        "Os": "linux",
        "Size": IMAGE_SIZE,
        # The image's own environment, which a container's `Config.Env` starts with.
        "Config": {"Env": list(IMAGE_ENV)},
    }


def images(host: HostState, args: list[str]) -> Done:
    parsed = parse(args, {"--format", "--filter", "-f"}, {"-q", "--quiet", "-a"}, "images")
    if isinstance(parsed, Done):
        return parsed
    wanted = [normalize_image(r) for r in parsed.rest]
    rows = []
    for image in sorted(host.images):
        if wanted and image not in wanted:
            continue
        repo, _, tag = image.rpartition(":")
        rows.append({"Repository": repo, "Tag": tag, "ID": image_id(host, image)[7:19]})
    if parsed.has("-q", "--quiet"):
        return Done(stdout="".join(r["ID"] + "\n" for r in rows))
    fmt = parsed.one("--format")
    if fmt is not None:
        return Done(stdout="".join(render_template(fmt, r) + "\n" for r in rows))
    table = [["REPOSITORY", "TAG", "IMAGE ID"]] + [
        [r["Repository"], r["Tag"], r["ID"]] for r in rows
    ]
    return Done(stdout=tabwriter(table, minwidth=10))


def image_inspect(host: HostState, args: list[str]) -> Done:
    if not args or args[0] != "inspect":
        return fail("docker image: only 'inspect' is simulated", 1)
    parsed = parse(args[1:], {"--format", "-f"}, set(), "image inspect")
    if isinstance(parsed, Done):
        return parsed
    found, missing = [], []
    for ref in parsed.rest:
        image = find_image(host, ref)
        if image is not None:
            found.append(image_value(host, image))
        else:
            missing.append(ref)
    fmt = parsed.one("--format", "-f")
    out = (
        "".join(render_template(fmt, v) + "\n" for v in found) or "\n"
        if fmt is not None
        else go_json(found, indent=4) + "\n"
    )
    # The 28.x CLI against the engine sparkd is tested with quotes the engine's reason.
    err = "".join(
        f"{DAEMON}: no such image: {m}: No such image: {normalize_image(m)}\n" for m in missing
    )
    return Done(out, err, 1 if missing else 0)

"""Stage 2, the image: present on every host, the same image (by ID) everywhere.

Containers start with `--pull=never`, so a missing image is for a human. A tag that points at
different images on the two hosts (pulled at different times) would build a cluster of mixed
versions: that is skew, and nothing of Ray is (re)started until it is fixed. A tag re-pulled on
every host is a new image: the running containers drift and are rolled out in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkd.core.judging.judge import Context, Hold, Verdict
from sparkd.core.spec import container_name, normalize_image, short_image_id
from sparkd.model.plan import RAY_STARTS


@dataclass
class ImageVerdict(Verdict):
    # The image ID the tag points at on every host, when all agree and it is known.
    image_id: str | None = None
    # Some host lacks the image or disagrees: no container may be replaced anywhere.
    unsafe: bool = False
    missing: list[str] = field(default_factory=list)


def judge_images(ctx: Context) -> ImageVerdict:
    desired = ctx.desired
    verdict = ImageVerdict()
    blocking = False
    wanted = normalize_image(desired.ray.image)
    for host in ctx.reachable:
        seen = ctx.facts[host.name]
        if seen.images is None or wanted in {normalize_image(i) for i in seen.images}:
            continue
        verdict.missing.append(host.name)
        why = (
            f"image {desired.ray.image} missing on {host.name} "
            "(containers start with --pull=never: pull it on the host)"
        )
        ours = seen.container(container_name(desired, host))
        if ours is not None and ours.running:
            # The running container stays; only a restart would need the image.
            verdict.holds.append(Hold(why, RAY_STARTS, frozenset({host.name})))
            verdict.notes.append(f"{why}; the running container stays")
        else:
            verdict.holds.append(Hold(why, RAY_STARTS, frozenset({host.name})))
            verdict.notes.append(why)
            blocking = True
    ids = {
        host.name: ctx.facts[host.name].image_id
        for host in ctx.reachable
        if ctx.facts[host.name].image_id is not None
    }
    distinct = sorted({i for i in ids.values() if i is not None})
    if len(distinct) > 1:
        where = ", ".join(f"{short_image_id(i)} on {name}" for name, i in sorted(ids.items()) if i)
        why = (
            f"image skew: {desired.ray.image} is {where}; pull the same image on every host "
            "(nothing of Ray is restarted until then)"
        )
        verdict.notes.append(why)
        verdict.holds.append(Hold(why, RAY_STARTS))
        blocking = True
    elif distinct and len(ids) == len(ctx.desired.hosts):
        verdict.image_id = distinct[0]
    verdict.unsafe = bool(verdict.missing) or len(distinct) > 1
    if blocking:
        verdict.phase = "blocked"
    return verdict

"""The fact script and assemble agree on every section name: each section the generated script
writes is read, and each section assemble reads is written (a one-sided rename would otherwise
read as "not observed", silently)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import docker_failure, head_extras, host_facts, unreadable
from sparkd.core.spec import container_name
from sparkd.model.cluster import ClusterSpec
from sparkd.model.sections import FactSection, top_container
from sparkd.shell import catalogue
from tests.toy import T0, reference_cluster

# `s NAME timeout ...` and `c NAME timeout ...` (the section and capture functions), and the
# sections the script prints itself (`printf '@@sparkd NAME\n...`).
_CALLED = re.compile(r"(?<![\w$-])[sc] ('[^']*'|\"[^\"]*\"|[^\s'\"]+) timeout ")
_PRINTED = re.compile(r"@@sparkd ([^\s%\\']+)\\n")


def variants() -> Iterator[ClusterSpec]:
    """Every shape of the fact script: the dashboard or `ray status`, a model directory on a
    mount (the prepare sections) or a hub id, units to clean or none."""
    cluster = reference_cluster()
    for dashboard in (True, False):
        ray = cluster.ray.model_copy(update={"dashboard": dashboard, "mounts": ("/m:/models",)})
        model = cluster.model.model_copy(update={"id": "/models/glm"})
        yield cluster.model_copy(update={"ray": ray, "model": model})
    cleanup = cluster.cleanup.model_copy(update={"units": ()})
    yield cluster.model_copy(update={"cleanup": cleanup})


def _name(token: str) -> str:
    return _kind(token.strip("'\""))


def _kind(name: str) -> str:
    """A section's name, or the prefix of the sections named per container or per peer."""
    if top_container(name) is not None:
        return FactSection.TOP
    return FactSection.PEER if name.startswith(f"{FactSection.PEER} ") else name


def written(cluster: ClusterSpec) -> set[str]:
    """The sections of every script `fact_script` can build for the cluster's hosts, and of
    `ray_cli`."""
    t = catalogue.remote.tool_timeout(cluster)
    flags = (False, True)
    scripts = [catalogue.reads.ray_cli(cluster, t)]
    for host in cluster.hosts:
        scripts += [
            catalogue.reads.fact_script(cluster, host, t, ray_status, read_ray, prepare)
            for ray_status in flags
            for read_ray in flags
            for prepare in flags
        ]
    names: set[str] = set()
    for script in scripts:
        names.update(_name(m) for m in _CALLED.findall(script.command))
        names.update(_name(m) for m in _PRINTED.findall(script.command))
    return names


class Reading(dict[str, parsers.Section]):
    """Sections that note every name looked up."""

    def __init__(self, sections: dict[str, parsers.Section]) -> None:
        super().__init__(sections)
        self.asked: set[str] = set()

    def _note(self, name: object) -> None:
        text = str(name)
        self.asked.add(_kind(text))

    def get(self, name: str, default: object = None) -> parsers.Section | None:  # type: ignore[override]
        self._note(name)
        return super().get(name)

    def __getitem__(self, name: str) -> parsers.Section:
        self._note(name)
        return super().__getitem__(name)

    def __contains__(self, name: object) -> bool:
        self._note(name)
        return super().__contains__(name)


def read(cluster: ClusterSpec, names: set[str]) -> set[str]:
    """What assemble asks for, given every written section present and answered."""
    asked: set[str] = set()
    for host in cluster.hosts:
        mine = container_name(cluster, host)
        given = {name: parsers.Section("", 0) for name in names if name != FactSection.TOP}
        # The container is listed running (so its `top` is looked for) and its `top` answered.
        given[FactSection.RUNNING] = parsers.Section(mine, 0)
        sections = Reading(given)
        unreadable(sections)
        docker_failure(sections)
        host_facts(cluster, host, sections, T0)
        if host.role == "head":
            head_extras(cluster, sections, T0)
        asked |= sections.asked
    return asked


def test_every_section_written_is_read_and_every_section_read_is_written() -> None:
    every = {section.value for section in FactSection}
    all_written: set[str] = set()
    all_read: set[str] = set()
    for cluster in variants():
        names = written(cluster)
        all_written |= names
        all_read |= read(cluster, names)
    assert all_written - all_read == set(), "written, never read"
    assert all_read - all_written == set(), "read, never written"
    assert all_written == every, "the script writes other sections than FactSection names"


def test_the_script_names_each_running_container_s_top_section() -> None:
    cluster = reference_cluster()
    script = catalogue.reads.fact_script(cluster, cluster.head, 10).command
    assert {top_container(m.strip("'\"")) for m in _CALLED.findall(script)} - {None} == {"$n"}

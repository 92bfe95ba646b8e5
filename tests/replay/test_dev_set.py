"""The development set that ships in the repository's data/ folder (docs/data.md): every
source in it is attributed in data/ATTRIBUTION.md, and it holds the trajectories the
documentation's dev-set table counts. Reads the file with gzip and json only."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DATA = ROOT / "data"
DEV_SET = DATA / "trajectories-dev.jsonl.gz"
#: The replay the dev-set table of docs/data.md is made from (scripts/check_doc_figures.py).
TARGETS = ROOT / "benchmarks" / "results" / "dev-replay-targets.json.gz"


@pytest.fixture(scope="module")
def per_source() -> Counter[str]:
    counts: Counter[str] = Counter()
    with gzip.open(DEV_SET, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                counts[json.loads(line)["source"]] += 1
    return counts


def test_every_source_is_attributed(per_source: Counter[str]) -> None:
    attribution = (DATA / "ATTRIBUTION.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| ([\d,]+) \|", attribution, flags=re.MULTILINE))
    assert set(per_source) <= set(rows), f"sources without attribution: {sorted(set(per_source) - set(rows))}"
    assert len(per_source) == 9
    assert {source: int(n.replace(",", "")) for source, n in rows.items()} == dict(per_source)
    assert f"{sum(per_source.values()):,} in all" in attribution


def test_the_licence_texts_it_points_to_exist() -> None:
    attribution = (DATA / "ATTRIBUTION.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)]+\.txt)\)", attribution)
    assert links
    for link in links:
        assert (DATA / link).resolve().is_file(), link


def test_the_count_is_the_dev_set_tables(per_source: Counter[str]) -> None:
    """The dev-set table of docs/data.md counts the replay's trajectories per source."""
    if not TARGETS.exists():
        assert sum(per_source.values()) > 7000
        return
    counted = json.loads(gzip.decompress(TARGETS.read_bytes()))["one_server"]["settings"]["trajectories"]
    assert dict(per_source) == counted
    assert sum(per_source.values()) == sum(counted.values())

"""Every Python block of the README and of the guide pages runs as pasted,
on every backend."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
BLOCKS = [
    (f"{page.relative_to(ROOT)} block {i}", block)
    for page in PAGES
    for i, block in enumerate(
        re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)
    )
]


def test_readme_and_guide_have_python_blocks():
    assert sum(name.startswith("README") for name, _ in BLOCKS) >= 2
    assert len(BLOCKS) >= 8, [name for name, _ in BLOCKS]


@pytest.mark.parametrize("name,block", BLOCKS, ids=[n for n, _ in BLOCKS])
def test_block_runs(name, block):
    exec(compile(block, name, "exec"), {})

"""The docs' preset table lists every preset with its scheme, parameters and verification."""

from __future__ import annotations

from pathlib import Path

from relpos_ref.presets import PRESETS

PAGE = Path(__file__).resolve().parent.parent / "docs" / "presets.md"


def test_every_preset_has_its_row_in_the_docs():
    rows = {line.split("|")[1].strip(" `"): line for line in PAGE.read_text().splitlines()
            if line.startswith("| `")}
    assert set(rows) == set(PRESETS)
    for name, preset in PRESETS.items():
        row = rows[name]
        assert f"`{preset.scheme}`" in row and preset.verified_by in row and preset.notes in row
        for key, value in preset.params.items():
            assert f"`{key}={value!r}`" in row

"""Golden fixtures: cases, generation, the file format, tolerances, verify and check.

This package sits on top of the core (the core never imports it). Typical use
is the command line (``relpos-ref generate / verify / check / list``); the
same steps are available here:

>>> from relpos_ref import golden
>>> cases = golden.default_cases().select(["shaw/clip/*"], dtypes=["float32"])
>>> [c.id for c in cases]
['shaw/clip/b2-h4-q17-k33-d16-K4/float32/s0']
"""

from __future__ import annotations

from .casefile import cases_from_toml
from .cases import SCHEMES, Case, CaseRegistry, default_cases
from .compare import ArrayResult, ObtainedError
from .dtypes import FLOAT_DTYPES
from .fileformat import FORMATS, CorruptFileError
from .manifest import FORMAT_VERSION, ManifestError, schema_path
from .results import CheckReport, check
from .suite import (
    GOLDEN_BACKENDS,
    GenerateResult,
    GoldenCase,
    Suite,
    SuiteError,
    generate,
    load_suite,
)
from .tolerance import RULE, derive_tolerance
from .verification import VerifyReport, verify

__all__ = [
    "FLOAT_DTYPES",
    "FORMATS",
    "FORMAT_VERSION",
    "GOLDEN_BACKENDS",
    "RULE",
    "SCHEMES",
    "ArrayResult",
    "Case",
    "CaseRegistry",
    "CheckReport",
    "CorruptFileError",
    "GenerateResult",
    "GoldenCase",
    "ManifestError",
    "ObtainedError",
    "Suite",
    "SuiteError",
    "VerifyReport",
    "cases_from_toml",
    "check",
    "default_cases",
    "derive_tolerance",
    "generate",
    "load_suite",
    "schema_path",
    "verify",
]

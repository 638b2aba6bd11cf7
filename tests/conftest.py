"""Shared fixtures: one test run per available backend, and hypothesis profiles.

The ``backend`` fixture (and ``xp``, its namespace) parametrizes a test over
every array library selected by ``RELPOS_BACKENDS`` (all by default): NumPy,
array-api-strict in a pinned and a "strictest" profile and on its "device1"
(arrays that refuse implicit conversion to NumPy, as a GPU library's do: the
CPU machine's check that no test reads results around the adapter), torch on
the CPU and CUDA, JAX, CuPy and dask. A library that is missing, or a GPU that is absent,
shows up as a skip with the reason.

Hypothesis profiles: ``ci`` (default, modest example counts, derandomized)
and ``thorough``; choose with ``RELPOS_HYPOTHESIS_PROFILE=thorough``. Under
``ci``, a hypothesis test on JAX draws an eighth of the examples (at least 2)
and on dask a quarter (at least 3) (`EXAMPLE_SHARE`): each new shape costs JAX
a compilation of every operation and dask a task graph, so their examples
cost 10 to 100 times NumPy's, and they run the same specification code the
other backends check in full.

Workers: with pytest-xdist installed (the ``test`` extra installs it), a run that
names no ``-n`` runs in ``RELPOS_TEST_WORKERS`` processes (2 by default; 0 runs
in this process), one test file to a worker (``--dist loadfile``, so a file's
module fixtures, such as the docs site's build, are made once).
"""

from __future__ import annotations

import os

# Triton's kernels are proven on a machine without a GPU by Triton's interpreter, which is
# chosen when triton is imported (nothing has imported it yet); a GPU machine compiles them.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from relpos_ref import backends

settings.register_profile(
    "ci",
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PROFILE = os.environ.get("RELPOS_HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)

#: Under the ``ci`` profile, the share of a hypothesis test's examples drawn on a backend
#: whose examples are costly, and the fewest it draws. JAX's examples cost the most (4 s
#: an example of test_blocked_equals_unblocked[jax-shaw]); at (1/3, 5) the default run
#: took 10.6 minutes on 2 cores, JAX's hypothesis tests about 4 of them.
EXAMPLE_SHARE = {"jax": (1 / 8, 2), "dask": (1 / 4, 3)}


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Run in ``RELPOS_TEST_WORKERS`` worker processes (2) where pytest-xdist is installed."""
    if not config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if config.getoption("numprocesses", None) is not None:  # -n given: it decides
        return
    raw = os.environ.get("RELPOS_TEST_WORKERS", "2")
    try:
        workers = int(raw)
    except ValueError:
        raise pytest.UsageError(
            f"RELPOS_TEST_WORKERS must be a whole number of processes, got {raw!r}") from None
    if workers < 0:
        raise pytest.UsageError(f"RELPOS_TEST_WORKERS must be 0 or more, got {workers}")
    if workers and not config.getoption("collectonly", False):
        config.option.numprocesses = workers
        if config.getoption("dist", "no") == "no":
            config.option.dist = "loadfile"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Run a hypothesis test on a costly backend with its share of the examples (``ci``)."""
    test = getattr(item, "obj", None)
    spec = getattr(item, "callspec", None)
    target = spec.params.get("backend") if spec is not None else None
    costly = EXAMPLE_SHARE.get(getattr(getattr(target, "adapter", None), "name", ""))
    loaded = getattr(settings, "_current_profile", None) or PROFILE  # --hypothesis-profile
    if loaded != "ci" or costly is None or not getattr(test, "is_hypothesis_test", False):
        yield
        return
    # Hypothesis reads a test's settings when it is called; the wrapped test function
    # is shared by the test's parametrizations, so the change is undone after the call.
    original = test._hypothesis_internal_use_settings
    share, least = costly
    fewer = min(original.max_examples, max(least, round(original.max_examples * share)))
    test._hypothesis_internal_use_settings = settings(original, max_examples=fewer)
    try:
        yield
    finally:
        test._hypothesis_internal_use_settings = original


@dataclass(frozen=True)
class Target:
    """One backend on one device (and, for array-api-strict, one profile)."""

    adapter: backends.Backend
    device: str | None = None
    profile: str | None = None

    @property
    def id(self) -> str:
        parts = [self.adapter.name, self.profile or self.device]
        return "-".join(p for p in parts if p and p != "cpu")

    @property
    def xp(self) -> Any:
        return self.adapter.namespace()

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """NumPy data into this backend, on this device."""
        a = np.asarray(a) if dtype is None else np.asarray(a, dtype=dtype)
        return self.adapter.from_numpy(a, device=self.device)

    def to_numpy(self, x: Any) -> np.ndarray:
        return self.adapter.to_numpy(x)

    def native_device(self) -> Any:
        """The library's device object of an array made here."""
        import array_api_compat

        return array_api_compat.device(self.asarray(np.zeros(1)))


def _targets() -> list[Any]:
    params = []
    for adapter in backends.selected():
        reason = adapter.unavailable_reason()
        if reason is not None:
            params.append(
                pytest.param(
                    Target(adapter), id=adapter.name, marks=pytest.mark.skip(reason=reason)
                )
            )
            continue
        if adapter.name == "array_api_strict":
            for profile in ("pinned", "strictest"):
                params.append(
                    pytest.param(Target(adapter, profile=profile), id=f"strict-{profile}")
                )
            # An accelerator's stand-in on a CPU machine: arrays on array-api-strict's
            # "device1" refuse implicit conversion to NumPy, as CuPy's do, so a test that
            # reads results with np.asarray instead of the adapter fails here, not on a GPU.
            params.append(pytest.param(Target(adapter, device="device1", profile="pinned"),
                                       id="strict-device1"))
        elif adapter.name == "torch":
            devices = adapter.devices()
            for device in devices:
                t = Target(adapter, device=device)
                params.append(pytest.param(t, id=t.id))
            if len(devices) == 1:
                params.append(
                    pytest.param(
                        Target(adapter, device="cuda:0"),
                        id="torch-cuda",
                        marks=pytest.mark.skip(reason="torch sees no CUDA device here"),
                    )
                )
        elif adapter.name == "jax":
            import jax

            # Without this JAX narrows float64 silently; the tests need float64.
            jax.config.update("jax_enable_x64", True)
            t = Target(adapter, device=adapter.devices()[0])
            params.append(pytest.param(t, id=adapter.name))
        else:
            t = Target(adapter, device=adapter.devices()[0])
            params.append(pytest.param(t, id=t.id))
    return params


TARGETS = _targets()


@pytest.fixture(params=TARGETS)
def backend(request: pytest.FixtureRequest) -> Any:
    target: Target = request.param
    if target.profile is not None:
        with target.adapter.profile(target.profile):
            yield target
    else:
        yield target


@pytest.fixture
def xp(backend: Target) -> Any:
    return backend.xp


FLOAT_TOLERANCE = {
    "float16": {"rtol": 2e-2, "atol": 2e-3},
    "float32": {"rtol": 2e-5, "atol": 2e-6},
    "float64": {"rtol": 1e-11, "atol": 1e-13},
}


def dtype_name(dtype: Any) -> str:
    """'float32' for any library's float32 dtype object."""
    return str(dtype).rsplit(".", 1)[-1].strip("'>").replace("dtype(", "").strip("'")

"""Golden traces: every number for a few pinned requests.

Generated numbers (embeddings and, through parameters_digest, the weights) are
compared bit for bit: they come from exact arithmetic and must be identical
everywhere. Computed stages go through BLAS and libm, whose last bits differ
between CPUs (an AVX-512 and a Haswell kernel differ by up to ~20 ulp here),
so they are compared to 1e-12: far below any real change to the arithmetic,
far above those last-bit differences. The files in tests/golden/ are written
only by scripts/regen-golden; these tests read them and never write.
"""

from __future__ import annotations

from dataclasses import replace

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import engine
import engine.layer
import engine.tracing

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
CASES = ["the_cat_sat.d24.h1", "the_cat_sat.d24.h4", "the_cat_sat.d24.h4.causal"]

# The numbers each golden file held when its ENGINE_VERSION was released (printed by
# scripts/regen-golden). Regenerating the files without bumping ENGINE_VERSION breaks
# this table; bumping it means adding the new version's fingerprints here, on purpose.
PINNED_FINGERPRINTS = {
    "1.0.0": {
        "the_cat_sat.d24.h1": "sha256:f0fc30f48e51cf33363333b9b3b16c332df8a425782c5d2e311325070c4ffba6",
        "the_cat_sat.d24.h4": "sha256:2681414e90e64b1f73c32dd34f0ba2c86bb8e89b7b87412acd00f155c1cc3004",
        "the_cat_sat.d24.h4.causal": "sha256:4af926f2fdfa9b30a21c35e8203d046d22fdc2d121c187b6739da133c26c4de9",
    },
    # 1.1.0 changed constructed heads in a stack only: these seeded traces keep 1.0.0's numbers
    "1.1.0": {
        "the_cat_sat.d24.h1": "sha256:f0fc30f48e51cf33363333b9b3b16c332df8a425782c5d2e311325070c4ffba6",
        "the_cat_sat.d24.h4": "sha256:2681414e90e64b1f73c32dd34f0ba2c86bb8e89b7b87412acd00f155c1cc3004",
        "the_cat_sat.d24.h4.causal": "sha256:4af926f2fdfa9b30a21c35e8203d046d22fdc2d121c187b6739da133c26c4de9",
    },
}

HOW_TO_UPDATE = (
    "Generated and computed numbers are a public contract pinned by ENGINE_VERSION. If this change is "
    "intended, bump ENGINE_VERSION in engine/version.py, regenerate with `.venv/bin/python scripts/regen-golden` "
    "and add the fingerprints it prints to PINNED_FINGERPRINTS in tests/test_engine_golden.py. "
    "If it is not intended, the engine has a regression."
)


def load(case: str) -> dict:
    return json.loads((GOLDEN_DIR / f"{case}.json").read_text(encoding="utf-8"))


def fresh_trace(golden: dict) -> engine.Trace:
    request = golden["request"]
    return engine.trace(engine.TraceConfig(**request["config"]), sentence=request["sentence"])


def assert_bit_identical(actual: np.ndarray, expected: list, what: str) -> None:
    expected_arr = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected_arr.shape, (
        f"{what}: shape {actual.shape}, golden {expected_arr.shape}. {HOW_TO_UPDATE}")
    # Compare the float64 bit patterns: exact, and even -0.0 vs 0.0 counts.
    a_bits = np.ascontiguousarray(actual, dtype="<f8").view("<u8")
    e_bits = np.ascontiguousarray(expected_arr, dtype="<f8").view("<u8")
    if not np.array_equal(a_bits, e_bits):
        differ = np.argwhere(a_bits != e_bits)
        idx = tuple(int(i) for i in differ[0])
        ulps = int(np.abs(a_bits.astype(np.int64) - e_bits.astype(np.int64)).max())
        pytest.fail(
            f"GOLDEN MISMATCH in {what}: {len(differ)} of {a_bits.size} values differ, first at {list(idx)}: "
            f"golden {float(expected_arr[idx])!r}, now {float(actual[idx])!r} (largest difference {ulps} ulp). "
            f"A few ulp with no engine change points at another BLAS kernel or CPU (e.g. OPENBLAS_CORETYPE): "
            f"bit-exact goldens assume numpy/OpenBLAS take the same code path as where they were written.\n"
            f"{HOW_TO_UPDATE}"
        )


GENERATED_STAGES = {"token_embedding"}


def assert_within_1e12(actual: np.ndarray, expected: list, what: str) -> None:
    expected_arr = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected_arr.shape, f"{what}: shape {actual.shape}, golden {expected_arr.shape}"
    atol = 1e-12 * max(1.0, float(np.abs(expected_arr).max(initial=0.0)))
    bad = ~np.isclose(actual, expected_arr, rtol=1e-12, atol=atol)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        pytest.fail(f"GOLDEN MISMATCH in {what}: {int(bad.sum())} of {bad.size} values differ beyond 1e-12, "
                    f"first at {list(idx)}: golden {float(expected_arr[idx])!r}, now {float(actual[idx])!r}.\n"
                    f"{HOW_TO_UPDATE}")


def test_the_golden_files_are_all_there():
    assert sorted(p.stem for p in GOLDEN_DIR.glob("*.json")) == sorted(CASES)


@pytest.mark.parametrize("case", CASES)
def test_golden_file_is_for_this_engine_version(case):
    # A version bump without regenerating leaves stale goldens behind.
    assert load(case)["engine_version"] == engine.ENGINE_VERSION, HOW_TO_UPDATE


@pytest.mark.parametrize("case", CASES)
def test_golden_numbers_are_the_ones_released_with_this_version(case):
    # A regeneration without a version bump changes the numbers under an old version.
    golden = load(case)
    body = {k: v for k, v in golden.items() if k != "engine_version"}
    digest = "sha256:" + hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
    ).hexdigest()
    pinned = PINNED_FINGERPRINTS.get(golden["engine_version"])
    assert pinned is not None, f"no fingerprints pinned for ENGINE_VERSION {golden['engine_version']}. {HOW_TO_UPDATE}"
    assert digest == pinned[case], f"{case}.json changed without an ENGINE_VERSION bump. {HOW_TO_UPDATE}"


@pytest.mark.parametrize("case", CASES)
def test_trace_reproduces_golden(case):
    golden = load(case)
    tr = fresh_trace(golden)
    assert [{"text": t.text, "start": t.start, "end": t.end} for t in tr.tokens] == golden["tokens"]
    assert tr.parameters_digest == golden["parameters_digest"], f"weights changed. {HOW_TO_UPDATE}"
    assert list(tr.stages) == list(golden["stages"]), f"stage list changed. {HOW_TO_UPDATE}"
    for stage_id, stored in golden["stages"].items():
        stage = tr.stages[stage_id]
        if stage_id == "tokens":
            assert stage.values == stored["values"]
            continue
        if stage_id in GENERATED_STAGES:
            assert_bit_identical(stage.values, stored["values"], f"{case} stage {stage_id}")
        else:
            assert_within_1e12(stage.values, stored["values"], f"{case} stage {stage_id}")
        if "mask" in stored:
            assert np.array_equal(stage.mask, np.array(stored["mask"], dtype=bool)), f"{case} mask. {HOW_TO_UPDATE}"
        else:
            assert stage.mask is None
    assert_within_1e12(tr.entropy, golden["entropy"], f"{case} entropy")
    assert_within_1e12(tr.max_weight, golden["max_weight"], f"{case} max_weight")


@pytest.mark.parametrize("case", CASES)
def test_golden_catches_a_change_in_the_last_digits_that_matter(case, monkeypatch):
    # The 1e-12 comparison still fails loudly on a tiny real change: a scale
    # factor off by one part in 1e9 moves every scaled score.
    golden = load(case)
    real = engine.layer.layer_steps

    def skewed(config, **kwargs):
        return tuple(replace(s, fn=lambda d_k, scale: float(np.sqrt(d_k)) * (1 + 1e-9)) if s.name == "scale_factor"
                     else s for s in real(config, **kwargs))

    monkeypatch.setattr(engine.tracing, "layer_steps", skewed)
    tr = fresh_trace(golden)
    with pytest.raises(pytest.fail.Exception, match="GOLDEN MISMATCH"):
        assert_within_1e12(tr.stages["scaled_scores"].values, golden["stages"]["scaled_scores"]["values"], case)


def test_golden_pins_the_documented_worked_example_shape():
    # Sanity of what is pinned: "the cat sat", d_model 24, seed 0, √d_k scaling, sinusoidal PE.
    for case in CASES:
        golden = load(case)
        assert golden["request"]["sentence"] == "the cat sat"
        config = golden["request"]["config"]
        assert (config["d_model"], config["seed"], config["scale"], config["positional_encoding"]) == (
            24, 0, True, "sinusoidal")
    assert "masked_scores" in load("the_cat_sat.d24.h4.causal")["stages"]
    assert "masked_scores" not in load("the_cat_sat.d24.h4")["stages"]
    # The 1-head and 4-head layers share embeddings but not weights.
    one_head, four_heads = load("the_cat_sat.d24.h1"), load("the_cat_sat.d24.h4")
    assert one_head["stages"]["token_embedding"] == four_heads["stages"]["token_embedding"]
    assert one_head["parameters_digest"] != four_heads["parameters_digest"]


def test_regen_script_is_an_executable_python_script():
    script = Path(__file__).resolve().parents[1] / "scripts" / "regen-golden"
    assert script.stat().st_mode & 0o111, "scripts/regen-golden must be executable"
    assert script.read_text(encoding="utf-8").startswith("#!/usr/bin/env python3\n")

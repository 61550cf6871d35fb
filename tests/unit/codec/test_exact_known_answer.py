"""The drift known answer: digests of pre-rounding intermediates catch a one-ulp difference that the
integer logits would hide, and name where it first appears."""

from __future__ import annotations

import decimal
import json
from pathlib import Path

import pytest
import torch
from cascade.codec.exact import frequencies, root, tables
from cascade.codec.exact.known_answer import (
    KnownAnswerError,
    check_known_answer,
    reference,
    reference_path,
    write_reference,
)
from cascade.engine.fingerprint import model_fingerprint

from tests.unit.codec.numerics_matrix import PYCODER, load, random_model


def test_the_shipped_reference_of_the_default_model_is_reproduced_here() -> None:
    path = reference_path(model_fingerprint(str(PYCODER)))
    assert path.is_file()
    check_known_answer(load("pycoder-23m"), path)


def test_a_one_ulp_drift_of_the_output_scale_is_named_although_the_integers_agree(tmp_path: Path) -> None:
    model = random_model("llama-mha")
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(reference(model)))
    check_known_answer(model, path)
    hidden = model.prefill([[1, 2, 3, 4, 5]])
    before = model.logits(hidden)
    scale = model.lm_head.scale
    original = scale.clone()
    try:
        scale[7] = torch.nextafter(original[7], torch.tensor(2.0, dtype=torch.float64))
        assert torch.equal(model.logits(hidden), before)
        with pytest.raises(KnownAnswerError, match=r"prefill\.logits_before_rint differs"):
            check_known_answer(model, path)
    finally:
        scale.copy_(original)


def test_a_drift_inside_a_layer_names_that_layer(tmp_path: Path) -> None:
    model = random_model("llama-mha")
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(reference(model)))
    norm = model.layers[1].mlp_norm
    original = norm.clone()
    try:
        norm[3] = torch.nextafter(original[3], torch.tensor(2.0, dtype=torch.float64))
        with pytest.raises(KnownAnswerError, match=r"prefill\.layer1 differs"):
            check_known_answer(model, path)
    finally:
        norm.copy_(original)


def test_a_machine_with_another_square_root_variant_passes_with_a_note(tmp_path: Path) -> None:
    """MKL's root differs between CPUs (``codec.exact.root``): the model computes with the correctly
    rounded root, so such a machine reproduces every digest, and is told that its root is another
    variant."""
    model = random_model("llama-mha")
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(reference(model) | {"root_variant": "another-machine"}))
    note = check_known_answer(model, path)
    assert note is not None and "another-machine" in note and "checksum" in note
    path.write_text(json.dumps(reference(model)))
    assert check_known_answer(model, path) is None


def test_the_models_root_is_the_correctly_rounded_one_whatever_the_machine() -> None:
    from cascade.codec.exact import root

    squares = torch.rand(4096, dtype=torch.float64) * 1e6
    context = decimal.Context(prec=60)
    assert root.root(squares).tolist() == [float(decimal.Decimal(v).sqrt(context)) for v in squares.tolist()]
    with root.machine():
        assert torch.equal(root.root(squares), root.machine_root(squares))


def test_a_reference_of_another_numerics_version_is_refused(tmp_path: Path) -> None:
    model = random_model("llama-mha")
    document = reference(model) | {"numerics": "exact-llama-0"}
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(document))
    with pytest.raises(KnownAnswerError, match="exact-llama-0"):
        check_known_answer(model, path)


def test_write_reference_records_a_model_folder(tmp_path: Path) -> None:
    out = write_reference(PYCODER, b"\0" * 32, tmp_path / "pycoder.json")
    written = json.loads(out.read_text())
    shipped = json.loads(reference_path(model_fingerprint(str(PYCODER))).read_text())
    # The square root's variant is this machine's (CPUs differ in it); everything else is the reference's.
    assert written.pop("root_variant") == root.variant()
    shipped.pop("root_variant")
    assert written == shipped


def test_tables_ignore_the_threads_decimal_context() -> None:
    expected = (tables.attention_exp_table().copy(), tables.sigmoid_table().copy(),
                [t.clone() for t in frequencies._tables()])
    rope = tables.rope_tables(64, 10000.0, 32)
    context = decimal.getcontext()
    saved = (context.prec, context.rounding)
    try:
        context.prec, context.rounding = 12, decimal.ROUND_FLOOR
        for cached in (tables.attention_exp_table, tables.sigmoid_table, tables.rope_tables, frequencies._tables,
                       frequencies._entries):
            cached.cache_clear()
        assert (tables.attention_exp_table() == expected[0]).all()
        assert (tables.sigmoid_table() == expected[1]).all()
        assert all(torch.equal(a, b) for a, b in zip(frequencies._tables(), expected[2], strict=True))
        again = tables.rope_tables(64, 10000.0, 32)
        assert (again[0] == rope[0]).all() and (again[1] == rope[1]).all()
    finally:
        context.prec, context.rounding = saved

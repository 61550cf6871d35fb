"""Start-up facts the engine adapter reads: the export probe tells processed prompt logits from raw ones
whatever the logits' ties, and the end-of-sequence ids come from the tokenizer and the generation config."""

from __future__ import annotations

from types import SimpleNamespace

from cascade.engine.manager import end_of_sequence_ids, export_probe_problem
from cascade.export.topk import ExportPosition


def _position(index: int, ids: tuple[int, ...]) -> ExportPosition:
    share = -float(len(ids))
    return ExportPosition(index, ids[0] if ids else 0, ids, tuple(share for _ in ids), None, None)


def test_an_export_holding_only_the_allowed_tokens_passes_even_when_they_tie() -> None:
    positions = [_position(1, (5, 9)), _position(2, (9, 5)), _position(3, (5,))]
    assert export_probe_problem(positions, 4, (5, 9)) == ""


def test_raw_prompt_logprobs_naming_other_tokens_fail_the_probe() -> None:
    positions = [_position(1, (5, 9)), _position(2, (9, 17, 5, 3))]
    problem = export_probe_problem(positions, 3, (5, 9))
    assert "position 2" in problem and "[3, 17]" in problem


def test_missing_positions_or_empty_distributions_fail_the_probe() -> None:
    assert "1 positions came back for a 4-token prompt" in export_probe_problem([_position(1, (5,))], 4, (5, 9))
    assert "(none)" in export_probe_problem([_position(1, ())], 2, (5, 9))


def _engine(generation_config: dict[str, object] | Exception) -> SimpleNamespace:
    def read() -> dict[str, object]:
        if isinstance(generation_config, Exception):
            raise generation_config
        return generation_config

    return SimpleNamespace(model_config=SimpleNamespace(try_get_generation_config=read))


def test_end_of_sequence_ids_join_the_tokenizer_and_the_generation_config() -> None:
    tokenizer = SimpleNamespace(eos_token_id=1)
    assert end_of_sequence_ids(tokenizer, _engine({"eos_token_id": [5, 9]})) == {1, 5, 9}
    assert end_of_sequence_ids(tokenizer, _engine({"eos_token_id": 5})) == {1, 5}
    assert end_of_sequence_ids(tokenizer, _engine(OSError("no generation_config.json"))) == {1}
    assert end_of_sequence_ids(SimpleNamespace(eos_token_id=None), _engine({})) == frozenset()

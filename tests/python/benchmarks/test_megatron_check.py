"""The cost model against published throughput (Narayanan et al. 2021, Megatron-LM):
Table 1 within +-10% per row with one set of constants, Table 2's PTD-P vs ZeRO-3 pairs
ranked as published with ZeRO-3's collapse at 1,536+ GPUs. These check predictions
(pure arithmetic on graphs built without torch), never wall-clock time."""
import importlib.util
import pathlib

import pytest

_path = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "megatron.py"
_spec = importlib.util.spec_from_file_location("megatron_benchmark", _path)
megatron = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(megatron)


@pytest.mark.parametrize("row", megatron.TABLE1, ids=lambda r: f"{r[0]}B")
def test_table1_row_predicted_within_10_percent(row):
    published = row[-1]
    found = megatron.predict_table1_row(row)
    assert found is not None, "no plan fits in 80 GB"
    predicted = found[0].predicted_megatron_tflops_per_device()
    assert abs(predicted - published) / published <= 0.10, f"predicted {predicted:.1f} vs published {published}"


def test_table2_pairs_ranked_as_published_with_zero3_collapse():
    preds = {(r[0], r[4], r[7]): megatron.predict_table2_row(r) for r in megatron.TABLE2}
    pairs = list(megatron.table2_pairs(preds))
    assert len(pairs) == 6
    for name, gpus, ptdp, zero3 in pairs:
        assert ptdp > zero3, f"{name} at {gpus} GPUs: PTD-P {ptdp:.0f} <= ZeRO-3 {zero3:.0f}"
    # The collapse: ZeRO-3 at the largest scale loses most of its throughput.
    assert preds[("175B", "ZeRO-3", 1536)] < 0.5 * preds[("175B", "ZeRO-3", 384)]
    assert preds[("530B", "ZeRO-3", 2240)] < 0.5 * preds[("530B", "ZeRO-3", 560)]

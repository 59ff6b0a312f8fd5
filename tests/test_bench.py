"""The benchmark package (CPU): every family's module registers its benchmarks, in the order
``python -m specdec_lib bench`` runs them, and the command says why it cannot run here."""
import pytest

from specdec_lib import bench, runtime


def test_bench_families_register_in_order():
    bench._load_families()
    assert list(bench._BENCHES) == ["copy", "append_kv", "verify_attention", "verify_attention_b1",
                                    "verify_attention_kv8", "rope_append_kv",
                                    "gdn_round", "gdn_sweep", "conv1d", "draft_combine", "linear",
                                    "gated_rms_norm", "linear_chain", "round_host", "round_b1", "spec_sample"]
    # a bare `bench` skips the long sweeps (and the 8-bit rows' duplicate)
    assert bench._OPTIONAL == {"gdn_sweep", "verify_attention_b1", "verify_attention_kv8",
                               "linear_chain"}


def test_bench_without_gpu_says_why(capsys):
    if runtime.gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present: the benchmarks would run")
    assert bench.main(["spec_sample"]) == 2
    assert "no GPU" in capsys.readouterr().out


def test_bench_bad_flag_is_an_error():
    if runtime.gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit):
        bench.main(["--no-such-flag"])

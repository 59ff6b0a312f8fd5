"""The public surface a stack reads: __all__, __version__ (one source), the CLI's --version and
--help, public exceptions and status codes (equal to the reference's and the CUDA headers'
constants), the old module names kept as aliases, py.typed."""
import os
import re
import subprocess
import sys
import types

import pytest

import specdec_lib
import specdec_lib.arrays  # noqa: F401
import specdec_lib.cubins  # noqa: F401
import specdec_lib.models  # noqa: F401
import specdec_lib.registry  # noqa: F401
from specdec_lib import errors, ops, status

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.dirname(specdec_lib.__file__)
IN_TREE = os.path.isfile(os.path.join(ROOT, "pyproject.toml")) and \
    os.path.samefile(PKG, os.path.join(ROOT, "specdec_lib"))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "specdec_lib", *args], capture_output=True,
                          text=True, timeout=120)


def test_all_names_resolve():
    for mod in (specdec_lib, errors, status, specdec_lib.runtime, specdec_lib.dtypes,
                specdec_lib.arrays, specdec_lib.registry, specdec_lib.models,
                specdec_lib.cubins):
        assert len(set(mod.__all__)) == len(mod.__all__), mod.__name__
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.{name}"


def test_adapters_all():
    pytest.importorskip("torch")
    from specdec_lib import adapters
    assert all(hasattr(adapters, n) for n in adapters.__all__)


def test_all_lists_every_op():
    public = {n for n, v in vars(ops).items()
              if not n.startswith("_") and callable(v) and not isinstance(v, types.ModuleType)}
    assert public <= set(specdec_lib.__all__), public - set(specdec_lib.__all__)


@pytest.mark.skipif(not IN_TREE, reason="needs the source tree (pyproject.toml)")
def test_version_has_one_source():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        meta = tomllib.load(fh)
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "specdec_lib.__version__"}
    # setuptools reads it statically (no import of the package) and gets the same string
    from setuptools.config.expand import read_attr
    assert read_attr("specdec_lib.__version__", root_dir=ROOT) == specdec_lib.__version__


def test_version_cli_and_info():
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", specdec_lib.__version__)
    r = _cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"specdec_lib {specdec_lib.__version__}"
    assert specdec_lib.runtime.info()["version"] == specdec_lib.__version__


def test_help_names_the_demo_model():
    r = _cli("--help")
    assert r.returncode == 0
    demo = r.stdout.split("demo", 1)[1].split("inspect")[0]
    assert "SmolLM2" in demo and "tiny-hybrid" in demo


def test_status_codes_match_the_reference_and_headers():
    from specdec_lib.reference import sampling, sequence
    for s in status.SampleStatus:
        assert getattr(sampling, "STATUS_" + s.name) == s
        assert sampling.STATUS_NAMES[s]
    assert set(sequence.FINISH_REASONS) == {r.value for r in status.FinishReason}
    for r in status.FinishReason:
        want = "FINISH_NONE" if r.name == "RUNNING" else "FINISH_" + r.name
        assert getattr(sequence, want) == r
    if not IN_TREE:
        return
    headers = {status.SampleStatus: ("sampling/sampling_params.h", "SPEC_SAMPLE_"),
               status.FinishReason: ("sequence/sequence_params.h", "SPECDEC_FINISH_"),
               status.GdnStatus: ("gdn/gdn_params.h", "SPECDEC_GDN_"),
               status.ConvStatus: ("conv/conv_params.h", "SPECDEC_CONV_")}
    for enum, (header, prefix) in headers.items():
        text = open(os.path.join(ROOT, "cuda_src", header)).read()
        for m in enum:
            if m.value == 0:
                continue
            found = re.search(rf"#define {prefix}{m.name}\s+(\d+)", text)
            assert found and int(found.group(1)) == m.value, (header, m.name)
    assert status.GdnStatus(3) == status.GdnStatus.BAD_SLOT | status.GdnStatus.BAD_ROWS


def test_exceptions_are_public_and_shared_with_the_driver_layer():
    assert specdec_lib.CudaUnavailable is errors.CudaUnavailable
    assert issubclass(errors.CudaUnavailable, errors.CudaError)
    assert issubclass(errors.CudaError, RuntimeError)
    assert specdec_lib.runtime.ExtensionMissing is errors.ExtensionMissing
    try:
        from specdec_lib import _driver
    except ImportError:
        pytest.skip("compiled driver layer not built")
    assert _driver.CudaError is errors.CudaError and _driver.CudaUnavailable is errors.CudaUnavailable


def test_old_inspect_module_is_an_alias():
    import specdec_lib.cubins as cubins
    import specdec_lib.inspect as old
    assert old is cubins and old.inspect_cubin is cubins.inspect_cubin


def test_py_typed_ships():
    assert os.path.isfile(os.path.join(PKG, "py.typed"))
    if IN_TREE:
        assert '"py.typed"' in open(os.path.join(ROOT, "setup.py")).read()


def test_import_loads_no_framework():
    code = ("import sys, specdec_lib, specdec_lib.status, specdec_lib.errors, specdec_lib.cubins; "
            "bad = [m for m in ('torch', 'cupy', 'specdec_lib._driver') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_loading_logs_to_the_package_logger(caplog, tmp_path):
    from specdec_lib.models import load_demo_checkpoint, make_demo_checkpoint
    path = make_demo_checkpoint(str(tmp_path))
    with caplog.at_level("INFO", logger="specdec_lib"):
        load_demo_checkpoint(path)
    assert any(r.name == "specdec_lib.registry" and "validated" in r.getMessage()
               for r in caplog.records)


def test_gguf_progress_bar_only_on_a_terminal():
    """progress=None (the default) draws the bar only when stderr is a terminal."""
    import inspect as std_inspect
    from specdec_lib.models import gguf_llama, load_smollm2_target, smollm2
    for fn in (gguf_llama.read_gguf_llama, smollm2.load_smollm2, load_smollm2_target):
        assert std_inspect.signature(fn).parameters["progress"].default is None, fn

"""tools/release/check_wheel.py, the release wheel's gate in .ci/run (CPU): it must catch an unrepaired
tag, a missing kernel image, a stale module and a bad size, on a synthetic wheel."""
import os
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# check_wheel is a gate of the source tree (it compares a wheel with pyx/ and the tree's .py
# files), not a module of the package: it is imported from tools/release, which holds no
# specdec_lib (so the installed package the wheel run tests is never shadowed)
sys.path.insert(0, os.path.join(ROOT, "tools", "release"))
import check_wheel  # noqa: E402


def _wheel(tmp_path, plat="manylinux_2_28_x86_64", drop=(), extra=()):
    """A wheel holding what a release holds (dummy kernel images and extensions)."""
    with open(os.path.join(ROOT, "specdec_lib", "_kernels.py")) as f:
        table = f.read()
    images = sorted(check_wheel.expected_images(table))
    stems = [os.path.splitext(p)[0] for p in os.listdir(os.path.join(ROOT, "pyx")) if p.endswith(".pyx")]
    files = {"specdec_lib/_kernels.py": table, "specdec_lib/__init__.py": "",
             "specdec_lib/_cubin/MANIFEST": "\n".join(images) + "\n",
             "specdec_lib-0.1.0.dist-info/WHEEL": "Wheel-Version: 1.0\n"}
    files.update({f"specdec_lib/_cubin/{n}": "x" for n in images})
    files.update({f"specdec_lib/{s}.cpython-311-x86_64-linux-gnu.so": "not an ELF" for s in stems})
    files.update({n: "x" for n in check_wheel.weights_files(ROOT)})
    files.update({n: "" for n in extra})
    path = tmp_path / f"specdec_lib-0.1.0-cp311-cp311-{plat}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, body in files.items():
            if name not in drop:
                z.writestr(name, body)
    return str(path)


def _problems(path):
    # the synthetic wheel is tiny: drop the size complaint, keep every other
    return [p for p in check_wheel.check(path) if "MB compressed" not in p]


def test_a_complete_wheel_passes_but_for_its_size(tmp_path):
    path = _wheel(tmp_path)
    probs = check_wheel.check(path)
    assert len(probs) == 1 and "MB compressed: outside" in probs[0]


def test_an_unrepaired_tag_fails(tmp_path):
    path = _wheel(tmp_path, plat="linux_x86_64")
    assert any("platform tag linux_x86_64" in p for p in _problems(path))


def test_a_missing_kernel_image_fails(tmp_path):
    path = _wheel(tmp_path, drop=("specdec_lib/_cubin/sampling.sm_75.cubin",))
    assert any("missing kernel images" in p and "sampling.sm_75.cubin" in p for p in _problems(path))


def test_stale_modules_and_images_fail(tmp_path):
    path = _wheel(tmp_path, extra=("specdec_lib/bench_gdn.py", "specdec_lib/_cubin/old.sm_90.cubin"))
    probs = _problems(path)
    assert any("bench_gdn.py is not in the source tree" in p for p in probs)
    assert any("does not ship (stale?)" in p and "old.sm_90.cubin" in p for p in probs)


def test_a_missing_extension_fails(tmp_path):
    path = _wheel(tmp_path, drop=("specdec_lib/_driver.cpython-311-x86_64-linux-gnu.so",))
    assert any("extension specdec_lib/_driver missing" in p for p in _problems(path))


def test_wheel_tags_from_the_file_name():
    assert check_wheel.wheel_tags("d/specdec_lib-0.1.0-cp311-cp311-manylinux_2_28_x86_64.whl") == \
        ("cp311", "cp311", ["manylinux_2_28_x86_64"])


def test_a_missing_draft_head_or_hybrid_fails(tmp_path):
    path = _wheel(tmp_path, drop=("specdec_lib/models/heads/smollm2_mtp/model.safetensors.packed",))
    assert any("weights file" in p and "smollm2_mtp/model.safetensors.packed" in p
               for p in _problems(path))
    path = _wheel(tmp_path, drop=("specdec_lib/models/hybrid/smollm2_hybrid/config.json",))
    assert _problems(path) == ["trained weights file specdec_lib/models/hybrid/smollm2_hybrid/"
                               "config.json missing"]

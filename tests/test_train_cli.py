"""``python -m specdec_lib train-draft``: reachable from the dispatcher, and its help needs
neither torch nor the model extra (the trainer imports them only once it runs)."""
import subprocess
import sys

import specdec_lib
from toy_models import cli_without_torch as _run


def test_train_draft_help_without_torch():
    p = _run("train-draft", "--help")
    assert p.returncode == 0, p.stderr
    assert "train-draft" in p.stdout and "--method" in p.stdout and "--train-seconds" in p.stdout


def test_dispatcher_lists_train_draft():
    p = _run("--help")
    assert p.returncode == 0, p.stderr
    assert "train-draft" in p.stdout


def test_import_specdec_lib_does_not_import_the_trainer():
    p = subprocess.run([sys.executable, "-c", "import sys, specdec_lib, specdec_lib.train; "
                        "assert 'torch' not in sys.modules, 'torch imported'"],
                       capture_output=True, text=True, timeout=60,
                       env=dict(__import__("os").environ,
                                PYTHONPATH=__import__("os").path.dirname(
                                    __import__("os").path.dirname(specdec_lib.__file__))))
    assert p.returncode == 0, p.stderr

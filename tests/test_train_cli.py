"""``python -m specdec_lib train-draft``: reachable from the dispatcher, and its help needs
neither torch nor the model extra (the trainer imports them only once it runs)."""
import subprocess
import sys

import specdec_lib

_NO_TORCH = ("import sys; sys.modules['torch'] = None; sys.modules['gguf'] = None; "
             "from specdec_lib.__main__ import main; sys.exit(main(sys.argv[1:]))")


def _run(*args):
    import os
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(specdec_lib.__file__)))
    return subprocess.run([sys.executable, "-c", _NO_TORCH, *args], capture_output=True,
                          text=True, timeout=60, env=env)


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

"""torch stays optional: ``import specdec_lib`` must not import it (runs with or without
torch installed)."""
import os
import subprocess
import sys


def test_import_specdec_lib_does_not_import_torch():
    code = ("import sys, specdec_lib, specdec_lib.ops, specdec_lib.reference; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; "
            "assert not bad, bad")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
